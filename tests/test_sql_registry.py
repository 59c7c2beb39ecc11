"""The SQL registry (``tracecal/sql/registry.py``): view files declare their columns with their comments
and their dependencies once, views are created in dependency order, a malformed header, a cycle, a
missing dependency or a column without a comment is refused with a line naming it, and
``docs/views.md`` is the page the registry generates."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import duckdb
import pytest

from tracecal.schema import TABLES
from tracecal.sql import registry, view_docs
from tracecal.sql.connection import create_view, open_database, query_arrow
from tracecal.sql.registry import SqlRegistryError, View, dependency_order, parse_view

VIEWS = registry.view_definitions()
KNOWN = {t.name for t in TABLES} | {m.name for m in registry.macro_definitions()}
TABLE_DDL = dict(zip((t.name for t in TABLES), registry.table_ddl(), strict=True))


def _view(name: str, depends_on: str = "runs", columns: str = "--   run_id: run identifier", query: str = "") -> View:
    text = f"-- What {name} answers\n--\n-- depends on: {depends_on}\n--\n-- columns:\n{columns}\n\n"
    return parse_view(name, text + (query or "SELECT run_id FROM runs"), Path(f"views/{name}.sql"))


def _tables_and_macros(con: duckdb.DuckDBPyConnection, names: set[str]) -> None:
    for name in sorted(names & set(TABLE_DDL)):
        con.execute(TABLE_DDL[name])
    for macro in registry.macro_definitions():
        if macro.name in names:
            con.execute(macro.statements())


def test_every_view_file_parses_with_a_comment_on_each_column() -> None:
    assert sorted(v.name for v in VIEWS) == registry.view_names() and len(VIEWS) >= 9
    for view in VIEWS:
        assert view.summary and view.depends_on and view.columns, view.name
        assert all(c.comment for c in view.columns), view.name


def test_views_come_after_the_views_they_depend_on_whatever_the_file_order() -> None:
    position = {v.name: i for i, v in enumerate(VIEWS)}
    for view in VIEWS:
        assert all(position[d] < position[view.name] for d in view.depends_on if d in position), view.name
    assert position["best_iteration"] < position["component_breakdown"]  # one the files list the other way
    assert dependency_order(reversed(VIEWS), KNOWN) == VIEWS


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: v.name)
def test_a_view_binds_with_only_what_it_declares_and_reads_all_of_it(view: View) -> None:
    """In an empty database holding only its declared tables, macros and views (theirs in turn), the
    view binds: nothing it reads is undeclared. Every name it declares appears in its query."""
    by_name = {v.name: v for v in VIEWS}
    needed: list[View] = []
    pending = [view]
    while pending:
        current = pending.pop()
        needed.append(current)
        pending += [by_name[d] for d in current.depends_on if d in by_name and by_name[d] not in needed]
    con = duckdb.connect()
    _tables_and_macros(con, {d for v in needed for d in v.depends_on})
    for current in dependency_order(needed, KNOWN):
        create_view(con, current)
    query = re.sub(r"--[^\n]*", "", view.query)
    unread = [d for d in view.depends_on if not re.search(rf"\b{d}\b", query)]
    assert not unread, f"{view.name} declares dependencies its query does not read: {unread}"


def test_a_cycle_of_views_is_named() -> None:
    views = [_view("a", "runs, b"), _view("b", "c"), _view("c", "a")]
    with pytest.raises(SqlRegistryError, match="cycle") as caught:
        dependency_order(views, KNOWN)
    chain = re.search(r"\(([a-c](?: -> [a-c])+),", str(caught.value))
    assert chain, str(caught.value)
    names = chain.group(1).split(" -> ")
    assert names[0] == names[-1] and len(names) == 4
    depends = {"a": "b", "b": "c", "c": "a"}
    assert all(depends[x] == y for x, y in itertools.pairwise(names)), "each depends on the next"


def test_a_view_that_depends_on_itself_is_a_cycle() -> None:
    with pytest.raises(SqlRegistryError, match=r"cycle \(a -> a,"):
        dependency_order([_view("a", "a")], KNOWN)


def test_a_missing_dependency_is_named() -> None:
    with pytest.raises(SqlRegistryError, match=r"views/a\.sql: view a depends on no_such_view, which is no table"):
        dependency_order([_view("a", "runs, no_such_view"), _view("b")], KNOWN)


@pytest.mark.parametrize(
    ("columns", "query", "message"),
    [
        ("--   run_id: run identifier", "SELECT run_id, name FROM runs", "columns without a comment: name"),
        ("--   run_id: run identifier\n--   name: run name", "SELECT run_id FROM runs", "does not have: name"),
        ("--   name: run name\n--   run_id: run identifier", "SELECT run_id, name FROM runs", "another order"),
    ],
    ids=["uncommented", "absent", "reordered"],
)
def test_a_view_whose_columns_differ_from_its_header_is_refused(columns: str, query: str, message: str) -> None:
    con = duckdb.connect()
    _tables_and_macros(con, {"runs"})
    with pytest.raises(SqlRegistryError, match=message):
        create_view(con, _view("v", columns=columns, query=query))


def test_the_header_says_what_each_comment_is() -> None:
    view = parse_view(
        "v",
        "-- What it answers,\n-- over two lines\n--\n-- How: it's done.\n--\n-- depends on: runs, ranks\n--\n"
        "-- columns:\n--   run_id: the run's id, a long\n--     comment: continued\n--   rank: a rank\n\n"
        "SELECT run_id, rank FROM ranks JOIN runs USING (run_id);\n",
        Path("v.sql"),
    )
    assert view.summary == "What it answers, over two lines"
    assert view.description == ("How: it's done.",)
    assert view.depends_on == ("runs", "ranks")
    assert [(c.name, c.comment) for c in view.columns] == [("run_id", "the run's id, a long comment: continued"),
                                                           ("rank", "a rank")]  # fmt: skip
    assert view.query == "SELECT run_id, rank FROM ranks JOIN runs USING (run_id)"
    assert "COMMENT ON COLUMN v.run_id IS 'the run''s id, a long comment: continued';" in view.comment_statements()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-- depends on: runs\n--\n-- columns:\n--   a: x\nSELECT 1 AS a", "starts with a summary"),
        ("-- S\n--\n-- columns:\n--   a: x\nSELECT 1 AS a", "no `depends on:`"),
        ("-- S\n--\n-- depends on: runs\nSELECT 1 AS a", "no `columns:`"),
        ("-- S\n--\n-- depends on: runs\n--\n-- columns:\nSELECT 1 AS a", "lists no column"),
        ("-- S\n--\n-- depends on: runs\n--\n-- columns:\n--   a:\nSELECT 1 AS a", "a column entry is"),
        ("-- S\n--\n-- depends on: runs\n--\n-- columns:\n--   a: x\n--   a: y\nSELECT 1 AS a", "listed twice"),
        ("-- S\n--\n-- depends on: runs\n--\n-- columns:\n--   a: x\n--\n-- more\nSELECT 1 AS a", "come before"),
        ("-- S\n--\n-- depends on: runs table\n--\n-- columns:\n--   a: x\nSELECT 1 AS a", "comma-separated"),
        ("-- S\n--\n-- depends on: runs\n--\n-- columns:\n--   a: x\nCREATE VIEW v AS SELECT 1 AS a", "SELECT or WITH"),
        ("-- S\n--\n-- depends on: runs\n--\n-- columns:\n--   a: x\nSELECT 1 AS a; SELECT 2", "one query"),
        ("--S\n--\n-- depends on: runs\n--\n-- columns:\n--   a: x\nSELECT 1 AS a", "start with '-- '"),
    ],
)
def test_a_malformed_header_is_refused_with_the_file_and_what_to_do(text: str, message: str) -> None:
    with pytest.raises(SqlRegistryError, match=re.escape(message)) as caught:
        parse_view("v", text, Path("views/v.sql"))
    assert str(caught.value).startswith("views/v.sql") and "\n" not in str(caught.value)


def test_the_database_stores_each_header_comment(db_path: Path) -> None:
    with open_database(db_path) as con:  # of the views, all but events (the event store's: test_event_store)
        stored = con.execute(
            "SELECT table_name, column_name, comment FROM duckdb_columns() "
            "WHERE table_name IN (SELECT view_name FROM duckdb_views() WHERE NOT internal AND view_name != 'events') "
            "ORDER BY table_name, column_index"
        ).fetchall()
        summaries = dict(
            con.execute(
                "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal AND view_name != 'events'"
            ).fetchall()
        )
        sorted_views = sorted(VIEWS, key=lambda v: v.name)
        assert stored == [(v.name, c.name, c.comment) for v in sorted_views for c in v.columns]
        assert summaries == {v.name: v.summary for v in VIEWS}
        for view in VIEWS:  # the file runs as it is (tracecal sql --file)
            assert query_arrow(con, view.path.read_text()).column_names == view.column_names


def test_docs_views_page_is_current() -> None:
    assert view_docs.DOCS_PAGE.read_text() == view_docs.current_page(), (
        "docs/views.md is stale: run `python -m tracecal.sql.view_docs`"
    )


def test_the_page_shows_every_view_its_dependencies_and_every_column_comment(tmp_path: Path) -> None:
    page = tmp_path / "views.md"
    assert view_docs.main([str(page)]) == 0
    text = page.read_text()
    for view in VIEWS:
        section = text.split(f"\n## {view.name}\n", 1)[1].split("\n## ", 1)[0]
        assert view_docs._cell(view.summary) in section
        assert all(f"| `{c.name}` | {view_docs._cell(c.comment)} |" in section for c in view.columns), view.name
        assert all(f"`{d}`" in section for d in view.depends_on), view.name
    assert view_docs.main([str(tmp_path / "missing" / "views.md")]) == 2
