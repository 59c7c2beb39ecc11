"""Shape columns of stored compute samples, re-derived from the trace record each one carries.

A compute sample's shape columns are ``decode.shape_features.shape_row`` of the Input Dims, Input type and
Concrete Inputs a trace records for its call (``cases.shape_columns``), and the sampler stores that
record in ``params_json``. When the decoder's features change (``io_bytes`` of an element-wise op
counting each tensor at its own dtype, for one), samples exported by an earlier tracecal would keep
the old values while re-ingested operators get the new ones, and the two sides of calibration's join
would no longer mean the same thing. Importing them re-derives the columns from the record instead.
Sample ids are kept: they name the measurement, which has not changed.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from tracecal.decode.shape_features import DTYPE_BYTES, shape_row
from tracecal.samplers.rows import SOURCE
from tracecal.schema import SAMPLES, SHAPE_COLUMNS, arrow_schema

RECORD_KEYS = ("input_dims", "input_types", "concrete_inputs")
"""The ``params_json`` keys holding a sample's trace record."""


def recorded_shape_row(op: str, params_json: str | None, dtype: str | None) -> dict[str, Any] | None:
    """The shape columns of a sample whose ``params_json`` holds its call's trace record, as
    ``cases.shape_columns`` computes them (a TensorList's element type is the sample's ``dtype``);
    None when it holds no record (imported, collective or older samples)."""
    try:
        params = json.loads(params_json) if params_json else None
    except json.JSONDecodeError:
        return None
    if not isinstance(params, dict) or "input_dims" not in params or "input_types" not in params:
        return None
    dims, types, concrete = (params.get(key) for key in RECORD_KEYS)
    row = shape_row(op, dims, types, concrete, list_element_bytes=DTYPE_BYTES.get(dtype or ""))
    row["dtype"] = row["dtype"] or dtype
    return row


def rederive_shape_columns(table: pa.Table) -> pa.Table:
    """``table`` (rows of the ``samples`` schema) with the shape columns of every sampler-measured
    row that carries its trace record re-derived by this version's decoder; other rows unchanged."""
    names = [c.name for c in SHAPE_COLUMNS]
    columns = {name: table.column(name).to_pylist() for name in names}
    ops, sources = table.column("op").to_pylist(), table.column("source").to_pylist()
    params, dtypes = table.column("params_json").to_pylist(), table.column("dtype").to_pylist()
    changed = False
    for i, (op, source, record, dtype) in enumerate(zip(ops, sources, params, dtypes, strict=True)):
        row = recorded_shape_row(op, record, dtype) if source == SOURCE else None
        if row is None:
            continue
        for name in names:
            if columns[name][i] != row[name]:
                columns[name][i] = row[name]
                changed = True
    if not changed:
        return table
    schema = arrow_schema(SAMPLES)
    for name in names:
        table = table.set_column(table.column_names.index(name), name, pa.array(columns[name], schema.field(name).type))
    return table
