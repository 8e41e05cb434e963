"""A tiny GPT-2 trained with the Hugging Face Trainer; nothing in it mentions observers.

Run it zero-code (the Trainer gets the observers callback automatically)::

    OBSERVERS_DATASET=tiny-gpt2 opentelemetry-instrument python trainer_tiny_gpt2.py

The model is built from a config and the data is made here: no download.
Pass a folder as the first argument to also save what the Trainer logged (the tests do).
"""

import json
import sys
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


def token_rows(n: int, length: int, vocab: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Sequences counting up modulo ``vocab`` from random starts: easy to learn."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for start in torch.randint(0, vocab, (n,), generator=g).tolist():
        ids = (torch.arange(length) + start) % vocab
        rows.append({"input_ids": ids, "labels": ids.clone()})
    return rows


def main(out: Path | None) -> None:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=str((out or Path(".")) / "trainer-out"), report_to="none", use_cpu=True,
        num_train_epochs=2, per_device_train_batch_size=4, per_device_eval_batch_size=8,
        learning_rate=3e-3, logging_steps=2, eval_strategy="epoch", save_strategy="no",
        disable_tqdm=True, seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=token_rows(24, 16, 64, 1),
                      eval_dataset=token_rows(8, 16, 64, 2))
    trainer.train()
    print(f"global_step={trainer.state.global_step} final eval_loss={trainer.state.log_history[-2]['eval_loss']:.4f}")
    if out is not None:
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
