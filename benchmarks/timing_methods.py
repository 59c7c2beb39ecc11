"""How far each way of timing a GPU call reads from the kernel's own duration, on the traced GEMM shapes.

Usage:
    python benchmarks/timing_methods.py [--probe FILE]          # summarise a probe file
    python benchmarks/timing_methods.py --measure [--out DIR]   # on a CUDA GPU: measure, write, summarise

A probe file is a JSON list of rows ``{m, n, k, layout, <method>: µs, ...}``: bf16 ``[m, k] x [k, n]``
GEMMs with each operand as stored (N) or transposed (T), the median duration per method. The
reference is the profiler's kernel duration (``profiler``, or ``prof_flush`` in the shared H200
probe), which is what a GPU trace records; every other method is printed as its difference to it.

Without ``--measure`` the file is ``--probe`` (default: ``../shared/data/gpu/h200/timing_probe.json``,
recorded on an H200 before tracecal had its burst method: one call between CUDA events with and
without an L2 flush, a burst of 50 calls between events, the profiler with and without the flush).
With ``--measure`` the probe's shapes are timed by tracecal's own methods (``samplers.timing``:
``cuda_events``, ``cuda_burst``, ``profiler``, the L2 flush on, 20 repeats) on this machine's first
GPU, written to ``DIR/timing_methods.json`` (``DIR`` defaults to ``$OUT``) and summarised the same
way. ``benchmarks/gpu_check.sh`` runs it. docs/samples.md#timing cites the result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

SHARED_PROBE = Path(__file__).resolve().parents[2] / "shared" / "data" / "gpu" / "h200" / "timing_probe.json"
SHAPE_KEYS = ("m", "n", "k", "layout")
REFERENCES = ("profiler", "prof_flush")
MEASURED = ("cuda_events", "cuda_burst", "profiler")


def reference_of(rows: list[dict]) -> str:
    """The reference column of a probe: the profiler's kernel duration with the L2 flush."""
    for name in REFERENCES:
        if rows and all(name in r for r in rows):
            return name
    raise SystemExit(f"the probe has no reference column ({' or '.join(REFERENCES)})")


def summary(rows: list[dict]) -> list[str]:
    """Markdown: per shape each method's µs and % over the reference, then per method the range."""
    ref = reference_of(rows)
    methods = [k for k in rows[0] if k not in SHAPE_KEYS and k != ref]
    lines = [
        f"| m × n × k | layout | {ref} µs | " + " | ".join(f"{m} %" for m in methods) + " |",
        "|---|---|---:|" + "---:|" * len(methods),
    ]
    for r in rows:
        cells = " | ".join(f"{100 * (r[m] / r[ref] - 1):+.1f}" for m in methods)
        lines.append(f"| {r['m']}×{r['n']}×{r['k']} | {r['layout']} | {r[ref]:.1f} | {cells} |")
    lines += ["", f"| method | vs {ref}: min % | median % | max % | median µs over |", "|---|---:|---:|---:|---:|"]
    for m in methods:
        pct = [100 * (r[m] / r[ref] - 1) for r in rows]
        over = [r[m] - r[ref] for r in rows]
        middle, median_over = statistics.median(pct), statistics.median(over)
        lines.append(f"| {m} | {min(pct):+.1f} | {middle:+.1f} | {max(pct):+.1f} | {median_over:+.2f} |")
    return lines


def measure(shapes: list[dict], repeats: int = 20) -> list[dict]:
    """Time each probe shape by tracecal's CUDA methods on GPU 0; the medians in µs."""
    import torch

    from tracecal.samplers.timing import time_call

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: --measure times on a GPU; without it the probe file is summarised")
    out = []
    for s in shapes:
        m, n, k, layout = (s[key] for key in SHAPE_KEYS)
        a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t() if layout[0] == "T" else None
        a = a if a is not None else torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() if layout[1] == "T" else None
        b = b if b is not None else torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        row = dict(zip(SHAPE_KEYS, (m, n, k, layout), strict=True))
        for method in MEASURED:
            durations = time_call(lambda a=a, b=b: torch.mm(a, b), "cuda", 3, repeats, method=method)
            row[method] = statistics.median(durations) / 1e3  # ns -> µs
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", type=Path, default=SHARED_PROBE)
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = parser.parse_args(argv)
    rows = json.loads(args.probe.read_text())
    if args.measure:
        shapes = list({tuple(r[k] for k in SHAPE_KEYS): {k: r[k] for k in SHAPE_KEYS} for r in rows}.values())
        rows = measure(shapes)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "timing_methods.json").write_text(json.dumps(rows, indent=1))
    text = "\n".join(summary(rows))
    print(text)
    if args.measure and args.out is not None:
        (args.out / "timing_methods.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
