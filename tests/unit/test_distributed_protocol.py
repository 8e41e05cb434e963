"""The store protocol of distributed runs, in one process on a real TCPStore: run-id
agreement, clock offsets against rank 0, straggler windows."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from observers.capture import distributed as d
from observers.config import ObserversConfig
from observers.run import Run


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10))


def _rank_run(rank: int, world: int, tmp_path) -> Run:
    run = Run(ObserversConfig(dataset_name="proto", local_dir=tmp_path))
    run.rank, run.world_size, run.distributed = rank, world, True
    return run


def test_first_offer_wins_and_nobody_waits(store):
    clients = [store.clone() for _ in range(3)]
    got = [d.agree_run_id(c, "observers/a0/r0", f"id-{i}") for i, c in enumerate(clients)]
    assert got == ["id-0"] * 3
    assert d.agree_run_id(store, "observers/a0/r1", "id-9") == "id-9"  # next run: new key


def test_clock_offset_against_rank0(store, tmp_path):
    shared = d._Shared(store, "observers/a0/r0")
    zero = d.DistributedMonitor(_rank_run(0, 2, tmp_path), shared)
    one_run = _rank_run(1, 2, tmp_path)
    one_run.clock_offset_ns += 3_000_000_000  # rank 1's wall clock is 3 s ahead
    one = d.DistributedMonitor(one_run, shared)
    server = threading.Thread(target=zero._serve_clock, args=(d._clone(store, 10),), daemon=True)
    server.start()
    offset, rtt = one.measure_clock(d._clone(store, 10))
    store.queue_push(zero._req_key, "stop")
    server.join(5)
    assert not server.is_alive()
    assert abs(offset + 3.0) < max(rtt, 0.02), (offset, rtt)
    assert 0 < rtt < 1.0


def test_slow_ranks_uses_median_threshold_and_floor():
    means = {0: {"step_time": 0.1, "forward_time": 0.010}, 1: {"step_time": 0.1, "forward_time": 0.011},
             2: {"step_time": 0.1, "forward_time": 0.050}, 3: {"step_time": 0.1, "forward_time": 0.0105}}
    assert d.slow_ranks(means, threshold=0.2) == {2: ("forward_time", 0.050, 0.01075, 0.1)}
    assert d.slow_ranks(means, threshold=0.5) == {}  # +39 ms is less than half of a 100 ms step
    tiny = {0: {"data_time": 1e-5}, 1: {"data_time": 1e-4}}  # 10x slower but only 90 us
    assert d.slow_ranks(tiny, threshold=0.2) == {}


def test_straggler_alert_needs_consecutive_windows(store, tmp_path):
    monitor = d.DistributedMonitor(_rank_run(0, 3, tmp_path), d._Shared(store, "ns"))
    totals = {r: d.WindowStats(0, {m: 0.0 for m in d.STRAGGLER_METRICS}) for r in range(3)}

    def window(slow_rank: int | None) -> None:
        for r in range(3):
            t = totals[r]
            fwd = 0.05 if r == slow_rank else 0.01
            totals[r] = d.WindowStats(t.steps + 5, {"step_time": t.sums["step_time"] + 5 * 0.06,
                                                    "data_time": t.sums["data_time"] + 5 * 0.001,
                                                    "forward_time": t.sums["forward_time"] + 5 * fwd})
        monitor._check(dict(totals), final=False)

    window(2)
    window(None)       # streak broken
    window(2)
    assert monitor.alerts == []
    window(2)          # second window in a row
    assert [(a["rank"], a["metric"], a["rule"]) for a in monitor.alerts] == [(2, "forward_time", "straggler")]
    window(2)
    assert len(monitor.alerts) == 1  # once per rank and run


def test_short_run_is_judged_on_the_whole_run_at_the_end(store, tmp_path):
    monitor = d.DistributedMonitor(_rank_run(0, 2, tmp_path), d._Shared(store, "ns"))
    totals = {0: d.WindowStats(3, {"step_time": 0.3, "data_time": 0.0, "forward_time": 0.03}),
              1: d.WindowStats(3, {"step_time": 0.3, "data_time": 0.0, "forward_time": 0.24})}
    monitor._check(totals, final=True)
    assert [a["rank"] for a in monitor.alerts] == [1]


def test_rank_info_from_torchrun_env(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("GROUP_RANK", "2")
    assert d.rank_info() == d.RankInfo(5, 1, 8, 2, False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-42")
    monkeypatch.setenv("MASTER_PORT", "29500")
    first = d.derived_run_id(0)
    assert first == d.derived_run_id(0) != d.derived_run_id(1)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert d.derived_run_id(0) is None


def test_straggler_alert_has_the_outputs_of_every_alert(store, tmp_path):
    from observers.process.alerts import AlertWarning

    seen = []
    run = Run(ObserversConfig(dataset_name="proto", local_dir=tmp_path, alert_callback=seen.append))
    run.rank, run.world_size, run.distributed = 0, 2, True
    monitor = d.DistributedMonitor(run, d._Shared(store, "ns"))
    monitor._alert(1, "data_time", 0.05, 0.01, 0.1, n=2)
    [row] = monitor.alerts
    assert row["rank"] == 1 and row["rule"] == "straggler" and abs(row["threshold"] - 0.03) < 1e-12
    with pytest.warns(AlertWarning, match="rank 1 is a straggler"):
        d._publish_alert(run, row)
    assert [(a.rule, a.metric, a.value) for a in seen] == [("straggler", "data_time", 0.05)]


def _tiny_training(steps: int = 3) -> None:
    import torch

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_periodic_clock_measurements_become_system_rows(store, tmp_path, monkeypatch):
    from datasets import load_dataset

    monkeypatch.setenv("OBSERVERS_CLOCK_SYNC_INTERVAL", "0.3")
    monkeypatch.setenv("OBSERVERS_STRAGGLER_INTERVAL", "0")
    shared = d._Shared(store, "observers/periodic")
    zero = d.DistributedMonitor(_rank_run(0, 2, tmp_path), shared)
    server = threading.Thread(target=zero._serve_clock, args=(d._clone(store, 10),), daemon=True)
    server.start()
    from observers import Observation

    with Observation(dataset_name="periodic", local_dir=tmp_path) as obs:
        run = obs._run
        run.rank, run.world_size = 1, 2
        one = d.DistributedMonitor(run, shared)
        one.on_start(run)
        _tiny_training()
        import time

        time.sleep(1.2)
        one.on_finish(run)
    store.queue_push(zero._req_key, "stop")
    server.join(5)
    system = load_dataset(str(tmp_path / "periodic"), "system", split="train",
                          cache_dir=str(tmp_path / "cache")).to_pandas()
    clock = system[(system.device == "clock") & (system.name == "clock_offset_s")]
    assert len(clock) >= 3, clock          # at the start, then every 0.3 s
    assert (clock.value.abs() < 0.05).all()
    assert len(system[(system.device == "clock") & (system.name == "clock_rtt_s")]) == len(clock)


def test_distributed_before_init_process_group_uses_torchrun_env(tmp_path, monkeypatch):
    """``Observation(distributed=True)`` entered before ``init_process_group``: rank from
    ``RANK``/``WORLD_SIZE``, the run id derived from ``TORCHELASTIC_RUN_ID``, rank folders."""
    from observers import Observation

    for var, value in {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                       "TORCHELASTIC_RUN_ID": "job-7", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(var, value)
    expected = d.derived_run_id(0)
    monkeypatch.setattr(d, "_SEQUENCE", iter(range(10**6)))  # this process may have run others
    with Observation(dataset_name="early", local_dir=tmp_path, distributed=True) as obs:
        _tiny_training()
    assert (obs._run.rank, obs._run.local_rank, obs._run.world_size) == (3, 1, 4)
    assert obs.run_id == expected
    assert (tmp_path / "early" / "data" / "scalars" / expected / "rank-00003" / "epoch-00000.parquet").is_file()
