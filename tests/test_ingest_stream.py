"""Streamed parsing: a document above ``DIRECT_DECODE_BYTES`` is decoded chunk by chunk (``event_chunks``)
and gives the rows the whole-document decoder gives; its events can be spilled to Parquet and loaded."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import KINETO
from tracecal.errors import TraceFormatError
from tracecal.ingest import event_chunks
from tracecal.ingest.trace import EventsFile
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.schema import EVENTS, RUN_TABLES
from tracecal.sources.kineto import parser
from tracecal.sources.kineto.parser import parse_kineto_file
from tracecal.sql.connection import open_database

SHARED = [
    KINETO / "single" / "v100_resnet50_2021_schema.pt.trace.json.gz",  # a top-level array
    KINETO / "single" / "h100_bert_small_inference.json.gz",  # metadata after the events
    KINETO / "single" / "cpu_gloo_rank-34_of_300.pt.trace.json.gz",
    next((KINETO / "dlrm_8rank").glob("worker0_*")),
]


def _plain(table: pa.Table) -> pa.Table:
    """Dictionary columns decoded, one chunk: tables compared by value."""
    columns = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in table.columns]
    return pa.table(columns, names=table.column_names).combine_chunks()


def _facts(parsed: object) -> dict[str, object]:
    skip = {"events", "metadata"}  # metadata: the streamed header keeps every small key (not stored)
    return {f.name: getattr(parsed, f.name) for f in dataclasses.fields(parsed) if f.name not in skip}  # type: ignore[arg-type]


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every document streamed, in chunks of a few events."""
    monkeypatch.setattr(parser, "DIRECT_DECODE_BYTES", 0)
    monkeypatch.setattr(event_chunks, "CHUNK_BYTES", 1500)


@pytest.mark.parametrize("path", SHARED, ids=lambda p: p.name[:30])
def test_streamed_parse_gives_the_whole_document_rows(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = parse_kineto_file(path)
    monkeypatch.setattr(parser, "DIRECT_DECODE_BYTES", 0)
    monkeypatch.setattr(event_chunks, "CHUNK_BYTES", 20_000)
    streamed = parse_kineto_file(path)
    assert isinstance(whole.events, pa.Table) and isinstance(streamed.events, pa.Table)
    assert _plain(streamed.events).equals(_plain(whole.events))
    assert _facts(streamed) == _facts(whole)


def test_spilled_events_are_the_rows_in_a_parquet_file(tmp_path: Path, streamed: None) -> None:
    path = SHARED[-1]
    kept = parse_kineto_file(path)
    spilled = parse_kineto_file(path, tmp_path)
    assert isinstance(spilled.events, EventsFile) and isinstance(kept.events, pa.Table)
    assert spilled.events.rows == kept.events.num_rows
    kernels = sum(1 for kind in kept.events.column("kind").to_pylist() if kind == "kernel")
    assert spilled.events.kernels == kernels > 0
    assert _plain(pq.read_table(spilled.events.path)).equals(_plain(kept.events))


def test_a_spill_holds_ts_statistics_so_a_time_range_reads_only_its_row_groups(tmp_path: Path, streamed: None) -> None:
    """Decode windows read a shard by time range (decode_window_events.sql): each row group says the
    range of its ts_ns, so DuckDB skips the others instead of reading the whole shard per window."""
    spilled = parse_kineto_file(SHARED[-1], tmp_path)
    assert isinstance(spilled.events, EventsFile)
    meta = pq.ParquetFile(spilled.events.path).metadata
    ts = meta.schema.names.index("ts_ns")
    ranges = [meta.row_group(g).column(ts).statistics for g in range(meta.num_row_groups)]
    assert len(ranges) > 10 and all(r is not None and r.has_min_max for r in ranges)
    middle = ranges[len(ranges) // 2]
    overlapping = sum(1 for r in ranges if r.min <= middle.max and r.max >= middle.min)
    assert overlapping < len(ranges)
    with duckdb.connect() as con:
        plan = con.execute(
            "EXPLAIN ANALYZE SELECT count(*) FROM read_parquet(?) WHERE ts_ns >= ? AND ts_ns <= ?",
            [str(spilled.events.path), middle.min, middle.max],
        ).fetchall()[0][1]
    assert f"Row Groups Scanned: {overlapping} / {len(ranges)}" in plan


def test_a_spill_dictionary_encodes_its_text_columns_only(tmp_path: Path, streamed: None) -> None:
    """Ids and times are nearly all distinct: no dictionary is built for them (one would be dropped for
    plain pages once full); names, kinds and shapes repeat and are dictionary pages."""
    spilled = parse_kineto_file(SHARED[-1], tmp_path)
    assert isinstance(spilled.events, EventsFile)
    group = pq.ParquetFile(spilled.events.path).metadata.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
    assert all("RLE_DICTIONARY" in encodings[c] for c in ("kind", "name", "category"))
    assert not any("RLE_DICTIONARY" in encodings[c] for c in ("event_id", "ts_ns", "correlation", "dur_ns"))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_boundaries_inside_strings_and_nested_values_are_not_cuts(tmp_path: Path, streamed: None) -> None:
    """Event names holding ``},{`` and args holding lists of objects: every chunk still ends after an event."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "x},{" * (i % 50), "ts": i, "dur": 1, "args": {"Input Dims": [[i, 2]]}}
        for i in range(300)
    ]
    for i in range(0, 300, 7):
        events[i]["args"]["Concrete Inputs"] = [{"a": 1}, {"b": "}, {"}] * 20  # type: ignore[index]
    path = _write(tmp_path / "t.json", json.dumps({"schemaVersion": 1, "traceEvents": events, "traceName": "]"}))
    rows = parse_kineto_file(path).events.to_pylist()
    assert [r["name"] for r in rows] == [e["name"] for e in events]
    assert [r["event_id"] for r in rows] == list(range(300))


def test_a_gzip_document_streams_like_the_plain_one(tmp_path: Path, streamed: None) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "ts": i, "dur": 1} for i in range(200)]
    text = json.dumps({"traceEvents": events})
    plain = _write(tmp_path / "rank-0.json", text)
    packed = tmp_path / "rank-1.json.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert _plain(parse_kineto_file(packed).events).equals(_plain(parse_kineto_file(plain).events))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"traceEvents": [' + '{"ph": "X", "name": "a", "ts": 1, "dur": 1},' * 60, "truncated"),
        ('{"traceEvents": [' + '{"ph": "X", "name": "a", "ts": 1, "dur": 1},' * 60 + "{] }", "invalid JSON"),
        (
            '{"traceEvents": [{"ph": "X" "name": "a"}' + ', {"ph": "X", "name": "a", "ts": 1}' * 60 + "]}",
            "invalid JSON",
        ),
        ('{"config": {"lr": 0.1}, "layers": [' + "1, " * 600 + "1]}", "not a Kineto trace"),
    ],
    ids=["truncated", "damaged-end", "damaged-start", "not-a-trace"],
)
def test_damaged_streamed_documents_name_the_file(tmp_path: Path, streamed: None, text: str, message: str) -> None:
    path = _write(tmp_path / "rank-0.json", text)
    with pytest.raises(TraceFormatError, match=rf"rank-0\.json: .*{message}"):
        parse_kineto_file(path)


def test_an_event_error_in_a_later_chunk_names_its_index_in_the_file(tmp_path: Path, streamed: None) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": i, "dur": 1} for i in range(200)]
    del events[150]["ts"]
    path = _write(tmp_path / "t.json", json.dumps({"traceEvents": events}))
    with pytest.raises(TraceFormatError, match=r"t\.json: event 150 \(ph X\) has no 'ts'"):
        parse_kineto_file(path)


def _rows(db: Path) -> dict[str, list[tuple[object, ...]]]:
    with open_database(Path(db), read_only=True) as con:
        return {
            t.name: sorted(
                con.execute(f"SELECT * EXCLUDE (ingest_seconds, ingested_at, events_dir) FROM {t.name}").fetchall(),
                key=repr,
            )
            if t.name == "runs"
            else sorted(con.execute(f"SELECT * FROM {t.name}").fetchall(), key=repr)
            for t in (*RUN_TABLES, EVENTS)
        }


def test_a_run_of_spilled_ranks_stores_the_rows_of_held_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "dlrm"
    shutil.copytree(KINETO / "dlrm_8rank", run)
    dbs = []
    for name in ("held", "spilled"):
        if name == "spilled":
            monkeypatch.setattr(parser, "DIRECT_DECODE_BYTES", 0)
            monkeypatch.setattr(event_chunks, "CHUNK_BYTES", 50_000)
        db = tmp_path / f"{name}.duckdb"
        with open_database(db) as con:
            ingest_runs(con, [run], IngestOptions(workers=1))
        dbs.append(_rows(db))
    assert dbs[0] == dbs[1]
    assert len(dbs[0]["events"]) > 10_000 and dbs[0]["operators"]


def test_values_of_earlier_chunks_stay_intact_while_they_are_kept(tmp_path: Path, streamed: None) -> None:
    """The window's buffers are reused only when no decoded value points into them: a consumer that
    keeps every chunk's events (their raw ``Input Dims`` slices point into the buffers) reads them intact."""
    from functools import partial

    from tracecal.sources.kineto.events import decode_events

    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "ts": i, "dur": 1, "args": {"Input Dims": [[i, i + 1]]}}
        for i in range(400)
    ]
    path = _write(tmp_path / "t.json", json.dumps({"traceEvents": events}))
    data = path.read_bytes()
    blocks = iter([data[i : i + 700] for i in range(700, len(data), 700)])
    _, chunks = event_chunks.open_document(path, data[:700], blocks, partial(decode_events, path))
    kept = [event for _, decoded, _ in chunks for event in decoded]  # every chunk held to the end
    assert [json.loads(bytes(e.args.input_dims)) for e in kept] == [[[i, i + 1]] for i in range(400)]
