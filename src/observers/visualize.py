"""``observers.visualize``: load recorded runs and plot them.

The implementation lives in :mod:`observers.present.visualize` (the presentation layer);
this module makes ``import observers.visualize`` and ``from observers.visualize import
load_dataset`` work as well as ``from observers import visualize``.
"""

from observers.present.visualize import *  # noqa: F401,F403
from observers.present.visualize import __all__  # noqa: F401
