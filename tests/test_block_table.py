"""kvcy.block_table: the row twins side by side, the BlockTable API, and the slot-mapping op.

The row edits are checked on both twins in one process (``_fast.load``), by
random sequences whose every array is compared with a plain-numpy model of
vLLM's edits and with the other twin; bad calls raise the same exception
with the same message in both and leave every array as it was.  The op is
checked C++ against the plain-torch reference (both implementations, the
same random batches with and without context parallelism, the same refusals)
and against a per-token loop written from vLLM's kernel.
"""

from __future__ import annotations

import random

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from kvcy import _fast  # noqa: E402
from kvcy import _ops_reference as ref  # noqa: E402
from kvcy import ops  # noqa: E402
from kvcy.block_table import (  # noqa: E402
    PAD_SLOT_ID,
    BlockTable,
    MultiGroupBlockTable,
    SlotMappingMode,
    get_block_table_width,
)

IMPLS = _fast.available()


@pytest.fixture(params=IMPLS)
def twin(request):
    return _fast.load(request.param)["block_table"]


def _rows(twin, rows=6, width=5):
    table = np.zeros((rows, width), dtype=np.int32)
    counts = np.zeros(rows, dtype=np.int32)
    return twin.BlockTableRows(table, counts), table, counts


class _Model:
    """vLLM 0.33.0's row edits, spelled in plain numpy (the behaviour both twins must have)."""

    def __init__(self, rows, width):
        self.table = np.zeros((rows, width), dtype=np.int32)
        self.counts = np.zeros(rows, dtype=np.int32)

    def append_row(self, ids, r):
        if not ids:
            return
        s = self.counts[r]
        self.counts[r] += len(ids)
        self.table[r, s : s + len(ids)] = ids

    def add_row(self, ids, r):
        self.counts[r] = 0
        self.append_row(ids, r)

    def clear_row(self, r):
        n = self.counts[r]
        self.table[r, :n] = 0
        self.counts[r] = 0

    def move_row(self, s, t):
        n = self.counts[s]
        self.table[t, :n] = self.table[s, :n]
        self.counts[t] = n
        self.table[s, :n] = 0
        self.counts[s] = 0

    def swap_row(self, s, t):
        self.counts[[s, t]] = self.counts[[t, s]]
        self.table[[s, t]] = self.table[[t, s]]


def _random_edit(rng, rows, width, counts):
    op = rng.choice(["append_row", "add_row", "clear_row", "move_row", "swap_row"])
    r, s = rng.randrange(rows), rng.randrange(rows)
    if op in ("append_row", "add_row"):
        room = width - (counts[r] if op == "append_row" else 0)
        ids = [rng.randrange(1 << 31) if rng.random() < 0.05 else rng.randrange(100) for _ in range(rng.randint(0, room))]
        kind = rng.random()
        if kind < 0.2:
            ids = tuple(ids)
        elif kind < 0.3:
            ids = np.array(ids, dtype=np.int64)
        return op, (ids, r)
    if op == "clear_row":
        return op, (r,)
    return op, (r, s)


@pytest.mark.parametrize("seed", range(4))
def test_twins_replay_vllms_row_edits(seed):
    rng = random.Random(seed)
    rows, width = 7, 6
    model = _Model(rows, width)
    twins = [_rows(_fast.load(impl)["block_table"], rows, width) for impl in IMPLS]
    for _ in range(1500):
        op, args = _random_edit(rng, rows, width, model.counts)
        getattr(model, op)(*(([int(x) for x in args[0]],) + args[1:] if op in ("append_row", "add_row") else args))
        for rows_obj, table, counts in twins:
            getattr(rows_obj, op)(*args)
            assert np.array_equal(table, model.table), op
            assert np.array_equal(counts, model.counts), op


BAD_CALLS = [
    ("append_row", ([1], 6), ValueError, "append_row: row_idx 6 is out of range for a block table of 6 rows"),
    ("append_row", ([1], -1), ValueError, "append_row: row_idx -1 is out of range for a block table of 6 rows"),
    ("append_row", ([1], 1.0), TypeError, "append_row: row_idx must be an int, got float"),
    ("append_row", ([1, 2, 3, 4], 0), ValueError, "append_row: row 0 holds 2 blocks; 4 more do not fit in its 5 columns"),
    ("add_row", ([1] * 6, 1), ValueError, "add_row: row 1 holds 0 blocks; 6 more do not fit in its 5 columns"),
    ("append_row", ([1, 2.5], 1), TypeError, "append_row: block_ids[1] must be an int, got float"),
    ("append_row", ([1, "2"], 1), TypeError, "append_row: block_ids[1] must be an int, got str"),
    ("append_row", ([3, -1], 1), ValueError, "append_row: block_ids[1] = -1 is not a block id (0 <= id < 2**31)"),
    ("add_row", ([2**31], 1), ValueError, "add_row: block_ids[0] = 2147483648 is not a block id (0 <= id < 2**31)"),
    ("add_row", ([2**70], 1), ValueError,
     f"add_row: block_ids[0] = {2**70} is not a block id (0 <= id < 2**31)"),
    ("add_row", (np.array([1.0]), 1), TypeError, "add_row: block_ids[0] must be an int, got float64"),
    ("add_row", ([[1]], 1), TypeError, "add_row: block_ids[0] must be an int, got list"),
    ("add_row", (iter([1]), 1), TypeError, "add_row: block_ids must be a sequence of ints, got list_iterator"),
    ("add_row", (5, 1), TypeError, "add_row: block_ids must be a sequence of ints, got int"),
    ("add_row", ([], 9), ValueError, "add_row: row_idx 9 is out of range for a block table of 6 rows"),
    ("clear_row", (6,), ValueError, "clear_row: row_idx 6 is out of range for a block table of 6 rows"),
    ("clear_row", (None,), TypeError, "clear_row: row_idx must be an int, got NoneType"),
    ("move_row", (0, 7), ValueError, "move_row: tgt 7 is out of range for a block table of 6 rows"),
    ("move_row", (-2, 0), ValueError, "move_row: src -2 is out of range for a block table of 6 rows"),
    ("swap_row", (0, 2**80), ValueError, f"swap_row: tgt {2**80} is out of range for a block table of 6 rows"),
    ("swap_row", ("0", 1), TypeError, "swap_row: src must be an int, got str"),
]


@pytest.mark.parametrize("op,args,exc,msg", BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_bad_calls_raise_the_same_and_write_nothing(twin, op, args, exc, msg):
    rows, table, counts = _rows(twin)
    rows.add_row([4, 5], 0)
    rows.add_row([6], 2)
    before = table.copy(), counts.copy()
    with pytest.raises(exc) as info:
        getattr(rows, op)(*args)
    assert str(info.value) == msg
    assert np.array_equal(table, before[0]) and np.array_equal(counts, before[1])
    check = getattr(rows, "check_" + op)
    with pytest.raises(exc) as info:
        check(*args)
    assert str(info.value) == msg


@pytest.mark.parametrize("value", [-1, 6, 2**31 - 1])
def test_a_block_count_written_out_of_range_is_refused_not_followed(twin, value):
    rows, table, counts = _rows(twin)
    rows.add_row([4, 5], 0)
    counts[0] = value
    before = table.copy()
    for call in (lambda: rows.clear_row(0), lambda: rows.move_row(0, 1), lambda: rows.append_row([1], 0)):
        with pytest.raises(ValueError, match=rf"num_blocks_per_row\[0\] = {value} is out of range for a row of 5"):
            call()
    assert np.array_equal(table, before)
    rows.add_row([7], 0)  # add_row resets the count: fine again
    assert counts[0] == 1 and table[0, 0] == 7


def test_ids_of_other_int_types_are_accepted(twin):
    rows, table, counts = _rows(twin)
    rows.add_row(np.array([3, 4], dtype=np.int32), 0)
    rows.append_row((np.int64(5), True), 0)
    rows.append_row(range(8, 9), 0)
    rows.add_row(np.array([9], dtype=np.uint16), np.int64(1))
    assert table[0].tolist() == [3, 4, 5, 1, 8] and counts.tolist()[:2] == [5, 1] and table[1, 0] == 9


def test_empty_append_is_a_no_op_for_any_row_as_in_vllm(twin):
    rows, table, counts = _rows(twin)
    rows.append_row([], 99)
    rows.append_row(np.array([], dtype=np.int64), -5)
    assert not table.any() and not counts.any()


@pytest.mark.parametrize("bad,exc,msg", [
    (lambda: (np.zeros((2, 3), np.int64), np.zeros(2, np.int32)), TypeError, "table must be an int32 array, got int64"),
    (lambda: (np.zeros((2, 3), np.int32), np.zeros(3, np.int32)), ValueError,
     "num_blocks_per_row has 3 entries for a table of 2 rows"),
    (lambda: (np.zeros((2, 6), np.int32)[:, ::2], np.zeros(2, np.int32)), ValueError,
     "table must be a writeable C-contiguous array"),
    (lambda: ([[0]], np.zeros(1, np.int32)), TypeError, "table must be a numpy array, got list"),
])
def test_rows_refuse_arrays_they_cannot_edit_safely(twin, bad, exc, msg):
    with pytest.raises(exc, match=msg.replace("(", r"\(").replace("[", r"\[")):
        twin.BlockTableRows(*bad())


# --------------------------------------------------------------------------- BlockTable API


def _table(**kw):
    args = dict(block_size=4, max_num_reqs=4, max_num_blocks_per_req=8, max_num_batched_tokens=32,
                pin_memory=False, device=torch.device("cpu"), cp_kv_cache_interleave_size=1)
    args.update(kw)
    return BlockTable(**args)


def test_block_table_buffers_and_commit():
    bt = _table()
    assert bt.get_numpy_array().dtype == np.int32 and bt.get_numpy_array().shape == (4, 8)
    assert bt.get_cpu_tensor().dtype == torch.int32 and bt.slot_mapping.gpu.dtype == torch.int64
    assert bt.get_cpu_tensor().data_ptr() == bt.get_numpy_array().ctypes.data
    bt.add_row([1, 2, 3], 0)
    bt.add_row([5], 1)
    bt.append_row([6, 7], 1)
    assert bt.get_device_tensor(2).tolist() == [[0] * 8, [0] * 8]  # not committed yet
    bt.commit_block_table(1)
    assert bt.get_device_tensor(2).tolist() == [[1, 2, 3, 0, 0, 0, 0, 0], [0] * 8]
    bt.commit_block_table(4)
    assert bt.get_device_tensor(4)[1, :3].tolist() == [5, 6, 7]
    assert bt.num_blocks_per_row.tolist() == [3, 3, 0, 0]
    bt.clear()
    assert not bt.get_numpy_array().any() and not bt.block_table.gpu.any()
    assert bt.num_blocks_per_row.tolist() == [3, 3, 0, 0]  # as vLLM: clear() keeps the counts


def test_move_row_clears_the_vacated_row_as_vllm():
    bt = _table(block_size=16, max_num_blocks_per_req=8, max_num_batched_tokens=64)
    bt.add_row([7, 8, 9], row_idx=0)
    bt.add_row([4, 5], row_idx=1)
    bt.move_row(1, 0)
    assert bt.block_table.np[0, :3].tolist() == [4, 5, 9]  # vLLM copies only the moved blocks
    assert bt.num_blocks_per_row.tolist()[:2] == [2, 0]
    assert not bt.block_table.np[1].any()
    bt.move_row(0, 0)  # as vLLM: moving a row onto itself clears it
    assert bt.block_table.np[0, :3].tolist() == [0, 0, 9] and bt.num_blocks_per_row[0] == 0


@pytest.mark.parametrize("call,exc,msg", [
    (lambda bt: bt.commit_block_table(5), ValueError, "commit_block_table: num_reqs 5 is out of range"),
    (lambda bt: bt.commit_block_table(-1), ValueError, "commit_block_table: num_reqs -1 is out of range"),
    (lambda bt: bt.get_device_tensor(2.0), TypeError, "get_device_tensor: num_reqs must be an int"),
    (lambda bt: bt.append_row([1] * 8, 0), ValueError, "append_row: row 0 holds 1 blocks; 8 more"),
    (lambda bt: bt.add_row([1], 4), ValueError, "add_row: row_idx 4 is out of range"),
])
def test_block_table_refuses_bad_arguments(call, exc, msg):
    bt = _table()
    bt.add_row([3], 0)
    with pytest.raises(exc, match=msg.replace("(", r"\(")):
        call(bt)
    assert bt.get_numpy_array()[0, :2].tolist() == [3, 0] and bt.num_blocks_per_row.tolist() == [1, 0, 0, 0]


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(block_size=0), ValueError, "block_size must be positive, got 0"),
    (dict(max_num_reqs=-1), ValueError, "max_num_reqs must be non-negative, got -1"),
    (dict(cp_kv_cache_interleave_size=0), ValueError, "cp_kv_cache_interleave_size must be positive"),
    (dict(slot_mapping_mode="none"), TypeError, "slot_mapping_mode must be a SlotMappingMode"),
    (dict(dcp_world_size=2, dcp_rank=2), ValueError, "dcp_rank 2 is out of range for a world of 2"),
    (dict(block_size=4.0), TypeError, "block_size must be an int, got float"),
    (dict(device="nodevice"), ValueError, "device must name a torch device, got 'nodevice'"),
    pytest.param(dict(device="cuda"), ValueError, "torch sees no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is there")),
])
def test_block_table_refuses_bad_construction(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        _table(**kw)


def test_buffers_are_not_reassignable():
    bt = _table()
    for name in ("block_table", "num_blocks_per_row", "slot_mapping"):
        with pytest.raises(AttributeError):
            setattr(bt, name, None)
    with pytest.raises(AttributeError):
        bt.block_table.np = np.zeros((4, 8), np.int32)


def test_get_block_table_width_as_vllm():
    assert get_block_table_width(10, 16) == 16  # 128 tokens = 8 blocks of 16: 10 -> 16
    assert get_block_table_width(10, 16, token_alignment=None) == 10
    assert get_block_table_width(3, 48) == 8  # 128 / gcd(128, 48) = 8
    assert get_block_table_width(1, 256) == 1
    with pytest.raises(ValueError, match="token_alignment must be positive"):
        get_block_table_width(1, 16, token_alignment=0)


def test_multi_group_checks_every_group_before_editing_any():
    mg = MultiGroupBlockTable(4, 32, False, "cpu", [16, 64], [10, 2])
    assert [t.max_num_blocks_per_req for t in mg.block_tables] == [16, 2]
    mg.add_row(([1, 2], [3]), 0)
    before = [t.get_numpy_array().copy() for t in mg.block_tables], [t.num_blocks_per_row.copy() for t in mg.block_tables]
    with pytest.raises(ValueError, match="append_row: row 0 holds 1 blocks; 2 more do not fit in its 2 columns"):
        mg.append_row(([5], [6, 7]), 0)  # fits group 0, not group 1
    with pytest.raises(ValueError, match="add_row: block_ids has 1 groups' ids for 2 KV cache groups"):
        mg.add_row(([5],), 0)
    with pytest.raises(TypeError, match=r"add_row: block_ids\[0\] must be an int, got float"):
        mg.add_row(([5], [0.5]), 1)
    mg.block_tables[1].num_blocks_per_row[2] = 99
    with pytest.raises(ValueError, match=r"clear_row: num_blocks_per_row\[2\] = 99"):
        mg.clear_row(2)
    mg.block_tables[1].num_blocks_per_row[2] = 0
    for t, a, c in zip(mg.block_tables, *before):
        assert np.array_equal(t.get_numpy_array(), a) and np.array_equal(t.num_blocks_per_row, c)
    assert mg[1] is mg.block_tables[1]


def test_multi_group_slot_mappings_and_none_groups():
    mg = MultiGroupBlockTable(2, 16, False, "cpu", [4, 16, 8], [40, 2, 1],
                              slot_mapping_modes=[SlotMappingMode.TOKEN_TO_KV_SLOT, SlotMappingMode.TOKEN_TO_KV_SLOT,
                                                  SlotMappingMode.NONE])
    assert [t.max_num_blocks_per_req for t in mg.block_tables] == [64, 8, 1]
    mg.add_row(([1, 2, 3], [5, 6], [9]), 0)
    mg.commit_block_table(1)
    mg.compute_slot_mapping(1, torch.tensor([0, 5], dtype=torch.int32), torch.arange(5))
    assert mg[0].slot_mapping.gpu[:6].tolist() == [4, 5, 6, 7, 8, -1]
    assert mg[1].slot_mapping.gpu[:6].tolist() == [80, 81, 82, 83, 84, -1]
    assert not mg[2].slot_mapping.gpu.any()  # NONE: no slot mapping
    # A position past the narrower group's row: neither mapping is written.
    snap = [t.slot_mapping.gpu.clone() for t in mg.block_tables]
    with pytest.raises(ValueError, match=r"positions\[0\] = 128 is out of range for a block table row of 8 blocks x 16 tokens"):
        mg.compute_slot_mapping(1, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([128]))
    for t, s in zip(mg.block_tables, snap):
        assert torch.equal(t.slot_mapping.gpu, s)


# --------------------------------------------------------------------------- the slot-mapping op

OP_IMPLS = [pytest.param("reference", id="reference"),
            pytest.param("cpp", id="cpp", marks=pytest.mark.skipif(not ops.HAS_SLOT_MAPPING_KERNEL,
                                                                  reason="kvcy._C without compute_slot_mapping"))]


def _op(impl):
    if impl == "reference":
        return ref.compute_slot_mapping
    return torch.ops.kvcy.compute_slot_mapping


def _vllm_formula(qsl, pos, table, n_slots, num_reqs, bs, w, rank, inter):
    """vLLM 0.33.0's ComputeSlotMappingKernel, one token at a time (from its Triton source)."""
    out = [None] * n_slots
    for r in range(num_reqs):
        for t in range(qsl[r], qsl[r + 1]):
            vbs = bs * w
            vbi, vbo = pos[t] // vbs, pos[t] % vbs
            if (vbo // inter) % w == rank:
                out[t] = int(table[r][vbi]) * bs + (vbo // (w * inter)) * inter + vbo % inter
            else:
                out[t] = PAD_SLOT_ID
    for t in range(len(pos), n_slots):
        out[t] = PAD_SLOT_ID
    return out


def _random_batch(rng, cp=True):
    w = rng.randint(1, 4) if cp else 1
    rank, inter, bs = rng.randrange(w), rng.choice([1, 2, 4, 16]), rng.choice([1, 2, 3, 16, 32, 48])
    rows, width = rng.randint(1, 6), rng.randint(1, 9)
    num_reqs = rng.randint(0, rows)
    lens = [rng.randint(0, 12) for _ in range(num_reqs)]
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    num_tokens = qsl[-1] + rng.randint(0, 2)
    pos = [rng.randrange(width * bs * w) for _ in range(num_tokens)]
    table = [[rng.randrange(5000) for _ in range(width)] for _ in range(rows)]
    return dict(qsl=qsl, pos=pos, table=table, n_slots=num_tokens + rng.randint(0, 4), num_reqs=num_reqs,
                bs=bs, w=w, rank=rank, inter=inter)


@pytest.mark.parametrize("impl", OP_IMPLS)
@pytest.mark.parametrize("qsl_dtype", [torch.int32, torch.int64])
def test_slot_mapping_matches_vllms_formula(impl, qsl_dtype):
    rng = random.Random(7)
    for _ in range(150):
        b = _random_batch(rng)
        out = torch.full((b["n_slots"],), 12345, dtype=torch.int64)
        _op(impl)(torch.tensor(b["qsl"], dtype=qsl_dtype), torch.tensor(b["pos"], dtype=torch.int64),
                  torch.tensor(b["table"], dtype=torch.int32), out, b["num_reqs"], b["bs"], b["w"], b["rank"],
                  b["inter"])
        want = _vllm_formula(**b)
        got = out.tolist()
        # Tokens no request covers are left as they were (vLLM's kernel does not touch them).
        assert got == [12345 if w is None else w for w in want]


@pytest.mark.skipif(not ops.HAS_SLOT_MAPPING_KERNEL, reason="kvcy._C without compute_slot_mapping")
def test_cpp_kernel_equals_the_reference_on_strided_tensors():
    rng = random.Random(3)
    for _ in range(50):
        b = _random_batch(rng)
        table = torch.tensor(b["table"], dtype=torch.int32)
        wide = torch.zeros(table.shape[0], table.shape[1] * 2 + 1, dtype=torch.int32)
        wide[:, ::2][:, : table.shape[1]] = table
        strided_table = wide[:, ::2][:, : table.shape[1]]
        pos = torch.tensor(b["pos"], dtype=torch.int64).repeat_interleave(2)[::2]
        outs = []
        for fn in (ref.compute_slot_mapping, torch.ops.kvcy.compute_slot_mapping):
            out = torch.full((b["n_slots"] * 2,), 7, dtype=torch.int64)
            fn(torch.tensor(b["qsl"], dtype=torch.int32), pos, strided_table, out[::2], b["num_reqs"], b["bs"],
               b["w"], b["rank"], b["inter"])
            outs.append(out)
        assert torch.equal(outs[0], outs[1])


def _bad_op_calls():
    i32, i64 = torch.int32, torch.int64
    qsl = torch.tensor([0, 2, 3], dtype=i32)
    pos = torch.tensor([0, 5, 1], dtype=i64)
    table = torch.tensor([[1, 2], [3, 4]], dtype=i32)
    out = torch.zeros(4, dtype=i64)
    base = dict(query_start_loc=qsl, positions=pos, block_table=table, slot_mapping=out, num_reqs=2, block_size=4,
                cp_world_size=1, cp_rank=0, cp_kv_cache_interleave_size=1)
    op = "compute_slot_mapping"
    cases = [
        (dict(block_size=0), ValueError, f"{op}: block_size must be positive, got 0"),
        (dict(cp_world_size=0), ValueError, f"{op}: cp_world_size must be positive, got 0"),
        (dict(cp_world_size=2, cp_rank=2), ValueError,
         f"{op}: cp_rank 2 is out of range for a context-parallel world of 2"),
        (dict(cp_kv_cache_interleave_size=0), ValueError, f"{op}: cp_kv_cache_interleave_size must be positive, got 0"),
        (dict(query_start_loc=qsl.float()), TypeError,
         f"{op}: query_start_loc must be an int32 or int64 tensor, got torch.float32"),
        (dict(positions=pos.to(i32)), TypeError, f"{op}: positions must be an int64 tensor, got torch.int32"),
        (dict(block_table=table.long()), TypeError, f"{op}: block_table must be an int32 tensor, got torch.int64"),
        (dict(slot_mapping=out.to(i32)), TypeError, f"{op}: slot_mapping must be an int64 tensor, got torch.int32"),
        (dict(positions=pos.view(3, 1)), ValueError, f"{op}: positions must be 1-D, got shape [3, 1]"),
        (dict(block_table=table.view(-1)), ValueError, f"{op}: block_table must be 2-D, got shape [4]"),
        (dict(positions=pos.to("meta")), ValueError, f"{op}: positions is on meta but slot_mapping is on cpu"),
        (dict(num_reqs=3), ValueError, f"{op}: num_reqs 3 is out of range for a block table of 2 rows"),
        (dict(query_start_loc=qsl[:2]), ValueError, f"{op}: query_start_loc has 2 entries; num_reqs 2 needs 3"),
        (dict(slot_mapping=out[:2]), ValueError, f"{op}: 3 positions do not fit in a slot_mapping of 2"),
        (dict(query_start_loc=torch.tensor([-1, 2, 3], dtype=i32)), ValueError,
         f"{op}: query_start_loc[0] = -1 is negative"),
        (dict(query_start_loc=torch.tensor([0, 3, 2], dtype=i32)), ValueError,
         f"{op}: query_start_loc[2] = 2 is less than query_start_loc[1] = 3"),
        (dict(query_start_loc=torch.tensor([0, 2, 4], dtype=i32)), ValueError,
         f"{op}: query_start_loc[2] = 4 is beyond the 3 positions"),
        (dict(positions=torch.tensor([0, 8, 1])), ValueError,
         f"{op}: positions[1] = 8 is out of range for a block table row of 2 blocks x 4 tokens"),
        (dict(positions=torch.tensor([0, 1, -3])), ValueError,
         f"{op}: positions[2] = -3 is out of range for a block table row of 2 blocks x 4 tokens"),
    ]
    return base, cases


@pytest.mark.parametrize("case", range(len(_bad_op_calls()[1])))
@pytest.mark.parametrize("impl", OP_IMPLS)
def test_slot_mapping_refusals_are_the_same_and_write_nothing(impl, case):
    base, cases = _bad_op_calls()
    change, exc, msg = cases[case]
    args = {k: (v.clone() if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v) for k, v in base.items()}
    args.update(change)
    out = args["slot_mapping"]
    before = out.clone() if out.device.type == "cpu" else None
    with pytest.raises(exc) as info:
        _op(impl)(*args.values())
    assert str(info.value).splitlines()[0] == msg
    if before is not None:
        assert torch.equal(out, before)


def test_ops_wrapper_checks_python_arguments():
    t = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(TypeError, match="compute_slot_mapping: positions must be a torch.Tensor, got list"):
        ops.compute_slot_mapping(torch.tensor([0]), [0], torch.zeros(1, 1, dtype=torch.int32), t, 0, 4)
    with pytest.raises(TypeError, match="compute_slot_mapping: block_size must be an int, got float"):
        ops.compute_slot_mapping(torch.tensor([0]), t, torch.zeros(1, 1, dtype=torch.int32), t, 0, 4.0)


def test_block_table_slot_mapping_uses_the_committed_table_and_the_dcp_rank():
    bt = _table(block_size=4, cp_kv_cache_interleave_size=2, dcp_world_size=2, dcp_rank=1)
    bt.add_row([3, 4, 5], 0)
    qsl, pos = torch.tensor([0, 10], dtype=torch.int32), torch.arange(10)
    bt.compute_slot_mapping(1, qsl, pos)
    assert bt.slot_mapping.gpu[:10].tolist() == [-1, -1, 0, 1, -1, -1, 2, 3, -1, -1]  # table not committed: zeros
    bt.commit_block_table(1)
    bt.compute_slot_mapping(1, qsl, pos)
    assert bt.slot_mapping.gpu[:12].tolist() == [-1, -1, 12, 13, -1, -1, 14, 15, -1, -1, -1, -1]
    with pytest.raises(ValueError, match="positions is on meta but slot_mapping is on cpu"):
        bt.compute_slot_mapping(1, qsl, pos.to("meta"))
    bt_none = _table(slot_mapping_mode=SlotMappingMode.NONE)
    bt_none.compute_slot_mapping(1, qsl, pos)  # no slot mapping for NONE groups, as in vLLM
    assert not bt_none.slot_mapping.gpu.any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_block_table_pins_host_buffers_and_maps_slots_like_the_cpu():
    bt = _table(device=torch.device("cuda"), pin_memory=True)
    cpu = _table()
    assert bt.get_cpu_tensor().is_pinned() and bt.slot_mapping.cpu.is_pinned()
    rng = random.Random(5)
    for _ in range(20):
        b = _random_batch(rng, cp=False)
        if len(b["table"]) > 4 or len(b["table"][0]) > 8 or b["n_slots"] > 32:
            continue
        for t in (bt, cpu):
            for r, row in enumerate(b["table"]):
                t.add_row([x % 1000 for x in row], r)
            t.commit_block_table(len(b["table"]))
        qsl, pos = torch.tensor(b["qsl"], dtype=torch.int32), torch.tensor(b["pos"], dtype=torch.int64)
        pos = pos.clamp(max=8 * 4 - 1)
        bt.compute_slot_mapping(b["num_reqs"], qsl.cuda(), pos.cuda())
        cpu.compute_slot_mapping(b["num_reqs"], qsl, pos)
        assert torch.equal(bt.slot_mapping.gpu.cpu(), cpu.slot_mapping.gpu)


def test_the_readme_example_runs_and_says_what_it_prints():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Block tables and slot mappings"):]
    code = section[section.index("```python\n") + 10 : section.index("```\n", section.index("```python\n") + 10)]
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["slots"].tolist() == list(range(112, 128)) + [48, 49, 50, 51, 84]
    assert scope["tables"][0].slot_mapping.gpu[21:].eq(PAD_SLOT_ID).all()


def test_a_subclass_keeps_its_row_edit_overrides():
    seen = []

    class Logged(BlockTable):
        def add_row(self, block_ids, row_idx):
            seen.append((list(block_ids), row_idx))
            super().add_row(block_ids, row_idx)

    bt = Logged(4, 2, 4, 8, False, "cpu", 1)
    bt.add_row([5, 6], 1)
    bt.append_row([7], 1)
    assert seen == [([5, 6], 1)] and bt.get_numpy_array()[1].tolist() == [5, 6, 7, 0]
    assert type(_table().add_row.__self__).__name__ == "BlockTableRows"  # the twin's own method, no wrapper
