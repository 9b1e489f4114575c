"""kvcy.block_table beside vLLM 0.33.0's own worker block tables, live, on a CPU device.

vLLM's ``BlockTable`` / ``MultiGroupBlockTable`` and kvcy's get the same random
sequence of row edits and commits; after every step each host array, block
count and device tensor is compared.  vLLM's slot mapping is a Triton kernel
(on the CPU a ``vllm._C`` op), neither of which a CPU-only install without
Triton can run, so slot mappings are compared with a per-token loop of that
kernel's formula, fed vLLM's own committed device table, with the widths vLLM
computes and its ``PAD_SLOT_ID``, and with kvcy's reference op.  Skips where
vLLM does not import (``KVCY_REQUIRE_VLLM=1`` makes that a failure).
"""

from __future__ import annotations

import random

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from kvcy import _ops_reference as ref  # noqa: E402
from kvcy.block_table import BlockTable, MultiGroupBlockTable, SlotMappingMode  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def vllm_bt():
    import vllm.v1.worker.block_table as vbt
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    assert PAD_SLOT_ID == ref.PAD_SLOT_ID
    return vbt


def _same(v, k):
    assert np.array_equal(v.get_numpy_array(), k.get_numpy_array())
    assert np.array_equal(v.num_blocks_per_row, k.num_blocks_per_row)
    assert torch.equal(v.get_cpu_tensor(), k.get_cpu_tensor())
    assert torch.equal(v.block_table.gpu, k.block_table.gpu)
    assert v.get_device_tensor(v.max_num_reqs).shape == k.get_device_tensor(k.max_num_reqs).shape
    assert v.max_num_blocks_per_req == k.max_num_blocks_per_req
    assert (v.block_size, v.max_num_reqs, v.max_num_batched_tokens) == (k.block_size, k.max_num_reqs,
                                                                          k.max_num_batched_tokens)
    assert (v.dcp_world_size, v.dcp_rank, v.pcp_world_size, v.pcp_rank) == (
        k.dcp_world_size, k.dcp_rank, k.pcp_world_size, k.pcp_rank)
    assert v.slot_mapping_mode.value == k.slot_mapping_mode.value


def _formula(table, qsl, pos, n_slots, num_reqs, block_size, w=1, rank=0, inter=1, pad=-1):
    """vLLM 0.33.0's ComputeSlotMappingKernel, token by token."""
    out = [None] * n_slots
    for r in range(num_reqs):
        for t in range(qsl[r], qsl[r + 1]):
            vbs = block_size * w
            vbi, vbo = pos[t] // vbs, pos[t] % vbs
            local = (vbo // inter) % w == rank
            out[t] = int(table[r, vbi]) * block_size + (vbo // (w * inter)) * inter + vbo % inter if local else pad
    for t in range(len(pos), n_slots):
        out[t] = pad
    return out


def _edit(rng, tables, rows):
    """A random edit every group can take (vLLM's numpy edits have no checks)."""
    op = rng.choice(["append_row", "add_row", "add_row", "clear_row", "move_row", "swap_row", "commit"])
    r, s = rng.randrange(rows), rng.randrange(rows)
    if op in ("append_row", "add_row"):
        ids = []
        for t in tables:
            room = t.max_num_blocks_per_req - (int(t.num_blocks_per_row[r]) if op == "append_row" else 0)
            ids.append([rng.randrange(1, 4096) for _ in range(rng.randint(0, min(room, 6)))])
        return op, (tuple(ids), r)
    if op == "clear_row":
        return op, (r,)
    if op == "commit":
        return "commit_block_table", (rng.randint(0, rows),)
    return op, (r, s)


@pytest.mark.parametrize("seed", range(3))
def test_single_group_row_edits_match_vllm(vllm_bt, seed):
    rng = random.Random(seed)
    args = (16, 6, 12, 64, False, CPU, 1)
    v, k = vllm_bt.BlockTable(*args), BlockTable(*args)
    for _ in range(600):
        op, a = _edit(rng, [k], 6)
        if op in ("append_row", "add_row"):
            a = (a[0][0], a[1])
        getattr(v, op)(*a)
        getattr(k, op)(*a)
        _same(v, k)
    v.clear()
    k.clear()
    _same(v, k)


@pytest.mark.parametrize("seed", range(3))
def test_multi_group_row_edits_and_slot_mappings_match_vllm(vllm_bt, seed):
    rng = random.Random(100 + seed)
    block_sizes, max_blocks = [16, 32, 64], [9, 3, 2]
    modes_k = [SlotMappingMode.TOKEN_TO_KV_SLOT, SlotMappingMode.TOKEN_TO_KV_SLOT, SlotMappingMode.NONE]
    modes_v = [vllm_bt.SlotMappingMode(m.value) for m in modes_k]
    rows, tokens = 5, 96
    v = vllm_bt.MultiGroupBlockTable(rows, tokens, False, CPU, block_sizes, max_blocks, 1, modes_v)
    k = MultiGroupBlockTable(rows, tokens, False, CPU, block_sizes, max_blocks, 1, modes_k)
    assert [t.max_num_blocks_per_req for t in v.block_tables] == [t.max_num_blocks_per_req for t in k.block_tables]
    for step in range(400):
        op, a = _edit(rng, k.block_tables, rows)
        getattr(v, op)(*a)
        getattr(k, op)(*a)
        for vt, kt in zip(v.block_tables, k.block_tables):
            _same(vt, kt)
        if step % 10 == 9:
            _check_slot_mappings(rng, v, k, rows, tokens)


def _check_slot_mappings(rng, v, k, rows, tokens):
    num_reqs = rng.randint(0, rows)
    v.commit_block_table(num_reqs)
    k.commit_block_table(num_reqs)
    lens = [rng.randint(0, tokens // max(rows, 1)) for _ in range(num_reqs)]
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    limit = min(t.max_num_blocks_per_req * t.block_size for t in k.block_tables
                if t.slot_mapping_mode != SlotMappingMode.NONE)
    pos = [rng.randrange(limit) for _ in range(qsl[-1])]
    qsl_t, pos_t = torch.tensor(qsl, dtype=torch.int32), torch.tensor(pos, dtype=torch.int64)
    for kt in k.block_tables:
        kt.slot_mapping.gpu.fill_(777)
    k.compute_slot_mapping(num_reqs, qsl_t, pos_t)
    for vt, kt in zip(v.block_tables, k.block_tables):
        got = kt.slot_mapping.gpu.tolist()
        if kt.slot_mapping_mode == SlotMappingMode.NONE:
            assert got == [777] * tokens
            continue
        want = _formula(vt.block_table.gpu, qsl, pos, vt.max_num_batched_tokens, num_reqs, vt.block_size,
                        vt.dcp_world_size, vt.dcp_rank, vt.cp_kv_cache_interleave_size)
        assert got == [777 if w is None else w for w in want]
        out = torch.full((tokens,), 777, dtype=torch.int64)
        ref.compute_slot_mapping(qsl_t, pos_t, kt.block_table.gpu, out, num_reqs, kt.block_size)
        assert out.tolist() == got


@pytest.mark.parametrize("w,rank,inter", [(2, 0, 1), (2, 1, 1), (4, 3, 2), (3, 1, 16)])
def test_context_parallel_slot_mapping_follows_vllms_kernel(vllm_bt, w, rank, inter):
    """vLLM reads the DCP world from its process group; here kvcy is told, and its slots follow the kernel."""
    rng = random.Random(w * 100 + rank * 10 + inter)
    bs, rows, width = 16, 4, 8
    v = vllm_bt.BlockTable(bs, rows, width, 128, False, CPU, inter)
    k = BlockTable(bs, rows, width, 128, False, CPU, inter, dcp_world_size=w, dcp_rank=rank)
    for r in range(rows):
        ids = [rng.randrange(1, 999) for _ in range(width)]
        v.add_row(ids, r)
        k.add_row(ids, r)
    v.commit_block_table(rows)
    k.commit_block_table(rows)
    _same_rows = np.array_equal(v.get_numpy_array(), k.get_numpy_array())
    assert _same_rows
    qsl = [0, 30, 30, 75, 100]
    pos = [rng.randrange(width * bs * w) for _ in range(100)]
    k.compute_slot_mapping(rows, torch.tensor(qsl, dtype=torch.int32), torch.tensor(pos))
    want = _formula(v.block_table.gpu, qsl, pos, 128, rows, bs, w, rank, inter)
    assert k.slot_mapping.gpu.tolist() == want
    assert want.count(-1) > 28  # the other ranks' positions, and the padding
