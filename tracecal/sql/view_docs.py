"""``docs/views.md``, generated from the view registry: every view, what it answers, how it is computed,
what it depends on and reads it, and its columns with their comments.

Regenerate after editing a view file (a test fails while the page is stale)::

    python -m tracecal.sql.view_docs            # writes docs/views.md of this checkout
    python -m tracecal.sql.view_docs PATH       # or another file
"""

from __future__ import annotations

import sys
from pathlib import Path

from tracecal.errors import TracecalError
from tracecal.schema import TABLES
from tracecal.sql.registry import Macro, View, macro_definitions, view_definitions

DOCS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "views.md"
"""The page in a checkout of the repository (docs/ beside the package)."""

_REPO = DOCS_PAGE.parents[1]


def _cell(text: str) -> str:
    """Text for a Markdown table cell: a pipe would end the cell, ``<x>`` would be read as HTML."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def _source(path: Path) -> str:
    relative = path.resolve().relative_to(_REPO).as_posix()
    return f"[{relative}](../{relative})"


def _dependencies(view: View, views: set[str]) -> str:
    tables = {t.name for t in TABLES}
    kinds = [
        ("table", [d for d in view.depends_on if d in tables]),
        ("view", [f"[`{d}`](#{d})" for d in view.depends_on if d in views]),
        ("macro", [d for d in view.depends_on if d not in tables and d not in views]),
    ]
    parts = []
    for kind, names in kinds:
        if names:
            shown = ", ".join(n if n.startswith("[") else f"`{n}`" for n in names)
            parts.append(f"{kind}{'s' if len(names) > 1 else ''} {shown}")
    return "; ".join(parts)


def _view_section(view: View, every: tuple[View, ...]) -> list[str]:
    names = {v.name for v in every}
    readers = sorted(v.name for v in every if view.name in v.depends_on)
    lines = [f"## {view.name}", "", _cell(view.summary) + ("" if view.summary.endswith(".") else "."), ""]
    for paragraph in view.description:
        lines += [_cell(paragraph), ""]
    lines.append(f"- Depends on: {_dependencies(view, names)}.")
    if readers:
        lines.append(f"- Read by: {', '.join(f'[`{r}`](#{r})' for r in readers)}.")
    lines += [f"- Source: {_source(view.path)}", "", "| column | comment |", "|---|---|"]
    lines += [f"| `{c.name}` | {_cell(c.comment)} |" for c in view.columns]
    return [*lines, ""]


def _macro_row(macro: Macro, views: tuple[View, ...]) -> str:
    readers = ", ".join(
        f"[`{v.name}`](#{v.name})" for v in sorted(views, key=lambda v: v.name) if macro.name in v.depends_on
    )
    return f"| `{macro.name}` | {_cell(macro.summary)} | {readers} | {_source(macro.path)} |"


def render(views: tuple[View, ...], macros: tuple[Macro, ...]) -> str:
    """The page's Markdown for ``views`` (in creation order) and the ``macros`` they share."""
    lines = [
        "# Views",
        "",
        "<!-- Generated from tracecal/sql/views/*.sql by `python -m tracecal.sql.view_docs`; "
        "edit those files, not this page. -->",
        "",
        "Every tracecal database holds these views over its [tables](index.md#the-database). Each is one",
        "file, `tracecal/sql/views/<name>.sql`: a header of `--` lines that says what the view answers,",
        "how it is computed, what it depends on and what each column means, then its query (the header's",
        "format is in `tracecal/sql/registry.py`). The database stores the same comments:",
        "`tracecal sql \"select column_name, comment from duckdb_columns() where table_name = 'op_summary'\"`.",
        "A view file is also a plain query: `tracecal sql --file tracecal/sql/views/op_summary.sql` runs it.",
        "",
        "The views are created in the order of this page, each after the views it depends on.",
        "",
        "| view | what it answers | depends on |",
        "|---|---|---|",
    ]
    names = {v.name for v in views}
    lines += [f"| [`{v.name}`](#{v.name}) | {_cell(v.summary)} | {_dependencies(v, names)} |" for v in views]
    lines.append("")
    for view in views:
        lines += _view_section(view, views)
    lines += [
        "## Macros",
        "",
        "Table macros hold the logic several views share; they are created before the views.",
        "",
        "| macro | what it computes | used by | source |",
        "|---|---|---|---|",
        *(_macro_row(m, views) for m in macros),
    ]
    return "\n".join(lines) + "\n"


def current_page() -> str:
    """The page as the shipped view and macro files make it."""
    return render(view_definitions(), macro_definitions())


def main(argv: list[str]) -> int:
    if len(argv) > 1 or argv[:1] in (["-h"], ["--help"]):
        sys.stdout.write(__doc__ or "")
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    page = Path(argv[0]) if argv else DOCS_PAGE
    if not page.parent.is_dir():
        sys.stderr.write(
            f"no directory {page.parent} for the page: pass its path (python -m tracecal.sql.view_docs PATH)\n"
        )
        return 2
    try:
        text = current_page()
    except TracecalError as exc:  # a malformed view file: its one-line message
        sys.stderr.write(f"{exc}\n")
        return 1
    page.write_text(text)
    sys.stdout.write(f"wrote {page}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
