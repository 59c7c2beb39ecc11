"""Every command block of README.md and docs/*.md runs, in order, on the shared data, so a page that
skips a step (ingests without --cluster, calibrates before importing) fails here.

A page's ```` ```bash ```` blocks run top to bottom in one scratch directory with one database
(``./tracecal.duckdb``, the default), as a reader following the page would. ``../shared`` is the
shared data beside the checkout. The published sample directories and the published runs stand in
as trimmed copies (a few files, 80 rows each; one run): the commands and their order are the page's,
the data only as much as each command needs. A block that needs what CI has not (a GPU, Nsight
Systems, a Slurm cluster, a package index) says so in its info string, ```` ```bash no-ci: why ````;
its tracecal commands still have to parse.
"""

from __future__ import annotations

import glob
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import GPUMODELING25, REPO, SHARED
from tracecal.cli.main import app

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
ENTRY_POINTS = {"tracecal": [], "trace-ingest": ["ingest"], "calibrate": ["calibrate"]}
"""Console scripts and the `tracecal` command each one is (`trace-ingest X` = `tracecal ingest X`)."""

SKIPPED_STEP_HINTS = (
    "ingest one with",
    "ingest some with",
    "ingest a run first",
    "import them with",
    "take some with",
    "--cluster NAME (models from",
    "run calibrate",
)
"""Output that tells the reader to run a step first: on a docs page it means the page skipped it."""

SLOW_PAGES = {"published-runs.md", "samples.md", "workload.md", "replay.md", "calibration.md", "export-diff.md"}
"""Pages whose blocks spawn processes or calibrate (more than ~20 s on 2 cores)."""

_FENCE = re.compile(r"^```(\w*)\s*(.*)$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    info: str
    text: str

    @property
    def runs_in_ci(self) -> bool:
        return self.lang == "bash" and not self.info.startswith("no-ci")


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page, in order."""
    found, current, start, lang, info = [], None, 0, "", ""
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        fence = _FENCE.match(line)
        if current is None and fence:
            current, start, lang, info = [], number, fence.group(1), fence.group(2).strip()
        elif current is not None and line.startswith("```"):
            found.append(Block(page, start, lang, info, "\n".join(current)))
            current = None
        elif current is not None:
            current.append(line)
    return found


def commands(text: str) -> list[list[str]]:
    """The shell commands of a block: comments dropped, continued lines (``\\``) and quoted strings
    over several lines joined."""
    out, pending = [], ""
    for line in text.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.rstrip().endswith("\\"):
            pending = pending.rstrip()[:-1]
            continue
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the string goes on
            continue
        if words:
            out.append(words)
        pending = ""
    assert not pending, f"unterminated command: {pending!r}"
    return out


# -- the data the pages read -----------------------------------------------------------------------

SAMPLE_FILES = {
    "perlmutter_a100_compute": ["NVIDIAA100-SXM4-80GB_linear2_fp16.csv"],
    "perlmutter_a100_nccl": ["NVIDIAA100-SXM4-80GB_allreduce_fp16_1_2.csv"],
}
"""Per published sample directory, the sample files its trimmed copy keeps (with its tuned-config file)."""
SAMPLE_ROWS = 80
RUNS_KEPT = ["llemma_7B_4_2_2_4_4"]
"""The published runs the trimmed runs folder keeps: those the pages name (the smallest of the five,
16 GPUs and 4 micro-batches, so each replay the pages ask for is quick)."""


@pytest.fixture(scope="module")
def trimmed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Shared path (as the pages spell it) -> its trimmed stand-in."""
    root = tmp_path_factory.mktemp("trimmed")
    samples = GPUMODELING25 / "samples"
    mapping = {}
    for name, files in SAMPLE_FILES.items():
        target = root / name
        target.mkdir()
        shutil.copy(samples / name / "NVIDIAA100-SXM4-80GB.csv", target)
        for file in files:
            lines = (samples / name / file).read_text().splitlines(keepends=True)
            (target / file).write_text("".join(lines[: SAMPLE_ROWS + 1]))
        mapping[f"../shared/data/gpumodeling25/samples/{name}"] = str(target)
    runs = root / "perlmutter"
    runs.mkdir()
    for run in RUNS_KEPT:
        (runs / run).symlink_to(GPUMODELING25 / "runs" / "perlmutter" / run)
    mapping["../shared/data/gpumodeling25/runs/perlmutter"] = str(runs)
    return mapping


def _argument(word: str, trimmed: dict[str, str]) -> list[str]:
    """One word of a command as the test runs it: trimmed data for the large shared inputs, ``../shared``
    as the shared data beside the checkout, and a glob expanded as the shell would."""
    for shared, stand_in in trimmed.items():
        if word.startswith(shared):
            word = stand_in + word[len(shared) :]
            break
    if word.startswith("../shared"):
        word = str(SHARED) + word[len("../shared") :]
    if any(c in word for c in "*?["):
        return sorted(glob.glob(word)) or [word]
    return [word]


def run_command(argv: list[str], trimmed: dict[str, str]) -> tuple[int, str]:
    program, args = argv[0], [a for word in argv[1:] for a in _argument(word, trimmed)]
    assert program in ENTRY_POINTS, f"{program}: only tracecal's commands run in a ```bash block (else no-ci)"
    result = CliRunner().invoke(app, [*ENTRY_POINTS[program], *args])
    output = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        output += f"\n{type(result.exception).__name__}: {result.exception}"
    return result.exit_code, output


def _page_param(page: Path) -> object:
    marks = [pytest.mark.slow] if page.name in SLOW_PAGES else []
    return pytest.param(page, id=page.name, marks=marks)


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES])
def test_every_command_block_runs_in_order(
    page: Path, trimmed: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACECAL_DB", raising=False)
    for block in blocks(page):
        if not block.runs_in_ci:
            continue
        for argv in commands(block.text):
            code, output = run_command(argv, trimmed)
            where = f"{page.name}:{block.line}: {shlex.join(argv)}"
            assert code == 0, f"{where} failed ({code}):\n{output}"
            hints = [h for h in SKIPPED_STEP_HINTS if h in output]
            assert not hints, f"{where} asks for a step the page skipped ({hints}):\n{output}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_blocks_that_do_not_run_say_why_and_still_parse(page: Path) -> None:
    for block in blocks(page):
        if block.lang != "bash" or block.runs_in_ci:
            continue
        assert re.match(r"no-ci: \S", block.info), f"{page.name}:{block.line}: say why it cannot run in CI"
        for argv in commands(block.text):
            if argv[0] in ENTRY_POINTS and "--help" not in argv:
                args = [str(SHARED) + a[len("../shared") :] if a.startswith("../shared") else a for a in argv[1:]]
                result = CliRunner().invoke(app, [*ENTRY_POINTS[argv[0]], *args, "--help"])
                assert result.exit_code == 0, f"{page.name}:{block.line}: {shlex.join(argv)}\n{result.output}"


def test_the_pages_have_runnable_blocks() -> None:
    """A renamed fence (```sh, ```console) would silently leave a page out of the runner; configuration
    files (```yaml) are shown, not run."""
    every = [b for p in PAGES for b in blocks(p)]
    assert sum(b.runs_in_ci for b in every) >= 15
    shown = ("bash", "python", "text", "yaml", "")
    unknown = [f"{b.page.name}:{b.line} ```{b.lang}" for b in every if b.lang not in shown]
    assert not unknown, unknown


def test_the_runner_catches_a_skipped_step(trimmed: dict[str, str], tmp_path: Path, monkeypatch) -> None:
    """The published-runs page without its --cluster: calibrate's in-trace check asks for the step."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACECAL_DB", raising=False)
    compute = "../shared/data/gpumodeling25/samples/perlmutter_a100_compute"
    for argv in (
        ["tracecal", "samples", "import", compute, "--cluster", "perlmutter"],
        ["calibrate", "--cluster", "perlmutter", "--family", "gemm"],
    ):
        code, output = run_command(argv, trimmed)
        assert code == 0, output
    assert any(h in output for h in SKIPPED_STEP_HINTS), output
