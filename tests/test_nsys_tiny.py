"""Nsight reader on tiny exports built in code: small integer times a person can check by hand,
rank assignment, and every bad-input path (not SQLite, not Nsight, unsupported schema, no kernel
table, nothing usable, .nsys-rep with and without ``nsys``)."""

from __future__ import annotations

import gzip
import os
import sqlite3
import stat
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from tracecal.cli.main import app
from tracecal.errors import InputNotFoundError, TraceFormatError
from tracecal.ingest.discover import discover_run
from tracecal.sources.nsys.export import CACHE_DIR_NAME, open_export
from tracecal.sources.nsys.parser import _resolve_sync_devices, parse_nsys_file
from tracecal.sql.connection import open_database

GTID = 1 << 48  # nsys sets a high "hardware/VM" bit in every global id


def gtid(pid: int, tid: int) -> int:
    return GTID | (pid << 24) | tid


def gpid(pid: int) -> int:
    return GTID | (pid << 24)


def make_export(
    path: Path,
    *,
    kernels: list[tuple] = (),  # (start, end, device, stream, correlation, pid, name)
    runtime: list[tuple] = (),  # (start, end, pid, tid, correlation, name, eventClass)
    nvtx: list[tuple] = (),  # (start, end, pid, tid, text, eventType)
    memcpy: list[tuple] = (),  # (start, end, device, stream, correlation, pid, bytes, copyKind, src, dst)
    sync: list[tuple] = (),  # (start, end, context, stream, correlation, pid, syncType)
    version: str | None = "3.25.0",
    kernel_table: bool = True,
    session_start: tuple[int, int] | None = None,  # (utcEpochNs, systemClockNs)
    gpus: list[tuple[int, str]] = (),
) -> Path:
    """Write a minimal Nsight-shaped SQLite export (the real column names, a subset of columns)."""
    con = sqlite3.connect(path)
    strings: dict[str, int] = {}

    def sid(text: str) -> int:
        return strings.setdefault(text, len(strings) + 1)

    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT)")
    con.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PRODUCT_NAME', 'NVIDIA Nsight Systems')")
    if version is not None:
        con.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', ?)", (version,))
    con.execute("CREATE TABLE META_DATA_CAPTURE (name TEXT, value TEXT)")
    con.execute("INSERT INTO META_DATA_CAPTURE VALUES ('DEVICE_DISPLAY_NAME', 'node7')")
    if kernel_table:
        con.execute(
            "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, contextId INT, streamId INT, "
            "correlationId INT, globalPid INT, demangledName INT, shortName INT, gridX INT, gridY INT, gridZ INT, "
            "blockX INT, blockY INT, blockZ INT)"
        )
        for s, e, dev, stream, corr, pid, name in kernels:
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?,?,4,1,1,128,1,1)",
                (s, e, dev, dev + 1, stream, corr, gpid(pid), sid(name), sid(name.split("(")[0])),
            )
    if runtime:
        con.execute(
            "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, eventClass INT, globalTid INT, "
            "correlationId INT, nameId INT)"
        )
        for s, e, pid, tid, corr, name, cls in runtime:
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?)",
                (s, e, cls, gtid(pid, tid), corr, sid(name)),
            )
    if memcpy:
        con.execute(
            "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT, end INT, deviceId INT, contextId INT, streamId INT, "
            "correlationId INT, globalPid INT, bytes INT, copyKind INT, srcKind INT, dstKind INT)"
        )
        for s, e, dev, stream, corr, pid, nbytes, kind, src, dst in memcpy:
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (s, e, dev, dev + 1, stream, corr, gpid(pid), nbytes, kind, src, dst),
            )
    if sync:
        con.execute(
            "CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INT, end INT, deviceId INT, contextId INT, "
            "streamId INT, correlationId INT, globalPid INT, syncType INT)"
        )
        for s, e, ctx, stream, corr, pid, kind in sync:
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES (?,?,0,?,?,?,?,?)",
                (s, e, ctx, stream, corr, gpid(pid), kind),
            )
    if nvtx:
        con.execute(
            "CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, text TEXT, globalTid INT, "
            "endGlobalTid INT, textId INT, domainId INT, binaryData BLOB)"
        )
        for i, (s, e, pid, tid, text, etype) in enumerate(nvtx):
            # Alternate inline text and textId: exports use both.
            inline, text_id = (text, None) if i % 2 == 0 else (None, sid(text))
            con.execute(
                "INSERT INTO NVTX_EVENTS VALUES (?,?,?,?,?,NULL,?,0,NULL)",
                (s, e, etype, inline, gtid(pid, tid), text_id),
            )
    if session_start is not None:
        con.execute("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INT, utcTime TEXT, systemClockNs INT)")
        con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', ?)", session_start)
    if gpus:
        con.execute("CREATE TABLE TARGET_INFO_GPU (id INT, name TEXT)")
        con.executemany("INSERT INTO TARGET_INFO_GPU VALUES (?, ?)", gpus)
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in strings.items()])
    con.commit()
    con.close()
    return path


def one_step(pid: int = 10, device: int = 0, corr: int = 7) -> dict:
    """One emit_nvtx operator launching one kernel, all inside a ProfilerStep range."""
    return {
        "nvtx": [
            (50, 400, pid, pid, "ProfilerStep#1, op_id = 1", 59),
            (100, 200, pid, pid, "aten::mm, seq = 3, op_id = 2, sizes = [[2, 3], [3, 4]]", 59),
        ],
        "runtime": [(120, 130, pid, pid, corr, "cudaLaunchKernel_v7000", 0)],
        "kernels": [(150, 180, device, 7, corr, pid, "void gemm_kernel<float>(float*)")],
    }


def test_tiny_export_maps_every_field(tmp_path: Path) -> None:
    path = make_export(tmp_path / "r.sqlite", **one_step(), gpus=[(0, "NVIDIA H100")])
    (rank,) = parse_nsys_file(path)
    assert rank.rank is None and rank.rank_source == "nsys_order"  # one process: the path decides
    assert (rank.pid, rank.host, rank.device_name, rank.format) == (10, "node7", "NVIDIA H100", "nsys")
    assert rank.schema_era == "nsys-3.25.0"
    rows = rank.events.to_pylist()
    assert [r["event_id"] for r in rows] == [0, 1, 2, 3]
    by_kind = {r["kind"]: r for r in rows}
    step, op = (r for r in rows if r["category"] == "NVTX_EVENTS")
    assert (step["kind"], step["name"], step["ts_ns"], step["dur_ns"]) == ("user_annotation", "ProfilerStep#1", 50, 350)
    assert (op["kind"], op["name"], op["sequence_number"]) == ("cpu_op", "aten::mm", 3)
    assert op["input_dims"] == "[[2,3],[3,4]]"
    assert (op["pid"], op["tid"]) == (10, 10)
    launch = by_kind["cuda_runtime"]
    assert (launch["name"], launch["correlation"], launch["ts_ns"], launch["dur_ns"]) == (
        "cudaLaunchKernel",
        7,
        120,
        10,
    )
    kernel = by_kind["kernel"]
    assert (kernel["name"], kernel["ts_ns"], kernel["dur_ns"]) == ("void gemm_kernel<float>(float*)", 150, 30)
    assert (kernel["pid"], kernel["tid"], kernel["device"], kernel["stream"]) == (0, 7, 0, 7)
    assert (kernel["correlation"], kernel["grid"], kernel["block"]) == (7, "[4,1,1]", "[128,1,1]")
    assert kernel["external_id"] is None and kernel["run_id"] is None and kernel["rank"] is None


def test_session_start_shifts_to_utc(tmp_path: Path) -> None:
    path = make_export(tmp_path / "r.sqlite", **one_step(), session_start=(1_000_000, 40))
    (rank,) = parse_nsys_file(path)
    kernel = next(r for r in rank.events.to_pylist() if r["kind"] == "kernel")
    assert kernel["ts_ns"] == 150 - 40 + 1_000_000 and kernel["dur_ns"] == 30
    assert rank.metadata["nsys_utc_offset_ns"] == 1_000_000 - 40


def test_memcpy_and_sync_names_and_devices(tmp_path: Path) -> None:
    step = one_step(device=2)
    path = make_export(
        tmp_path / "r.sqlite",
        **step,
        memcpy=[(300, 310, 2, 7, 9, 10, 4096, 1, 0, 2)],
        sync=[(320, 330, 3, 7, 11, 10, 3), (340, 350, 3, 4294967295, 12, 10, 1)],
    )
    (rank,) = parse_nsys_file(path)
    rows = rank.events.to_pylist()
    copy = next(r for r in rows if r["kind"] == "memcpy")
    assert (copy["name"], copy["bytes"], copy["device"], copy["pid"]) == (
        "Memcpy HtoD (Pageable -> Device)",
        4096,
        2,
        2,
    )
    stream_sync, event_sync = (r for r in rows if r["kind"] == "sync")
    # the context (deviceId + 1 in make_export) resolves the device the sync record does not carry
    assert (stream_sync["name"], stream_sync["device"], stream_sync["stream"]) == ("Stream Sync", 2, 7)
    assert (event_sync["name"], event_sync["device"], event_sync["stream"]) == ("Event Sync", 2, None)


def test_driver_calls_are_cuda_driver(tmp_path: Path) -> None:
    step = one_step()
    step["runtime"].append((140, 145, 10, 10, 8, "cuLaunchKernelEx", 1))
    (rank,) = parse_nsys_file(make_export(tmp_path / "r.sqlite", **step))
    kinds = {r["name"]: r["kind"] for r in rank.events.to_pylist() if r["category"] == "CUPTI_ACTIVITY_KIND_RUNTIME"}
    assert kinds == {"cudaLaunchKernel": "cuda_runtime", "cuLaunchKernelEx": "cuda_driver"}


def test_processes_ordered_by_device_then_pid(tmp_path: Path) -> None:
    a, b, c = one_step(pid=30, device=0, corr=1), one_step(pid=20, device=1, corr=1), one_step(pid=40, device=1)
    merged = {k: a[k] + b[k] + c[k] for k in a}
    merged["nvtx"].append((0, 10, 99, 99, "launcher", 59))  # a process without GPU work
    ranks = parse_nsys_file(make_export(tmp_path / "two.sqlite", **merged))
    assert [(r.pid, r.rank, r.rank_source) for r in ranks] == [(30, 0, "nsys_order"), (20, 1, "nsys_order"),
                                                              (40, 2, "nsys_order")]  # fmt: skip
    assert [r.metadata["nsys_devices"] for r in ranks] == [[0], [1], [1]]
    assert all(r.metadata["nsys_ranks_in_file"] == 3 for r in ranks)
    assert all(set(r.events.column("rank").to_pylist()) == {r.rank} for r in ranks)
    assert any("skipped 1 events of 1 process(es) without GPU activity" in w for w in ranks[0].metadata["warnings"])
    # each rank holds only its own process's CPU events
    for r in ranks:
        cpu_pids = {e["pid"] for e in r.events.to_pylist() if e["kind"] in ("cpu_op", "cuda_runtime")}
        assert cpu_pids == {r.pid}


def test_no_kernel_table_warns_and_keeps_cpu_events(tmp_path: Path) -> None:
    step = one_step()
    path = make_export(tmp_path / "r.sqlite", nvtx=step["nvtx"], runtime=step["runtime"], kernel_table=False)
    (rank,) = parse_nsys_file(path)
    assert sorted(rank.events.column("kind").to_pylist()) == ["cpu_op", "cuda_runtime", "user_annotation"]
    assert any("no CUPTI_ACTIVITY_KIND_KERNEL table" in w for w in rank.metadata["warnings"])


def test_unterminated_nvtx_range_has_null_duration(tmp_path: Path) -> None:
    step = one_step()
    step["nvtx"].append((300, None, 10, 10, "open at capture end", 59))
    step["nvtx"].append((310, None, 10, 10, "a mark", 34))  # marks are not ranges
    (rank,) = parse_nsys_file(make_export(tmp_path / "r.sqlite", **step))
    names = {r["name"]: r["dur_ns"] for r in rank.events.to_pylist()}
    assert names["open at capture end"] is None and "a mark" not in names


def test_nothing_usable_fails_clearly(tmp_path: Path) -> None:
    path = make_export(tmp_path / "empty.sqlite", kernel_table=False)
    with pytest.raises(TraceFormatError, match=r"empty\.sqlite: the Nsight export holds no kernels"):
        parse_nsys_file(path)


def test_not_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    path.write_text("hello")
    with pytest.raises(TraceFormatError, match=r"notes\.sqlite: not an SQLite file"):
        parse_nsys_file(path)


def test_sqlite_that_is_not_nsight(tmp_path: Path) -> None:
    path = tmp_path / "app.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (id INT)")
    con.commit()
    con.close()
    with pytest.raises(TraceFormatError, match=r"app\.sqlite: SQLite file is not an Nsight Systems export"):
        parse_nsys_file(path)


def test_unsupported_schema_major(tmp_path: Path) -> None:
    path = make_export(tmp_path / "future.sqlite", **one_step(), version="4.0.1")
    with pytest.raises(TraceFormatError, match=r"schema 4\.0\.1 is not supported"):
        parse_nsys_file(path)


def test_missing_required_column(tmp_path: Path) -> None:
    path = make_export(tmp_path / "odd.sqlite", **one_step())
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_RUNTIME DROP COLUMN correlationId")
    con.commit()
    con.close()
    with pytest.raises(TraceFormatError, match=r"CUPTI_ACTIVITY_KIND_RUNTIME lacks column\(s\) correlationId"):
        parse_nsys_file(path)


def test_gzipped_export_and_corrupt_gzip(tmp_path: Path) -> None:
    raw = make_export(tmp_path / "r.sqlite", **one_step())
    gz = tmp_path / "r.sqlite.gz"
    gz.write_bytes(gzip.compress(raw.read_bytes()))
    assert parse_nsys_file(gz)[0].events.num_rows == 4
    bad = tmp_path / "bad.sqlite.gz"
    bad.write_bytes(gzip.compress(raw.read_bytes())[:200])
    with pytest.raises(TraceFormatError, match=r"bad\.sqlite\.gz: corrupt gzip"):
        parse_nsys_file(bad)


def test_nsys_rep_without_nsys_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rep = tmp_path / "rank0.nsys-rep"
    rep.write_bytes(b"\x00binary report")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(
        TraceFormatError, match=r"`nsys` is not on PATH; run `nsys export --type sqlite .*rank0\.sqlite"
    ):
        parse_nsys_file(rep)


def _fake_nsys(bin_dir: Path, source: Path, calls: Path, *, old_release: bool = False) -> None:
    """A stand-in ``nsys`` (there is none on this machine) that 'exports' by copying ``source``;
    ``old_release`` rejects ``--include-blobs`` like an nsys that predates the option."""
    bin_dir.mkdir()
    script = bin_dir / "nsys"
    script.write_text(
        f"#!{sys.executable}\n"
        "import shutil, sys\n"
        "args = sys.argv[1:]\n"
        f"open({str(calls)!r}, 'a').write(' '.join(args) + '\\n')\n"
        "assert args[:3] == ['export', '--type', 'sqlite'], args\n"
        f"if {old_release} and '--include-blobs=true' in args:\n"
        "    sys.exit('unrecognised option --include-blobs')\n"
        f"shutil.copy({str(source)!r}, args[args.index('--output') + 1])\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_nsys_rep_is_exported_once_into_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = make_export(tmp_path / "source.sqlite", **one_step())
    run = tmp_path / "run"
    run.mkdir()
    rep = run / "rank0.nsys-rep"
    rep.write_bytes(b"report")
    calls = tmp_path / "calls.txt"
    _fake_nsys(tmp_path / "bin", source, calls)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    first = parse_nsys_file(rep)
    assert first[0].events.num_rows == 4 and first[0].file == rep
    assert (run / CACHE_DIR_NAME / "rank0.sqlite").is_file()
    parse_nsys_file(rep)  # cache is fresh: no second export
    assert len(calls.read_text().splitlines()) == 1
    assert "--include-blobs=true" in calls.read_text()  # keeps NCCL's NVTX payloads


def test_nsys_rep_export_retries_without_blobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = make_export(tmp_path / "source.sqlite", **one_step())
    rep = tmp_path / "rank0.nsys-rep"
    rep.write_bytes(b"report")
    calls = tmp_path / "calls.txt"
    _fake_nsys(tmp_path / "bin", source, calls, old_release=True)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert parse_nsys_file(rep)[0].events.num_rows == 4
    first, second = calls.read_text().splitlines()
    assert "--include-blobs=true" in first and "--include-blobs" not in second


def test_open_export_reads_metadata(tmp_path: Path) -> None:
    path = make_export(tmp_path / "r.sqlite", **one_step(), version="3.24.14")
    with open_export(path) as export:
        assert export.schema_version == "3.24.14"
        assert export.capture_meta["DEVICE_DISPLAY_NAME"] == "node7"
        assert "CUPTI_ACTIVITY_KIND_KERNEL" in export.tables
        assert export.columns("NO_SUCH_TABLE") == []


def test_discovery_skips_the_export_cache_and_shadowed_reports(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / CACHE_DIR_NAME).mkdir(parents=True)
    for name in ("rank0.nsys-rep", f"{CACHE_DIR_NAME}/rank0.sqlite", "rank1.nsys-rep", "rank1.sqlite.gz"):
        (run / name).write_bytes(b"x")
    assert [f.path.name for f in discover_run(run).files] == ["rank0.nsys-rep", "rank1.sqlite.gz"]


def test_nsys_rep_run_ingests_and_reingests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_path: Path) -> None:
    source = make_export(tmp_path / "source.sqlite", **one_step())
    run = tmp_path / "llama_nsys"
    run.mkdir()
    (run / "rank3.nsys-rep").write_bytes(b"report")
    _fake_nsys(tmp_path / "bin", source, tmp_path / "calls.txt")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    for _ in range(2):  # the second ingest must not also pick up the cached export
        result = CliRunner().invoke(app, ["ingest", str(run), "--db", str(db_path), "-j", "1"])
        assert result.exit_code == 0, result.output
    with open_database(Path(db_path), read_only=True) as con:
        assert con.execute("SELECT rank, rank_source, events FROM ranks").fetchall() == [(3, "path", 4)]


def test_nvtx_iteration_marker(tmp_path: Path, db_path: Path) -> None:
    """Two ``train_step`` NVTX ranges, each launching one kernel, delimit two iterations."""
    steps = [one_step(corr=c) for c in (1, 2)]
    nvtx = [(s, e, 10, 10, "train_step", 59) for s, e in ((50, 400), (1050, 1400))]
    nvtx += [(r[0] + shift, r[1] + shift, *r[2:]) for st, shift in zip(steps, (0, 1000), strict=True)
             for r in st["nvtx"][1:]]  # fmt: skip
    runtime = [(r[0] + shift, r[1] + shift, *r[2:]) for st, shift in zip(steps, (0, 1000), strict=True)
               for r in st["runtime"]]  # fmt: skip
    kernels = [(k[0] + shift, k[1] + shift, *k[2:]) for st, shift in zip(steps, (0, 1000), strict=True)
               for k in st["kernels"]]  # fmt: skip
    run = tmp_path / "steps"
    run.mkdir()
    make_export(run / "rank0.sqlite", nvtx=nvtx, runtime=runtime, kernels=kernels)
    args = ["ingest", str(run), "--db", str(db_path), "-j", "1", "--iteration-marker", "^train_step$"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    with open_database(Path(db_path), read_only=True) as con:
        its = con.execute("SELECT iteration, marker, cpu_start_ns, cpu_end_ns FROM iterations ORDER BY 1").fetchall()
        assert its == [(0, "train_step", 50, 400), (1, "train_step", 1050, 1400)]
        ops = con.execute("SELECT ts_ns, iteration, cpu_op_name, link FROM operators ORDER BY 1").fetchall()
        assert ops == [(150, 0, "aten::mm", "time"), (1150, 1, "aten::mm", "time")]


def test_two_multi_process_files_by_order_alone_are_refused(tmp_path: Path, db_path: Path) -> None:
    a, b = one_step(pid=30, device=0, corr=1), one_step(pid=20, device=1, corr=1)
    both = {k: a[k] + b[k] for k in a}
    run = tmp_path / "two_nodes"
    run.mkdir()
    make_export(run / "node0.sqlite", **both)
    make_export(run / "node1.sqlite", **both)
    result = CliRunner().invoke(app, ["ingest", str(run), "--db", str(db_path), "-j", "1"])
    assert result.exit_code == 2
    assert "both hold rank 0" in result.output


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError, match=r"gone\.sqlite does not exist"):
        parse_nsys_file(tmp_path / "gone.sqlite")


def test_sync_records_take_the_lowest_device_of_their_process_and_context() -> None:
    """The (process, context) -> device map as SQL would give it: the lowest non-NULL device seen in
    that context; NULL for a NULL process or context, a context whose activity has no device, or one
    without GPU activity."""
    gpu = pa.table({
        "proc": pa.array([10, 10, 10, 20, None, 30], pa.int64()),
        "context": pa.array([1, 1, 2, 1, 1, 5], pa.int64()),
        "device": pa.array([3, 1, 2, 4, 0, None], pa.int32()),
    })  # fmt: skip
    sync = pa.table({
        "proc": pa.array([10, 10, 20, 10, None, 30, 40], pa.int64()),
        "context": pa.array([1, 2, 1, None, 1, 5, 1], pa.int64()),
        "device": pa.nulls(7, pa.int32()),
        "pid": pa.nulls(7, pa.int64()),
    })  # fmt: skip
    resolved = _resolve_sync_devices(sync, [gpu.slice(0, 3), gpu.slice(3)])
    assert resolved.column("device").to_pylist() == [1, 2, 4, None, None, None, None]
    assert resolved.column("pid").to_pylist() == [1, 2, 4, None, None, None, None]
    assert resolved.schema == sync.schema
