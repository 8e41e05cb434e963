"""Hugging Face ``transformers.Trainer``: its logs, epochs and configuration in the run.

Added automatically: while a run is attached (zero-code, ``@observe`` or ``Observation``),
every ``Trainer`` built gets an :class:`ObserversCallback` (``Trainer.__init__`` is
wrapped, and restored when the run ends). It adds what the generic loop capture cannot
know; steps still come from the optimizer hooks, so there is exactly one step per
optimizer step and the callback never creates one.

=======================  ==============================================================
``scalars``              ``trainer/<key>`` for every number in the Trainer's logs
                         (``trainer/loss``, ``trainer/learning_rate``, ``trainer/grad_norm``,
                         ``trainer/epoch``, ``trainer/train_runtime`` ...), ``eval/<metric>``
                         for evaluation logs (``eval_loss`` -> ``eval/loss``), and
                         ``trainer/global_step``; at the step the Trainer just finished
``runs.hyperparameters``  ``trainer_args`` (``TrainingArguments.to_dict()``, tokens
                         masked by transformers) and ``model_config``
epochs                   the Trainer's: an epoch ends when the Trainer begins the next
=======================  ==============================================================

Use it by hand, e.g. to observe one Trainer only (it opens a run itself when none is
attached; keyword arguments are those of ``Observation``)::

    from observers.integrations.transformers import ObserversCallback
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[ObserversCallback(dataset_name="exp")])
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from observers.integrations._common import (EpochFollower, RunBinding, emit_scalars, is_number, last_step,
                                            set_hyperparameters)

EVAL_PREFIX = "eval_"


def scalar_name(key: str) -> str:
    """The ``scalars.name`` of a Trainer log key: ``eval_loss`` -> ``eval/loss``, ``loss`` -> ``trainer/loss``."""
    if key.startswith(EVAL_PREFIX):
        return "eval/" + key[len(EVAL_PREFIX):]
    return "trainer/" + key


class ObserversCallback(TrainerCallback):  # type: ignore[misc]
    """Reports a ``Trainer``'s logs, epochs and configuration to the observers run.

    Args:
        **options: ``Observation`` keyword arguments, used only when no run is attached
            (the callback then records the run of this ``train()`` call itself).
    """

    def __init__(self, **options: Any) -> None:
        self._binding = RunBinding(options)
        self._epochs = EpochFollower()
        self._logged_step = -1
        self._logged_names: set[str] = set()   # names recorded at _logged_step (epoch repeats in each log)

    @classmethod
    def _automatic(cls) -> "ObserversCallback":
        callback = cls()
        callback._binding = RunBinding(None)
        return callback

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        run = self._binding.begin()
        if run is None:
            return
        self._epochs.start(run, "transformers.Trainer")
        set_hyperparameters(run, "trainer_args", args.to_dict())
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            set_hyperparameters(run, "model_config", config.to_dict())

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run = self._binding.active()
        if run is not None:
            self._epochs.epoch_begins(run)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        run = self._binding.active()
        if run is None or not logs:
            return
        step = last_step(run)
        if step != self._logged_step:
            self._logged_step, self._logged_names = step, set()
        values = {scalar_name(k): v for k, v in logs.items() if is_number(v)}
        values["trainer/global_step"] = state.global_step
        values = {k: v for k, v in values.items() if k not in self._logged_names}  # one value per step
        self._logged_names.update(values)
        emit_scalars(run, values, step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._binding.end()


def attach(trainer: Any) -> None:
    """Add the callback to ``trainer`` unless it already has one (called after ``__init__``)."""
    if not any(isinstance(cb, ObserversCallback) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(ObserversCallback._automatic())


def detach(trainer: Any) -> None:
    """Remove the automatically added callback (the run it reported to has ended)."""
    for cb in list(trainer.callback_handler.callbacks):
        if isinstance(cb, ObserversCallback) and cb._binding.options is None:
            trainer.remove_callback(cb)
