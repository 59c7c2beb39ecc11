"""Figures of a validation (matplotlib, Agg backend, PNG files): component proportions per run, the
measured vs replayed timeline of one rank, the published comparison's stages and shares, and where
each component's error comes from (the attribution). The only module of ``tracecal.predict`` that
plots."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tracecal.predict.components import COMPONENTS, node_components
from tracecal.predict.run import Prediction

COLORS = {
    "compute_fwd": "#4C72B0",
    "compute_bwd": "#55A868",
    "optimizer": "#8172B2",
    "other": "#937860",
    "comm_tp": "#C44E52",
    "comm_dp": "#DD8452",
    "comm_pp": "#DA8BC3",
    "comm_ep": "#8C8C8C",
    "comm_other": "#CCB974",
    "memcpy": "#64B5CD",
    "idle": "#E5E5E5",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def component_proportions(components: pl.DataFrame, path: Path) -> Path:
    """Stacked bars: for each run, the share of each component in the rank-summed iteration time,
    measured (left bar) and predicted (right bar). ``components``: rows of several runs."""
    plt = _pyplot()
    parts = [*COMPONENTS, "idle"]
    runs = list(dict.fromkeys(components["run_id"].to_list()))
    totals = (
        components.filter(pl.col("component").is_in(parts))
        .group_by("run_id", "component")
        .agg(pl.col("measured_ns").sum(), pl.col("predicted_ns").sum())
    )
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(runs) + 2), 4.5))
    x = np.arange(len(runs), dtype=float)
    width = 0.38
    for offset, col in ((-width / 2 - 0.01, "measured_ns"), (width / 2 + 0.01, "predicted_ns")):
        bottom = np.zeros(len(runs))
        sums = np.array([totals.filter(pl.col("run_id") == r)[col].sum() for r in runs], dtype=float)
        for comp in parts:
            vals = np.array(
                [totals.filter((pl.col("run_id") == r) & (pl.col("component") == comp))[col].sum() for r in runs],
                dtype=float,
            )
            share = np.divide(vals, sums, out=np.zeros_like(vals), where=sums > 0)
            label = comp if col == "measured_ns" else None
            ax.bar(x + offset, share, width, bottom=bottom, color=COLORS[comp], label=label, edgecolor="white", lw=0.3)
            bottom += share
    ax.set_xticks(x, [f"{r}\nmeasured | predicted" for r in runs], fontsize=8)
    ax.set_ylabel("share of iteration time (summed over ranks)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("component proportions per run")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def rank_timeline(prediction: Prediction, rank: int, path: Path, title: str = "") -> Path:
    """Two rows of intervals coloured by component: the rank's measured schedule and its replay."""
    plt = _pyplot()
    g = prediction.graph
    comp = node_components(g)
    idx = np.flatnonzero((g.nodes["rank"].to_numpy() == rank) & (comp != None))  # noqa: E711
    fig, ax = plt.subplots(figsize=(11, 2.8))
    rows = (("measured", g.measured_times, 1.0), ("predicted", prediction.replayed, 0.0))
    origin = min(g.measured_times[2 * idx].min(), prediction.replayed[2 * idx].min()) if idx.size else 0
    for _label, times, y in rows:
        for c in COMPONENTS:
            sel = idx[comp[idx] == c]
            if sel.size == 0:
                continue
            starts = (times[2 * sel] - origin) / 1e6
            widths = np.maximum((times[2 * sel + 1] - times[2 * sel]) / 1e6, 1e-6)
            ax.broken_barh(
                list(zip(starts, widths, strict=True)), (y + 0.1, 0.8), color=COLORS[c], label=c if y else None
            )
    ax.set_yticks([0.5, 1.5], ["predicted", "measured"])
    ax.set_xlabel("ms from the iteration start")
    ax.set_title(title or f"rank {rank}: measured vs replayed ({prediction.mode})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def published_component_shares(shares: pl.DataFrame, path: Path) -> Path:
    """Horizontal bars, one panel per run: the share (%) of the predicted iteration each published
    component takes (``shares``: rows of ``published.component_shares`` for several runs)."""
    plt = _pyplot()
    runs = list(dict.fromkeys(shares["run_id"].to_list()))
    cols = min(3, max(1, len(runs)))
    rows = -(-len(runs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharex=True)
    for ax, run in zip(axes.flat, runs, strict=False):
        part = shares.filter(pl.col("run_id") == run)
        names = part["component"].to_list()
        values = part["share_pct"].fill_null(0.0).to_numpy()
        y = np.arange(len(names))
        ax.barh(y, values, color="#4C72B0")
        for yi, v in zip(y, values, strict=True):
            ax.text(v, yi, f" {v:.1f}", va="center", fontsize=6)
        ax.set_yticks(y, names, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(run, fontsize=8)
    for ax in list(axes.flat)[len(runs) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("% of the predicted iteration")
    fig.suptitle("component shares of the predicted iteration (shares overlap)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def published_stage_times(stages: pl.DataFrame, path: Path) -> Path:
    """A grid of runs (rows) by module (``stage_fwd``, ``stage_bwd``, ``optimizer``; columns): measured
    and predicted ms per pipeline stage (``stages``: rows of ``published.stage_comparison``); a measured
    bar edited by hand in the published measurements is hatched."""
    plt = _pyplot()
    runs = list(dict.fromkeys(stages["run_id"].to_list()))
    modules = list(dict.fromkeys(stages["module"].to_list()))
    fig, axes = plt.subplots(len(runs), len(modules), figsize=(3.6 * len(modules), 2.4 * len(runs)), squeeze=False)
    width = 0.38
    for r, run in enumerate(runs):
        for c, module in enumerate(modules):
            ax = axes[r][c]
            part = stages.filter((pl.col("run_id") == run) & (pl.col("module") == module))
            x = np.arange(part.height, dtype=float)
            measured = part["measured_ms"].fill_null(0.0).to_numpy()
            predicted = part["predicted_ms"].fill_null(0.0).to_numpy()
            bars = ax.bar(x - width / 2, measured, width, color="#937860", label="measured")
            for bar, edited in zip(bars, part["hand_edited"].to_list(), strict=True):
                if edited:
                    bar.set_hatch("///")
                    bar.set_edgecolor("white")
            ax.bar(x + width / 2, predicted, width, color="#4C72B0", label="predicted")
            ax.set_xticks(x, part["stage"].to_list(), fontsize=7)
            ax.tick_params(axis="y", labelsize=7)
            ax.set_title(f"{run}: {module}", fontsize=7)
            if c == 0:
                ax.set_ylabel("ms", fontsize=7)
    axes[0][-1].legend(fontsize=6, loc="upper right")
    fig.suptitle("measured vs predicted per stage (hatched: measured value edited by hand)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


PART_COLORS = {"schedule": "#8C8C8C", "interaction": "#D0D0D0"}
"""Colours of the two attribution parts that are not a family (families take the tab20 colours)."""


def error_attribution(parts: pl.DataFrame, path: Path) -> Path:
    """Where each component's error comes from, one panel per run: per component a horizontal bar of
    signed parts (the schedule, each family, the interaction; positive parts stack right of 0,
    negative ones left) and a black mark at the component's error. ``parts``: the long form of an
    attribution (``attribution.long_form``: run_id, component, error_pct, part, share_pct)."""
    plt = _pyplot()
    runs = list(dict.fromkeys(parts["run_id"].to_list()))
    names = list(dict.fromkeys(parts["part"].to_list()))
    families = sorted(n for n in names if n not in PART_COLORS)
    palette = plt.get_cmap("tab20")
    colors = {**PART_COLORS, **{f: palette(i % 20) for i, f in enumerate(families)}}
    cols = min(2, max(1, len(runs)))
    rows = -(-len(runs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.4 * rows), squeeze=False)
    for ax, run in zip(axes.flat, runs, strict=False):
        run_parts = parts.filter(pl.col("run_id") == run)
        components = list(dict.fromkeys(run_parts.filter(pl.col("error_pct").is_not_null())["component"].to_list()))
        y = np.arange(len(components), dtype=float)
        pos, neg = np.zeros(len(components)), np.zeros(len(components))
        for name in ["schedule", *families, "interaction"]:
            sel = run_parts.filter(pl.col("part") == name)
            share = dict(zip(sel["component"].to_list(), sel["share_pct"].fill_null(0.0).to_list(), strict=True))
            values = np.array([share.get(c, 0.0) for c in components], dtype=float)
            left = np.where(values >= 0, pos, neg)
            ax.barh(y, values, left=left, color=colors[name], edgecolor="white", lw=0.3, height=0.7, label=name)
            pos += np.clip(values, 0, None)
            neg += np.clip(values, None, 0)
        errors = run_parts.unique(["component"], keep="first", maintain_order=True)
        err = dict(zip(errors["component"].to_list(), errors["error_pct"].to_list(), strict=True))
        ax.scatter([err[c] for c in components], y, marker="D", s=14, color="black", zorder=3, label="error")
        ax.axvline(0, color="black", lw=0.5)
        ax.set_yticks(y, components, fontsize=7)
        ax.invert_yaxis()
        ax.tick_params(axis="x", labelsize=7)
        ax.set_xlabel("% of the measured component time", fontsize=7)
        ax.set_title(run, fontsize=8)
    for ax in list(axes.flat)[len(runs) :]:
        ax.set_visible(False)
    legend: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.95))
    fig.suptitle("where the error comes from: the schedule, each family predicted alone, their interaction", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
