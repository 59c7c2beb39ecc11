"""One ``samples`` row of a measurement this machine took: what every sampler writes the same way.

A sampler knows what it timed (the op, its shape or collective columns, its own settings for
``params_json``); ``sample_row`` adds what every measured row carries: the statistics of the
per-repeat durations (``timing.summarize``), where it was taken (``timing.SamplerEnv``), the source
and the time. The compute sampler (``compute``) and the communication sampler (``comm``) both build
their rows here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import msgspec

from tracecal.samplers.timing import SamplerEnv, summarize
from tracecal.schema import SAMPLES

SOURCE = "sampler"
"""``samples.source`` of every row a sampler of this package measured."""


def sample_row(
    env: SamplerEnv,
    *,
    sample_id: str,
    cluster: str,
    family: str,
    op: str,
    direction: str,
    durations_ns: Sequence[float],
    params: Mapping[str, Any],
    source_file: str | None,
    columns: Mapping[str, Any],
) -> dict[str, Any]:
    """A row with every ``samples`` column (None where nothing says otherwise): the identity given,
    ``median_ns``/``min_ns``/``iqr_ns``/``repeats`` of ``durations_ns``, ``env``'s device, host and
    library versions, ``params`` as JSON, and ``columns`` (shape or collective columns, ``timing``;
    a mapping, as ``params`` is a shape column too).

    Raises:
        KeyError: a name in ``columns`` is not a ``samples`` column (a programming error).
    """
    unknown = sorted(set(columns) - set(SAMPLES.column_names))
    if unknown:
        raise KeyError(f"not samples columns: {', '.join(unknown)}")
    stats = summarize(durations_ns)
    row: dict[str, Any] = dict.fromkeys(SAMPLES.column_names)
    row.update(columns)
    row.update(
        sample_id=sample_id,
        cluster=cluster,
        device_name=env.device_name,
        host=env.host,
        family=family,
        op=op,
        direction=direction,
        median_ns=stats.median_ns,
        min_ns=stats.min_ns,
        iqr_ns=stats.iqr_ns,
        repeats=stats.repeats,
        source=SOURCE,
        source_file=source_file,
        params_json=msgspec.json.encode(params).decode(),
        torch_version=env.torch_version,
        cuda_version=env.cuda_version,
        nccl_version=env.nccl_version,
        sampled_at=datetime.now(timezone.utc).replace(tzinfo=None),
    )
    return row
