"""``Input Dims`` cells: the shapes a profiler records for an operator's arguments (docs/parsing.md#input-dims).

A cell is JSON: a list with one entry per argument. A tensor is its shape (a list of integers, ``[]``
for a scalar tensor), an argument that is no tensor is ``[]``, and a tensor list is a list of shapes.
Older torch records a tensor list as ``[]``; newer torch records the tensors of c10d collectives
and of ``cat``/``stack`` as lists: an all-reduce ``[[[4, 2048, 6144]], [], [], []]``, a cat
``[[[2048, 4, 16, 24], [2048, 4, 16, 72]], []]``.

Pure functions of one cell; anything that is not such a list (text, a number, deeper nesting) gives
no shape (None), never an exception. Readers of a format whose cells must be lists (the decoded
kernel tables) check them with ``is_dims_text`` and name the cell themselves.
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

_OUTPUT_FIRST = re.compile(r"^c10d::(_?allgather|_?reduce_scatter|alltoall|gather_|scatter_)")
"""Collective operators whose first argument is their output (a c10d ``allgather_(Tensor[][] output,
Tensor[] input, ...)``, ``_allgather_base_(Tensor output, Tensor input, ...)``, reduce-scatter,
all-to-all, gather, scatter); their input is the second argument. ``nccl:``/``gloo:`` ranges record
their input tensors only, ``record_param_comms`` and the functional collectives
(``_c10d_functional::all_gather_into_tensor(Tensor input, ...)``) their input first."""


def parse_dims(cell: str | list[Any] | None) -> list[Any] | None:
    """A cell as its list of arguments; None when absent, not JSON or not a list."""
    if cell is None or isinstance(cell, list):
        return cell
    if not isinstance(cell, (str, bytes)):
        return None
    try:
        value = orjson.loads(cell)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, list) else None


def is_dims_text(cell: str) -> bool:
    """Whether ``cell`` is JSON text of a list (what every Input Dims cell is, however nested)."""
    return parse_dims(cell) is not None


def is_shape(value: Any) -> bool:
    """A tensor's shape: a list of non-negative integers (``[]`` is a scalar tensor or no tensor)."""
    return isinstance(value, list) and all(type(d) is int and d >= 0 for d in value)


def argument_shapes(argument: Any) -> list[list[int]]:
    """The tensor shapes one argument holds: its own shape when it is a tensor (none for ``[]``), the
    non-empty shapes of a tensor list, else none (a scalar, text, deeper nesting)."""
    if not isinstance(argument, list) or not argument:
        return []
    if is_shape(argument):
        return [argument]
    if all(is_shape(x) for x in argument):
        return [x for x in argument if x]
    return []


def elements(shape: list[int]) -> int:
    """Elements of a tensor of ``shape`` (1 for a scalar tensor)."""
    return math.prod(shape)


def tensor_shapes(cell: str | list[Any] | None) -> list[list[int]]:
    """Every tensor shape of a cell, argument by argument, tensor lists flattened."""
    return [s for argument in parse_dims(cell) or [] for s in argument_shapes(argument)]


_COLLECTIVE_OPERATOR = re.compile(
    r"(?i)^(nccl|rccl|gloo|c10d|_c10d_functional|c10d_functional):|^record_param_comms$|^ProcessGroup"
)
"""Operators that are a collective call and record its tensors: the c10d operators, the backends'
``nccl:``/``gloo:`` ranges, ``record_param_comms`` and the functional collectives. Any other operator
(``CheckpointFunctionBackward`` around an activation all-gather) records its own arguments
(``message_elements`` says when they are the message)."""


def is_collective_operator(op_name: str | None) -> bool:
    """Whether ``op_name`` is a collective call whose Input Dims are the collective's tensors."""
    return bool(op_name) and _COLLECTIVE_OPERATOR.search(op_name or "") is not None


def input_argument(op_name: str | None) -> int:
    """Which argument of ``op_name`` holds a collective's input (``_OUTPUT_FIRST``): 1 or 0."""
    return 1 if op_name and _OUTPUT_FIRST.search(op_name) else 0


SAME_SIZE_COLLECTIVES = frozenset({"allreduce", "broadcast", "reduce", "send", "recv", "sendrecv"})
"""Collectives (letters only) whose input and output are one tensor of one size on every rank: any
operator that holds that tensor states the message. An all-gather's shard and whole differ (as do a
reduce-scatter's and an all-to-all's), so only the collective call's signature tells them apart."""


def message_elements(op_name: str | None, cell: str | list[Any] | None, collective: str | None = None) -> int | None:
    """Elements of a collective's message as the operator ``op_name`` records it: its input, one rank's
    share of an all-gather.

    A collective call (``is_collective_operator``; an unnamed operator is read as one) states it by
    its signature: the tensors of its input argument summed (an all-reduce's list of tensors; an
    all-gather's input, not its output list). Any other operator (the frame around the call,
    ``_ReduceFromModelParallelRegion``, ``CheckpointFunctionBackward``) records its own arguments:
    its first is the message only of a collective whose input and output are the same tensor
    (``collective`` in ``SAME_SIZE_COLLECTIVES``, spelt with or without underscores); of an
    all-gather it may be the shard or the gathered whole, so it states nothing.

    None when the operator states nothing, that argument holds no tensor, the cell says nothing or
    the count is beyond int64."""
    same_size = (collective or "").replace("_", "").lower() in SAME_SIZE_COLLECTIVES
    if op_name is not None and not is_collective_operator(op_name) and not same_size:
        return None
    dims = parse_dims(cell)
    index = input_argument(op_name)
    if not dims or index >= len(dims):
        return None
    shapes = argument_shapes(dims[index])
    total = sum(elements(s) for s in shapes)
    return total if shapes and total <= INT64_MAX else None


def output_elements(op_name: str | None, cell: str | list[Any] | None) -> int | None:
    """Elements of the output argument of a collective call whose first argument is its output
    (``_OUTPUT_FIRST``: an all-gather's gathered whole, a reduce-scatter's shard); None for any other
    operator, or when the output holds no tensor (older torch's unrecorded lists)."""
    if input_argument(op_name) != 1:
        return None
    dims = parse_dims(cell)
    shapes = argument_shapes(dims[0]) if dims else []
    total = sum(elements(s) for s in shapes)
    return total if shapes and total <= INT64_MAX else None


INT64_MAX = 2**63 - 1
"""Counts beyond this are no real tensor's (and no int64 column holds them): no answer."""


_JOINS = re.compile(r"(?:^|::)(cat|concat|concatenate|stack|hstack|vstack|_cat|_stack)$")
"""Operators whose output holds every tensor of their first argument (a list): ``cat``, ``stack``."""


def joins_tensors(op_name: str | None) -> bool:
    """Whether ``op_name`` concatenates or stacks the tensor list of its first argument."""
    return bool(op_name) and _JOINS.search(op_name or "") is not None
