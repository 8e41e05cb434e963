"""Imports the capability modules so that they register their run components.

Each capability (layer statistics, GPU/system sampling, alerts, Hub upload...) appends a
factory to :data:`observers.run.COMPONENT_FACTORIES` when imported.
"""

from observers.export import otel_tables  # noqa: F401,E402 - per-layer (opt-in) and alert OTel metrics (issue 6)
from observers import integrations  # noqa: F401,E402 - Trainer/Lightning callbacks, AMP GradScaler (issue 10)
from observers.export import hub_upload  # noqa: F401,E402 - background push to the Hub (issue 4)
from observers.capture import system  # noqa: F401,E402 - GPU and host sampler (issue 5)
from observers.process import alert_monitor  # noqa: F401,E402 - alert rules and detectors (issue 8)
from observers.capture import distributed  # noqa: F401,E402 - shared run id, clock offsets, stragglers (issue 9)
from observers.capture import module_hooks  # noqa: F401,E402 - per-layer activation/gradient/weight statistics (issue 3)
