"""What a source provides so that its runs can be predicted at other parallel layouts.

A source whose runs can be rebuilt at another layout names, in its ``Source.relayout`` (the registry),
a callable taking the run's folder and returning a ``SourceRelayout``: the layout the run ran at, the
model's sizes, and a rebuild at a target layout as the ranks an ingest takes (``FolderRun``).
``relayout_run`` stores the rebuilt ranks in a scratch database and replays them like any stored run;
``search`` ranks the layouts of N GPUs by them. Nothing here knows a format: the GPUModeling25 source's
``DecodedRelayout`` is one implementation, found through the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from tracecal.ingest.trace import FolderRun
    from tracecal.predict.layouts import Layout, ModelFacts
    from tracecal.predict.relayout_shapes import ModelDims


class LayoutPlan(Protocol):
    """How a run was laid out at a target: what a layout prediction reports besides its replay."""

    @property
    def layout(self) -> Layout:
        """The target, with what it left open (micro-batches, their size, GPUs per node) resolved."""
        ...

    @property
    def source(self) -> Layout:
        """The layout the run ran at."""
        ...

    @property
    def layers_per_stage(self) -> list[int]:
        """Transformer layers of each pipeline stage at the target."""
        ...

    @property
    def partition_rule(self) -> str:
        """The framework's rule that cut the layers into stages (``layouts.partition_rule``)."""
        ...

    @property
    def notes(self) -> list[str]:
        """What the re-layout assumed or adjusted, for the user."""
        ...


@dataclass(frozen=True)
class RebuiltLayout:
    """A run rebuilt at a target layout: its ranks as an ingest stores them, how it was laid out, and the
    folder it was read from (the rebuilt ranks' source path)."""

    run: FolderRun
    plan: LayoutPlan
    folder: Path


class SourceRelayout(Protocol):
    """A run as its source rebuilds it at other layouts (what ``Source.relayout`` returns)."""

    @property
    def layout(self) -> Layout:
        """The layout the run ran at, with its micro-batches, their size and GPUs per node."""
        ...

    @property
    def dims(self) -> ModelDims:
        """The model's sizes at the run's own layout."""
        ...

    @property
    def facts(self) -> ModelFacts:
        """What decides which layouts the model can run at (``layouts.check_layout``)."""
        ...

    def first_stage_layers(self, layout: Layout) -> int:
        """Transformer layers of the first pipeline stage at ``layout`` (its memory estimate).

        Raises:
            LayoutError: a stage would hold no transformer layer.
        """
        ...

    def rebuild(self, target: Layout, *, gpus: int | None = None) -> RebuiltLayout:
        """The run's iteration at ``target`` (``gpus``: the GPUs it must use, when given).

        Raises:
            LayoutError: the model cannot run at ``target``. PredictionError: the run lacks what a
            re-layout needs.
        """
        ...
