"""GPT-NeoX training logs (stdout of ``deepy.py``/``train.py``) -> a `NeoxLog`, and Table 8 from it.

A GPT-NeoX log holds what a trace does not: the full argument dump (``  name ..... value ....updated``),
the launcher's node/GPU layout, DeepSpeed's engine configuration, the pipeline partition listing
(``stage=0 layers=13`` then ``    0: EmbeddingPipe`` ...), DeepSpeed's wall-clock timers and one
``elapsed time per iteration (ms)`` line per iteration. Lines may carry a pdsh ``host: `` prefix.

Pure parsing: no DuckDB, no printing. `NeoxLog.to_json` / `NeoxLog.from_json` round-trip through JSON
so the result can be kept in ``runs.metadata_json``.
"""

from __future__ import annotations

import ast
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tracecal.errors import InputNotFoundError, TraceFormatError

#: version of the `NeoxLog.to_json` layout; `from_json` refuses other versions.
NEOX_LOG_JSON_VERSION = 1

_ARGS_BEGIN = "-------------------- arguments --------------------"
_ARGS_END = "---------------- end of arguments ----------------"
_ARG_SUFFIXES = ("updated", "default")
# GPT-NeoX pads "  name <dots> value" with dots to this width before the updated/default tag
_ARG_PAD_WIDTH = 64

_HOST_PREFIX = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*): (?P<rest>.*)$")
_ARG_LINE = re.compile(r"^  (?P<name>[A-Za-z_][\w-]*) \.* (?P<value>.*)$", re.DOTALL)
_LOG_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d ")
_DS_CONFIG_BEGIN = re.compile(r"\[config\.py:\d+:print\] DeepSpeedEngine configuration:")
_DS_CONFIG_ITEM = re.compile(r"\[config\.py:\d+:print\]   (?P<name>\w+) ?\.* (?P<value>.*)$")
_DS_VERSION = re.compile(r"DeepSpeed info: version=(?P<version>\S+?),")
_LAUNCHER = re.compile(r"nnodes=(?P<nodes>\d+), num_local_procs=(?P<local>\d+), node_rank=(?P<node_rank>\d+)")
_DIST_WORLD = re.compile(r"dist_world_size=(?P<n>\d+)")
_NEOX_WORLD = re.compile(r"using world size: (?P<n>\d+) and model-parallel size: (?P<tp>\d+)")
_STAGE = re.compile(r"^stage=(?P<stage>\d+) layers=(?P<n>\d+)\s*$")
_STAGE_LAYER = re.compile(r"^\s+(?P<index>\d+): (?P<name>\S+)\s*$")
_ITERATION = re.compile(
    r"iteration\s+(?P<it>\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\): (?P<ms>[0-9.eE+-]+)"
)
_TIMERS = re.compile(r"\[Rank 0\] time \(ms\) \| (?P<body>.*)$")
_TIMER_ITEM = re.compile(r"(?P<name>[\w/.-]+): (?P<ms>[0-9.eE+-]+)")
_PIPE_PARTITIONED = re.compile(r"is_pipe_partitioned= ?(?P<value>True|False)")


@dataclass(frozen=True)
class NeoxLog:
    """What one GPT-NeoX log states. Every typed field is None when the log does not state it.

    Attributes:
        source: the path the log was read from (as given).
        args: the whole argument dump, name -> the printed value as a raw string.
        deepspeed_config: DeepSpeed's "DeepSpeedEngine configuration" print, name -> raw value.
        deepspeed_version: e.g. ``0.12.4+02e2ebf``.
        pipe_parallel_size, model_parallel_size: from the argument dump.
        data_parallel_size: world size / (pp * tp); DeepSpeed's printed ``world_size`` (its data-parallel
            size) when the log does not state the world size.
        world_size: ranks of the job (``global_num_gpus``, else the launcher's ``dist_world_size``).
        nodes, gpus_per_node: from the DeepSpeed launcher line ``nnodes=N, num_local_procs=G``, else the
            arguments ``num_nodes``/``num_gpus``.
        num_layers, hidden_size, num_attention_heads, seq_length: model shape.
        train_micro_batch_size_per_gpu, gradient_accumulation_steps: batch layout.
        precision: ``fp16``, ``bf16`` or ``fp32``.
        checkpoint_activations: activation checkpointing on/off.
        zero_stage, reduce_bucket_size, allgather_bucket_size: ZeRO settings (bucket sizes in elements).
        profile_step_start, profile_step_stop: the torch.profiler window (see `profiled_iterations`).
        pipe_partitioned: DeepSpeed's pipeline engine line ``is_pipe_partitioned= True``: each tensor-parallel
            rank sends its 1/tp share of the activations between stages.
        stage_layers: per pipeline stage, the layer class names in order (from the partition listing).
        iteration_ms: (iteration number, elapsed ms) from rank 0's per-iteration lines, in log order.
        step_timers_ms: (iteration the timers precede, or None after the last one, {timer: ms}) for each
            DeepSpeed wall-clock breakdown print.
    """

    source: str
    args: dict[str, str]
    deepspeed_config: dict[str, str] = field(default_factory=dict)
    deepspeed_version: str | None = None
    pipe_parallel_size: int | None = None
    model_parallel_size: int | None = None
    data_parallel_size: int | None = None
    world_size: int | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    seq_length: int | None = None
    train_micro_batch_size_per_gpu: int | None = None
    gradient_accumulation_steps: int | None = None
    precision: str | None = None
    checkpoint_activations: bool | None = None
    zero_stage: int | None = None
    reduce_bucket_size: int | None = None
    allgather_bucket_size: int | None = None
    profile_step_start: int | None = None
    profile_step_stop: int | None = None
    pipe_partitioned: bool | None = None
    stage_layers: list[list[str]] = field(default_factory=list)
    iteration_ms: list[tuple[int, float]] = field(default_factory=list)
    step_timers_ms: list[tuple[int | None, dict[str, float]]] = field(default_factory=list)

    def unstated(self, *names: str) -> list[str]:
        """Which of the typed fields ``names`` the log does not state (None), in the order given."""
        return [name for name in names if getattr(self, name) is None]

    @property
    def transformer_layers_per_stage(self) -> list[int]:
        """Per pipeline stage, how many of its layers are transformer layers (class name contains
        ``TransformerLayer``)."""
        return [sum("TransformerLayer" in name for name in stage) for stage in self.stage_layers]

    @property
    def profiled_iterations(self) -> list[int] | None:
        """The 1-based iterations the torch profiler recorded: ``profile_step_start + 1 ... profile_step_stop``.

        GPT-NeoX builds ``schedule(wait=start, warmup=1, active=stop - start)`` and steps the profiler at the
        top of every iteration, so the first ``start`` iterations wait and the last active one is ``stop``.
        None when the log states no profiling window.
        """
        if self.profile_step_start is None or self.profile_step_stop is None:
            return None
        return list(range(self.profile_step_start + 1, self.profile_step_stop + 1))

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (lists, not tuples) that `from_json` turns back into an equal `NeoxLog`."""
        out: dict[str, Any] = {"version": NEOX_LOG_JSON_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "iteration_ms":
                value = [[it, ms] for it, ms in value]
            elif f.name == "step_timers_ms":
                value = [[it, dict(timers)] for it, timers in value]
            elif isinstance(value, dict):
                value = dict(value)
            elif f.name == "stage_layers":
                value = [list(stage) for stage in value]
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NeoxLog:
        """Rebuild a `NeoxLog` from `to_json` output.

        Raises:
            TraceFormatError: ``data`` is not a `to_json` dict of this version.
        """
        version = data.get("version") if isinstance(data, Mapping) else None
        if version != NEOX_LOG_JSON_VERSION or "args" not in data:
            raise TraceFormatError(
                f"stored GPT-NeoX log metadata has version {version!r}, expected {NEOX_LOG_JSON_VERSION}; "
                "re-ingest the run to rewrite it"
            )
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            if f.name == "iteration_ms":
                value = [(int(it), float(ms)) for it, ms in value]
            elif f.name == "step_timers_ms":
                value = [(None if it is None else int(it), {k: float(v) for k, v in t.items()}) for it, t in value]
            kwargs[f.name] = value
        return cls(**kwargs)


def parse_neox_log(path: Path) -> NeoxLog:
    """Read a GPT-NeoX stdout log.

    Raises:
        InputNotFoundError: ``path`` does not exist.
        TraceFormatError: the file holds no GPT-NeoX argument dump.
    """
    if not path.is_file():
        raise InputNotFoundError(f"no GPT-NeoX log at {path}; pass the run's *.log file (the training stdout)")
    text = path.read_text(encoding="utf-8", errors="replace")
    return parse_neox_log_text(text, source=str(path))


def parse_neox_log_text(text: str, source: str = "<text>") -> NeoxLog:
    """`parse_neox_log` on the log's text; ``source`` names it in errors.

    Raises:
        TraceFormatError: the text holds no complete GPT-NeoX argument dump.
    """
    lines = [_split_host(line) for line in text.splitlines()]
    args = _parse_args(lines, source)
    ds_config = _parse_deepspeed_config(lines)
    stages = _parse_stages(lines, source)
    launcher = _launcher(lines)
    rank0_host = launcher.get("host")
    iteration_ms, timers = _parse_iterations(lines, rank0_host)

    pp = _int(args.get("pipe_parallel_size"))
    tp = _int(args.get("model_parallel_size"))
    world = _positive(_int(args.get("global_num_gpus"))) or _world_from_lines(lines)
    nodes = launcher.get("nodes") or _positive(_int(args.get("num_nodes")))
    gpus_per_node = launcher.get("local") or _positive(_int(args.get("num_gpus")))
    if world is None and nodes is not None and gpus_per_node is not None:
        world = nodes * gpus_per_node
    dp: int | None = None
    if world is not None and tp is not None and pp is not None and world % (max(pp, 1) * tp) == 0:
        dp = world // (max(pp, 1) * tp)
    elif "world_size" in ds_config:
        dp = _int(ds_config["world_size"])

    partitioned = next((m["value"] == "True" for _, body in lines if (m := _PIPE_PARTITIONED.search(body))), None)
    zero = _literal(args.get("zero_optimization"))
    zero = zero if isinstance(zero, dict) else {}
    version = next((m["version"] for _, body in lines if (m := _DS_VERSION.search(body))), None)
    return NeoxLog(
        source=source,
        args=args,
        deepspeed_config=ds_config,
        deepspeed_version=version,
        pipe_parallel_size=pp,
        model_parallel_size=tp,
        data_parallel_size=dp,
        world_size=world,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        num_layers=_int(args.get("num_layers")),
        hidden_size=_int(args.get("hidden_size")),
        num_attention_heads=_int(args.get("num_attention_heads")),
        seq_length=_int(args.get("seq_length")),
        train_micro_batch_size_per_gpu=_int(args.get("train_micro_batch_size_per_gpu")),
        gradient_accumulation_steps=_int(args.get("gradient_accumulation_steps")),
        precision=_precision(args),
        checkpoint_activations=_bool(args.get("checkpoint_activations")),
        zero_stage=_first_int(args.get("zero_stage"), zero.get("stage")),
        reduce_bucket_size=_first_int(args.get("zero_reduce_bucket_size"), zero.get("reduce_bucket_size")),
        allgather_bucket_size=_first_int(args.get("zero_allgather_bucket_size"), zero.get("allgather_bucket_size")),
        profile_step_start=_int(args.get("profile_step_start")),
        profile_step_stop=_int(args.get("profile_step_stop")),
        pipe_partitioned=partitioned,
        stage_layers=stages,
        iteration_ms=iteration_ms,
        step_timers_ms=timers,
    )


def iteration_statistics(
    log: NeoxLog | None, train_batch_us: Mapping[str, Sequence[float]] | None = None
) -> dict[str, Any]:
    """Table 8 of GPUModeling25: iteration time over the profiled iterations, in seconds.

    From the log's rank-0 ``elapsed time per iteration`` lines for the profiled iterations
    (`NeoxLog.profiled_iterations`; every logged iteration when the log states no profiling window):
    min, max, mean, population std and (mean - min) / min * 100. When the log has none of those lines,
    from ``train_batch_us``: ``{"average": [µs per traced rank], "min": [µs per traced rank]}`` (the
    ``train_batch`` rows of the decoded run's ``module_times_average.csv``/``module_times_min.csv``; zeros
    mean "not found on that rank" and are skipped), which give the mean (of the per-rank means: each rank
    traced the same iterations) and the min only.

    Returns:
        ``{"iterations": [int] | None, "min_s", "max_s", "mean_s", "std_s": float | None,
        "mean_vs_min_pct": float | None, "source": {figure: where it came from},
        "missing": [figures that are None], "missing_iterations": [profiled iterations absent from the log]}``.
    """
    figures = ("min_s", "max_s", "mean_s", "std_s", "mean_vs_min_pct")
    out: dict[str, Any] = dict.fromkeys(figures)
    out.update(iterations=None, source={}, missing_iterations=[])
    if log is not None and log.iteration_ms:
        wanted = log.profiled_iterations
        logged = dict(log.iteration_ms)
        chosen = sorted(logged) if wanted is None else [it for it in wanted if it in logged]
        if chosen:
            seconds = [logged[it] / 1e3 for it in chosen]
            where = "profiled" if wanted is not None else "all logged"
            label = f"log: elapsed time per iteration, {where} iterations {_span(chosen)} (rank 0)"
            out.update(
                iterations=chosen,
                min_s=min(seconds),
                max_s=max(seconds),
                mean_s=statistics.fmean(seconds),
                std_s=statistics.pstdev(seconds),
                missing_iterations=[it for it in (wanted or []) if it not in logged],
            )
            out["source"] = dict.fromkeys(("min_s", "max_s", "mean_s", "std_s"), label)
    if out["mean_s"] is None and train_batch_us:
        averages = [v for v in train_batch_us.get("average") or [] if _present(v)]
        minima = [v for v in train_batch_us.get("min") or [] if _present(v)]
        if minima:
            out["min_s"] = min(minima) / 1e6
            out["source"]["min_s"] = f"module_times_min.csv train_batch: min over {len(minima)} traced ranks"
        if averages:
            out["mean_s"] = statistics.fmean(averages) / 1e6
            out["source"]["mean_s"] = f"module_times_average.csv train_batch: mean over {len(averages)} traced ranks"
        if log is not None:
            out["iterations"] = log.profiled_iterations
    if out["mean_s"] is not None and out["min_s"]:
        out["mean_vs_min_pct"] = (out["mean_s"] - out["min_s"]) / out["min_s"] * 100
        out["source"]["mean_vs_min_pct"] = "(mean - min) / min * 100"
    out["missing"] = [name for name in figures if out[name] is None]
    return out


# --- line-level helpers ------------------------------------------------------------------------------


def _split_host(line: str) -> tuple[str | None, str]:
    """(pdsh host prefix or None, the line without it)."""
    m = _HOST_PREFIX.match(line)
    if m is None:
        return None, line
    return m["host"], m["rest"]


def _parse_args(lines: Sequence[tuple[str | None, str]], source: str) -> dict[str, str]:
    bodies = [body for _, body in lines]
    try:
        begin = next(i for i, body in enumerate(bodies) if body.strip() == _ARGS_BEGIN)
    except StopIteration:
        raise TraceFormatError(
            f"{source}: no GPT-NeoX argument dump ({_ARGS_BEGIN!r}); pass the full training stdout, "
            "not a trimmed or per-rank log"
        ) from None
    end = next((i for i in range(begin + 1, len(bodies)) if bodies[i].strip() == _ARGS_END), None)
    if end is None:
        raise TraceFormatError(f"{source}: the GPT-NeoX argument dump has no {_ARGS_END!r} line; the log is truncated")
    args: dict[str, str] = {}
    pending: list[str] = []
    # a value holding a newline is printed over several lines; the tag closes the entry
    for body in bodies[begin + 1 : end]:
        pending.append(body)
        entry = "\n".join(pending)
        tag = next((t for t in _ARG_SUFFIXES if entry.endswith(t)), None)
        if tag is None:
            continue
        pending = []
        content = entry[: -len(tag)]
        m = _ARG_LINE.match(content)
        if m is None:
            continue
        value = m["value"]
        if len(content) <= _ARG_PAD_WIDTH:
            value = value.rstrip(".")
        args[m["name"]] = value
    if not args:
        raise TraceFormatError(f"{source}: the GPT-NeoX argument dump is empty; pass the full training stdout")
    return args


def _parse_deepspeed_config(lines: Sequence[tuple[str | None, str]]) -> dict[str, str]:
    config: dict[str, str] = {}
    host: str | None = None
    inside = False
    current: str | None = None
    for line_host, body in lines:
        if not inside:
            if _DS_CONFIG_BEGIN.search(body):
                inside, host = True, line_host
            continue
        if line_host != host:
            continue
        m = _DS_CONFIG_ITEM.search(body)
        if m is not None:
            current = m["name"]
            config[current] = m["value"].rstrip()
        elif _LOG_RECORD.match(body) or current is None:
            break
        else:
            config[current] += "\n" + body.rstrip()
    return config


def _parse_stages(lines: Sequence[tuple[str | None, str]], source: str) -> list[list[str]]:
    stages: list[list[str]] = []
    host: str | None = None
    expected = 0
    for line_host, body in lines:
        m = _STAGE.match(body)
        if m is not None:
            if stages and int(m["stage"]) == 0:
                break  # a second rank's copy of the same listing
            if int(m["stage"]) != len(stages):
                raise TraceFormatError(
                    f"{source}: pipeline listing jumps to stage={m['stage']} after {len(stages)} stages"
                )
            host, expected = line_host, int(m["n"])
            stages.append([])
            continue
        if stages and line_host == host and len(stages[-1]) < expected:
            layer = _STAGE_LAYER.match(body)
            if layer is not None:
                stages[-1].append(layer["name"])
    for index, stage in enumerate(stages):
        if not stage:
            raise TraceFormatError(f"{source}: pipeline stage {index} lists no layers; the log is truncated")
    return stages


def _launcher(lines: Sequence[tuple[str | None, str]]) -> dict[str, Any]:
    """The DeepSpeed launcher's node 0 line: host, nodes, local processes (= GPUs) per node."""
    for host, body in lines:
        m = _LAUNCHER.search(body)
        if m is not None and int(m["node_rank"]) == 0:
            return {"host": host, "nodes": int(m["nodes"]), "local": int(m["local"])}
    return {}


def _world_from_lines(lines: Sequence[tuple[str | None, str]]) -> int | None:
    sizes = [int(m["n"]) for _, body in lines if (m := _DIST_WORLD.search(body) or _NEOX_WORLD.search(body))]
    # the launcher process itself reports a world of 1 before the ranks start
    return max(sizes) if sizes and max(sizes) > 0 else None


def _parse_iterations(
    lines: Sequence[tuple[str | None, str]], rank0_host: str | None
) -> tuple[list[tuple[int, float]], list[tuple[int | None, dict[str, float]]]]:
    hits = [(host, m, body) for host, body in lines if (m := _ITERATION.search(body))]
    hosts = {host for host, _, _ in hits}
    # only one rank prints these lines; when rank 0's host is unknown or silent, keep the first printer
    keep = rank0_host if rank0_host in hosts else (hits[0][0] if hits else None)
    iterations: list[tuple[int, float]] = []
    timers: list[tuple[int | None, dict[str, float]]] = []
    pending: dict[str, float] = {}
    seen: set[int] = set()
    for host, body in lines:
        if host != keep:
            continue
        t = _TIMERS.search(body)
        if t is not None:
            pending.update({m["name"]: float(m["ms"]) for m in _TIMER_ITEM.finditer(t["body"])})
            continue
        m = _ITERATION.search(body)
        if m is None:
            continue
        it = int(m["it"])
        if pending:
            timers.append((it, pending))
            pending = {}
        if it not in seen:
            seen.add(it)
            iterations.append((it, float(m["ms"])))
    if pending:
        timers.append((None, pending))
    return iterations, timers


# --- value helpers -----------------------------------------------------------------------------------


def _literal(raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _int(raw: Any) -> int | None:
    if raw is None or isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    text = str(raw).strip().replace(",", "")
    try:
        return int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            return None
        return int(value) if math.isfinite(value) and value.is_integer() else None


def _first_int(*candidates: Any) -> int | None:
    return next((v for c in candidates if (v := _int(c)) is not None), None)


def _positive(value: int | None) -> int | None:
    return value if value is not None and value > 0 else None


def _bool(raw: str | None) -> bool | None:
    if raw is None:
        return None
    return {"true": True, "false": False}.get(raw.strip().lower())


def _precision(args: Mapping[str, str]) -> str | None:
    stated = args.get("precision", "").strip().lower()
    if stated in {"fp16", "bf16", "fp32", "float16", "bfloat16", "float32"}:
        return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(stated, stated)
    for name in ("bf16", "fp16"):
        block = _literal(args.get(name))
        if isinstance(block, dict) and block.get("enabled"):
            return name
    return None


def _present(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _span(iterations: Iterable[int]) -> str:
    its = list(iterations)
    contiguous = its == list(range(its[0], its[-1] + 1))
    return f"{its[0]}-{its[-1]}" if contiguous and len(its) > 1 else ",".join(map(str, its))
