"""transformers.Trainer under ``opentelemetry-instrument``: its logs, epochs and config in the dataset.

The docs example trains a tiny GPT-2 built from a config (no download) for 2 epochs of
6 optimizer steps, logging every 2 steps and evaluating each epoch; it saves the Trainer's
own ``log_history``, which the recorded dataset must reproduce without extra steps.
"""

from __future__ import annotations

import json

import pytest
from datasets import load_dataset

from tests._support import REPO, run_script

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("trainer")
    run_script(REPO / "docs" / "examples" / "trainer_tiny_gpt2.py", base, instrumented=True, args=(str(base),),
               OBSERVERS_DATASET="tiny-gpt2", OBSERVERS_SAMPLE_INTERVAL="5", HF_HUB_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error")
    root, cache = str(base / "observers" / "tiny-gpt2"), str(base / "hf-cache")
    scalars = load_dataset(root, "scalars", split="train", cache_dir=cache).to_pandas()
    runs = load_dataset(root, "runs", split="train", cache_dir=cache).to_pandas()
    history = json.loads((base / "log_history.json").read_text())
    return {"scalars": scalars, "runs": runs, "history": history, "root": base / "observers" / "tiny-gpt2"}


def test_one_step_per_optimizer_step_and_trainer_epochs(trainer_run):
    df = trainer_run["scalars"]
    assert not df.duplicated(["step", "name"]).any(), "the callback adds values, never a second step"
    steps = df.drop_duplicates("step").sort_values("step")
    assert steps.step.tolist() == list(range(12)), "Trainer.state.global_step == 12"
    assert steps.epoch.tolist() == [0] * 6 + [1] * 6
    shards = sorted(p.name for p in (trainer_run["root"] / "data" / "scalars").glob("*/*.parquet"))
    assert shards == ["epoch-00000.parquet", "epoch-00001.parquet"]
    wide = df.pivot_table(index="step", columns="name", values="value")
    assert wide["loss"].notna().all() and wide["learning_rate"].notna().all()
    assert wide["grad_norm"].dropna().index.tolist() == [0, 5, 10]


def test_trainer_logs_land_in_scalars(trainer_run):
    df, history = trainer_run["scalars"], trainer_run["history"]
    train_logs = [h for h in history if "loss" in h]
    eval_logs = [h for h in history if "eval_loss" in h]
    assert len(train_logs) == 6 and len(eval_logs) == 2

    def series(name):
        rows = df[df.name == name].sort_values("step")
        return rows.step.tolist(), rows.value.tolist()

    # a log of Trainer global_step g belongs to our step g - 1 (the optimizer step just closed)
    assert series("trainer/loss") == ([h["step"] - 1 for h in train_logs], [h["loss"] for h in train_logs])
    assert series("trainer/grad_norm")[1] == [h["grad_norm"] for h in train_logs]
    assert series("trainer/learning_rate")[1] == [h["learning_rate"] for h in train_logs]
    assert series("trainer/epoch")[1] == [h["epoch"] for h in train_logs], "once per step: eval repeats it"
    assert series("eval/loss") == ([h["step"] - 1 for h in eval_logs], [h["eval_loss"] for h in eval_logs])
    assert series("trainer/train_loss")[1] == [history[-1]["train_loss"]]
    wide = df.pivot_table(index="step", columns="name", values="value")
    # the Trainer's logged loss is the mean of our per-step losses since its last log
    for h in train_logs:
        s = h["step"] - 1
        assert h["loss"] == pytest.approx(wide.loc[[s - 1, s], "loss"].mean(), rel=1e-5)
        assert wide.loc[s, "trainer/learning_rate"] == pytest.approx(wide.loc[s, "learning_rate"], rel=1e-12)
        assert wide.loc[s, "trainer/global_step"] == h["step"]


def test_runs_row_has_trainer_args_and_model_config(trainer_run):
    row = trainer_run["runs"].iloc[0]
    assert row.status == "finished" and row.steps == 12 and row.epochs == 2
    assert row.model_class == "transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel"
    hp = json.loads(row.hyperparameters)
    args, config = hp["trainer_args"], hp["model_config"]
    assert args["num_train_epochs"] == 2 and args["logging_steps"] == 2 and args["report_to"] == []
    assert args["learning_rate"] == 3e-3 and args["per_device_train_batch_size"] == 4
    assert config["model_type"] == "gpt2" and config["n_layer"] == 2 and config["n_embd"] == 32
