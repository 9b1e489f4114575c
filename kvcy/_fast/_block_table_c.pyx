# cython: language_level=3
"""Row operations of a worker's block table: the compiled twin.

Same API, checks and messages as ``_block_table_py``; the cells are written by
C loops through typed memoryviews taken once, at construction, instead of
numpy slice assignments, which cost a few microseconds of dispatch each for
rows of a few blocks.  Block ids are read straight off a list or tuple; other
sequences (numpy arrays, ranges) are turned into a list first.

Bounds checks are off in this module, so every index is checked in the
``def`` methods before it is used, including the block counts read back from
the counts array (which Python code may write freely).
"""

cimport cython
from cpython.long cimport PyLong_AsLongLong, PyLong_AsLongLongAndOverflow
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.string cimport memcpy, memset

import operator

import numpy as np

__all__ = ["IMPLEMENTATION", "MAX_BLOCK_ID", "BlockTableRows"]

IMPLEMENTATION = "cython"

#: Largest block id an ``int32`` block table holds.
MAX_BLOCK_ID = 2**31 - 1

cdef long long _MAX_ID = 2**31 - 1


cdef object _check_array(object arr, str name, int ndim):
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(arr).__name__}")
    if arr.dtype != np.int32:
        raise TypeError(f"{name} must be an int32 array, got {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {list(arr.shape)}")
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise ValueError(f"{name} must be a writeable C-contiguous array")
    return arr


cdef object _bad_block_id(object block_ids, str op):
    """The exception for the first element of ``block_ids`` that is not a valid block id."""
    for i, b in enumerate(block_ids):
        try:
            v = operator.index(b)
        except TypeError:
            return TypeError(f"{op}: block_ids[{i}] must be an int, got {type(b).__name__}")
        if not 0 <= v <= MAX_BLOCK_ID:
            return ValueError(f"{op}: block_ids[{i}] = {v} is not a block id (0 <= id < 2**31)")
    return TypeError(f"{op}: block_ids must be a flat sequence of ints")


@cython.final
cdef class BlockTableRows:
    """Checked row edits on a block table's host array and its per-row block counts.

    Args:
        table: the host block table, ``int32 [rows, columns]``, C-contiguous.
        num_blocks_per_row: blocks in use per row, ``int32 [rows]``.
    """

    cdef int[:, ::1] _table
    cdef int[::1] _counts
    cdef Py_ssize_t _rows
    cdef Py_ssize_t _width
    cdef object _arrays  # keeps the arrays (and so the memory) alive

    def __init__(self, table, num_blocks_per_row):
        table = _check_array(table, "table", 2)
        counts = _check_array(num_blocks_per_row, "num_blocks_per_row", 1)
        if counts.shape[0] != table.shape[0]:
            raise ValueError(
                f"num_blocks_per_row has {counts.shape[0]} entries for a table of {table.shape[0]} rows"
            )
        self._table = table
        self._counts = counts
        self._rows = table.shape[0]
        self._width = table.shape[1]
        self._arrays = (table, counts)

    @property
    def num_rows(self):
        """Rows of the table (``max_num_reqs``)."""
        return self._rows

    @property
    def num_columns(self):
        """Columns of the table (``max_num_blocks_per_req``)."""
        return self._width

    # ------------------------------------------------------------------ checks
    cdef inline Py_ssize_t _row(self, object value, str name, str op) except -1:
        cdef long long row
        cdef int overflow = 0
        if type(value) is not int:
            try:
                value = operator.index(value)
            except TypeError:
                raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}") from None
        row = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:
            row = -1
        if row < 0 or row >= self._rows:
            raise ValueError(
                f"{op}: {name} {value} is out of range for a block table of {self._rows} rows"
            )
        return <Py_ssize_t>row

    cdef inline Py_ssize_t _count(self, Py_ssize_t row, str op) except -1:
        cdef int n = self._counts[row]
        if n < 0 or n > self._width:
            raise ValueError(
                f"{op}: num_blocks_per_row[{row}] = {n} is out of range for a row of {self._width} columns"
            )
        return n

    cdef inline Py_ssize_t _len(self, object block_ids, str op) except -1:
        try:
            return len(block_ids)
        except TypeError:
            raise TypeError(f"{op}: block_ids must be a sequence of ints, got {type(block_ids).__name__}") from None

    cdef object _as_seq(self, object block_ids):
        if type(block_ids) is list or type(block_ids) is tuple:
            return block_ids
        if isinstance(block_ids, np.ndarray) and block_ids.ndim == 1 and block_ids.dtype.kind in "iub":
            return block_ids.tolist()
        return list(block_ids)

    cdef int _check_ids(self, object seq, Py_ssize_t n, object block_ids, str op) except -1:
        """Every element an int in [0, MAX_BLOCK_ID]; else raise as the pure twin does."""
        cdef Py_ssize_t i
        cdef object item
        cdef long long v
        cdef int overflow = 0
        cdef bint is_list = type(seq) is list
        for i in range(n):
            item = <object>(PyList_GET_ITEM(seq, i) if is_list else PyTuple_GET_ITEM(seq, i))
            if type(item) is not int:
                raise _bad_block_id(block_ids, op)
            v = PyLong_AsLongLongAndOverflow(item, &overflow)
            if overflow or v < 0 or v > _MAX_ID:
                raise _bad_block_id(block_ids, op)
        return 0

    cdef object _prepare(self, object block_ids, object row_idx, bint append,
                         Py_ssize_t* row, Py_ssize_t* start):
        """The ids as a checked list or tuple; None for an append of nothing."""
        cdef str op = "append_row" if append else "add_row"
        cdef Py_ssize_t n = self._len(block_ids, op)
        if append and n == 0:
            return None
        row[0] = self._row(row_idx, "row_idx", op)
        start[0] = self._count(row[0], op) if append else 0
        if start[0] + n > self._width:
            raise ValueError(
                f"{op}: row {row[0]} holds {start[0]} blocks; {n} more do not fit in its {self._width} columns"
            )
        if n == 0:
            return None
        seq = self._as_seq(block_ids)
        if len(seq) != n:
            raise _bad_block_id(block_ids, op)
        try:
            self._check_ids(seq, n, block_ids, op)
        except (TypeError, ValueError):
            # Not ints (numpy scalars, bools...): the pure twin's rules decide.
            seq = self._coerce(seq, block_ids, op)
        return seq

    cdef object _coerce(self, object seq, object block_ids, str op):
        out = []
        for b in seq:
            try:
                v = operator.index(b)
            except TypeError:
                raise _bad_block_id(block_ids, op) from None
            if type(v) is not int or not 0 <= v <= MAX_BLOCK_ID:
                raise _bad_block_id(block_ids, op)
            out.append(int(v))
        return out

    cdef inline void _write(self, object seq, Py_ssize_t row, Py_ssize_t start) noexcept:
        cdef Py_ssize_t i, n
        cdef int* dst = &self._table[row, 0]
        if type(seq) is list:
            n = PyList_GET_SIZE(seq)
            for i in range(n):
                dst[start + i] = <int>PyLong_AsLongLong(<object>PyList_GET_ITEM(seq, i))
        else:
            n = PyTuple_GET_SIZE(seq)
            for i in range(n):
                dst[start + i] = <int>PyLong_AsLongLong(<object>PyTuple_GET_ITEM(seq, i))
        self._counts[row] = <int>(start + n)

    # ------------------------------------------------------------------ edits
    def append_row(self, block_ids, row_idx):
        """Append ``block_ids`` to row ``row_idx``'s blocks (no-op for no ids, as in vLLM)."""
        cdef Py_ssize_t row = 0, start = 0
        seq = self._prepare(block_ids, row_idx, True, &row, &start)
        if seq is not None:
            self._write(seq, row, start)

    def add_row(self, block_ids, row_idx):
        """Make ``block_ids`` row ``row_idx``'s blocks (cells past them are left as they are)."""
        cdef Py_ssize_t row = 0, start = 0
        seq = self._prepare(block_ids, row_idx, False, &row, &start)
        if seq is None:
            self._counts[row] = 0
        else:
            self._write(seq, row, 0)

    def clear_row(self, row_idx):
        """Zero row ``row_idx``'s blocks and set its block count to 0."""
        cdef Py_ssize_t row = self._row(row_idx, "row_idx", "clear_row")
        cdef Py_ssize_t n = self._count(row, "clear_row")
        if n > 0:
            memset(&self._table[row, 0], 0, n * sizeof(int))
        self._counts[row] = 0

    def move_row(self, src, tgt):
        """Copy row ``src``'s blocks into row ``tgt``, then clear ``src`` (as vLLM: ``src == tgt`` clears it)."""
        cdef Py_ssize_t s = self._row(src, "src", "move_row")
        cdef Py_ssize_t t = self._row(tgt, "tgt", "move_row")
        cdef Py_ssize_t n = self._count(s, "move_row")
        if n > 0:
            if s != t:
                memcpy(&self._table[t, 0], &self._table[s, 0], n * sizeof(int))
            memset(&self._table[s, 0], 0, n * sizeof(int))
        self._counts[t] = <int>n
        self._counts[s] = 0

    def swap_row(self, src, tgt):
        """Exchange rows ``src`` and ``tgt``: every column, and their block counts."""
        cdef Py_ssize_t s = self._row(src, "src", "swap_row")
        cdef Py_ssize_t t = self._row(tgt, "tgt", "swap_row")
        cdef Py_ssize_t i
        cdef int tmp
        cdef int* a
        cdef int* b
        if s == t:
            return
        a = &self._table[s, 0]
        b = &self._table[t, 0]
        for i in range(self._width):
            tmp = a[i]
            a[i] = b[i]
            b[i] = tmp
        tmp = self._counts[s]
        self._counts[s] = self._counts[t]
        self._counts[t] = tmp

    # ------------------------------------------------------------------ dry runs
    # What the edit of the same name would raise, without writing: a table of
    # several KV cache groups checks every group before it edits any.
    def check_append_row(self, block_ids, row_idx):
        """Raise what ``append_row(block_ids, row_idx)`` would raise; write nothing."""
        cdef Py_ssize_t row = 0, start = 0
        self._prepare(block_ids, row_idx, True, &row, &start)

    def check_add_row(self, block_ids, row_idx):
        """Raise what ``add_row(block_ids, row_idx)`` would raise; write nothing."""
        cdef Py_ssize_t row = 0, start = 0
        self._prepare(block_ids, row_idx, False, &row, &start)

    def check_clear_row(self, row_idx):
        """Raise what ``clear_row(row_idx)`` would raise; write nothing."""
        self._count(self._row(row_idx, "row_idx", "clear_row"), "clear_row")

    def check_move_row(self, src, tgt):
        """Raise what ``move_row(src, tgt)`` would raise; write nothing."""
        cdef Py_ssize_t s = self._row(src, "src", "move_row")
        self._row(tgt, "tgt", "move_row")
        self._count(s, "move_row")

    def check_swap_row(self, src, tgt):
        """Raise what ``swap_row(src, tgt)`` would raise; write nothing."""
        self._row(src, "src", "swap_row")
        self._row(tgt, "tgt", "swap_row")
