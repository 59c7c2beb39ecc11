"""Nsight export ingest speed: tracecal's reader vs a naive row-dict reader, in one run.

    python benchmarks/ingest_nsys.py                 # the shared 2xH100 export, plus a 20x replica
    python benchmarks/ingest_nsys.py --copies 50 --repeat 5

Cases, each timed ``--repeat`` times (best run reported):
- ``parse_nsys_file(.sqlite.gz)``: what ``trace-ingest`` does (decompression included);
- ``parse_nsys_file(.sqlite)``: the same on the decompressed file;
- ``naive dicts``: ``SELECT *`` per table with ``sqlite3.Row`` dicts, names looked up in a Python
  dict, ``pa.Table.from_pylist`` (the pattern tracecal avoids) — same tables, no NVTX parsing;
- the same two readers on a replica whose activity tables hold ``--copies`` copies of the rows
  (times shifted by the capture window), to see throughput beyond start-up costs.

Also prints the peak resident memory of a fresh process parsing each uncompressed file. Prints wall
and CPU seconds, rows/s and MB/s of the input file (wall time), and each case's wall time
relative to tracecal on the same file. On a shared machine compare the CPU seconds too.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from tracecal.sources.nsys import tables as nsys_tables
from tracecal.sources.nsys.parser import parse_nsys_file

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "nsys" / "mfu_2gpu_after.sqlite.gz"
WINDOW_NS = 300_000_000  # the shared export is trimmed to 300 ms


def naive_rows(path: Path) -> int:
    """The straightforward reader: one dict per row, then Arrow from the dicts."""
    con = sqlite3.connect(path)
    con.row_factory = sqlite3.Row
    strings = dict(con.execute("SELECT id, value FROM StringIds").fetchall())
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    n = 0
    for table in nsys_tables.READERS:
        if table not in tables:
            continue
        records = []
        for row in con.execute(f"SELECT * FROM {table}"):
            d = dict(row)
            for key in ("demangledName", "nameId", "textId"):
                if d.get(key) is not None:
                    d[key] = strings.get(d[key])
            d["dur_ns"] = d["end"] - d["start"] if d["end"] is not None else None
            d.pop("binaryData", None)
            records.append(d)
        n += pa.Table.from_pylist(records).num_rows
    con.close()
    return n


def tracecal_rows(path: Path) -> int:
    return sum(r.events.num_rows for r in parse_nsys_file(path))


def replicate(src: Path, dst: Path, copies: int) -> None:
    """Append ``copies - 1`` time-shifted copies of every activity table's rows."""
    shutil.copy(src, dst)
    con = sqlite3.connect(dst)
    for table in nsys_tables.READERS:
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
        if not cols:
            continue
        for k in range(1, copies):
            exprs = [f'"{c}" + {k * WINDOW_NS}' if c in ("start", "end") else f'"{c}"' for c in cols]
            con.execute(f'INSERT INTO "{table}" SELECT {", ".join(exprs)} FROM "{table}" WHERE start < ?', (
                con.execute(f'SELECT min(start) FROM "{table}"').fetchone()[0] + WINDOW_NS,))  # fmt: skip
    con.commit()
    con.execute("VACUUM")
    con.close()


def best_of(fn: Callable[[Path], int], path: Path, repeat: int) -> tuple[int, float, float]:
    """Rows, best wall seconds, best CPU seconds of this process (less sensitive to a busy machine)."""
    walls, cpus, rows = [], [], 0
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        rows = fn(path)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return rows, min(walls), min(cpus)


def peak_rss_mb(path: Path) -> float:
    """Peak resident memory of a fresh process that parses ``path`` (imports included), MB."""
    code = "import sys; from pathlib import Path; from tracecal.sources.nsys.parser import parse_nsys_file; " \
           "parse_nsys_file(Path(sys.argv[1]))"  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", code, str(path)])
    _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"parsing {path} failed in the child process")
    return usage.ru_maxrss / 1024  # Linux reports KiB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", type=Path, default=SHARED, help="an .sqlite.gz Nsight export")
    parser.add_argument("--copies", type=int, default=20, help="row copies in the replica (default 20)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the best is reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "export.sqlite"
        with gzip.open(args.export, "rb") as f, plain.open("wb") as g:
            shutil.copyfileobj(f, g)
        big = Path(tmp) / f"replica_x{args.copies}.sqlite"
        replicate(plain, big, args.copies)
        big_gz = Path(tmp) / (big.name + ".gz")
        with big.open("rb") as f, gzip.open(big_gz, "wb", compresslevel=6) as g:
            shutil.copyfileobj(f, g)
        # first, while this process is small: a forked child's peak RSS starts from the parent's
        rss = {p.name: (p.stat().st_size / 1e6, peak_rss_mb(p)) for p in (plain, big)}
        cases = [
            ("tracecal", args.export, tracecal_rows),
            ("tracecal", plain, tracecal_rows),
            ("naive dicts", plain, naive_rows),
            ("tracecal", big_gz, tracecal_rows),
            ("tracecal", big, tracecal_rows),
            ("naive dicts", big, naive_rows),
        ]
        print(f"{'case':<12} {'file':<26} {'MB':>6} {'rows':>7} {'wall s':>7} {'cpu s':>6} {'rows/s':>8} "
              f"{'MB/s':>5} {'x tracecal':>10}")  # fmt: skip
        reference: dict[str, float] = {}
        for label, path, fn in cases:
            rows, secs, cpu = best_of(fn, path, args.repeat)
            mb = path.stat().st_size / 1e6
            key = path.name.removesuffix(".gz")
            if label == "tracecal" and path.suffix != ".gz":
                reference[key] = secs
            ratio = f"{secs / reference[key]:.2f}" if key in reference else "-"
            print(f"{label:<12} {path.name:<26} {mb:>6.2f} {rows:>7} {secs:>7.3f} {cpu:>6.2f} {rows / secs:>8.0f} "
                  f"{mb / secs:>5.1f} {ratio:>10}")  # fmt: skip
        for name, (mb, peak) in rss.items():
            print(f"peak RSS of a process parsing {name} ({mb:.1f} MB): {peak:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
