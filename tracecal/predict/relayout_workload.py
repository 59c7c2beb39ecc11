"""A traced run of the reference workload rebuilt at another parallel layout, as the rank traces the
workload would write there (pure, apart from reading the source run and writing the new one).

The source run's traces (``tracecal workload run``: one Kineto trace per rank and ``run.json``) hold
the model's operators at the traced layout. One profiled step of one rank per pipeline stage is cut
into the pieces the workload's code is made of, each a subtree of CPU operators as traced:

* per micro-batch forward (``## forward ##``): the embedding (first stage), one block per transformer
  layer (a block starts at its first LayerNorm and holds two), the final norm, head and loss (last
  stage); per micro-batch backward (``## backward ##``): the loss, head and final norm, one block per
  layer (it ends with its second LayerNorm backward and the gradient accumulations after it), the
  embedding;
* the step's ``zero_grad`` and AdamW step, one piece per parameter (``workload.parameters``);
* the tensor-, pipeline- and data-parallel communication is not copied but rebuilt for the target.

For a target ``PP'×TP'×DP'`` (and micro-batch count and size) every rank's step is assembled from
them: layers per stage by the workload's rule (``layers / PP'`` contiguous layers, ``WorkloadConfig``),
the stage's instructions in the workload's own 1F1B order (``workload.pipeline_order``), each layer's
tensor-parallel all-reduces where ``parallel.py`` puts them (after the attention and MLP row-parallel
linears forward, before each LayerNorm backward), the gradient buckets of ``train.py`` all-reduced
over DP' ranks, and the AdamW step over the stage's parameters at TP'. Shapes are re-derived
(``relayout_shapes``: the TP split of GEMM n/k, heads and FFN, the token dimension of the micro-batch
size), not scaled.

**Times.** Every copied operator keeps its traced duration, its own time (outside its children) times
the work ratio of its new shape (the duration no model gives), and the traced gap before it inside its
piece. The gaps between the
step's scopes are the smallest of that scope in the source stage (its pure Python time: the traced
waits are rebuilt). A rebuilt collective posts at its ``c10d`` operator; it completes when every member
has posted plus its transfer time (the shortest traced transfer of that collective and message size,
else 0 for the model to price), and the waiting thread resumes after it by the traced residual.
Operators the source never ran (communication of a layout it did not have) take the median traced
duration of the same operator, else the median gap between the step's scopes (the dispatch of one
Python-level call). Each rank is laid out by a small event-driven pass over these rules, so the
written traces are consistent across ranks; the replay then re-times them with the cluster's models.
Everything is documented in ``docs/what-if.md``.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
import statistics
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field, replace
from itertools import count
from pathlib import Path
from typing import Any

from tracecal.errors import PredictionError, WorkloadError
from tracecal.predict.layouts import Layout, LayoutError, ModelFacts, check_layout
from tracecal.predict.relayout_shapes import ModelDims, ShapeMap, rewrite_dims, shape_map, work_ratio
from tracecal.workload.config import WorkloadConfig
from tracecal.workload.parameters import gradient_buckets, stage_parameters
from tracecal.workload.pipeline_order import (
    BACKWARD,
    COMMUNICATE,
    FORWARD,
    RECV_ACTIVATIONS,
    RECV_GRADS,
    SEND_ACTIVATIONS,
    SEND_GRADS,
    stage_instructions,
)

RUN_JSON = "run.json"
PARTITION_RULE = "workload (layers/PP contiguous layers per stage)"

LAYER_NORM = "aten::layer_norm"
LINEAR = "aten::linear"
NORM_BACKWARD = "NativeLayerNormBackward0"
ACCUMULATE = "AccumulateGrad"
ZERO_GRAD = "Optimizer.zero_grad"
OPTIMIZER = "## optimizer ##"
REDUCE_GRADS = "_exec_reduce_grads"
STEP = re.compile(r"^ProfilerStep#(\d+)$")
EVALUATE = "autograd::engine::evaluate_function: "
TP_FORWARD_COPY = "_CopyToModelParallelRegion"
TP_FORWARD_REDUCE = "_ReduceFromModelParallelRegion"
TP_BACKWARD_COPY = "_CopyToModelParallelRegionBackward"
TP_BACKWARD_REDUCE = "_ReduceFromModelParallelRegionBackward"
TP_NAMES = (TP_FORWARD_COPY, TP_FORWARD_REDUCE, EVALUATE + TP_BACKWARD_COPY, EVALUATE + TP_BACKWARD_REDUCE)
"""The tensor-parallel regions of ``parallel.py`` as torch.profiler names them (stripped from the source,
rebuilt for the target)."""
POSTS = (SEND_ACTIVATIONS, RECV_ACTIVATIONS, SEND_GRADS, RECV_GRADS)
C10D = {"send": "c10d::send", "recv": "c10d::recv_", "all_reduce": "c10d::allreduce_"}
GLOO = {"send": "gloo:send", "recv": "gloo:recv", "all_reduce": "gloo:all_reduce"}
_C10D_ARGS = {
    "send": {"Input Dims": [[], [], [], []], "Input type": ["TensorList", "", "Scalar", "Scalar"]},
    "recv": {"Input Dims": [[], [], [], []], "Input type": ["TensorList", "", "Scalar", "Scalar"]},
    "all_reduce": {
        "Input Dims": [[], [], [], [], [], []],
        "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "", "True", "-1"],
    },
}
"""Arguments torch.profiler records for a gloo ``c10d`` operator (no Input Dims on CPU: TensorLists)."""


# --- operator trees ----------------------------------------------------------------------------------


@dataclass
class Op:
    """A traced CPU operator (or annotation) with its children: ``lead`` is the gap before it (from its
    previous sibling's end, or its parent's start), ``tail`` the time after its last child."""

    name: str
    cat: str
    args: dict[str, Any]
    dur: float
    lead: float = 0.0
    tail: float = 0.0
    children: list[Op] = field(default_factory=list)
    comm: Comm | None = None
    """A ``c10d`` operator: the collective it posts."""
    waits: list[Comm] = field(default_factory=list)
    """Collectives this operator's end waits for (a synchronous all-reduce's region), then ``tail``."""


@dataclass
class Wait:
    """An untraced wait for collectives (``work.wait()``), then ``residual`` before the next operator."""

    comms: list[Comm]
    residual: float
    lead: float = 0.0


@dataclass
class Comm:
    """One rank's part of a collective: ``key`` is the same on every member."""

    kind: str
    key: tuple
    members: tuple[int, ...]
    dims: list
    transfer: float
    worker: bool
    """Its gloo range runs on a worker thread (all-reduce), not on the posting thread (send/recv)."""


Item = Op | Wait


def _tree(events: list[dict[str, Any]], start: float, end: float) -> list[Op]:
    """The events (one thread, ``ts``/``dur`` in µs) nested by time, as ``Op`` trees with leads and tails."""
    roots: list[Op] = []
    stack: list[tuple[Op, float, float]] = []
    for e in sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0.0))):
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        op = Op(e["name"], e.get("cat", "cpu_op"), dict(e.get("args") or {}), dur)
        while stack and ts >= stack[-1][2]:
            stack.pop()
        siblings = stack[-1][0].children if stack else roots
        siblings.append(op)
        op.lead = ts  # absolute for now
        stack.append((op, ts, ts + dur))
    _relative(roots, start, end)
    return roots


def _relative(ops: list[Op], start: float, end: float) -> None:
    at = start
    for op in ops:
        ts = op.lead
        op.lead = max(0.0, ts - at)
        _relative(op.children, ts, ts + op.dur)
        at = ts + op.dur
    # the caller's tail is set by the caller (``end - at``)
    _ = end


def _set_tails(op: Op) -> None:
    if op.children:
        inside = sum(c.lead + c.dur for c in op.children)
        op.tail = max(0.0, op.dur - inside)
    for c in op.children:
        _set_tails(c)


def _walk(ops: list[Op]) -> Iterator[Op]:
    for op in ops:
        yield op
        yield from _walk(op.children)


# --- the source run ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StagePieces:
    """One source stage's step cut into the workload's pieces (``micro``: per micro-batch)."""

    prologue: list[Op]
    zero_grad: Op | None
    forward: list[Op]
    backward: list[Op]
    fwd_prefix: list[list[Op]]
    fwd_layers: list[list[list[Op]]]
    fwd_suffix: list[list[Op]]
    bwd_prefix: list[list[Op]]
    bwd_layers: list[list[list[Op]]]
    bwd_suffix: list[list[Op]]
    optimizer: Op | None
    epilogue: list[Op]
    leads: dict[str, float]
    step_tail: float


@dataclass(frozen=True)
class SourceRun:
    config: WorkloadConfig
    run_json: dict[str, Any]
    header: dict[str, Any]
    step: int
    stages: list[StagePieces]
    templates: dict[str, Op]
    durations: dict[str, float]
    transfers: dict[tuple[str, int], float]
    dispatch: float


def read_config(run_dir: Path) -> tuple[WorkloadConfig, dict[str, Any]]:
    """The workload configuration a run folder's ``run.json`` states.

    Raises:
        PredictionError: no run.json of the reference workload, or an inconsistent one."""
    path = run_dir / RUN_JSON
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PredictionError(
            f"{path}: not readable ({exc}); --layout rebuilds runs of `tracecal workload run`"
        ) from exc
    if (
        not isinstance(meta, dict)
        or meta.get("generator") != "tracecal.workload"
        or not isinstance(meta.get("config"), dict)
    ):
        raise PredictionError(f"{path}: not a run of the reference workload (`tracecal workload run`)")
    try:
        return WorkloadConfig.from_dict(meta["config"]).validate(), meta
    except (TypeError, WorkloadError) as exc:
        raise PredictionError(f"{path}: its configuration is not valid ({exc})") from exc


def _load_trace(path: Path) -> dict[str, Any]:
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as f:
            return json.load(f)
    except (OSError, ValueError, EOFError) as exc:
        raise PredictionError(f"{path}: not a readable trace ({exc})") from exc


def _rank_step(trace: dict[str, Any], step: int | None, path: Path) -> tuple[int, dict, list[dict], list[dict]]:
    """The chosen (else the shortest) ``ProfilerStep``: its event, the events inside it on its thread,
    and the ``gloo:`` ranges of the rank in its window."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    steps = {int(m.group(1)): e for e in events if (m := STEP.match(str(e.get("name"))))}
    if not steps:
        raise PredictionError(f"{path}: no ProfilerStep in the trace; is it a `tracecal workload run` trace?")
    if step is None:
        step = min(steps, key=lambda n: steps[n].get("dur", 0.0))
    if step not in steps:
        raise PredictionError(f"{path}: no ProfilerStep#{step} in the trace")
    s = steps[step]
    t0, t1 = float(s["ts"]), float(s["ts"]) + float(s["dur"])
    inside = [e for e in events if t0 <= float(e["ts"]) < t1 and e is not s]
    gloo = [e for e in inside if str(e["name"]).startswith("gloo:")]
    main = [e for e in inside if e.get("tid") == s.get("tid") and not str(e["name"]).startswith("gloo:")]
    return step, s, main, gloo


def _pair_ranges(ops: list[Op], gloo: list[dict], t0: float) -> dict[int, float]:
    """Per ``c10d`` operator (by id) the end of the gloo range it posted (FIFO per collective, µs from
    the step's start) and, on the operator, the range's message dims."""
    ends: dict[int, float] = {}
    for kind, c10d in C10D.items():
        calls = [op for op in ops if op.name == c10d]
        ranges = sorted((e for e in gloo if e["name"] == GLOO[kind]), key=lambda e: e["ts"])
        for op, rng in zip(calls, ranges, strict=False):
            ends[id(op)] = float(rng["ts"]) + float(rng.get("dur", 0.0)) - t0
            op.args["_range_dims"] = (rng.get("args") or {}).get("Input Dims")
            op.args["_range_dur"] = float(rng.get("dur", 0.0))
    return ends


def _absolute(ops: list[Op], start: float) -> Iterator[tuple[Op, float]]:
    at = start
    for op in ops:
        ts = at + op.lead
        yield op, ts
        yield from _absolute(op.children, ts)
        at = ts + op.dur


def _is_named(op: Op, suffix: str) -> bool:
    return op.name.endswith(suffix)


def _strip_tp(ops: list[Op]) -> list[Op]:
    """``ops`` without the tensor-parallel regions (their lead moves to the next operator)."""
    out: list[Op] = []
    carry = 0.0
    for op in ops:
        if op.name in TP_NAMES:
            carry += op.lead
            continue
        if carry:
            op = replace(op, lead=op.lead + carry)
            carry = 0.0
        out.append(op)
    return out


def _split_forward(
    children: list[Op], layers: int, last: bool, where: str
) -> tuple[list[Op], list[list[Op]], list[Op]]:
    norms = [i for i, op in enumerate(children) if op.name == LAYER_NORM]
    want = 2 * layers + int(last)
    if len(norms) != want:
        raise PredictionError(
            f"{where}: a forward holds {len(norms)} LayerNorms, not the {want} of {layers} workload layers"
            f"{' and the final norm' if last else ''}; the trace is not the reference workload's"
        )
    end = norms[2 * layers] if last else len(children)
    bounds = [norms[2 * j] for j in range(layers)] + [end]
    blocks = [children[bounds[j] : bounds[j + 1]] for j in range(layers)]
    return children[: norms[0]], blocks, children[end:] if last else []


def _split_backward(
    children: list[Op], layers: int, last: bool, where: str
) -> tuple[list[Op], list[list[Op]], list[Op]]:
    """Loss/head/final-norm part, the layers' blocks (in layer order, first layer first), the rest."""
    norms = [i for i, op in enumerate(children) if _is_named(op, NORM_BACKWARD)]
    want = 2 * layers + int(last)
    if len(norms) != want:
        raise PredictionError(
            f"{where}: a backward holds {len(norms)} LayerNorm backwards, not the {want} of {layers} workload layers"
        )

    def after(i: int) -> int:  # the index after a norm backward and the accumulations that follow it
        j = i + 1
        while j < len(children) and ACCUMULATE in children[j].name:
            j += 1
        return j

    cuts = ([after(norms[0])] if last else [0]) + [after(norms[int(last) + 2 * j + 1]) for j in range(layers)]
    blocks = [children[cuts[j] : cuts[j + 1]] for j in range(layers)]
    return children[: cuts[0]], blocks[::-1], children[cuts[-1] :]


def _stage_pieces(main: list[dict], s: dict, cfg: WorkloadConfig, pp_rank: int, where: str) -> StagePieces:
    t0, t1 = float(s["ts"]), float(s["ts"]) + float(s["dur"])
    top = _tree(main, t0, t1)
    for op in top:
        _set_tails(op)
    top = [op for op in top]
    leads: dict[str, list[float]] = {}
    prologue: list[Op] = []
    epilogue: list[Op] = []
    forward, backward = [], []
    zero_grad = optimizer = None
    seen_forward = False
    for op in top:
        key = op.name if op.name in (FORWARD, BACKWARD, OPTIMIZER, REDUCE_GRADS, *POSTS) else None
        if op.name.startswith(ZERO_GRAD):
            zero_grad, key = op, ZERO_GRAD
        if key is not None:
            leads.setdefault(key, []).append(op.lead)
        if op.name == FORWARD:
            forward.append(op)
            seen_forward = True
        elif op.name == BACKWARD:
            backward.append(op)
        elif op.name == OPTIMIZER:
            optimizer = op
        elif op.name in (*POSTS, REDUCE_GRADS) or op is zero_grad:
            continue
        elif optimizer is not None:
            epilogue.append(op)
        elif not seen_forward:
            prologue.append(op)
        # other operators between the scopes (detach, buffers) are the pure Python of the schedule: their
        # time is in the scopes' leads
    if not forward or len(forward) != len(backward):
        raise PredictionError(f"{where}: {len(forward)} forwards and {len(backward)} backwards in the step")
    last = pp_rank == cfg.pp - 1
    L = cfg.layers_per_stage
    fp, fl, fs, bp, bl, bs = [], [], [], [], [], []
    for f in forward:
        a, b, c = _split_forward(_strip_tp(f.children), L, last, where)
        fp.append(a)
        fl.append(b)
        fs.append(c)
    for bwd in backward:
        a, b, c = _split_backward(_strip_tp(bwd.children), L, last, where)
        bp.append(a)
        bl.append(b)
        bs.append(c)
    end_of_last = sum(op.lead + op.dur for op in top)
    return StagePieces(
        prologue, zero_grad, forward, backward, fp, fl, fs, bp, bl, bs, optimizer, epilogue,
        {k: min(v) for k, v in leads.items()}, max(0.0, (t1 - t0) - end_of_last),
    )  # fmt: skip


def read_source(run_dir: Path, step: int | None = None) -> SourceRun:
    """The source run's configuration and one step of the first rank of every pipeline stage, cut into
    the workload's pieces (``step``: the ``ProfilerStep`` number; default the shortest on stage 0).

    Raises:
        PredictionError: not a reference-workload run, or its traces do not hold its layers."""
    cfg, meta = read_config(run_dir)
    stages: list[StagePieces] = []
    templates: dict[str, Op] = {}
    names: dict[str, list[float]] = {}
    transfers: dict[tuple[str, int], list[float]] = {}
    gaps: list[float] = []
    header: dict[str, Any] = {}
    for p in range(cfg.pp):
        rank = cfg.rank_of(p, 0, 0)
        path = run_dir / f"rank{rank}.pt.trace.json.gz"
        trace = _load_trace(path)
        if not header:
            header = {k: v for k, v in trace.items() if k != "traceEvents"}
        step, s, main, gloo = _rank_step(trace, step, path)
        pieces = _stage_pieces(main, s, cfg, p, f"{path.name} ProfilerStep#{step}")
        stages.append(pieces)
        everything = [*pieces.prologue, *([pieces.zero_grad] if pieces.zero_grad else [])]
        tops = _tree(main, float(s["ts"]), float(s["ts"]) + float(s["dur"]))
        for op in tops:
            _set_tails(op)
        ends = _pair_ranges(list(_walk(tops)), gloo, float(s["ts"]))
        for op, ts in _absolute(tops, 0.0):
            names.setdefault(op.name, []).append(op.dur)
            if op.name in C10D.values() and id(op) in ends:
                kind = next(k for k, v in C10D.items() if v == op.name)
                dims = op.args.get("_range_dims") or []
                elems = _elements(dims)
                transfers.setdefault((kind, elems), []).append(float(op.args["_range_dur"]))
            if op.name in (*POSTS, TP_FORWARD_REDUCE, EVALUATE + TP_BACKWARD_COPY) and op.name not in templates:
                templates[op.name] = _template_of(op, ts, ends)
        gaps += [op.lead for op in tops if op.lead > 0]
        del everything
    return SourceRun(
        cfg, meta, header, int(step or 0), stages, templates,
        {k: statistics.median(v) for k, v in names.items()},
        {k: min(v) for k, v in transfers.items()},
        statistics.median(gaps) if gaps else 0.0,
    )  # fmt: skip


def _elements(dims: Any) -> int:
    first = dims[0] if isinstance(dims, list) and dims and isinstance(dims[0], list) else []
    n = 1
    for x in first:
        n *= int(x)
    return n if first else 0


def _template_of(op: Op, ts: float, ends: dict[int, float]) -> Op:
    """A communication scope as traced, its wait taken out: the operator that holds the ``c10d`` call
    ends the traced residual after the collective's range ends, not after the traced wait."""
    out = copy.deepcopy(op)
    if op.name in POSTS:
        return out
    for (orig, at), (mine, _) in zip(_absolute([op], ts), _absolute([out], ts), strict=True):
        c10d = next((c for c in orig.children if c.name in C10D.values() and id(c) in ends), None)
        if c10d is not None:
            mine.tail = max(0.0, at + orig.dur - ends[id(c10d)])
    return out


# --- the target ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadRelayout:
    """A workload run rebuilt at ``layout`` into ``out_dir`` (a run folder ``trace-ingest`` reads)."""

    out_dir: Path
    config: WorkloadConfig
    layout: Layout
    source: Layout
    layers_per_stage: list[int]
    partition_rule: str
    notes: list[str] = field(default_factory=list)


def source_layout(cfg: WorkloadConfig) -> Layout:
    return Layout(cfg.pp, cfg.tp, cfg.dp, cfg.micro_batches, cfg.micro_batch_size, max(1, cfg.world_size))


def target_config(cfg: WorkloadConfig, target: Layout, *, gpus: int | None = None) -> WorkloadConfig:
    """The workload configuration at ``target`` (what the source leaves open kept).

    Raises:
        LayoutError: the model cannot run at ``target`` (one line naming the numbers)."""
    facts = ModelFacts(layers=cfg.layers, heads=cfg.heads, hidden=cfg.hidden, ffn=cfg.ffn_hidden)
    check_layout(facts, target, gpus=gpus)
    new = replace(
        cfg,
        pp=target.pp,
        tp=target.tp,
        dp=target.dp,
        micro_batches=target.micro_batches or cfg.micro_batches,
        micro_batch_size=target.micro_batch_size or cfg.micro_batch_size,
    )
    try:
        new.validate()
    except WorkloadError as exc:
        raise LayoutError(f"layout {target.text}: {exc}") from exc
    if cfg.vocab_parallel and (cfg.tp > 1 or new.tp > 1) and cfg.tp != new.tp:
        raise LayoutError(
            f"layout {target.text}: the run splits its vocabulary over TP {cfg.tp} (--vocab-parallel); its "
            "embedding and cross-entropy collectives are not rebuilt at another TP"
        )
    return new


def _dims(cfg: WorkloadConfig) -> ModelDims:
    return ModelDims(
        hidden=cfg.hidden,
        heads=cfg.heads,
        seq=cfg.seq,
        ffn=cfg.ffn_hidden,
        vocab_padded=cfg.vocab if cfg.vocab_parallel else None,
        vocab_multiple=1,
        tp=cfg.tp,
        micro_batch_size=cfg.micro_batch_size,
        replicated=() if cfg.vocab_parallel else (cfg.vocab,),
    )


ROW_PARALLEL = ("k", "n", "m")
"""A layer's linear without a bias is row-parallel (its bias is added after the all-reduce): it splits k."""


def _reshaped(ops: list[Op], smap: ShapeMap) -> list[Op]:
    """Deep copies of ``ops`` with every Input Dims at the target; a leaf's duration times its work ratio."""
    out = copy.deepcopy(ops)
    if smap.identity:
        return out
    for op in _walk(out):
        dims = op.args.get("Input Dims")
        if isinstance(dims, list) and dims:
            row = op.name == LINEAR and len(dims) > 2 and dims[2] == []
            new = rewrite_dims(op.name, dims, smap, ROW_PARALLEL) if row else rewrite_dims(op.name, dims, smap)
            _scale_own_time(op, work_ratio(op.name, json.dumps(dims), json.dumps(new)))
            op.args["Input Dims"] = new
    return out


def _scale_own_time(op: Op, ratio: float) -> None:
    """An operator's own time (outside its children: a CPU operator's kernel runs there) times ``ratio``."""
    if ratio == 1.0:
        return
    if not op.children:
        op.dur *= ratio
        return
    for c in op.children:
        c.lead *= ratio
    op.tail *= ratio


def _with_shape(op: Op, old: tuple[int, ...], new: tuple[int, ...]) -> Op:
    """``op`` (a per-parameter piece) with every tensor of the parameter's shape at ``new``."""
    out = copy.deepcopy(op)
    ratio = _prod(new) / max(1, _prod(old))
    for o in _walk([out]):
        dims = o.args.get("Input Dims")
        if isinstance(dims, list):
            hit = False
            for i, d in enumerate(dims):
                if isinstance(d, list) and tuple(d) == old:
                    dims[i], hit = list(new), True
            if hit:
                _scale_own_time(o, ratio)
    return out


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def _generic(name: str) -> str:
    """A parameter name without its layer index (``blocks.3.qkv.weight`` -> ``qkv.weight``)."""
    return re.sub(r"^blocks\.\d+\.", "", name)


def parameter_pieces(node: Op, starts: list[int], params: list, where: str) -> dict[str, tuple[list[Op], tuple]]:
    """``node``'s children cut at ``starts`` into one piece per parameter: generic name -> (ops, shape)."""
    if len(starts) != len(params):
        raise PredictionError(
            f"{where}: {node.name} holds {len(starts)} per-parameter pieces, not the stage's {len(params)} parameters"
        )
    bounds = [*starts, len(node.children)]
    return {_generic(n): (node.children[bounds[i] : bounds[i + 1]], tuple(s)) for i, (n, s) in enumerate(params)}


def _per_parameter(node: Op, starts: list[int], pieces: dict[str, tuple[list[Op], tuple]], new_params: list) -> Op:
    """``node`` with one child piece per target parameter: the source piece of the same parameter
    (name without its layer), its shapes at the target's."""
    fallback = next(iter(pieces.values()))
    out = replace(node, args=dict(node.args), children=copy.deepcopy(node.children[: starts[0]]) if starts else [])
    for name, shape in new_params:
        ops, old = pieces.get(_generic(name), fallback)
        out.children += [_with_shape(op, tuple(old), tuple(shape)) for op in ops]
    return out


def _step_starts(step: Op) -> list[int]:
    """Where each parameter's piece of a single-tensor AdamW step starts: its step-count increment
    (``add_`` on a 0-d tensor)."""
    return [
        i
        for i, c in enumerate(step.children)
        if c.name == "aten::add_" and (c.args.get("Input Dims") or [[0]])[0] == []
    ]


def _optimizer_step(node: Op) -> Op | None:
    return next((c for c in node.children if c.name.startswith("Optimizer.step")), None)


class _Builder:
    """Assembles one target rank's step as a list of top-level items."""

    def __init__(self, src: SourceRun, cfg: WorkloadConfig, smap: ShapeMap, tokens: ShapeMap) -> None:
        self.src, self.cfg, self.smap = src, cfg, smap
        self.tokens = tokens
        """The micro-batch size's map alone: the embedding, head and loss are replicated over TP."""
        self.tp_count: dict[tuple, int] = {}
        self.p2p_count: dict[tuple, int] = {}
        self.piece_cache: dict[tuple[str, int], dict[str, tuple[list[Op], tuple]]] = {}

    def _source_stage(self, first: bool, last: bool) -> StagePieces:
        stages = self.src.stages
        return stages[0] if first else stages[-1] if last else stages[min(1, len(stages) - 1)]

    def _duration(self, name: str) -> float:
        return self.src.durations.get(name, self.src.dispatch)

    def _transfer(self, kind: str, dims: list) -> float:
        return self.src.transfers.get((kind, _elements(dims)), 0.0)

    def _c10d(self, comm: Comm, peer: int | None = None) -> Op:
        args = copy.deepcopy(_C10D_ARGS[comm.kind])
        if peer is not None:
            args["Concrete Inputs"] = ["", "", str(peer), "0"]
        return Op(C10D[comm.kind], "cpu_op", args, self._duration(C10D[comm.kind]), lead=self.src.dispatch, comm=comm)

    def _comm(self, kind: str, role: str, group: tuple[int, ...], dims: list, rank: int) -> Comm:
        key = (role, group, rank)  # each member counts its own calls on the group
        n = self.tp_count.get(key, 0)
        self.tp_count[key] = n + 1
        return Comm(kind, (role, group, n), group, dims, self._transfer(kind, dims), worker=True)

    # tensor parallel ------------------------------------------------------------------------------
    def _tp_forward(self, block: list[Op], rank: int) -> list[Op]:
        cfg = self.cfg
        if cfg.tp == 1:
            return block
        group = tuple(next(g for g in cfg.tp_groups() if rank in g))
        dims = [[cfg.micro_batch_size, cfg.seq, cfg.hidden]]
        out: list[Op] = []
        linears = 0
        for op in block:
            if op.name == LINEAR and linears % 2 == 0:
                out.append(self._region(TP_FORWARD_COPY, dims, None))
            out.append(op)
            if op.name == LINEAR:
                linears += 1
                if linears % 2 == 0:
                    out.append(self._region(TP_FORWARD_REDUCE, dims, self._comm("all_reduce", "tp", group, dims, rank)))
        return out

    def _tp_backward(self, block: list[Op], rank: int) -> list[Op]:
        cfg = self.cfg
        if cfg.tp == 1:
            return block
        group = tuple(next(g for g in cfg.tp_groups() if rank in g))
        dims = [[cfg.micro_batch_size, cfg.seq, cfg.hidden]]
        out: list[Op] = []
        for op in block:
            if _is_named(op, NORM_BACKWARD):
                out.append(
                    self._region(EVALUATE + TP_BACKWARD_COPY, dims, self._comm("all_reduce", "tp", group, dims, rank))
                )
            out.append(op)
        return out

    def _region(self, name: str, dims: list, comm: Comm | None) -> Op:
        """A tensor-parallel region: as traced in the source when it has one, else the workload's shape
        of it (``parallel.py``) timed by the dispatch rule."""
        tpl = self.src.templates.get(name)
        if tpl is not None:
            op = copy.deepcopy(tpl)
            for o in _walk([op]):
                if isinstance(o.args.get("Input Dims"), list) and o.args["Input Dims"] and o.args["Input Dims"][0]:
                    o.args["Input Dims"] = copy.deepcopy(dims)
                if o.name in C10D.values():
                    o.comm, o.children = comm, []
                    o.args.pop("_range_dims", None), o.args.pop("_range_dur", None)
        elif name == EVALUATE + TP_BACKWARD_COPY:
            inner = Op(TP_BACKWARD_COPY, "cpu_op", {"Input Dims": copy.deepcopy(dims)}, 0.0, lead=self.src.dispatch)
            op = Op(name, "cpu_op", {}, 0.0, lead=self.src.dispatch, children=[inner])
        else:
            op = Op(
                name,
                "cpu_op",
                {"Input Dims": copy.deepcopy(dims), "Input type": ["float"]},
                0.0,
                lead=self.src.dispatch,
            )
        if comm is not None:
            owner = op if op.name == TP_FORWARD_REDUCE else next(o for o in _walk([op]) if o.name == TP_BACKWARD_COPY)
            if not any(o.comm is not None for o in _walk([owner])):
                owner.children.append(self._c10d(comm))
            owner.waits = [comm]
            if tpl is None:
                owner.tail = self.src.dispatch
        else:
            op.dur = self._duration(name) if tpl is None else op.dur
        return op

    # the step ---------------------------------------------------------------------------------------
    def forward(self, rank: int, micro: int) -> Op:
        cfg, src = self.cfg, self.src
        stage, _, _ = cfg.coords(rank)
        first, last = stage == 0, stage == cfg.pp - 1
        home = self._source_stage(first, last)
        i = micro % len(home.forward)
        node = replace(home.forward[i], args=dict(home.forward[i].args), children=[])
        children: list[Op] = []
        if first:
            children += _reshaped(src.stages[0].fwd_prefix[micro % len(src.stages[0].fwd_prefix)], self.tokens)
        for g in self.layers(stage):
            s, j = divmod(g, src.config.layers_per_stage)
            pieces = src.stages[s]
            block = _reshaped(pieces.fwd_layers[micro % len(pieces.fwd_layers)][j], self.smap)
            children += self._tp_forward(block, rank)
        if last:
            children += _reshaped(src.stages[-1].fwd_suffix[micro % len(src.stages[-1].fwd_suffix)], self.tokens)
        node.children = children
        node.lead = home.leads.get(FORWARD, 0.0)
        return node

    def backward(self, rank: int, micro: int) -> Op:
        cfg, src = self.cfg, self.src
        stage, _, _ = cfg.coords(rank)
        first, last = stage == 0, stage == cfg.pp - 1
        home = self._source_stage(first, last)
        traced = home.backward[micro % len(home.backward)]
        node = replace(traced, args=dict(traced.args), children=[])
        children: list[Op] = []
        if last:
            children += _reshaped(src.stages[-1].bwd_prefix[micro % len(src.stages[-1].bwd_prefix)], self.tokens)
        for g in reversed(self.layers(stage)):
            s, j = divmod(g, src.config.layers_per_stage)
            pieces = src.stages[s]
            block = _reshaped(pieces.bwd_layers[micro % len(pieces.bwd_layers)][j], self.smap)
            children += self._tp_backward(block, rank)
        if first:
            children += _reshaped(src.stages[0].bwd_suffix[micro % len(src.stages[0].bwd_suffix)], self.tokens)
        node.children = children
        node.lead = home.leads.get(BACKWARD, 0.0)
        return node

    def layers(self, stage: int) -> list[int]:
        per = self.cfg.layers_per_stage
        return list(range(stage * per, (stage + 1) * per))

    def communicate(self, rank: int, posts: tuple[str, ...]) -> list[Item]:
        cfg = self.cfg
        stage, dp_rank, tp_rank = cfg.coords(rank)
        dims = [[cfg.micro_batch_size, cfg.seq, cfg.hidden]]
        home = self._source_stage(stage == 0, stage == cfg.pp - 1)
        items: list[Item] = []
        comms: list[Comm] = []
        for scope in posts:
            forward = scope in (SEND_ACTIVATIONS, RECV_ACTIVATIONS)
            sending = scope in (SEND_ACTIVATIONS, SEND_GRADS)
            peer = cfg.rank_of(stage + (1 if scope in (SEND_ACTIVATIONS, RECV_GRADS) else -1), dp_rank, tp_rank)
            src_rank, dst_rank = (rank, peer) if sending else (peer, rank)
            link = (src_rank, dst_rank, int(forward))
            n = self.p2p_count.get((link, rank), 0)  # each side counts its own transfers on the link
            self.p2p_count[link, rank] = n + 1
            kind = "send" if sending else "recv"
            comm = Comm(kind, ("pp", link, n), (src_rank, dst_rank), dims, self._transfer(kind, dims), worker=False)
            tpl = self.src.templates.get(scope)
            op = (
                copy.deepcopy(tpl) if tpl is not None else Op(scope, "user_annotation", {}, 0.0, tail=self.src.dispatch)
            )
            c10d = next((c for c in op.children if c.name == C10D[kind]), None)
            if c10d is None:
                op.children.append(self._c10d(comm, peer))
            else:
                c10d.comm, c10d.children = comm, []
                c10d.args["Concrete Inputs"] = ["", "", str(peer), "0"]
            op.lead = home.leads.get(scope, self.src.dispatch)
            items.append(op)
            comms.append(comm)
        items.append(Wait(comms, self.src.dispatch))
        return items

    def reduce_grads(self, rank: int) -> list[Item]:
        """The data-parallel gradient all-reduce of ``train.reduce_gradients``: per bucket a ``cat`` and
        an asynchronous all-reduce, then per bucket its wait, the division by DP and a copy per parameter."""
        cfg = self.cfg
        if cfg.dp == 1:
            return []
        stage, _, _ = cfg.coords(rank)
        group = tuple(next(g for g in cfg.dp_groups() if rank in g))
        shapes = [s for _, s in stage_parameters(cfg, stage)]
        buckets = gradient_buckets(shapes, cfg.bucket_bytes)
        node = Op(REDUCE_GRADS, "user_annotation", {}, 0.0, lead=self.src.dispatch, tail=self.src.dispatch)
        comms = []
        for bucket in buckets:
            n = sum(_prod(shapes[i]) for i in bucket)
            comm = self._comm("all_reduce", "dp", group, [[n]], rank)
            comms.append((comm, n, bucket))
            node.children.append(self._leaf("aten::cat", [[], []], n))
            node.children.append(self._c10d(comm))
        for comm, n, bucket in comms:
            node.children.append(Wait([comm], 0.0))  # type: ignore[arg-type]
            node.children.append(self._leaf("aten::div_", [[n], []], n))
            for i in bucket:
                shape = list(shapes[i])
                node.children.append(self._leaf("aten::copy_", [shape, shape, []], _prod(shapes[i])))
        return [node]

    def _leaf(self, name: str, dims: list, elements: int) -> Op:
        return Op(name, "cpu_op", {"Input Dims": dims}, self._duration(name), lead=self.src.dispatch)

    def _pieces(self, kind: str, home: int) -> dict[str, tuple[list[Op], tuple]]:
        """Per-parameter pieces of ``zero_grad`` or the AdamW step from every source stage, the home
        stage's first."""
        if (kind, home) in self.piece_cache:
            return self.piece_cache[kind, home]
        out: dict[str, tuple[list[Op], tuple]] = {}
        src = self.src
        for s in sorted(range(len(src.stages)), key=lambda s: s != home):
            pieces = src.stages[s]
            params = stage_parameters(src.config, s)
            where = f"source stage {s}"
            if kind == ZERO_GRAD and pieces.zero_grad is not None:
                node = pieces.zero_grad
                found = parameter_pieces(node, list(range(len(node.children))), params, where)
            elif kind == OPTIMIZER and pieces.optimizer is not None and (step := _optimizer_step(pieces.optimizer)):
                found = parameter_pieces(step, _step_starts(step), params, where)
            else:
                continue
            out = {**found, **out}
        self.piece_cache[kind, home] = out
        return out

    def optimizer_parts(self, rank: int) -> tuple[list[Op], Op | None, Op | None, list[Op]]:
        cfg, src = self.cfg, self.src
        stage, _, _ = cfg.coords(rank)
        first, last = stage == 0, stage == cfg.pp - 1
        s_index = 0 if first else src.config.pp - 1 if last else min(1, src.config.pp - 1)
        home = src.stages[s_index]
        new_params = stage_parameters(cfg, stage)
        zero = None
        if home.zero_grad is not None:
            node = home.zero_grad
            zero = _per_parameter(node, list(range(len(node.children))), self._pieces(ZERO_GRAD, s_index), new_params)
            zero.lead = home.leads.get(ZERO_GRAD, 0.0)
        opt = None
        if home.optimizer is not None:
            opt = copy.deepcopy(home.optimizer)
            step = _optimizer_step(opt)
            if step is not None:
                new_step = _per_parameter(step, _step_starts(step), self._pieces(OPTIMIZER, s_index), new_params)
                opt.children = [new_step if c is step else c for c in opt.children]
            opt.lead = home.leads.get(OPTIMIZER, 0.0)
        return copy.deepcopy(home.prologue), zero, opt, copy.deepcopy(home.epilogue)

    def step_items(self, rank: int) -> list[Item]:
        cfg = self.cfg
        stage, _, _ = cfg.coords(rank)
        prologue, zero, opt, epilogue = self.optimizer_parts(rank)
        items: list[Item] = [*prologue, *([zero] if zero else [])]
        for ins in stage_instructions(cfg.pp, stage, cfg.micro_batches):
            if ins.kind == FORWARD:
                items.append(self.forward(rank, int(ins.micro_batch or 0)))
            elif ins.kind == BACKWARD:
                items.append(self.backward(rank, int(ins.micro_batch or 0)))
            elif ins.kind == COMMUNICATE:
                items += self.communicate(rank, ins.posts)
        items += self.reduce_grads(rank)
        items += [*([opt] if opt else []), *epilogue]
        return items


# --- laying the ranks out -------------------------------------------------------------------------------

Event = dict[str, Any]
_Request = tuple[str, Comm, float]


class _Emitter:
    """One rank's events: its step laid out from ``t0``, suspending where it waits for collectives."""

    def __init__(self, rank: int, tid: int, pid: int, ids: Iterator[int]) -> None:
        self.rank, self.tid, self.pid, self.ids = rank, tid, pid, ids
        self.events: list[Event] = []
        self.posted: list[tuple[Comm, float]] = []

    def run(self, items: list[Item], t: float) -> Generator[_Request, float, float]:
        at = t
        for item in items:
            if isinstance(item, Wait):
                done = at
                for comm in item.comms:
                    done = max(done, (yield ("wait", comm, at)))
                at = done + item.residual
            else:
                at = yield from self.op(item, at + item.lead)
        return at

    def op(self, op: Op, start: float) -> Generator[_Request, float, float]:
        at = start
        if op.comm is not None:
            yield ("post", op.comm, start)
            self.posted.append((op.comm, start))
        if op.children:
            at = yield from self.run(op.children, start)  # type: ignore[arg-type]
            end = at + op.tail
        else:
            end = start + op.dur
        for comm in op.waits:
            end = max(end, (yield ("wait", comm, end)) + op.tail)
        args = {k: v for k, v in op.args.items() if not k.startswith("_")}
        args["External id"] = next(self.ids)
        self.events.append(
            {"ph": "X", "cat": op.cat, "name": op.name, "pid": self.pid, "tid": self.tid, "ts": start,
             "dur": end - start, "args": args}
        )  # fmt: skip
        return end


def lay_out(programs: dict[int, list[Item]], t0: float) -> tuple[dict[int, list[Event]], dict[int, float]]:
    """Run every rank's program until it ends: a collective completes when all its members have posted,
    plus its transfer time. Returns each rank's events (gloo ranges included) and its step end.

    Raises:
        PredictionError: the ranks wait for each other (a schedule that cannot run)."""
    ids = count(1)
    emitters = {r: _Emitter(r, 1000 + r, 1000 + r, ids) for r in programs}
    gens = {r: emitters[r].run(items, t0) for r, items in programs.items()}
    posts: dict[tuple, dict[int, float]] = {}
    pending: dict[int, _Request | None] = {}
    ends: dict[int, float] = {}

    def completion(comm: Comm) -> float | None:
        have = posts.get(comm.key, {})
        if len(have) < len(comm.members):
            return None
        return max(have.values()) + comm.transfer

    def step(r: int, value: float | None) -> None:
        try:
            pending[r] = gens[r].send(value)  # type: ignore[arg-type]
        except StopIteration as stop:
            ends[r] = float(stop.value)
            pending[r] = None

    for r in gens:
        step(r, None)
    progress = True
    while progress:
        progress = False
        for r in gens:
            while (req := pending.get(r)) is not None:
                what, comm, at = req
                if what == "post":
                    posts.setdefault(comm.key, {})[r] = at
                    step(r, None)
                    progress = True
                    continue
                done = completion(comm)
                if done is None:
                    break
                step(r, done)
                progress = True
    stuck = [r for r, req in pending.items() if req is not None]
    if stuck:
        raise PredictionError(f"the rebuilt schedule deadlocks on ranks {stuck}; this is a bug in the re-layout")
    out: dict[int, list[Event]] = {}
    for r, em in emitters.items():
        ranges: list[Event] = []
        workers: list[float] = []  # per worker thread, when it is free again
        for comm, start in em.posted:
            done = completion(comm)
            assert done is not None
            tid = em.tid
            if comm.worker:
                slot = next((i for i, free in enumerate(workers) if free <= start), None)
                if slot is None:
                    workers.append(0.0)
                    slot = len(workers) - 1
                workers[slot] = done
                tid = em.tid + 100 * (slot + 1)
            ranges.append(
                {"ph": "X", "cat": "user_annotation", "name": GLOO[comm.kind], "pid": em.pid, "tid": tid, "ts": start,
                 "dur": max(done - start, 0.001),
                 "args": {"Input Dims": comm.dims, "Concrete Inputs": [""], "Input type": ["float"],
                          "External id": next(ids)}}
            )  # fmt: skip
        out[r] = em.events + ranges
    return out, ends


# --- the run folder ---------------------------------------------------------------------------------------


def rebuild_workload_at(
    run_dir: Path, target: Layout, out_dir: Path, *, step: int | None = None, gpus: int | None = None
) -> WorkloadRelayout:
    """Write the source run's iteration at ``target`` into ``out_dir`` as a workload run folder (one
    trace per rank with one ``ProfilerStep``, and ``run.json``).

    Raises:
        LayoutError: the model cannot run at ``target``. PredictionError: the source is not a readable
        reference-workload run."""
    cfg, _ = read_config(run_dir)
    new = target_config(cfg, target, gpus=gpus)
    src = read_source(run_dir, step)
    smap = shape_map(_dims(cfg), _dims(new))
    tokens = shape_map(_dims(cfg), _dims(replace(cfg, micro_batch_size=new.micro_batch_size)))
    builder = _Builder(src, new, smap, tokens)
    programs = {r: builder.step_items(r) for r in range(new.world_size)}
    t0 = 0.0
    events, ends = lay_out(programs, t0)
    out_dir.mkdir(parents=True, exist_ok=True)
    tail = max(st.step_tail for st in src.stages)
    for r in range(new.world_size):
        em_events = events[r]
        tid = 1000 + r
        step_event = {
            "ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{src.step}", "pid": tid, "tid": tid,
            "ts": t0, "dur": ends[r] + tail - t0, "args": {"External id": 0},
        }  # fmt: skip
        base = src.header.get("baseTimeNanoseconds", 0)
        shift = 1_000_000.0  # µs after the trace's base, as torch.profiler writes them
        for e in [step_event, *em_events]:
            e["ts"] = round(e["ts"] + shift, 3)
            e["dur"] = round(e["dur"], 3)
        trace = {
            **src.header,
            "baseTimeNanoseconds": base,
            "distributedInfo": _distributed_info(new, r),
            "traceEvents": [step_event, *sorted(em_events, key=lambda e: (e["ts"], -e["dur"]))],
        }
        with gzip.open(out_dir / f"rank{r}.pt.trace.json.gz", "wt") as f:
            json.dump(trace, f)
    (out_dir / RUN_JSON).write_text(json.dumps(_run_json(src.run_json, new, src.step), indent=2) + "\n")
    per_stage = [new.layers_per_stage] * new.pp
    note = (
        f"re-laid out {source_layout(cfg).text} -> {target.text}: {per_stage} transformer layers per stage, "
        f"{new.micro_batches} micro-batches of {new.micro_batch_size} per data-parallel rank, "
        f"from ProfilerStep#{src.step}"
    )
    notes = [note]
    if smap.ambiguous:
        notes.append(
            f"sizes {sorted(smap.ambiguous)} are both a tensor-parallel split and an unsplit size of this model: "
            "outside GEMMs they keep their size"
        )
    lay = replace(
        target, micro_batches=new.micro_batches, micro_batch_size=new.micro_batch_size, gpus_per_node=new.world_size
    )
    return WorkloadRelayout(out_dir, new, lay, source_layout(cfg), per_stage, PARTITION_RULE, notes)


def _distributed_info(cfg: WorkloadConfig, rank: int) -> dict[str, Any]:
    groups = [
        {"pg_name": "0", "pg_desc": "default_pg", "pg_size": cfg.world_size, "ranks": list(range(cfg.world_size))}
    ]
    for role, listed in (("tp", cfg.tp_groups()), ("dp", cfg.dp_groups()), ("pp", cfg.pp_groups())):
        for ranks in listed:
            if rank in ranks:
                groups.append({"pg_name": str(len(groups)), "pg_desc": role, "pg_size": len(ranks), "ranks": ranks})
    return {"backend": "gloo", "rank": rank, "world_size": cfg.world_size, "pg_count": len(groups), "pg_config": groups}


def _run_json(meta: dict[str, Any], cfg: WorkloadConfig, step: int) -> dict[str, Any]:
    out = {k: v for k, v in meta.items() if k not in ("ranks", "losses", "train_seconds")}
    out.update(
        pp=cfg.pp, tp=cfg.tp, dp=cfg.dp, world_size=cfg.world_size, nodes=1, gpus_per_node=cfg.world_size,
        micro_batches=cfg.micro_batches, micro_batch_size=cfg.micro_batch_size,
        global_batch_size=cfg.global_batch_size, config=cfg.to_dict(),
        profile={**meta.get("profile", {}), "profiled_steps": [step]},
        relayout={"source": {"pp": meta.get("pp"), "tp": meta.get("tp"), "dp": meta.get("dp")}},
    )  # fmt: skip
    return out
