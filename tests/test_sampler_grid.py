"""Sampler grids and cases: YAML ranges, products, sharding, shape columns equal to a real trace's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracecal.decode.families import family_of
from tracecal.decode.shape_features import shape_row
from tracecal.errors import SampleError
from tracecal.samplers import cases
from tracecal.samplers.grid import GridPoint, dim_values, load_grid, parse_grid, shard, shipped_grids, with_dtypes
from tracecal.samplers.timing import summarize


def test_dim_values_ranges_lists_and_scalars() -> None:
    assert dim_values({"start": 512, "end": 4096, "step": 2, "scale": "mul"}, "x") == [512, 1024, 2048, 4096]
    assert dim_values({"start": 768, "end": 3072, "step": 768}, "x") == [768, 1536, 2304, 3072]
    assert dim_values({"start": 10, "end": 25, "step": 10}, "x") == [10, 20]  # end not on a step
    assert dim_values([true := True, False], "x") == [true, False]
    assert dim_values(64, "x") == [64]


@pytest.mark.parametrize(
    "spec",
    [
        {"start": 0, "end": 4, "step": 1},
        {"start": 4, "end": 2, "step": 1},
        {"start": 1, "end": 8, "step": 1, "scale": "mul"},
        {"start": 1, "end": 8, "step": 2, "scale": "pow"},
        {"start": 1.5, "end": 8, "step": 2},
        {"end": 8, "step": 2},
        [],
    ],
)
def test_dim_values_rejects_bad_ranges(spec: object) -> None:
    with pytest.raises(SampleError, match=r"grid\.yml: sweep 1, dim m"):
        dim_values(spec, "grid.yml: sweep 1, dim m")


def test_parse_grid_is_the_product_in_declared_order_last_dimension_fastest() -> None:
    doc = {
        "dtypes": ["float32", "bfloat16"],
        "directions": ["fwd"],
        "sweeps": [{"family": "gemm", "ops": ["aten::mm"], "dims": {"m": [1, 2], "n": [3, 4, 5], "k": 7}}],
    }
    grid = parse_grid(doc, "g.yml")
    assert len(grid.points) == 2 * 2 * 3
    first = [dict(p.dims) for p in grid.points[:3]]
    assert first == [{"m": 1, "n": 3, "k": 7}, {"m": 1, "n": 4, "k": 7}, {"m": 1, "n": 5, "k": 7}]
    assert {p.dtype for p in grid.points} == {"float32", "bfloat16"}


def test_parse_grid_errors_name_the_file_and_sweep() -> None:
    with pytest.raises(SampleError, match=r"g\.yml: a grid needs"):
        parse_grid({"sweeps": []}, "g.yml")
    with pytest.raises(SampleError, match=r"g\.yml: sweep 2: direction 'up'"):
        parse_grid(
            {"sweeps": [{"family": "gemm", "ops": "aten::mm"}, {"family": "gemm", "ops": "x", "directions": "up"}]},
            "g.yml",
        )


def test_load_grid_reports_unknown_names_and_broken_yaml(tmp_path: Path) -> None:
    with pytest.raises(SampleError, match="shipped: ci, "):
        load_grid("no-such-grid")
    bad = tmp_path / "bad.yml"
    bad.write_text("sweeps: [\n")
    with pytest.raises(SampleError, match=r"bad.yml: not a readable YAML grid"):
        load_grid(bad)


@given(n=st.integers(0, 60), parts=st.integers(1, 7))
def test_shards_partition_the_points(n: int, parts: int) -> None:
    points = [GridPoint("gemm", "aten::mm", "fwd", "float32", (("m", i + 1), ("n", 1), ("k", 1))) for i in range(n)]
    shards = [shard(points, parts, k) for k in range(1, parts + 1)]
    flat = [p for s in shards for p in s]
    assert sorted(flat, key=lambda p: p.dims) == sorted(points, key=lambda p: p.dims)
    assert len(flat) == len(set(flat)) == n
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1


def test_shard_rejects_a_part_outside_the_parts() -> None:
    with pytest.raises(SampleError, match="--part must be between 1 and --parts"):
        shard([], 4, 5)


def test_with_dtypes_replaces_and_dedupes() -> None:
    p = GridPoint("gemm", "aten::mm", "fwd", "float32", (("m", 1), ("n", 1), ("k", 1)))
    q = GridPoint("gemm", "aten::mm", "fwd", "float16", (("m", 1), ("n", 1), ("k", 1)))
    assert with_dtypes([p, q], ["bfloat16"]) == [GridPoint("gemm", "aten::mm", "fwd", "bfloat16", p.dims)]
    assert with_dtypes([p, q], None) == [p, q]


@pytest.mark.parametrize("name", shipped_grids())
def test_every_shipped_grid_is_valid_and_its_ops_are_in_their_decode_family(name: str) -> None:
    grid = load_grid(name)
    assert grid.points
    for point in grid.points:
        cols = cases.shape_columns(point)
        assert cols["dtype"] == point.dtype
        # the sample's op is classified into the sample's family by the same rule as traced operators
        assert family_of(point.op) == point.family, point.op
        if point.family == "gemm":
            assert cols["flops"] == 2.0 * cols["m"] * cols["n"] * cols["k"] * cols["batch"]


def test_shipped_grids_cover_every_family_and_op() -> None:
    """ci (every family and direction, in seconds on a CPU) and gpt-step (the ops of a GPU training
    step beyond it) together sample every op."""
    ops = {(p.family, p.op) for name in ("ci", "gpt-step") for p in load_grid(name).points}
    assert ops == set(cases.OP_SPECS)
    assert set(cases.FAMILIES) == {
        "gemm",
        "attention",
        "softmax",
        "norm",
        "elementwise",
        "embedding",
        "loss",
        "optimizer",
    }


def test_resolved_dims_checks_names_and_values() -> None:
    p = GridPoint("attention", "aten::scaled_dot_product_attention", "fwd", "float16",
                  (("batch", 2), ("heads", 4), ("seq", 128), ("head_dim", 64)))  # fmt: skip
    dims = cases.resolved_dims(p)
    assert (dims["seq_q"], dims["seq_k"], dims["causal"]) == (128, 128, False)
    with pytest.raises(SampleError, match="missing: k"):
        cases.resolved_dims(GridPoint("gemm", "aten::mm", "fwd", "float32", (("m", 1), ("n", 2))))
    with pytest.raises(SampleError, match="unknown: heads"):
        cases.resolved_dims(
            GridPoint("gemm", "aten::mm", "fwd", "float32", (("m", 1), ("n", 2), ("k", 3), ("heads", 1)))
        )
    with pytest.raises(SampleError, match="dimension m must be a positive integer"):
        cases.resolved_dims(GridPoint("gemm", "aten::mm", "fwd", "float32", (("m", 0), ("n", 2), ("k", 3))))
    with pytest.raises(SampleError, match="unknown family/op gemm:aten::conv2d"):
        cases.spec_for(GridPoint("gemm", "aten::conv2d", "fwd", "float32", ()))
    with pytest.raises(SampleError, match="dtype 'int8'"):
        cases.shape_columns(GridPoint("gemm", "aten::mm", "fwd", "int8", (("m", 1), ("n", 2), ("k", 3))))


def test_summarize_median_min_iqr() -> None:
    stats = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (stats.median_ns, stats.min_ns, stats.iqr_ns, stats.repeats) == (3.0, 1.0, 2.0, 5)
    assert summarize([7.0]).iqr_ns is None
    assert summarize([2.0, 2.0, 2.0]).iqr_ns == 0.0
    with pytest.raises(SampleError):
        summarize([])


def _profiled_args(point: GridPoint, tmp_path: Path, run: GridPoint | None = None) -> dict:
    """Input Dims / Input type / Concrete Inputs that torch.profiler records for the point's call
    (the call of ``run`` when given, recorded under ``point.op``)."""
    import torch

    built = cases.build(run or point, "cpu")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        built.run()
    path = tmp_path / f"{point.op.replace(':', '_')}.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return next(e["args"] for e in events if e.get("name") == point.op and e.get("ph") == "X")


def test_sample_shape_columns_equal_what_decode_computes_from_a_real_trace_of_the_call(tmp_path: Path) -> None:
    """The join: for every forward op, profile the sampler's own call with torch.profiler and decode
    its Input Dims exactly like a traced operator; the sample's shape columns must be identical."""
    seen = set()
    for point in load_grid("ci").points:
        if point.direction != "fwd" or point.op in seen or point.family == "optimizer":
            continue
        seen.add(point.op)
        args = _profiled_args(point, tmp_path)
        traced = shape_row(point.op, args.get("Input Dims"), args.get("Input type"), args.get("Concrete Inputs"))
        assert cases.shape_columns(point) == traced, point.op
    assert len(seen) == len({op for f, op in cases.OP_SPECS if f in {p.family for p in load_grid("ci").points}
                             and f != "optimizer" and op in {q.op for q in load_grid("ci").points}})  # fmt: skip


CUDA_ONLY = {"aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention"}
CPU_NAME = {"aten::_scaled_dot_product_flash_attention": "aten::_scaled_dot_product_flash_attention_for_cpu"}


@pytest.mark.slow
def test_gpu_step_samples_join_what_decode_computes_from_a_real_trace_of_the_call(tmp_path: Path) -> None:
    """The same join for the gpt-step grid's forward ops, on this CPU in float32 at small sizes: the
    call each sampler makes is recorded under the op's own name (the CPU flash kernel under its CPU
    name), with the Input Dims, types and Concrete Inputs that give the sample's shape columns."""
    seen = set()
    for point in load_grid("gpt-step").points:
        if point.direction != "fwd" or point.op in seen | CUDA_ONLY or point.family == "optimizer":
            continue
        if point.dim("src") in ("pinned", "pageable"):
            continue  # a host-to-device copy needs a GPU
        small = GridPoint(point.family, point.op, "fwd", "float32",
                          tuple((k, min(v, 256) if isinstance(v, int) and not isinstance(v, bool) else v)
                                for k, v in point.dims))  # fmt: skip
        if small.dim("src_dtype") == "float32":
            small = GridPoint(small.family, small.op, "fwd", "float32",
                              tuple((k, "bfloat16" if k == "src_dtype" else v) for k, v in small.dims))  # fmt: skip
        seen.add(point.op)
        name = CPU_NAME.get(point.op, point.op)
        args = _profiled_args(GridPoint(small.family, name, "fwd", small.dtype, small.dims), tmp_path, small)
        # a TensorList (cat) is untyped in a trace: a GPU kernel's name gives its element size
        # (decode.shape_features.kernel_element_bytes), a CPU trace has no kernel, the sample knows its dtype
        list_bytes = 4 if "TensorList" in args.get("Input type", []) else None
        traced = shape_row(name, args.get("Input Dims"), args.get("Input type"), args.get("Concrete Inputs"),
                           list_element_bytes=list_bytes)  # fmt: skip
        sampled = cases.shape_columns(small)
        if traced["dtype"] is None:
            traced["dtype"] = sampled["dtype"]
        assert sampled == traced, point.op  # io_bytes included: a cast's bytes at each tensor's dtype
    assert seen == {q.op for q in load_grid("gpt-step").points if q.family != "optimizer"} - CUDA_ONLY


def test_optimizer_samples_match_the_fused_kernel_call_of_a_real_trace(tmp_path: Path) -> None:
    import torch

    point = GridPoint("optimizer", "Optimizer.step#AdamW.step", "fwd", "float32", (("params", 1000), ("tensors", 3)))
    built = cases.build(point, "cpu")
    assert built.params["implementation"] in ("fused", "foreach")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        built.run()
    path = tmp_path / "adamw.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    fused = [e for e in events if e.get("name") in ("aten::_fused_adamw_", "aten::_foreach_lerp_")]
    assert fused, "the step must run one multi-tensor kernel over the TensorList"
    traced = shape_row(fused[0]["name"], fused[0]["args"]["Input Dims"], fused[0]["args"]["Input type"])
    assert traced["params"] == cases.shape_columns(point)["params"] == 1000


def test_cuda_timing_orders_flush_events_and_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path's logic on a CPU machine, with torch.cuda stood in by a recorder: the L2 flush is
    queued before each start event, the device is synchronised before the first and after the last
    repeat, and each pair's elapsed milliseconds come back as nanoseconds."""
    import torch

    from tracecal.samplers import timing

    log: list[str] = []

    class Event:
        count = 0

        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            Event.count += 1
            self.t = Event.count

        def record(self) -> None:
            log.append("record")

        def elapsed_time(self, end: Event) -> float:
            return 0.5 * (end.t - self.t)  # ms

    class Flush:
        def zero_(self) -> None:
            log.append("flush")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: log.append("sync"))
    monkeypatch.setattr(torch, "empty", lambda *a, **k: Flush())
    durations = timing.time_call(lambda: log.append("call"), "cuda", warmup=1, repeats=2, method="cuda_events")
    assert log == ["call", "sync", "flush", "record", "call", "record", "flush", "record", "call", "record", "sync"]
    assert durations == [0.5e6, 0.5e6]


def test_perf_counter_timing_is_the_clock_around_each_call_after_untimed_warmups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``perf_counter`` times the whole call, warm-ups untimed: a fake clock that each call advances
    by 5 ms gives exactly 5 ms per repeat, and the op runs once per warm-up and repeat."""
    from types import SimpleNamespace

    from tracecal.samplers import timing

    now = [0]
    calls: list[int] = []

    def call() -> None:
        calls.append(now[0])
        now[0] += 5_000_000

    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter_ns=lambda: now[0]))
    assert timing.time_call(call, "cpu", warmup=2, repeats=3) == [5.0e6, 5.0e6, 5.0e6]
    assert len(calls) == 5


def test_profiler_timing_reads_the_calls_own_events_not_the_span_around_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Work outside the op's event (3 ms of Python inside the 5 ms repeat marker) is not in the
    profiler's duration: a repeat is the sum of the marker's direct children, exactly as a CPU trace
    leaves it out of the operator's duration. The profiler is a fake, so no clock is read."""
    import torch

    from tracecal.samplers import timing

    class Range:
        def __init__(self, start_us: float, dur_us: float) -> None:
            self.start, self.dur_us = start_us, dur_us

        def elapsed_us(self) -> float:
            return self.dur_us

    class Ev:
        def __init__(self, name: str, start_us: float, dur_us: float, children: list[Ev] | None = None) -> None:
            self.name, self.time_range, self.cpu_children = name, Range(start_us, dur_us), children or []

    recorded: list[Ev] = []
    calls: list[bool] = []  # per call of fn: was it inside a repeat marker
    in_mark = [False]

    class Profile:
        def __init__(self, **_: object) -> None:
            pass

        def __enter__(self) -> Profile:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def events(self) -> list[Ev]:
            return list(reversed(recorded))  # order by start is the timer's job, not the profiler's

    class RecordFunction:
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> None:
            in_mark[0] = True

        def __exit__(self, *_: object) -> None:
            in_mark[0] = False
            i = len(recorded)
            inner = [Ev("op::inner", 1000.0 * i + 3, 2000.0 + i), Ev("op::tail", 1000.0 * i + 3, 10.0)]
            recorded.append(Ev(self.name, 1000.0 * i, 5000.0, inner))

    def call() -> None:
        calls.append(in_mark[0])

    monkeypatch.setattr(torch.profiler, "profile", Profile)
    monkeypatch.setattr(torch.profiler, "record_function", RecordFunction)
    own = timing.time_call(call, "cpu", warmup=1, repeats=3, method="profiler")
    assert calls == [False, True, True, True]  # the warm-up runs under the profiler, outside any marker
    assert own == [2010.0e3, 2011.0e3, 2012.0e3]  # the children, in repeat order, µs -> ns; not the 5 ms span


def test_profiler_timing_leaves_list_recording_as_torch_has_it(tmp_path: Path) -> None:
    """Profiler timing records as the CPU workload does (no list arguments), but the switch is
    process-wide: afterwards a profile of the same process records TensorList shapes again."""
    import torch

    from tracecal.samplers import timing
    from tracecal.workload.train import records_scalar_lists

    assert records_scalar_lists("cpu") is False and records_scalar_lists("cuda") is True
    parts = [torch.ones(3), torch.ones(4)]
    timing.time_call(lambda: torch.cat(parts), "cpu", warmup=0, repeats=1, method="profiler")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.cat(parts)
    prof.export_chrome_trace(str(tmp_path / "cat.json"))
    cat = [e for e in json.loads((tmp_path / "cat.json").read_text())["traceEvents"] if e.get("name") == "aten::cat"]
    assert cat[0]["args"]["Input Dims"][0] == [[3], [4]]


def test_a_torch_without_the_list_switch_keeps_recording_lists_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch is private torch API; where it is missing the workload must not claim lists are off."""
    import torch

    from tracecal.workload.train import record_scalar_lists

    assert record_scalar_lists(False) is False
    assert record_scalar_lists(True) is True
    monkeypatch.delattr(torch._C._profiler, "_set_record_concrete_inputs_enabled_val")
    assert record_scalar_lists(False) is True


def test_profiler_timing_of_a_backward_is_its_autograd_node_without_accumulate_grad() -> None:
    from tracecal.samplers import timing

    point = GridPoint("elementwise", "aten::gelu", "bwd", "float32", (("tokens", 64), ("hidden", 256)))
    durations = timing.time_call(cases.build(point, "cpu").run, "cpu", warmup=1, repeats=2, method="profiler")
    assert len(durations) == 2 and all(d > 0 for d in durations)

    class Ev:
        def __init__(self, name: str, children: list[Ev] | None = None) -> None:
            self.name, self.cpu_children = name, children or []

    node = Ev("GeluBackward0", [Ev("aten::gelu_backward")])
    engine = "autograd::engine::evaluate_function: "
    ranges = [Ev(engine + "GeluBackward0", [node]), Ev(engine + "torch::autograd::AccumulateGrad", [Ev("aten::add_")])]
    assert timing.call_events(ranges) == [node]
    linear = Ev("aten::linear", [Ev("aten::t"), Ev("aten::addmm")])
    assert timing.call_events([linear]) == [linear]  # a forward: the op's top-level event


@pytest.mark.parametrize(
    ("method", "device", "message"),
    [
        ("perf_counter", "cuda", "--timing perf_counter cannot time on cuda; use cuda_burst or profiler"),
        ("cuda_events", "cpu", "--timing cuda_events cannot time on cpu; use perf_counter or profiler"),
        ("wallclock", "cpu", "--timing wallclock cannot time on cpu"),
    ],
)
def test_a_timing_method_the_device_cannot_use_is_one_clear_error(method: str, device: str, message: str) -> None:
    from tracecal.samplers import timing

    with pytest.raises(SampleError, match=message):
        timing.time_call(lambda: None, device, warmup=0, repeats=1, method=method)
    assert timing.default_timing("cuda:1") == "cuda_burst" and timing.default_timing("cpu") == "perf_counter"


def test_compute_plan_filters_a_grid_and_asks_for_exactly_one_source(db_path: Path, template_cache: Path) -> None:
    from tracecal.samplers.plan import compute_plan
    from tracecal.sql.connection import open_database

    with open_database(db_path, cache_dir=template_cache) as con:
        whole = compute_plan(con, config="ci")
        assert whole.autograd and whole.params_for is None and whole.source.endswith("ci.yml")
        norm = compute_plan(con, config="ci", families=["norm"], dtypes=["bfloat16"], inference=True)
        assert norm.points and {(p.family, p.dtype) for p in norm.points} == {("norm", "bfloat16")}
        assert not norm.autograd
        halves = [compute_plan(con, config="ci", parts=2, part=k).points for k in (1, 2)]
        assert sorted(map(repr, halves[0] + halves[1])) == sorted(map(repr, whole.points))
        for kwargs in ({}, {"config": "ci", "from_run": "r"}):
            with pytest.raises(SampleError, match="exactly one of --config GRID or --from-run RUN"):
                compute_plan(con, **kwargs)  # type: ignore[arg-type]
        with pytest.raises(SampleError, match="no points to sample"):
            compute_plan(con, config="ci", families=["no-such-family"])
