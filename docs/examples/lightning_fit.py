"""A LightningModule trained with ``Trainer.fit``; observers is optional.

Zero-code (the Trainer gets the observers callback automatically)::

    OBSERVERS_DATASET=lightning-demo opentelemetry-instrument python lightning_fit.py

Or explicitly, without ``opentelemetry-instrument``::

    python lightning_fit.py --callback      # Trainer(callbacks=[ObserversCallback(...)])

Pass ``--out DIR`` to also save the losses the module saw (the tests compare them).
"""

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl


class Regressor(pl.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
        self.seen: dict[str, list[float]] = {"loss": [], "grad_norm": []}

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        self.seen["loss"].append(loss.item())
        return loss

    def on_before_optimizer_step(self, optimizer):
        grads = [p.grad.norm() for p in self.parameters() if p.grad is not None]
        self.seen["grad_norm"].append(torch.stack(grads).norm().item())

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


def loaders() -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, 8, generator=g)
    y = x[:, :1] * 2 - x[:, 1:2] + 0.1 * torch.randn(160, 1, generator=g)
    return (DataLoader(TensorDataset(x[:128], y[:128]), batch_size=16),
            DataLoader(TensorDataset(x[128:], y[128:]), batch_size=16))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--callback", action="store_true", help="pass ObserversCallback explicitly")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    callbacks = []
    if args.callback:
        from observers.integrations.lightning import ObserversCallback
        callbacks.append(ObserversCallback(dataset_name="lightning-demo"))
    pl.seed_everything(0, verbose=False)
    model = Regressor()
    trainer = pl.Trainer(max_epochs=2, accumulate_grad_batches=2, log_every_n_steps=1, callbacks=callbacks,
                         accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    train, val = loaders()
    trainer.fit(model, train, val)
    print(f"global_step={trainer.global_step} val_loss={float(trainer.callback_metrics['val_loss']):.4f}")
    if args.out:
        (args.out / "seen.json").write_text(json.dumps({**model.seen, "global_step": trainer.global_step}))


if __name__ == "__main__":
    main()
