"""Row operations of a worker's block table: the pure-Python twin.

A :class:`BlockTableRows` owns nothing; it edits two numpy arrays that belong to
a :class:`kvcy.block_table.BlockTable`: the host block table (``int32``,
``[max_num_reqs, max_num_blocks_per_req]``) and the number of blocks in use
per row (``int32``, ``[max_num_reqs]``).  The edits are numpy slice
assignments, as vLLM's worker makes them, so this twin runs at vLLM's speed;
the compiled twin (``_block_table_c``) writes the same cells with C loops.

Every method checks all of its arguments before it writes anything: a row out
of range, block ids that are not ints or not valid ids, more blocks than the
row has columns, or a block count that someone wrote out of range into the
counts array is a ``ValueError``/``TypeError`` and leaves both arrays as they
were.  Both twins raise the same exceptions with the same messages.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["IMPLEMENTATION", "MAX_BLOCK_ID", "BlockTableRows"]

IMPLEMENTATION = "python"

#: Largest block id an ``int32`` block table holds.
MAX_BLOCK_ID = 2**31 - 1


def _check_array(arr: object, name: str, ndim: int) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(arr).__name__}")
    if arr.dtype != np.int32:
        raise TypeError(f"{name} must be an int32 array, got {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {list(arr.shape)}")
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise ValueError(f"{name} must be a writeable C-contiguous array")
    return arr


def _index(value: object, name: str) -> int:
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


def _bad_block_id(block_ids: Sequence[Any], op: str) -> Exception:
    """The exception for the first element of ``block_ids`` that is not a valid block id."""
    for i, b in enumerate(block_ids):
        try:
            v = operator.index(b)
        except TypeError:
            return TypeError(f"{op}: block_ids[{i}] must be an int, got {type(b).__name__}")
        if not 0 <= v <= MAX_BLOCK_ID:
            return ValueError(f"{op}: block_ids[{i}] = {v} is not a block id (0 <= id < 2**31)")
    return TypeError(f"{op}: block_ids must be a flat sequence of ints")


class BlockTableRows:
    """Checked row edits on a block table's host array and its per-row block counts.

    Args:
        table: the host block table, ``int32 [rows, columns]``, C-contiguous.
        num_blocks_per_row: blocks in use per row, ``int32 [rows]``.
    """

    def __init__(self, table: np.ndarray, num_blocks_per_row: np.ndarray) -> None:
        table = _check_array(table, "table", 2)
        counts = _check_array(num_blocks_per_row, "num_blocks_per_row", 1)
        if counts.shape[0] != table.shape[0]:
            raise ValueError(
                f"num_blocks_per_row has {counts.shape[0]} entries for a table of {table.shape[0]} rows"
            )
        self._table = table
        self._counts = counts

    @property
    def num_rows(self) -> int:
        """Rows of the table (``max_num_reqs``)."""
        return int(self._table.shape[0])

    @property
    def num_columns(self) -> int:
        """Columns of the table (``max_num_blocks_per_req``)."""
        return int(self._table.shape[1])

    # ------------------------------------------------------------------ checks
    def _row(self, value: object, name: str, op: str) -> int:
        row = _index(value, f"{op}: {name}")
        if not 0 <= row < self._table.shape[0]:
            raise ValueError(f"{op}: {name} {row} is out of range for a block table of {self._table.shape[0]} rows")
        return row

    def _count(self, row: int, op: str) -> int:
        n = int(self._counts[row])
        if not 0 <= n <= self._table.shape[1]:
            raise ValueError(
                f"{op}: num_blocks_per_row[{row}] = {n} is out of range for a row of {self._table.shape[1]} columns"
            )
        return n

    def _ids(self, block_ids: Sequence[int], op: str) -> np.ndarray:
        # array("i") converts in C and refuses what is not an int (TypeError)
        # or does not fit an int32 (OverflowError); only negatives are left.
        try:
            ids = array("i", block_ids)
        except (TypeError, ValueError, OverflowError):
            raise _bad_block_id(block_ids, op) from None
        if min(ids) < 0:
            raise _bad_block_id(block_ids, op)
        return np.frombuffer(ids, dtype=np.int32)

    @staticmethod
    def _len(block_ids: Sequence[int], op: str) -> int:
        try:
            return len(block_ids)
        except TypeError:
            raise TypeError(f"{op}: block_ids must be a sequence of ints, got {type(block_ids).__name__}") from None

    def _prepare(self, block_ids: Sequence[int], row_idx: int, append: bool) -> tuple[int, int, np.ndarray | None]:
        """(row, first column to write, ids to write there); ids None for an append of nothing."""
        op = "append_row" if append else "add_row"
        n = self._len(block_ids, op)
        if append and n == 0:
            return -1, 0, None
        row = self._row(row_idx, "row_idx", op)
        start = self._count(row, op) if append else 0
        width = self._table.shape[1]
        if start + n > width:
            raise ValueError(f"{op}: row {row} holds {start} blocks; {n} more do not fit in its {width} columns")
        return row, start, self._ids(block_ids, op) if n else None

    # ------------------------------------------------------------------ edits
    def append_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Append ``block_ids`` to row ``row_idx``'s blocks (no-op for no ids, as in vLLM)."""
        row, start, ids = self._prepare(block_ids, row_idx, True)
        if ids is not None:
            end = start + len(ids)
            self._table[row, start:end] = ids
            self._counts[row] = end

    def add_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Make ``block_ids`` row ``row_idx``'s blocks (cells past them are left as they are)."""
        row, _, ids = self._prepare(block_ids, row_idx, False)
        if ids is None:
            self._counts[row] = 0
        else:
            self._table[row, : len(ids)] = ids
            self._counts[row] = len(ids)

    def clear_row(self, row_idx: int) -> None:
        """Zero row ``row_idx``'s blocks and set its block count to 0."""
        op = "clear_row"
        row = self._row(row_idx, "row_idx", op)
        n = self._count(row, op)
        if n > 0:
            self._table[row, :n] = 0
        self._counts[row] = 0

    def move_row(self, src: int, tgt: int) -> None:
        """Copy row ``src``'s blocks into row ``tgt``, then clear ``src`` (as vLLM: ``src == tgt`` clears it)."""
        s, t, n = self._prepare_move(src, tgt)
        table = self._table
        table[t, :n] = table[s, :n]
        self._counts[t] = n
        table[s, :n] = 0
        self._counts[s] = 0

    def _prepare_move(self, src: int, tgt: int) -> tuple[int, int, int]:
        op = "move_row"
        s = self._row(src, "src", op)
        t = self._row(tgt, "tgt", op)
        return s, t, self._count(s, op)

    def swap_row(self, src: int, tgt: int) -> None:
        """Exchange rows ``src`` and ``tgt``: every column, and their block counts."""
        op = "swap_row"
        s = self._row(src, "src", op)
        t = self._row(tgt, "tgt", op)
        if s == t:
            return
        table, counts = self._table, self._counts
        table[[s, t]] = table[[t, s]]
        counts[[s, t]] = counts[[t, s]]

    # ------------------------------------------------------------------ dry runs
    # What the edit of the same name would raise, without writing: a table of
    # several KV cache groups checks every group before it edits any.
    def check_append_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Raise what ``append_row(block_ids, row_idx)`` would raise; write nothing."""
        self._prepare(block_ids, row_idx, True)

    def check_add_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Raise what ``add_row(block_ids, row_idx)`` would raise; write nothing."""
        self._prepare(block_ids, row_idx, False)

    def check_clear_row(self, row_idx: int) -> None:
        """Raise what ``clear_row(row_idx)`` would raise; write nothing."""
        self._count(self._row(row_idx, "row_idx", "clear_row"), "clear_row")

    def check_move_row(self, src: int, tgt: int) -> None:
        """Raise what ``move_row(src, tgt)`` would raise; write nothing."""
        self._prepare_move(src, tgt)

    def check_swap_row(self, src: int, tgt: int) -> None:
        """Raise what ``swap_row(src, tgt)`` would raise; write nothing."""
        self._row(src, "src", "swap_row")
        self._row(tgt, "tgt", "swap_row")
