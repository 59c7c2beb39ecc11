"""What-if topology: where a collective's ranks sit, and the node size a replay on another cluster uses."""

from __future__ import annotations

import duckdb
import polars as pl

from tracecal.decode.topology import group_topology
from tracecal.predict.what_if import target_gpus_per_node, uncovered_families


def _collectives() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "rank": [0, 0, 16, 0],
            "peer": [None, None, 32, None],
            "pg_ranks": ["[0,1,2,3,4,5,6,7]", "[0,16,32,48]", "[0,16,32,48]", None],
        },
        schema={"rank": pl.Int32, "peer": pl.Int32, "pg_ranks": pl.String},
    )


def test_group_topology_places_ranks_node_major() -> None:
    out = group_topology(_collectives(), 4, world_size=64, nodes=16)
    # a TP group of 8 on nodes of 4: 2 x 4; a PP group: 4 x 1; a send spans its two ends only: 2 x 1
    assert out.select("nodes", "gpus_per_node").rows() == [(2, 4), (4, 1), (2, 1), (16, 4)]
    on_one_node = group_topology(_collectives(), 8)
    assert on_one_node.select("nodes", "gpus_per_node").rows()[0] == (1, 8)
    unknown = group_topology(_collectives(), None)
    assert unknown["nodes"].null_count() == unknown.height


def test_target_node_size_comes_from_the_option_then_the_target_samples(tmp_path) -> None:
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    con.execute("CREATE TABLE runs (run_id VARCHAR, cluster VARCHAR)")
    con.execute("CREATE TABLE samples (cluster VARCHAR, family VARCHAR, gpus_per_node INTEGER)")
    con.execute("INSERT INTO runs VALUES ('r', 'a')")
    con.execute("INSERT INTO samples VALUES ('b', 'comm', 1), ('b', 'comm', 2), ('b', 'gemm', 8), ('c', 'gemm', 8)")
    assert target_gpus_per_node(con, "r", "b", 3) == (3, "--gpus-per-node")
    assert target_gpus_per_node(con, "r", "a", None)[0] is None  # its own cluster: as traced
    gpn, source = target_gpus_per_node(con, "r", "b", None)
    assert gpn == 2 and "b's communication samples" in source
    assert target_gpus_per_node(con, "r", "c", None)[0] is None


def test_uncovered_families_are_named() -> None:
    assert uncovered_families({"all": 0.6, "gemm": 1.0, "attention": 0.0, "comm": 0.0}) == ["attention", "comm"]
