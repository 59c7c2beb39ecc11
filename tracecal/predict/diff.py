"""Where two timelines differ: time per group in A and B, the difference, and the share of the iteration
difference each group explains, largest movers first (pure).

Like Nsight Systems' ``diff`` recipe and TraceLens' TraceDiff, the unit of comparison is a group of
operators (a family, an operator / kernel name) or a component, matched by its key, with the groups
only one side has marked ``added`` or ``removed``. Two choices make the numbers comparable across runs
of different sizes and add up where they can:

* **per-rank mean.** A group's time is its time summed over the ranks of the best iteration divided
  by the number of ranks, and the iteration time is the mean of the ranks' iteration times, so runs
  with different world sizes compare, and a group's share is of the same per-rank quantity.
* **share of the iteration difference** = Δgroup / Δiteration × 100. Components are a disjoint split
  of each rank's iteration (``predict.components``, idle included), so their shares add up to 100 %.
  Operator groups are busy time: operators overlap (streams, threads) and idle time moves too, so
  their shares need not add up to 100 % (a group can explain more than all of it).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracecal.errors import PredictionError

BY = ("family", "name", "component")
"""What rows are grouped by."""

COLUMNS = ("group", "a_ms", "b_ms", "diff_ms", "share_pct", "a_count", "b_count", "status")
"""Columns of ``Diff.table``: the group, per-rank mean time in A and B and B − A (ms), the share of the
iteration difference (%, NULL when the iterations are equal), per-rank mean operator counts (NULL
for components), and ``added`` / ``removed`` / ``changed`` / ``same``."""


@dataclass(frozen=True)
class Side:
    """One timeline, per rank: ``groups`` has rank, group, time_ns, count (NULL for components);
    ``iterations`` has rank, iteration_ns."""

    label: str
    groups: pl.DataFrame
    iterations: pl.DataFrame

    @property
    def ranks(self) -> int:
        return self.iterations["rank"].n_unique()

    def iteration_ns(self) -> float:
        """Mean of the ranks' iteration times, ns."""
        return float(self.iterations["iteration_ns"].mean())  # type: ignore[arg-type]


@dataclass(frozen=True)
class Diff:
    """The comparison: ``table`` (``COLUMNS``, largest |diff| first) and the iterations it explains."""

    a: str
    b: str
    by: str
    table: pl.DataFrame
    a_iteration_ms: float
    b_iteration_ms: float
    a_ranks: int
    b_ranks: int

    @property
    def iteration_diff_ms(self) -> float:
        return self.b_iteration_ms - self.a_iteration_ms


def per_rank_mean(side: Side) -> pl.DataFrame:
    """group, time_ns, count: the group's totals over the ranks divided by the side's rank count."""
    n = side.ranks
    return side.groups.group_by("group").agg(
        (pl.col("time_ns").sum() / n).alias("time_ns"),
        (pl.col("count").sum() / n).alias("count")
        if side.groups["count"].null_count() == 0
        else pl.lit(None, pl.Float64).alias("count"),
    )


def diff(a: Side, b: Side, by: str) -> Diff:
    """Compare two timelines group by group (see the module docstring).

    Raises:
        PredictionError: a side has no ranks.
    """
    if a.iterations.height == 0 or b.iterations.height == 0:
        empty = a.label if a.iterations.height == 0 else b.label
        raise PredictionError(f"{empty} has no iteration to compare; was it decoded?")
    left = per_rank_mean(a).rename({"time_ns": "a_ns", "count": "a_count"})
    right = per_rank_mean(b).rename({"time_ns": "b_ns", "count": "b_count"})
    it_a, it_b = a.iteration_ns(), b.iteration_ns()
    delta_it = it_b - it_a
    table = left.join(right, on="group", how="full", coalesce=True)
    status = (
        pl.when(pl.col("a_ns").is_null())
        .then(pl.lit("added"))
        .when(pl.col("b_ns").is_null())
        .then(pl.lit("removed"))
        .when(pl.col("a_ns") == pl.col("b_ns"))
        .then(pl.lit("same"))
        .otherwise(pl.lit("changed"))
    )
    table = table.with_columns(
        status.alias("status"), pl.col("a_ns").fill_null(0.0), pl.col("b_ns").fill_null(0.0)
    ).with_columns((pl.col("b_ns") - pl.col("a_ns")).alias("diff_ns"))
    share = pl.col("diff_ns") / delta_it * 100.0 if delta_it != 0 else pl.lit(None, pl.Float64)
    table = table.with_columns(share.alias("share_pct")).sort(
        [pl.col("diff_ns").abs(), "group"], descending=[True, False]
    )
    table = table.select(
        "group",
        (pl.col("a_ns") / 1e6).alias("a_ms"),
        (pl.col("b_ns") / 1e6).alias("b_ms"),
        (pl.col("diff_ns") / 1e6).alias("diff_ms"),
        "share_pct",
        pl.col("a_count").cast(pl.Float64),
        pl.col("b_count").cast(pl.Float64),
        "status",
    )
    return Diff(
        a=a.label,
        b=b.label,
        by=by,
        table=table,
        a_iteration_ms=it_a / 1e6,
        b_iteration_ms=it_b / 1e6,
        a_ranks=a.ranks,
        b_ranks=b.ranks,
    )


def operator_side(label: str, operators: pl.DataFrame, iterations: pl.DataFrame, by: str) -> Side:
    """A side from operator time per rank (``diff_operator_time.sql`` rows: rank, family, name,
    component, count, time_ns) and iteration times per rank (rank, iteration_ns)."""
    _check_by(by)
    groups = operators.group_by("rank", pl.col(by).fill_null("other").alias("group")).agg(
        pl.col("time_ns").sum().cast(pl.Float64), pl.col("count").sum().cast(pl.Float64)
    )
    return Side(label, groups, iterations.select("rank", pl.col("iteration_ns").cast(pl.Float64)))


def component_side(label: str, components: pl.DataFrame, column: str = "measured_ns") -> Side:
    """A side from ``predict.components.component_table`` rows: the disjoint component times (idle
    included) of ``column`` (``measured_ns`` or ``predicted_ns``) and the ``iteration`` rows."""
    busy = components.filter(pl.col("component") != "iteration").select(
        "rank", pl.col("component").alias("group"), pl.col(column).cast(pl.Float64).alias("time_ns"),
        pl.lit(None, pl.Float64).alias("count"),
    )  # fmt: skip
    its = components.filter(pl.col("component") == "iteration").select(
        "rank", pl.col(column).cast(pl.Float64).alias("iteration_ns")
    )
    return Side(label, busy.filter(pl.col("time_ns") > 0), its)


def predicted_sides(predictions: pl.DataFrame, iteration: pl.DataFrame, by: str, run: str) -> tuple[Side, Side]:
    """Measured and predicted sides of one replay, from ``prediction_rows`` joined with the operator
    ``name`` (rank, event_id, family, component, name, measured_dur_ns, predicted_dur_ns) and
    ``Prediction.iteration_error()`` (rank, measured_ns, predicted_ns)."""
    _check_by(by)
    sides = []
    for label, dur, it in (
        (f"{run} measured", "measured_dur_ns", "measured_ns"),
        (f"{run} predicted", "predicted_dur_ns", "predicted_ns"),
    ):
        groups = predictions.group_by("rank", pl.col(by).fill_null("other").alias("group")).agg(
            pl.col(dur).sum().cast(pl.Float64).alias("time_ns"), pl.len().cast(pl.Float64).alias("count")
        )
        sides.append(Side(label, groups, iteration.select("rank", pl.col(it).cast(pl.Float64).alias("iteration_ns"))))
    return sides[0], sides[1]


def _check_by(by: str) -> None:
    if by not in BY:
        raise PredictionError(f"unknown --by {by!r}; use one of {', '.join(BY)}")
