"""Ingest at realistic rank sizes: MB/s per CPU-second and peak RSS from 0.3 to 7 GB, and 1 -> 2 workers.

    python benchmarks/ingest_scale.py                        # 0.3, 1, 3, 7 GB ranks, then 8 x 1 GB ranks
    python benchmarks/ingest_scale.py --sizes 0.3 1 --hta    # HTA side by side on each size
    python benchmarks/ingest_scale.py --sizes 1 3 --no-run   # single ranks only

Rank files are synthetic-from-real: ``--source``'s events replicated with shifted timestamps into one
uncompressed JSON file of at least the size (``ingest_vs_hta.stress`` makes them the same way), in a
temporary directory under ``--tmp`` that is deleted afterwards. Each case runs in a fresh process
(``ingest_vs_hta._run_child``: CPU time of every process and peak RSS of the largest, from the kernel's
accounting): ``trace-ingest -j1`` into a new database, parse + load and then decode. The run of 8 ranks is
one 1 GB file without ``distributedInfo``, linked as ``rank-0.json`` ... ``rank-7.json``.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest_vs_hta import STRESS_SOURCE, _run_child, machine_ceiling


def make_rank_file(source: Path, size_gb: float, path: Path, *, distributed: bool = True) -> int:
    """Write ``source``'s events, replicated with shifted timestamps, into ``path`` until it holds
    at least ``size_gb`` GB; returns its size. ``distributed=False`` drops ``distributedInfo`` (the
    rank then comes from the file name)."""
    import orjson

    with gzip.open(source, "rb") as handle:
        document = orjson.loads(handle.read())
    events = document.pop("traceEvents")
    if not distributed:
        document.pop("distributedInfo", None)
    stamped = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in stamped) - min(e["ts"] for e in stamped)
    target = int(size_gb * 1e9)
    written = 0
    with path.open("wb") as out:
        out.write(orjson.dumps(document)[:-1] + b', "traceEvents": [')
        copy = 0
        while written < target:
            shift = round(copy * (span + 1000.0), 3)
            chunk = orjson.dumps([{**e, "ts": round(e["ts"] + shift, 3)} if "ts" in e else e for e in events])
            out.write((b"," if copy else b"") + chunk[1:-1])
            written += len(chunk)
            copy += 1
        out.write(b"]}")
    return path.stat().st_size


def _row(label: str, size: int, r: dict[str, Any], base: float | None) -> tuple[str, float]:
    load_rate = size / 1e6 / r["load_cpu"]
    rate = size / 1e6 / r["cpu"]
    versus = f"{100 * (rate / base - 1):+5.0f} %" if base else "      "
    peak = max(r["main_rss"], r["worker_rss"])
    return (
        f"{label:>10s} {size / 1e9:6.2f} {r['events']:>11,} {r['load_cpu']:8.1f} {load_rate:7.1f} "
        f"{r['load_rss'] / 1e9:7.2f} {r['cpu']:8.1f} {rate:7.1f} {versus} {peak / 1e9:7.2f} {r['wall']:7.1f}",
        rate,
    )


def sizes_table(sizes: list[float], source: Path, tmp: Path, hta: bool) -> None:
    print(
        f"{'case':>10s} {'GB':>6s} {'events':>11s} {'load':>8s} {'MB/s':>7s} {'RSS GB':>7s} "
        f"{'+decode':>8s} {'MB/s':>7s} {'vs 1st':>7s} {'RSS GB':>7s} {'wall s':>7s}"
    )
    base: float | None = None
    for size_gb in sizes:
        run = tmp / f"rank_{size_gb:g}GB"
        run.mkdir()
        path = run / "rank-0.json"
        started = time.perf_counter()
        size = make_rank_file(source, size_gb, path)
        made = time.perf_counter() - started
        line, rate = _row(f"{size_gb:g} GB", size, _run_child("tracecal-j1", path), base)
        base = base or rate
        print(line + f"   (file made in {made:.0f} s)", flush=True)
        if hta:
            h = _run_child("hta", path)
            if "failed" in h:
                print(f"{'HTA':>10s} failed: {h['failed'][:100]}", flush=True)
            else:
                print(
                    f"{'HTA':>10s} {size / 1e9:6.2f} {h['events']:>11,} {h['cpu']:8.1f} {size / 1e6 / h['cpu']:7.1f} "
                    f"{max(h['main_rss'], h['worker_rss']) / 1e9:7.2f}   (TraceAnalysis; tracecal is "
                    f"{h['cpu'] / (size / 1e6 / rate):.1f}x faster per CPU-second with decode)",
                    flush=True,
                )
        shutil.rmtree(run)
    print(
        "load: parse + load CPU-s (all processes); MB/s: MB of JSON per CPU-second; RSS: peak of the largest "
        "process;\n+decode: the whole ingest with decode; vs 1st: its MB/s per CPU-second against the first size"
    )


def workers_table(ranks: int, size_gb: float, source: Path, tmp: Path) -> None:
    run = tmp / f"{ranks}x{size_gb:g}GB"
    run.mkdir()
    one = tmp / "one_rank.json"
    size = make_rank_file(source, size_gb, one, distributed=False)
    for rank in range(ranks):
        os.symlink(one, run / f"rank-{rank}.json")
    results = {j: _run_child(f"tracecal-j{j}", run) for j in (1, 2)}
    for j, r in results.items():
        print(
            f"-j{j}: {ranks} x {size / 1e9:.2f} GB: parse + load {r['load']:.1f} s wall, {r['load_cpu']:.1f} CPU-s; "
            f"with decode {r['wall']:.1f} s wall, {r['cpu']:.1f} CPU-s "
            f"({ranks * size / 1e6 / r['cpu']:.1f} MB/s per CPU-second); peak RSS main "
            f"{r['main_rss'] / 1e9:.2f} GB, largest worker {r['worker_rss'] / 1e9:.2f} GB",
            flush=True,
        )
    j1, j2 = results[1], results[2]
    print(
        f"1 -> 2 workers: parse + load {j1['load'] / j2['load']:.2f}x, with decode {j1['wall'] / j2['wall']:.2f}x "
        f"(wall); two processes of pure-Python work on this machine now: {machine_ceiling():.2f}x"
    )
    shutil.rmtree(run)
    one.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="*", default=[0.3, 1.0, 3.0, 7.0], help="rank sizes, GB")
    parser.add_argument("--ranks", type=int, default=8, help="ranks of the 1 -> 2 workers run (0: none)")
    parser.add_argument("--rank-gb", type=float, default=1.0, help="size of each rank of that run")
    parser.add_argument("--no-run", action="store_true", help="single ranks only")
    parser.add_argument("--hta", action="store_true", help="HTA's TraceAnalysis on each size too")
    parser.add_argument("--source", type=Path, default=STRESS_SOURCE, help="real trace the files replicate")
    parser.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()), help="where the files are made")
    args = parser.parse_args()
    free = shutil.disk_usage(args.tmp).free / 1e9
    need = max([*args.sizes, 0.0]) * 1.3 + (0 if args.no_run else args.rank_gb * 1.3 * args.ranks)
    print(f"{free:.0f} GB free in {args.tmp}; the largest case needs about {need:.0f} GB (JSON, database)")
    with tempfile.TemporaryDirectory(prefix="tracecal-scale-", dir=args.tmp) as tmp:
        if args.sizes:
            sizes_table(args.sizes, args.source, Path(tmp), args.hta)
        if not args.no_run and args.ranks:
            workers_table(args.ranks, args.rank_gb, args.source, Path(tmp))


if __name__ == "__main__":
    main()
