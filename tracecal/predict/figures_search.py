"""The figure of a layout search (matplotlib, Agg backend, one PNG): throughput per layout beside the
component split of its slowest stage."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracecal.predict.figures import COLORS


def search_figure(table: pl.DataFrame, path: Path, title: str) -> Path:
    """Left: samples per second per layout (ranked); right: each layout's component shares, stacked.

    ``table``: ``search.ranking`` rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    labels = [f"{r['layout']}\n(batch {r['global_batch']})" for r in table.iter_rows(named=True)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8.0, 1.3 * len(labels) + 4), 4.5))
    left.bar(range(len(labels)), table["samples_per_s"].to_list(), color="#4C72B0")
    left.set_xticks(range(len(labels)), labels, fontsize=8)
    left.set_ylabel("samples / s (predicted)")
    left.set_title("throughput")
    bottom = [0.0] * table.height
    for comp, color in COLORS.items():
        col = f"{comp}_share"
        if col not in table.columns:
            continue
        values = table[col].fill_null(0.0).to_list()
        right.bar(range(len(labels)), values, bottom=bottom, color=color, label=comp)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_xticks(range(len(labels)), labels, fontsize=8)
    right.set_ylabel("share of the slowest stage's iteration")
    right.set_title("component split")
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
