"""The Kineto parser on tiny traces built in code, whose expected rows can be checked by hand."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import KINETO
from tracecal.errors import TraceFormatError
from tracecal.ingest import event_chunks
from tracecal.ingest.files import trace_blocks
from tracecal.sources.kineto import parser
from tracecal.sources.kineto.parser import parse_kineto_file


def _write(path: Path, events: list[dict[str, object]], **top: object) -> Path:
    path.write_text(json.dumps({"traceEvents": events, **top}))
    return path


def _rows(path: Path) -> list[dict[str, object]]:
    return parse_kineto_file(path).events.to_pylist()


def test_float_microseconds_round_to_the_nearest_nanosecond(tmp_path: Path) -> None:
    # 4458676522690.655 µs * 1000 is 4458676522690654.5 in float64: truncation would lose 1 ns.
    text = '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 4458676522690.655, "dur": 156.777}]}'
    (tmp_path / "t.json").write_text(text)
    (row,) = _rows(tmp_path / "t.json")
    assert (row["ts_ns"], row["dur_ns"]) == (4458676522690655, 156777)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=8 * 10**15), min_size=1, max_size=20))
def test_kineto_float_timestamps_round_trip(tmp_path_factory: pytest.TempPathFactory, ns: list[int]) -> None:
    """Kineto writes ns / 1000 with three decimals; parsing gives the ns back exactly."""
    events = ",".join(
        f'{{"ph": "X", "cat": "cpu_op", "name": "op", "ts": {t // 1000}.{t % 1000:03d}, "dur": 1.5}}' for t in ns
    )
    path = tmp_path_factory.mktemp("rt") / "t.json"
    path.write_text(f'{{"traceEvents": [{events}]}}')
    assert [r["ts_ns"] for r in _rows(path)] == ns


def test_every_phase_keeps_its_place_and_only_complete_events_are_rows(tmp_path: Path) -> None:
    """Complete events are told from the others by ``ph`` wherever it is written; a phase outside the
    Chrome format (``Z``) sends the trace to the lenient decoder, which reads the same rows."""
    flow = {"ph": "s", "cat": "ac2g", "id": 7, "pid": 1, "tid": 1, "ts": 2}
    complete = [
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2},
        {"name": "b", "cat": "cpu_op", "ts": 3, "dur": 1, "ph": "X"},  # ph last
    ]
    for odd in ({"ph": "M", "name": "process_name", "args": {"name": "p"}}, {"ph": "Z", "cat": "odd"}):
        events = [complete[0], flow, odd, {"ph": "i", "name": "mark", "ts": 2}, complete[1]]
        rows = _rows(_write(tmp_path / "t.json", events))
        assert [(r["event_id"], r["name"], r["ts_ns"]) for r in rows] == [(0, "a", 1000), (4, "b", 3000)]
        assert parse_kineto_file(tmp_path / "t.json").schema_era == "2024"  # from the flow's category


def test_integer_microseconds_are_exact_beyond_float_precision(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.json", [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1694128201426557, "dur": 3}])
    assert _rows(path)[0]["ts_ns"] == 1694128201426557000


def test_missing_values_are_null_never_zero(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.json", [{"ph": "X", "cat": "weird_category", "name": "n", "ts": 5}])
    (row,) = _rows(path)
    assert row["kind"] == "other" and row["category"] == "weird_category"
    assert row["dur_ns"] is None and row["correlation"] is None and row["pid"] is None
    assert row["input_dims"] is None and row["device"] is None and row["bytes"] is None


def test_kinds_links_and_gpu_placement(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 7,
            "tid": 8,
            "ts": 10,
            "dur": 50,
            "args": {
                "External id": 3,
                "Input Dims": [[8, 512], [512, 1024]],
                "Input type": ["float", "float"],
                "Sequence number": 11,
                "Fwd thread id": 0,
            },
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 7,
            "tid": 8,
            "ts": 20,
            "dur": 5,
            "args": {"External id": 3, "correlation": 99},
        },
        {"ph": "f", "id": 99, "pid": 0, "tid": 7, "ts": 30, "cat": "ac2g", "name": "ac2g"},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "sgemm",
            "pid": 0,
            "tid": 7,
            "ts": 30,
            "dur": 100,
            "args": {
                "device": 0,
                "stream": 7,
                "correlation": 99,
                "External id": 3,
                "grid": [4, 1, 1],
                "block": [128, 1, 1],
            },
        },
        {"ph": "X", "cat": "gpu_user_annotation", "name": "## forward ##", "pid": 1, "tid": 13, "ts": 30, "dur": 100},
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy HtoD",
            "pid": 0,
            "tid": 7,
            "ts": 140,
            "dur": 2,
            "args": {"device": 0, "stream": 7, "correlation": 100, "bytes": "4096"},
        },
    ]
    rows = _rows(_write(tmp_path / "t.json", events))
    assert [r["kind"] for r in rows] == ["cpu_op", "cuda_runtime", "kernel", "gpu_user_annotation", "memcpy"]
    assert [r["event_id"] for r in rows] == [0, 1, 3, 4, 5]  # file order; the flow event is not stored
    op, launch, kernel, annotation, memcpy = rows
    assert (op["input_dims"], op["input_types"], op["sequence_number"]) == (
        "[[8,512],[512,1024]]",
        '["float","float"]',
        11,
    )
    assert op["device"] is None and op["stream"] is None and (op["pid"], op["tid"]) == (7, 8)
    assert launch["correlation"] == kernel["correlation"] == 99
    assert launch["external_id"] == kernel["external_id"] == op["external_id"] == 3
    assert (kernel["device"], kernel["stream"], kernel["grid"], kernel["block"]) == (0, 7, "[4,1,1]", "[128,1,1]")
    assert (annotation["device"], annotation["stream"]) == (1, 13)  # from pid/tid: no args on GPU annotations
    assert memcpy["bytes"] == 4096  # ROCm writes some counts as strings


def test_collective_args(tmp_path: Path) -> None:
    args = {
        "Collective name": "send",
        "In msg nelems": 1024,
        "Out msg nelems": 1024,
        "Group size": 2,
        "dtype": "BFloat16",
        "Process Group Name": 3,
        "Process Group Description": "pp",
        "Process Group Ranks": "[0, 4]",
        "In split size": "[]",
        "Out split size": "[]",
        "Global rank start": 0,
        "Global rank stride": 4,
        "Comms Id": 17,
        "Dst Rank": 4,
    }
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 1, "dur": 1, "args": args},
    ]
    plain, comm = _rows(_write(tmp_path / "t.json", events))
    assert plain["coll_name"] is None and plain["pg_ranks"] is None
    assert (comm["coll_name"], comm["in_msg_nelems"], comm["group_size"], comm["coll_dtype"]) == (
        "send",
        1024,
        2,
        "BFloat16",
    )
    assert (comm["pg_name"], comm["pg_desc"], comm["pg_ranks"]) == ("3", "pp", "[0,4]")
    assert (comm["in_split_size"], comm["global_rank_stride"], comm["coll_seq"]) == ("[]", 4, 17)
    assert (comm["dst_rank"], comm["src_rank"]) == (4, None)


def test_2021_array_document_with_string_thread_ids(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "Operator",
            "name": "aten::conv2d",
            "pid": 5,
            "tid": "4093687616",
            "ts": 1,
            "dur": 9,
            "args": {"Input dims": [[1, 3, 224, 224]], "external id": 2},
        },
        {
            "ph": "X",
            "cat": "Kernel",
            "name": "conv",
            "pid": 0,
            "tid": "stream 7",
            "ts": 3,
            "dur": 4,
            "args": {"device": 0, "stream": 7, "correlation": 8, "external id": 2},
        },
    ]
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps(events))
    parsed = parse_kineto_file(path)
    op, kernel = parsed.events.to_pylist()
    assert parsed.schema_era == "2021" and parsed.rank is None
    assert (op["kind"], op["tid"], op["external_id"], op["input_dims"]) == ("cpu_op", 4093687616, 2, "[[1,3,224,224]]")
    assert (kernel["kind"], kernel["tid"], kernel["stream"], kernel["external_id"]) == ("kernel", None, 7, 2)


def test_streamed_decoding_matches_direct_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i % 3}", "ts": i, "dur": 1.25} for i in range(7)]
    events.insert(3, {"ph": "i", "name": "instant", "ts": 2})
    path = _write(tmp_path / "t.json", events)
    direct = parse_kineto_file(path).events
    monkeypatch.setattr(parser, "DIRECT_DECODE_BYTES", 0)
    monkeypatch.setattr(event_chunks, "CHUNK_BYTES", 100)
    batched = parse_kineto_file(path).events
    assert batched.to_pylist() == direct.to_pylist()
    assert [r["event_id"] for r in batched.to_pylist()] == [0, 1, 2, 4, 5, 6, 7]


def test_error_index_is_the_event_index_in_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": i, "dur": 1} for i in range(5)]
    events[3]["args"] = {"correlation": [1]}
    path = _write(tmp_path / "t.json", events)
    with pytest.raises(TraceFormatError, match=r"t\.json: event 3, key args\.correlation"):
        parse_kineto_file(path)
    monkeypatch.setattr(parser, "DIRECT_DECODE_BYTES", 0)
    monkeypatch.setattr(event_chunks, "CHUNK_BYTES", 100)
    with pytest.raises(TraceFormatError, match=r"t\.json: event 3, key args\.correlation"):
        parse_kineto_file(path)


def test_event_without_ph_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.json", [{"ph": "X", "name": "a", "ts": 1}, {"name": "b", "ts": 2}])
    with pytest.raises(TraceFormatError, match=r"event 1, key \(the event itself\).*ph"):
        parse_kineto_file(path)


def test_trace_without_complete_events(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.json", [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}}])
    with pytest.raises(TraceFormatError, match="no complete"):
        parse_kineto_file(path)


def test_metadata_rank_and_device(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "t.json",
        [{"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 7, "ts": 1, "dur": 1, "args": {"device": 1}}],
        distributedInfo={
            "rank": 3,
            "world_size": 8,
            "backend": "nccl",
            "nccl_version": "2.21.5",
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 8, "ranks": list(range(8))}],
        },
        deviceProperties=[{"id": 0, "name": "GPU zero"}, {"id": 1, "name": "GPU one"}],
        baseTimeNanoseconds=1711964646000000000,
        host_name="nid001",
    )
    parsed = parse_kineto_file(path)
    assert (parsed.rank, parsed.world_size, parsed.backend, parsed.host) == (3, 8, "nccl", "nid001")
    assert parsed.device_name == "GPU one"
    assert parsed.process_groups[0]["pg_size"] == 8
    assert parsed.metadata["baseTimeNanoseconds"] == 1711964646000000000
    assert parsed.metadata["nccl_version"] == "2.21.5"
    assert parsed.schema_era == "2024" and parsed.source_bytes == path.stat().st_size


def test_integers_out_of_range_or_malformed_become_null(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "pid": 0,
            "tid": 7,
            "ts": 1,
            "dur": 1,
            "args": {"correlation": 2**70, "stream": 2**40, "bytes": "12x", "device": 1.0},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "pid": 0,
            "tid": "stream 99999999999999999999999",
            "ts": 2,
            "dur": 1,
            "args": {"correlation": 5, "stream": 7, "bytes": "4096", "device": 0},
        },
    ]
    first, second = _rows(_write(tmp_path / "t.json", events))
    assert (first["correlation"], first["stream"], first["bytes"], first["device"]) == (None, None, None, 1)
    assert (second["correlation"], second["stream"], second["bytes"], second["tid"]) == (5, 7, 4096, None)


@pytest.mark.parametrize(
    ("pids", "expected"),
    [
        ([3, 4], [3, 4]),  # all ints: one typed conversion
        ([3, "Spans"], [3, None]),  # a name among ints (2024 traces)
        (["12", "stream 7"], [12, None]),  # digits as text (2021 traces)
        ([2**63, 5], [None, 5]),  # beyond int64: NULL, never wrapped
    ],
)
def test_process_ids_as_ints_text_or_out_of_range(tmp_path: Path, pids: list[object], expected: list[object]) -> None:
    # annotations, not CPU operators: operators on several processes are several ranks (test_multi_rank_files)
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "op", "pid": p, "tid": p, "ts": i, "dur": 1}
        for i, p in enumerate(pids)
    ]
    rows = _rows(_write(tmp_path / "t.json", events))
    assert [r["pid"] for r in rows] == expected and [r["tid"] for r in rows] == expected


def test_strict_decoding_keeps_the_lenient_rules(tmp_path: Path) -> None:
    """Integer args written as JSON integers take the strict decoder (one conversion per column):
    out-of-range values still become NULL, ``"args": null`` is no args, and python_function events
    (read apart from the events that carry kept args) leave their rows NULL."""
    events = [
        {"ph": "X", "cat": "python_function", "name": "f", "ts": 1, "dur": 9, "args": {"Python id": 3}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2, "dur": 1,
         "args": {"correlation": 2**70, "stream": 2**40, "External id": 11, "grid": [1, 2, 3]}},
        {"ph": "X", "cat": "cpu_op", "name": "op", "ts": 3, "dur": 1, "args": None},
        {"ph": "X", "cat": "python_function", "name": "g", "ts": 4, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "op", "ts": 5, "dur": 1,
         "args": {"External id": 12, "Input Dims": [[8, 512], []], "Sequence number": 4}},
    ]  # fmt: skip
    rows = _rows(_write(tmp_path / "t.json", events))
    assert [r["external_id"] for r in rows] == [None, 11, None, None, 12]
    assert [r["input_dims"] for r in rows] == [None, None, None, None, "[[8,512],[]]"]
    assert [r["grid"] for r in rows] == [None, "[1,2,3]", None, None, None]
    assert [r["sequence_number"] for r in rows] == [None, None, None, None, 4]
    assert (rows[1]["correlation"], rows[1]["stream"], rows[1]["device"]) == (None, None, 0)


_int_lists = st.recursive(st.integers(min_value=0, max_value=10**25), lambda inner: st.lists(inner, max_size=4))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_int_lists, st.sampled_from(["", " ", "\n  "])), min_size=1, max_size=4))
def test_integer_lists_are_stored_compact_like_a_json_round_trip(
    tmp_path_factory: pytest.TempPathFactory, values: list[tuple[object, str]]
) -> None:
    """Input Dims as any profiler spaces them (lists of integers, nested, long numbers) are stored as
    msgspec decode + encode would write them."""
    import msgspec

    raws = [json.dumps(value, separators=("," + space, ":")) for value, space in values]
    events = ",".join(
        f'{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": {i}, "dur": 1, "args": {{"Input Dims": {raw}}}}}'
        for i, raw in enumerate(raws)
    )
    path = tmp_path_factory.mktemp("dims") / "rank0.json"
    path.write_text('{"traceEvents": [' + events + "]}")
    stored = parse_kineto_file(path).events
    assert isinstance(stored, pa.Table)
    round_trips = [msgspec.json.encode(msgspec.json.decode(raw)).decode() for raw in raws]
    assert stored.column("input_dims").to_pylist() == round_trips


def test_inflated_traces_are_the_bytes_gzip_gives() -> None:
    """``trace_blocks`` inflates with ISA-L when it is installed: the same bytes as the standard library."""
    for path in [*sorted((KINETO / "single").glob("*.gz")), next((KINETO / "dlrm_8rank").glob("*.gz"))]:
        assert b"".join(trace_blocks(path)) == gzip.decompress(path.read_bytes()), path


def test_a_gzip_of_several_members_or_with_trailing_bytes_is_inflated_as_gzip_does(tmp_path: Path) -> None:
    """Every member is inflated in turn, and zero bytes after a member are padding: what gzip gives."""
    document = json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}]}).encode()
    half = len(document) // 2
    members = tmp_path / "members.json.gz"
    members.write_bytes(gzip.compress(document[:half]) + gzip.compress(document[half:]))
    padded = tmp_path / "padded.json.gz"
    padded.write_bytes(gzip.compress(document) + b"\0" * 16)
    for path in (members, padded):
        assert b"".join(trace_blocks(path)) == gzip.decompress(path.read_bytes()) == document, path.name


def test_chunked_conversion_matches_one_batch_and_reads_both_dims_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Columns do not depend on where the 4 096-event chunks fall: a writer that switches from the
    2021 ``Input dims`` key to ``Input Dims`` keeps every row's dims, and ids written as text read the
    same in an all-text chunk as beside integers."""
    events = []
    for i in range(40):
        key = "Input dims" if i < 25 else "Input Dims"
        tid = [str(i), "-3", " 8", "stream 7"][i % 4] if i < 20 else i  # text first, integers after
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": tid, "ts": i, "dur": 1,
                       "args": {key: [[i, 2], [2, 2]]}})  # fmt: skip
    path = _write(tmp_path / "t.json", events)
    whole = _rows(path)
    monkeypatch.setattr(parser, "CHUNK_EVENTS", 8)
    chunked = _rows(path)
    assert chunked == whole
    assert [r["input_dims"] for r in whole] == [f"[[{i},2],[2,2]]" for i in range(40)]
    assert [r["tid"] for r in whole[:4]] == [0, -3, None, None]
