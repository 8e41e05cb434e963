"""Framework integrations: what a trainer knows that the generic loop capture cannot.

Steps, losses, learning rates and timings come from the loop capture for every framework
(one step per optimizer step). While a run is attached, the trainers below also get an
observers callback automatically (their ``__init__`` is wrapped on instrument and
restored when the run ends); each module documents what its callback adds.

=========================================  =============================================
``transformers.Trainer``                   :mod:`observers.integrations.transformers`
Lightning ``Trainer`` (``lightning.pytorch``  :mod:`observers.integrations.lightning`
or ``pytorch_lightning``)
Accelerate, ``torch.amp.GradScaler``,      no callback needed: loop capture, plus
``torch.compile``, gradient accumulation   :mod:`observers.capture.amp` for loss scaling
=========================================  =============================================
"""

from __future__ import annotations

from observers.capture.amp import GRAD_SCALER
from observers.capture.training_loop import CAPTURE
from observers.integrations._patching import TrainerPatch

PATCHES = (
    TrainerPatch(["transformers.trainer"], "Trainer", "observers.integrations.transformers"),
    TrainerPatch(["lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"], "Trainer",
                 "observers.integrations.lightning"),
)

CAPTURE.add_extension(GRAD_SCALER)
for _patch in PATCHES:
    CAPTURE.add_extension(_patch)
