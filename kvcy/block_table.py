"""The worker side of the cache: block tables and slot mappings, as vLLM 0.33.0's worker keeps them.

A serving loop gets each request's block ids from the manager
(``KVCacheManager.get_block_ids``); the model's attention needs them as a
dense table (one row per request in the batch, one column per block) on the
device, and the kernel that writes new tokens' keys and values needs a
*slot mapping*: for every scheduled token, ``block_id * block_size +
position % block_size``.  This module keeps both, with the names and the
behaviour of ``vllm/v1/worker/block_table.py``:

* :class:`BlockTable`, one KV cache group's table: a host ``int32`` array
  edited row by row (:meth:`~BlockTable.add_row`,
  :meth:`~BlockTable.append_row`, :meth:`~BlockTable.clear_row`,
  :meth:`~BlockTable.move_row`, :meth:`~BlockTable.swap_row`), copied to the
  device by :meth:`~BlockTable.commit_block_table`, and the slot mapping,
  computed on the device by :meth:`~BlockTable.compute_slot_mapping` (the
  ``torch.ops.kvcy.compute_slot_mapping`` op, :func:`kvcy.ops.compute_slot_mapping`);
* :class:`MultiGroupBlockTable`, one :class:`BlockTable` per KV cache group;
* :func:`get_block_table_width` and :class:`SlotMappingMode`, as in vLLM.

The device may be the CPU (the "device" tensors are then a second CPU copy,
as in vLLM) or a CUDA device, whose host buffers are pinned when
``pin_memory`` is set, so that the commit is an asynchronous copy.

Row edits run through the block-table twin of :mod:`kvcy._fast`: compiled C
loops, or numpy slice assignments as vLLM's (``KVCY_NO_EXTENSIONS=1``).  The
difference from vLLM is in what a bad call does: vLLM's numpy indexing reads
a negative row from the end, raises IndexError after it has already counted
the blocks of an append that does not fit, and writes floats truncated.  Here
a row out of range, a block id that is not an int in ``[0, 2**31)``, more
blocks than a row has columns, or a tensor of the wrong dtype or device is a
``ValueError`` or ``TypeError`` raised before anything is written; a
:class:`MultiGroupBlockTable` checks every group before it edits any.

Needs numpy and torch; ``import kvcy`` itself imports neither.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from enum import Enum

import numpy as np
import torch

from kvcy import _fast
from kvcy import ops as _ops

__all__ = [
    "PAD_SLOT_ID",
    "BlockTable",
    "CpuGpuBuffer",
    "MultiGroupBlockTable",
    "SlotMappingMode",
    "get_block_table_width",
]

#: The slot mapping's entry for a token whose K/V is not written here: padding
#: past the scheduled tokens, and positions another context-parallel rank stores.
PAD_SLOT_ID = _ops.PAD_SLOT_ID


def _int(value: object, name: str) -> int:
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


def _positive(value: object, name: str, minimum: int = 1) -> int:
    v = _int(value, name)
    if v < minimum:
        raise ValueError(f"{name} must be {'positive' if minimum == 1 else 'non-negative'}, got {v}")
    return v


def get_block_table_width(max_num_blocks: int, block_size: int, *, token_alignment: int | None = 128) -> int:
    """Columns of a block table: ``max_num_blocks`` rounded up so a row spans a multiple of ``token_alignment`` tokens.

    The row of ``n`` columns then covers ``n * block_size`` tokens, a multiple
    of ``token_alignment`` (the smallest such ``n >= max_num_blocks``);
    ``token_alignment=None`` leaves ``max_num_blocks`` as it is.

    Raises:
        ValueError: ``token_alignment`` is not positive.
    """
    if token_alignment is not None:
        if token_alignment <= 0:
            raise ValueError("token_alignment must be positive")
        step = token_alignment // math.gcd(token_alignment, block_size)
        max_num_blocks = -(-max_num_blocks // step) * step
    return max_num_blocks


class SlotMappingMode(Enum):
    """How a KV cache group turns scheduled tokens into cache slots.

    ``TOKEN_TO_KV_SLOT``: one slot per token (attention layers).  ``NONE``: no
    slot mapping; the table's entries are state slots (Mamba-like layers).
    """

    TOKEN_TO_KV_SLOT = "token_to_kv_slot"
    NONE = "none"


class CpuGpuBuffer:
    """A host tensor, its numpy view and a device twin, as vLLM's ``CpuGpuBuffer``.

    The host tensor is pinned when ``pin_memory`` is set and the device is a
    CUDA device (so that :meth:`copy_to_gpu` is asynchronous); a CPU
    "device" gets a second, separate CPU tensor, as in vLLM.
    """

    __slots__ = ("_cpu", "_gpu", "_np")

    def __init__(self, *size: int, dtype: torch.dtype, device: torch.device, pin_memory: bool) -> None:
        pin = bool(pin_memory) and device.type == "cuda"
        with torch.inference_mode(False):
            self._cpu = torch.zeros(*size, dtype=dtype, device="cpu", pin_memory=pin)
            self._gpu = torch.zeros_like(self._cpu, device=device)
        self._np = self._cpu.numpy()

    @property
    def cpu(self) -> torch.Tensor:
        """The host tensor (pinned where a CUDA device is used with ``pin_memory``)."""
        return self._cpu

    @property
    def gpu(self) -> torch.Tensor:
        """The device tensor."""
        return self._gpu

    @property
    def np(self) -> np.ndarray:
        """The host tensor as a numpy array (same memory)."""
        return self._np

    def copy_to_gpu(self, n: int | None = None) -> torch.Tensor:
        """Copy the first ``n`` rows (all when None) host -> device; asynchronous from pinned memory."""
        cpu, gpu = (self._cpu, self._gpu) if n is None else (self._cpu[:n], self._gpu[:n])
        return gpu.copy_(cpu, non_blocking=cpu.is_pinned())

    def copy_to_cpu(self, n: int | None = None) -> torch.Tensor:
        """Copy the first ``n`` rows (all when None) device -> host; synchronise before reading it."""
        cpu, gpu = (self._cpu, self._gpu) if n is None else (self._cpu[:n], self._gpu[:n])
        return cpu.copy_(gpu, non_blocking=True)


class BlockTable:
    """One KV cache group's block table: request rows of block ids, on the host and on the device.

    Row ``r`` holds the block ids of the request in batch slot ``r``;
    ``num_blocks_per_row[r]`` counts those in use.  Edits go to the host
    array; :meth:`commit_block_table` copies the first rows to the device,
    where :meth:`compute_slot_mapping` and the attention kernels read them.

    Args:
        block_size: tokens per cache block.
        max_num_reqs: rows (requests in one batch).
        max_num_blocks_per_req: columns (blocks of the longest request).
        max_num_batched_tokens: entries of the slot mapping (tokens in one step).
        pin_memory: pin the host buffers (with a CUDA device).
        device: where the device tensors live (``"cpu"`` or a CUDA device).
        cp_kv_cache_interleave_size: with context parallelism, how many
            consecutive positions one rank stores before the next rank's run.
        slot_mapping_mode: ``NONE`` for groups without token slots (Mamba).
        dcp_world_size: decode context-parallel ranks (vLLM reads its process
            group; kvcy has none, so the caller says).
        dcp_rank: this rank among them.
        pcp_world_size: prefill context-parallel ranks (kept, as in vLLM).
        pcp_rank: this rank among them.
    """

    def __init__(
        self,
        block_size: int,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        max_num_batched_tokens: int,
        pin_memory: bool,
        device: torch.device | str,
        cp_kv_cache_interleave_size: int,
        slot_mapping_mode: SlotMappingMode = SlotMappingMode.TOKEN_TO_KV_SLOT,
        *,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        pcp_world_size: int = 1,
        pcp_rank: int = 0,
    ) -> None:
        self.block_size = _positive(block_size, "block_size")
        self.max_num_reqs = _positive(max_num_reqs, "max_num_reqs", 0)
        self.max_num_blocks_per_req = _positive(max_num_blocks_per_req, "max_num_blocks_per_req", 0)
        self.max_num_batched_tokens = _positive(max_num_batched_tokens, "max_num_batched_tokens", 0)
        self.cp_kv_cache_interleave_size = _positive(cp_kv_cache_interleave_size, "cp_kv_cache_interleave_size")
        if not isinstance(slot_mapping_mode, SlotMappingMode):
            raise TypeError(f"slot_mapping_mode must be a SlotMappingMode, got {slot_mapping_mode!r}")
        self.slot_mapping_mode = slot_mapping_mode
        self.dcp_world_size = _positive(dcp_world_size, "dcp_world_size")
        self.dcp_rank = _int(dcp_rank, "dcp_rank")
        if not 0 <= self.dcp_rank < self.dcp_world_size:
            raise ValueError(f"dcp_rank {self.dcp_rank} is out of range for a world of {self.dcp_world_size}")
        self.pcp_world_size = _positive(pcp_world_size, "pcp_world_size")
        self.pcp_rank = _int(pcp_rank, "pcp_rank")
        if not 0 <= self.pcp_rank < self.pcp_world_size:
            raise ValueError(f"pcp_rank {self.pcp_rank} is out of range for a world of {self.pcp_world_size}")
        self.pin_memory = bool(pin_memory)
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device must name a torch device, got {device!r}") from exc
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device} was asked for, but torch sees no CUDA device")

        self._block_table = CpuGpuBuffer(
            self.max_num_reqs, self.max_num_blocks_per_req, dtype=torch.int32,
            device=self.device, pin_memory=self.pin_memory,
        )
        self._num_blocks_per_row = np.zeros(self.max_num_reqs, dtype=np.int32)
        self._slot_mapping = CpuGpuBuffer(
            self.max_num_batched_tokens, dtype=torch.int64, device=self.device, pin_memory=self.pin_memory
        )
        rows = _fast.block_table.BlockTableRows(self._block_table.np, self._num_blocks_per_row)
        self._rows = rows
        # The row edits are the twin's own bound methods: no Python frame of
        # this class between the caller and the C loop.  The methods below
        # say what they do (help()), and a subclass that overrides one keeps
        # its override.
        for name in ("append_row", "add_row", "clear_row", "move_row", "swap_row"):
            if getattr(type(self), name) is getattr(BlockTable, name):
                setattr(self, name, getattr(rows, name))

    # The buffers are read-only attributes: the row edits hold their memory,
    # so a buffer swapped in from outside would never see them.
    @property
    def block_table(self) -> CpuGpuBuffer:
        """The table: ``.np`` / ``.cpu`` on the host, ``.gpu`` on the device (``int32 [max_num_reqs, columns]``)."""
        return self._block_table

    @property
    def num_blocks_per_row(self) -> np.ndarray:
        """Blocks in use per row (``int32 [max_num_reqs]``)."""
        return self._num_blocks_per_row

    @property
    def slot_mapping(self) -> CpuGpuBuffer:
        """The slot mapping; :meth:`compute_slot_mapping` fills ``.gpu`` (``int64 [max_num_batched_tokens]``)."""
        return self._slot_mapping

    def append_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Append ``block_ids`` to row ``row_idx`` (nothing to append: no-op, as in vLLM).

        Raises:
            ValueError: row out of range, more blocks than the row has room
                for, an id outside ``[0, 2**31)``; nothing written.
            TypeError: an id or the row is not an int.
        """
        self._rows.append_row(block_ids, row_idx)

    def add_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Make ``block_ids`` row ``row_idx``'s blocks (columns past them keep their old ids, as in vLLM)."""
        self._rows.add_row(block_ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        """Zero row ``row_idx``'s blocks in use and set its count to 0."""
        self._rows.clear_row(row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        """Copy row ``src``'s blocks in use to row ``tgt`` and clear ``src`` (as vLLM, ``src == tgt`` clears it)."""
        self._rows.move_row(src, tgt)

    def swap_row(self, src: int, tgt: int) -> None:
        """Exchange rows ``src`` and ``tgt`` (every column) and their counts."""
        self._rows.swap_row(src, tgt)

    def _num_reqs(self, num_reqs: object, op: str) -> int:
        n = _int(num_reqs, f"{op}: num_reqs")
        if not 0 <= n <= self.max_num_reqs:
            raise ValueError(f"{op}: num_reqs {n} is out of range for a block table of {self.max_num_reqs} rows")
        return n

    def compute_slot_mapping(self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor) -> None:
        """Fill ``slot_mapping.gpu`` for this step's tokens, from the committed device table.

        Request ``r`` (row ``r``) owns tokens ``query_start_loc[r]`` to
        ``query_start_loc[r + 1]``; token ``t`` is at position
        ``positions[t]``.  Entries past ``positions.numel()`` become
        :data:`PAD_SLOT_ID`, as do positions another decode-context-parallel
        rank stores.  A ``NONE`` group has no slot mapping: no-op.

        Args:
            num_reqs: requests in the batch (rows ``0 .. num_reqs - 1``).
            query_start_loc: ``[num_reqs + 1]`` int32/int64, on the device.
            positions: ``[num_tokens]`` int64, on the device.

        Raises:
            ValueError, TypeError: see :func:`kvcy.ops.compute_slot_mapping`;
                nothing written.
        """
        if self.slot_mapping_mode == SlotMappingMode.NONE:
            return
        _ops.compute_slot_mapping(
            query_start_loc,
            positions,
            self._block_table.gpu,
            self._slot_mapping.gpu,
            num_reqs,
            self.block_size,
            cp_world_size=self.dcp_world_size,
            cp_rank=self.dcp_rank,
            cp_kv_cache_interleave_size=self.cp_kv_cache_interleave_size,
        )

    def commit_block_table(self, num_reqs: int) -> None:
        """Copy the first ``num_reqs`` rows to the device (asynchronous from pinned memory)."""
        self._block_table.copy_to_gpu(self._num_reqs(num_reqs, "commit_block_table"))

    def clear(self) -> None:
        """Zero the host and device tables (the block counts are left as they are, as in vLLM)."""
        self._block_table.gpu.fill_(0)
        self._block_table.cpu.fill_(0)

    def get_device_tensor(self, num_reqs: int) -> torch.Tensor:
        """The device table's first ``num_reqs`` rows (a view)."""
        return self._block_table.gpu[: self._num_reqs(num_reqs, "get_device_tensor")]

    def get_cpu_tensor(self) -> torch.Tensor:
        """The whole host table."""
        return self._block_table.cpu

    def get_numpy_array(self) -> np.ndarray:
        """The whole host table as numpy (same memory)."""
        return self._block_table.np


class MultiGroupBlockTable:
    """One :class:`BlockTable` per KV cache group, edited together.

    Group ``i`` has ``block_sizes[i]`` tokens per block and room for
    ``max_num_blocks[i]`` blocks per request, widened by
    :func:`get_block_table_width` (to 128-token rows for token-slot groups).
    Row edits take one list of block ids per group (``KVCacheManager.get_block_ids()``'s
    tuple) and check every group before they edit any.

    Raises:
        ValueError: ``slot_mapping_modes`` or ``max_num_blocks`` not one per group.
    """

    def __init__(
        self,
        max_num_reqs: int,
        max_num_batched_tokens: int,
        pin_memory: bool,
        device: torch.device | str,
        block_sizes: list[int],
        max_num_blocks: list[int],
        cp_kv_cache_interleave_size: int = 1,
        slot_mapping_modes: list[SlotMappingMode] | None = None,
        *,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        pcp_world_size: int = 1,
        pcp_rank: int = 0,
    ) -> None:
        if slot_mapping_modes is None:
            slot_mapping_modes = [SlotMappingMode.TOKEN_TO_KV_SLOT] * len(block_sizes)
        if len(slot_mapping_modes) != len(block_sizes):
            raise ValueError(
                f"slot_mapping_modes length ({len(slot_mapping_modes)}) "
                f"must match block_sizes length ({len(block_sizes)})"
            )
        if len(max_num_blocks) != len(block_sizes):
            raise ValueError(
                f"max_num_blocks length ({len(max_num_blocks)}) must match block_sizes length ({len(block_sizes)})"
            )
        widths = [
            get_block_table_width(n, bs, token_alignment=None if mode == SlotMappingMode.NONE else 128)
            for n, bs, mode in zip(max_num_blocks, block_sizes, slot_mapping_modes)
        ]
        self.block_tables = [
            BlockTable(
                bs, max_num_reqs, width, max_num_batched_tokens, pin_memory, device, cp_kv_cache_interleave_size,
                slot_mapping_mode=mode, dcp_world_size=dcp_world_size, dcp_rank=dcp_rank,
                pcp_world_size=pcp_world_size, pcp_rank=pcp_rank,
            )
            for bs, width, mode in zip(block_sizes, widths, slot_mapping_modes)
        ]
        # The groups differ in only one of the slot-mapping op's checks: how
        # many positions a row spans.  Computed narrowest first, a call that
        # fails fails on the first group, before any mapping is written.
        self._slot_order = sorted(
            self.block_tables, key=lambda t: t.max_num_blocks_per_req * t.block_size * t.dcp_world_size
        )

    def _group_ids(self, block_ids: Sequence[Sequence[int]], op: str) -> Sequence[Sequence[int]]:
        try:
            n = len(block_ids)
        except TypeError:
            raise TypeError(f"{op}: block_ids must hold one list of block ids per KV cache group, "
                            f"got {type(block_ids).__name__}") from None
        if n < len(self.block_tables):
            raise ValueError(f"{op}: block_ids has {n} groups' ids for {len(self.block_tables)} KV cache groups")
        return block_ids

    def append_row(self, block_ids: tuple[list[int], ...], row_idx: int) -> None:
        """Append group ``i``'s ``block_ids[i]`` to row ``row_idx`` of table ``i``, for every group."""
        block_ids = self._group_ids(block_ids, "append_row")
        tables = self.block_tables
        if len(tables) > 1:
            for i, table in enumerate(tables):
                table._rows.check_append_row(block_ids[i], row_idx)
        for i, table in enumerate(tables):
            table.append_row(block_ids[i], row_idx)

    def add_row(self, block_ids: tuple[list[int], ...], row_idx: int) -> None:
        """Make group ``i``'s ``block_ids[i]`` row ``row_idx`` of table ``i``, for every group."""
        block_ids = self._group_ids(block_ids, "add_row")
        tables = self.block_tables
        if len(tables) > 1:
            for i, table in enumerate(tables):
                table._rows.check_add_row(block_ids[i], row_idx)
        for i, table in enumerate(tables):
            table.add_row(block_ids[i], row_idx)

    def clear_row(self, row_idx: int) -> None:
        """Clear row ``row_idx`` of every group's table."""
        for table in self.block_tables:
            table._rows.check_clear_row(row_idx)
        for table in self.block_tables:
            table.clear_row(row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        """Move row ``src`` to row ``tgt`` in every group's table."""
        for table in self.block_tables:
            table._rows.check_move_row(src, tgt)
        for table in self.block_tables:
            table.move_row(src, tgt)

    def swap_row(self, src: int, tgt: int) -> None:
        """Swap rows ``src`` and ``tgt`` in every group's table."""
        for table in self.block_tables:
            table._rows.check_swap_row(src, tgt)
        for table in self.block_tables:
            table.swap_row(src, tgt)

    def compute_slot_mapping(self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor) -> None:
        """Each group's :meth:`BlockTable.compute_slot_mapping`; a bad argument writes no group's mapping."""
        for table in self._slot_order:
            table.compute_slot_mapping(num_reqs, query_start_loc, positions)

    def commit_block_table(self, num_reqs: int) -> None:
        """Copy the first ``num_reqs`` rows of every group's table to the device."""
        for table in self.block_tables:
            table._num_reqs(num_reqs, "commit_block_table")
        for table in self.block_tables:
            table.commit_block_table(num_reqs)

    def clear(self) -> None:
        """Zero every group's tables."""
        for table in self.block_tables:
            table.clear()

    def __getitem__(self, idx: int) -> BlockTable:
        """The :class:`BlockTable` of KV cache group ``idx``."""
        return self.block_tables[idx]

