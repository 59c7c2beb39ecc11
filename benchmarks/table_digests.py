"""Digest every table and view after ingesting every shared trace and decoded run, to show that a
refactor leaves the stored rows unchanged.

    python benchmarks/table_digests.py --out before.json          # on the old tree
    python benchmarks/table_digests.py --out after.json --compare before.json

Each input is ingested with ``trace-ingest -j1`` into its own fresh database (in a temporary
directory), then every base table and view is reduced to its row count and an order-independent
digest: DuckDB's ``hash`` of each whole row, XOR-ed and summed over the rows. Columns that record the
moment or cost of an ingest (``VOLATILE``) and the schema fingerprint (``BUILD_ROWS``) are left out.
``--compare`` prints each table whose digest moved and exits 1 if any did.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# Columns that differ between two ingests of the same input: when and how long, by which build, and
# the name of the run's folder in the event store (a random token per ingest).
VOLATILE = {
    "runs": {"ingest_seconds", "ingested_at", "tool_version", "events_dir"},
    "samples_overview": {"last_sampled_at"},
}
# Rows that name the build rather than the data: the fingerprint of the schema's .sql files moves with
# any edit to them (a comment included), which the rows of every other table show or not by themselves.
BUILD_ROWS = {"tracecal_meta": "key <> 'schema_fingerprint'"}


def shared_inputs(shared: Path) -> list[Path]:
    """Every run directory and single-file trace in the shared data that ``trace-ingest`` reads."""
    kineto = shared / "traces" / "kineto"
    inputs = [kineto / "dlrm_8rank", kineto / "sampled_2_of_128"]
    inputs += sorted((kineto / "single").glob("*.json.gz"))
    inputs += sorted((shared / "traces" / "nsys").glob("*.sqlite.gz"))
    inputs += sorted(p for p in (shared / "gpumodeling25" / "runs" / "perlmutter").iterdir() if p.is_dir())
    inputs += sorted(p for p in (shared / "gpu" / "h200").iterdir() if (p / "run.json").exists())
    return inputs


def digest_database(db: Path) -> dict[str, list[int]]:
    """``{table or view: [rows, xor of row hashes, sum of row hashes mod 2**64]}``."""
    con = duckdb.connect(str(db), read_only=True)
    con.execute("SET file_search_path = ?", [str(db.parent)])  # where the events view's files are
    try:
        names = [
            row[0]
            for row in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' ORDER BY 1"
            ).fetchall()
        ]
        digests: dict[str, list[int]] = {}
        for name in names:
            columns = [
                row[0]
                for row in con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position",
                    [name],
                ).fetchall()
                if row[0] not in VOLATILE.get(name, set())
            ]
            row_struct = ", ".join(f'"{c}"' for c in columns)
            count, xor, total = con.execute(
                f"SELECT count(*), coalesce(bit_xor(h), 0), coalesce(sum(h::HUGEINT) % 18446744073709551616, 0) "
                f'FROM (SELECT hash(struct_pack({row_struct})) AS h FROM "{name}" WHERE {BUILD_ROWS.get(name, "true")})'
            ).fetchone()
            digests[name] = [int(count), int(xor), int(total)]
        return digests
    finally:
        con.close()


def ingest_and_digest(path: Path, scratch: Path) -> dict[str, list[int]]:
    db = scratch / f"{path.name}.duckdb"
    result = subprocess.run(
        ["trace-ingest", str(path), "--db", str(db), "-j1"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        print(f"{path.name}: trace-ingest exited {result.returncode}: {result.stderr.strip()}", file=sys.stderr)
        return {"<ingest failed>": [result.returncode, 0, 0]}
    return digest_database(db)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file the digests are written to")
    parser.add_argument("--compare", type=Path, help="digests of an earlier tree to compare with")
    parser.add_argument("--shared", type=Path, default=SHARED, help="the shared data folder")
    args = parser.parse_args()

    digests: dict[str, dict[str, list[int]]] = {}
    with tempfile.TemporaryDirectory(prefix="tracecal-digests-") as scratch:
        for path in shared_inputs(args.shared):
            key = str(path.relative_to(args.shared))
            digests[key] = ingest_and_digest(path, Path(scratch))
            rows = sum(d[0] for d in digests[key].values())
            print(f"{key}: {len(digests[key])} tables and views, {rows} rows", flush=True)
    args.out.write_text(json.dumps(digests, indent=1, sort_keys=True))

    if args.compare is None:
        return 0
    earlier = json.loads(args.compare.read_text())
    moved = [
        f"{run} {table}: {earlier.get(run, {}).get(table)} -> {digests.get(run, {}).get(table)}"
        for run in sorted(set(earlier) | set(digests))
        for table in sorted(set(earlier.get(run, {})) | set(digests.get(run, {})))
        if earlier.get(run, {}).get(table) != digests.get(run, {}).get(table)
    ]
    print("\n".join(moved) if moved else "every table and view is row-identical")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
