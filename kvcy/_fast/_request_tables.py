"""The per-request tables of a single-type manager, as callers see them (both twins).

``SingleTypeKVCacheManager.req_to_blocks`` and ``.num_cached_block`` are
mappings over the manager's own dicts: reads go straight through, and every
change is checked first and then moves the manager's generation (the compiled
twin's per-request record reads it; the Python twin passes ``None``).  Not a
hot path, so one pure-Python home serves both twins; each twin passes its own
block class and count check.
"""

from __future__ import annotations

from collections.abc import MutableMapping

__all__ = ["_BlockTable", "_CountTable", "_RequestTable"]


class _RequestTable(MutableMapping):
    """A manager's per-request table (``req_to_blocks``, ``num_cached_block``) as callers see it.

    A mapping over the manager's own dict: reads go straight to it; every
    change checks the key (a request id) and the value before it is made and
    then moves the manager's generation, so that what the compiled manager
    remembers per request is read again (the Python twin remembers nothing:
    its tables only check).  The table itself cannot be replaced.
    """

    __slots__ = ("_entries", "_generation")

    def __init__(self, entries, generation):
        self._entries = entries
        self._generation = generation

    def _check(self, value):
        return value

    def __getitem__(self, request_id):
        return self._entries[request_id]

    def __setitem__(self, request_id, value):
        if type(request_id) is not str:
            raise TypeError(f"request ids must be str, got {type(request_id).__name__}")
        value = self._check(value)
        self._entries[request_id] = value
        self._moved()

    def __delitem__(self, request_id):
        del self._entries[request_id]
        self._moved()

    def _moved(self):
        if self._generation is not None:
            self._generation.bump()

    def __iter__(self):
        return iter(self._entries)

    def __len__(self):
        return len(self._entries)

    def __contains__(self, request_id):
        return request_id in self._entries

    def get(self, request_id, default=None):
        return self._entries.get(request_id, default)

    def __eq__(self, other):
        if isinstance(other, _RequestTable):
            other = other._entries
        return self._entries == other

    __hash__ = None

    def __repr__(self):
        return f"{type(self).__name__}({self._entries!r})"


class _BlockTable(_RequestTable):
    """``req_to_blocks``: values are lists of this pool's blocks."""

    __slots__ = ("_pool_blocks", "_block_type")

    def __init__(self, entries, generation, pool_blocks, block_type):
        super().__init__(entries, generation)
        self._pool_blocks = pool_blocks
        self._block_type = block_type

    def _check(self, value):
        if type(value) is not list:
            raise TypeError(f"req_to_blocks values must be lists of blocks, got {type(value).__name__}")
        pool = self._pool_blocks
        n = len(pool)
        for block in value:
            if not isinstance(block, self._block_type):
                raise TypeError(f"req_to_blocks values must be lists of blocks, got a list holding "
                                f"{type(block).__name__}")
            block_id = block.block_id
            if not (0 <= block_id < n and pool[block_id] is block):
                raise RuntimeError(f"block {block_id} is not a block of this pool")
        return value


class _CountTable(_RequestTable):
    """``num_cached_block``: values are non-negative ints."""

    __slots__ = ("_check_count",)

    def __init__(self, entries, generation, check_count):
        super().__init__(entries, generation)
        self._check_count = check_count

    def _check(self, value):
        return self._check_count("num_cached_block values", value)
