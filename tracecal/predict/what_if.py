"""What-if on another cluster: replay a run traced on one machine with another cluster's models.

The operators keep their shapes; their durations come from the target cluster's models. The
communication topology follows the target: its GPUs per node from the user, else from the target's
communication samples (the largest node size they were taken on), and every collective's nodes and
GPUs per node are recomputed from its ranks (``decode.topology``).
"""

from __future__ import annotations

import duckdb


def target_gpus_per_node(
    con: duckdb.DuckDBPyConnection, run_id: str, cluster: str | None, gpus_per_node: int | None
) -> tuple[int | None, str]:
    """The GPUs per node a replay of ``run_id`` with ``cluster``'s models places ranks on (None: as
    traced) and where that number came from."""
    if gpus_per_node is not None:
        return gpus_per_node, "--gpus-per-node"
    row = con.execute("SELECT cluster FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if cluster is None or row is None or row[0] == cluster:
        return None, "the run's own layout"
    found = con.execute(
        "SELECT max(gpus_per_node) FROM samples WHERE cluster = ? AND family = 'comm'", [cluster]
    ).fetchone()
    if found is None or found[0] is None:
        return None, f"the run's own layout ({cluster}'s communication samples state no GPUs per node)"
    return int(found[0]), f"the largest node size of {cluster}'s communication samples"


def uncovered_families(coverage: dict[str, float]) -> list[str]:
    """Families (of a prediction's ``coverage``) with no operator time predicted by a model."""
    return sorted(f for f, share in coverage.items() if f != "all" and share == 0.0)
