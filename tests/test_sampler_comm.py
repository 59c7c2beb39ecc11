"""The communication sampler: size planning, configs, and every collective over 2 local gloo ranks."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tracecal.errors import SampleError
from tracecal.samplers.comm import (
    COLLECTIVES,
    CommSettings,
    Topology,
    load_comm_config,
    make_group,
    parse_size,
    plan,
)
from tracecal.samplers.comm_launch import spawn_local
from tracecal.sql.connection import open_database
from tracecal.sql.samples import import_parquet, write_samples, write_samples_parquet
from tracecal.workload.launch import free_port


def test_parse_size_binary_multiples() -> None:
    assert [parse_size(s) for s in ("4096", "64K", "1M", "2G", "8kb")] == [4096, 65536, 1 << 20, 2 << 30, 8192]
    with pytest.raises(SampleError, match="not a byte count"):
        parse_size("lots")


def test_plan_rounds_to_whole_elements_per_rank_nccl_tests_style() -> None:
    s = CommSettings("c", sizes_bytes=(10, 1000, 4096), dtype="float32")
    got = plan(s, 3)
    # all_reduce/broadcast/send: whole float32 elements; gathers: a multiple of world size elements
    assert ("all_reduce", 8) in got and ("all_reduce", 1000) in got
    assert ("all_gather", 996) in got and ("reduce_scatter", 4092) in got and ("all_to_all", 996) in got
    assert ("all_gather", 8) not in got  # 2 elements cannot give 3 ranks one each
    assert {c for c, _ in got} == set(COLLECTIVES)


def test_shipped_comm_configs_and_bad_settings(tmp_path: Path) -> None:
    ci = load_comm_config("comm-ci", "local")
    assert ci.sizes_bytes == (1024, 8192, 65536) and ci.collectives == COLLECTIVES
    assert len(load_comm_config("comm-sweep", "x").sizes_bytes) == 21  # 1 KiB .. 1 GiB
    bad = tmp_path / "c.yml"
    bad.write_text("sizes: [1024]\ncollectives: [all_reduce, allreduce]\n")
    with pytest.raises(SampleError, match="unknown collective 'allreduce'"):
        load_comm_config(bad, "x")
    with pytest.raises(SampleError, match="no comm config nope"):
        load_comm_config("nope", "x")
    with pytest.raises(SampleError, match="--world-size must be at least 2"):
        spawn_local(CommSettings("x"), 1)


@pytest.mark.slow
def test_every_collective_over_two_gloo_ranks(db_path: Path, tmp_path: Path, template_cache: Path) -> None:
    settings = CommSettings("local", sizes_bytes=(4096, 1 << 18), repeats=4, warmup=1)
    table = spawn_local(settings, 2)
    rows = table.to_pylist()
    assert sorted((r["collective"], r["size_bytes"]) for r in rows) == sorted(
        (c, s) for c in COLLECTIVES for s in (4096, 1 << 18)
    )
    for r in rows:
        assert r["family"] == "comm" and r["op"] == r["collective"] and r["direction"] == "fwd"
        assert (r["group_size"], r["nodes"], r["gpus_per_node"]) == (2, 1, 2)
        assert r["median_ns"] > 0 and 0 < r["min_ns"] <= r["median_ns"] and r["iqr_ns"] >= 0
        assert r["repeats"] == 4 and r["dtype"] == "float32" and r["nccl_version"] is None
    with open_database(db_path, cache_dir=template_cache) as con:
        assert write_samples(con, table) == len(rows)
        stored = {r[0] for r in con.execute("SELECT sample_id FROM samples").fetchall()}
    # resume: ranks skip the points whose ids are stored
    assert spawn_local(settings, 2, frozenset(stored)).num_rows == 0
    # Parquet hand-over (what rank 0 writes under torchrun --output) loads with the sample store
    out = tmp_path / "comm.parquet"
    assert write_samples_parquet(table, out) == len(rows)
    assert pq.read_table(out).num_rows == len(rows)
    with open_database(tmp_path / "other.duckdb", cache_dir=template_cache) as con:
        assert import_parquet(con, out) == len(rows)


def test_bad_settings_fail_before_any_process_starts() -> None:
    with pytest.raises(SampleError, match="dtype 'int8' is not one of float32"):
        spawn_local(CommSettings("x", dtype="int8"), 2)
    with pytest.raises(SampleError, match="--sizes must be positive"):
        spawn_local(CommSettings("x", sizes_bytes=(0,)), 2)


@pytest.mark.slow
def test_the_torchrun_entry_point_writes_rank0_samples(tmp_path: Path) -> None:
    """`torchrun -m tracecal.samplers.comm` as the README shows it: 2 gloo ranks, rank 0 writes."""
    import subprocess
    import sys

    out = tmp_path / "comm.parquet"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "tracecal.samplers.comm", "--cluster", "tr", "--sizes", "4K", "--collectives", "all_reduce,broadcast",
           "--repeats", "2", "--warmup", "1", "--output", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 comm samples written to" in done.stderr
    rows = pq.read_table(out).to_pylist()
    assert sorted(r["collective"] for r in rows) == ["all_reduce", "broadcast"]
    assert all(r["cluster"] == "tr" and r["group_size"] == 2 and r["gpus_per_node"] == 2 for r in rows)
    bad = subprocess.run(
        [sys.executable, "-m", "tracecal.samplers.comm", "--cluster", "x", "--sizes", "huge", "--output", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "error: size 'HUGE' is not a byte count" in bad.stderr


def test_a_torchrun_rank_stores_through_the_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun, `samples measure comm` gives the sampler rank 0's stored ids and writer: the rows go
    to the session's database (the sampler opens none), and a second sweep resumes past them."""
    from tracecal.api import Session
    from tracecal.samplers import comm_launch

    def rank0(settings: CommSettings, backend: str, *, stored, write) -> int:  # the group, as two local ranks
        return write(spawn_local(settings, 2, stored()))

    monkeypatch.setattr(comm_launch, "under_torchrun", lambda: True)
    monkeypatch.setattr(comm_launch, "run_distributed", rank0)
    session = Session(tmp_path / "t.duckdb")
    options = {"sizes": "4K", "collectives": "all_reduce,broadcast", "repeats": 2, "warmup": 1}
    first = session.samples_measure_comm("tr", **options)
    assert (first.written, first.world_size) == (2, None)
    assert session.samples_measure_comm("tr", **options).written == 0
    assert session.sql("SELECT count(*) AS n FROM samples WHERE cluster = 'tr'")["n"].to_list() == [2]


class _StubDist:
    """Just enough of torch.distributed for group arithmetic: records new_group calls."""

    def __init__(self, rank: int) -> None:
        self.rank, self.created = rank, []

    def get_rank(self) -> int:
        return self.rank

    def new_group(self, ranks: list[int]) -> str:
        self.created.append(list(ranks))
        return f"group{len(self.created) - 1}"


def test_groups_of_a_two_node_job_by_four_gpus() -> None:
    dist = _StubDist(rank=5)
    assert make_group(dist, "world", 8, 4) == (None, list(range(8)), Topology(8, 2, 4), 1)
    group, members, topo, concurrent = make_group(dist, "node:2", 8, 4)
    assert (members, topo, concurrent) == ([4, 5], Topology(2, 1, 2), 4)
    assert dist.created == [[0, 1], [2, 3], [4, 5], [6, 7]] and group == "group2"  # every rank creates all
    dist.created.clear()
    group, members, topo, concurrent = make_group(dist, "cross-node", 8, 4)
    assert (members, topo, concurrent) == ([1, 5], Topology(2, 2, 1), 4)
    assert dist.created == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert make_group(dist, "node:3", 8, 4) is None  # 3 does not divide 4 GPUs per node
    assert make_group(dist, "node:8", 8, 4) is None  # wider than a node
    assert make_group(dist, "cross-node", 4, 4) is None  # one node


def test_unknown_groups_are_refused() -> None:
    for bad in ("node:1", "node:x", "ring"):
        with pytest.raises(SampleError, match="use world, cross-node or node:G"):
            CommSettings("c", groups=(bad,)).check()


@pytest.mark.slow
def test_sub_groups_run_concurrently_on_four_gloo_ranks() -> None:
    settings = CommSettings("local", collectives=("all_reduce", "send"), sizes_bytes=(4096,), repeats=2, warmup=1,
                            groups=("world", "node:2", "node:4", "cross-node"))  # fmt: skip
    rows = spawn_local(settings, 4).to_pylist()
    # node:4 is the world on one node and cross-node does not exist there: both add nothing
    got = sorted((r["collective"], r["group_size"], r["nodes"], r["gpus_per_node"]) for r in rows)
    assert got == [("all_reduce", 2, 1, 2), ("all_reduce", 4, 1, 4), ("send", 2, 1, 2), ("send", 4, 1, 4)]
    pair = next(r for r in rows if r["collective"] == "send" and r["group_size"] == 2)
    assert '"concurrent_groups":2' in pair["params_json"] and '"src":0,"dst":1' in pair["params_json"]


def test_nccl_timing_path_aligns_times_and_takes_the_slowest_rank() -> None:
    """The GPU branch of the comm timing with torch/torch.distributed stood in by recorders (no GPU
    here): barrier on the rank's device, device synchronised before the start event, end event
    waited for, ms -> ns, and the per-repeat MAX all-reduce over ranks on the device."""
    from types import SimpleNamespace

    from tracecal.samplers.comm import time_aligned

    log: list[object] = []

    class Event:
        n = 0

        def __init__(self, enable_timing: bool) -> None:
            Event.n += 1
            self.t = Event.n

        def record(self) -> None:
            log.append("record")

        def synchronize(self) -> None:
            log.append("wait end")

        def elapsed_time(self, end: Event) -> float:
            return 0.25  # ms

    class Tensor:
        def __init__(self, values: list[float]) -> None:
            self.values = values

        def cpu(self) -> Tensor:
            return self

        def tolist(self) -> list[float]:
            return self.values

    def tensor(values: list[float], dtype: object, device: object) -> Tensor:
        log.append(("tensor", device))
        return Tensor(list(values))

    def all_reduce(t: Tensor, op: object) -> None:
        log.append(("all_reduce", op))
        t.values = [v * 2 for v in t.values]  # another rank was twice as slow

    device = SimpleNamespace(index=3)
    torch = SimpleNamespace(
        float64="f64", tensor=tensor,
        cuda=SimpleNamespace(Event=Event, synchronize=lambda d: log.append(("sync", d.index))),
    )  # fmt: skip
    dist = SimpleNamespace(
        barrier=lambda device_ids: log.append(("barrier", device_ids)), all_reduce=all_reduce,
        ReduceOp=SimpleNamespace(MAX="MAX"),
    )  # fmt: skip
    settings = CommSettings("c", warmup=1, repeats=2)
    out = time_aligned(dist, torch, lambda: log.append("call"), settings, device, cuda=True)
    one = [("barrier", [3]), ("sync", 3), "record", "call", "record", "wait end"]
    assert log == ["call", *one, *one, ("tensor", device), ("all_reduce", "MAX")]
    assert out == [0.5e6, 0.5e6]
