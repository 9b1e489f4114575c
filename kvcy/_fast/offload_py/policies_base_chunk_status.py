"""``ChunkStatus``: one chunk of the CPU cache and how it is used
(``vllm.v1.kv_offload.cpu.policies.base``)."""

from __future__ import annotations

from kvcy._fast.offload_py._common import _check_int


class ChunkStatus:
    """One chunk of the CPU cache and how it is used.

    ``ref_cnt`` is ``-1`` while the chunk is being written (after
    ``prepare_store``, before ``complete_store``), ``0`` when it is readable and
    may be evicted, and ``k > 0`` while ``k`` loads are reading it.

    Args:
        chunk_id: the chunk's number, ``0 .. num_chunks - 1``.
    """

    __slots__ = ("chunk_id", "ref_cnt")

    def __init__(self, chunk_id: int):
        self.chunk_id: int = _check_int("chunk_id", chunk_id)
        self.ref_cnt: int = -1

    @property
    def is_ready(self) -> bool:
        """Whether the chunk's data is written (it can be read)."""
        return self.ref_cnt >= 0

    def __repr__(self) -> str:
        return f"ChunkStatus(chunk_id={self.chunk_id}, ref_cnt={self.ref_cnt})"
