"""Tiny traces built in code: rows of ``schema.EVENTS`` with small integer timestamps."""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from tracecal.schema import EVENTS, arrow_schema

GPU = {"kernel", "memcpy", "memset"}


def events(rows: list[dict[str, Any]], rank: int = 0) -> pl.DataFrame:
    """An events frame: each row gives kind, name, ts, dur (ns) and any other EVENTS column.

    ``event_id`` is the row index unless given; CPU rows default to pid 1 / tid 1, GPU rows to
    pid 0 / stream 7.
    """
    full = []
    for i, r in enumerate(rows):
        kind = r["kind"]
        base: dict[str, Any] = {c: None for c in EVENTS.column_names}
        base.update(
            run_id=None,
            rank=rank,
            event_id=i,
            category=kind,
            pid=0 if kind in GPU else 1,
            tid=7 if kind in GPU else 1,
            device=0 if kind in GPU else None,
            stream=7 if kind in GPU else None,
        )
        base.update({k: v for k, v in r.items() if k not in ("ts", "dur")})
        base["ts_ns"] = r["ts"]
        base["dur_ns"] = r.get("dur")
        full.append(base)
    frame = pl.from_arrow(pa.Table.from_pylist(full, schema=arrow_schema(EVENTS)))
    assert isinstance(frame, pl.DataFrame)
    return frame


def step(n: int, ts: int, dur: int, **kw: Any) -> dict[str, Any]:
    return {"kind": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur, **kw}


def op(name: str, ts: int, dur: int, **kw: Any) -> dict[str, Any]:
    return {"kind": "cpu_op", "name": name, "ts": ts, "dur": dur, **kw}


def launch(corr: int, ts: int, dur: int = 2, **kw: Any) -> dict[str, Any]:
    return {"kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": dur, "correlation": corr, **kw}


def kernel(name: str, corr: int, ts: int, dur: int, **kw: Any) -> dict[str, Any]:
    return {"kind": "kernel", "name": name, "ts": ts, "dur": dur, "correlation": corr, **kw}
