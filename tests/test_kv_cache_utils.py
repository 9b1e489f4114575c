"""``kv_cache_utils``: ``KVCacheBlock``, the free-block queue and the block-hash helpers, both twins.

vLLM 0.33.0's ``tests/v1/core/test_kv_cache_utils.py`` tests the same module.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import inspect
import sys
import weakref

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvcy import hashing
from kvcy.hashing import get_hash_fn_by_name, init_none_hash
from kvcy.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange

from _kv_cache_helpers import ids


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


# --------------------------------------------------------------------------- free queue
def test_free_queue_order_and_errors(impl):
    m = impl.kv_cache
    blocks = [m.KVCacheBlock(i) for i in range(6)]
    q = m.FreeKVCacheBlockQueue(blocks)
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4, 5]
    assert q.popleft().block_id == 0
    assert ids(q.popleft_n(2)) == [1, 2]
    q.remove(blocks[4])
    assert ids(q.get_all_free_blocks()) == [3, 5]
    q.append(blocks[0])
    q.prepend_n([blocks[2], blocks[1]])
    q.append_n([blocks[4]])
    assert ids(q.get_all_free_blocks()) == [2, 1, 3, 5, 0, 4]
    assert q.num_free_blocks == 6
    with pytest.raises(RuntimeError):
        q.append(blocks[0])  # already queued: nothing changes
    assert q.num_free_blocks == 6
    assert ids(q.popleft_n(6)) == [2, 1, 3, 5, 0, 4]
    with pytest.raises(ValueError, match="No free blocks available"):
        q.popleft()
    with pytest.raises(RuntimeError):
        q.remove(blocks[0])
    with pytest.raises(AssertionError):  # (vLLM asserts num_free_blocks >= n)
        q.popleft_n(1)


# --------------------------------------------------------------------------- bad batches leave no trace
def test_free_queue_rejects_bad_batches_unchanged(impl):
    m = impl.kv_cache
    blocks = [m.KVCacheBlock(i) for i in range(6)]
    q = m.FreeKVCacheBlockQueue(blocks[:3])
    loose = blocks[3:]
    for bad, exc, msg in (
        ([loose[0], loose[1], loose[0]], RuntimeError, "appears twice"),
        ([loose[0], blocks[1]], RuntimeError, "already in the free queue"),
        ([loose[0], "x"], TypeError, "KVCacheBlock"),
    ):
        for op in (q.append_n, q.prepend_n):
            with pytest.raises(exc, match=msg):
                op(bad)
            assert ids(q.get_all_free_blocks()) == [0, 1, 2] and q.num_free_blocks == 3
            assert all(b.prev_free_block is None and b.next_free_block is None for b in loose)
    q.append_n(loose)  # the rejected blocks are still usable
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4, 5]


def test_block_hash_round_trip(impl):
    blk = impl.kv_cache.KVCacheBlock(3)
    key = b"\x01" * 32 + (2).to_bytes(4, "big")
    blk.set_block_hash(key, 48)
    assert blk.block_hash == key and blk.block_hash_num_tokens == 48
    blk.reset_hash()
    assert blk.block_hash is None and blk.block_hash_num_tokens is None


def test_resolve_block_hashes_rejects_bad_sizes(impl):
    hashes = [b"a" * 32, b"b" * 32]
    assert impl.kv_cache.resolve_block_hashes(hashes, 4, 4) is hashes
    assert len(impl.kv_cache.resolve_block_hashes(hashes, 4, 8)) == 1
    for hash_bs, bs, exc in ((4, 2, AssertionError), (4, 0, ValueError), (0, 4, ValueError), (4, -8, ValueError),
                             (4, 6, AssertionError)):
        with pytest.raises(exc, match="multiple of the hash block size"):
            impl.kv_cache.resolve_block_hashes(hashes, hash_bs, bs)


# ------------------------------------------- names vLLM's modules export
def test_lookahead_extra_keys_as_vllm(impl):
    """``kv_cache_utils.generate_lookahead_block_hash_extra_keys``: keys over the block and
    its lookahead tokens, the multimodal index stepped back to the items still open at the
    block's end (values recorded from vLLM 0.33.0)."""
    from kvcy.kv_cache_utils import generate_lookahead_block_hash_extra_keys
    from kvcy.request import MultiModalFeatureSpec, PlaceholderRange

    items = [MultiModalFeatureSpec(identifier=i, mm_position=PlaceholderRange(o, n), modality="image")
             for i, o, n in (("A", 2, 5), ("B", 7, 2), ("C", 10, 6))]
    req = impl.kv_cache.Request("r", list(range(20)), mm_features=items, cache_salt="s")
    expected = {
        (0, 4, 6, 0): ((("mm", "A", 2), ("cache_salt", "s")), 0),
        (4, 8, 10, 0): ((("mm", "A", -2), ("mm", "B", 3)), 1),
        (8, 12, 14, 1): ((("mm", "B", -1), ("mm", "C", 2)), 2),
        (12, 16, 18, 2): ((("mm", "C", -2),), 3),
        (4, 8, 8, 0): ((("mm", "A", -2), ("mm", "B", 3)), 1),
    }
    for args, keys in expected.items():
        assert generate_lookahead_block_hash_extra_keys(req, *args) == keys, args


def test_null_head_helpers():
    """``kv_cache_utils.null_head_len`` / ``trim_null_head``: the leading null blocks."""
    from kvcy.kv_cache_utils import KVCacheBlock, null_head_len, trim_null_head

    null = KVCacheBlock(0, is_null=True)
    blocks = [null, null, KVCacheBlock(3), null]
    assert null_head_len(blocks) == 2 and null_head_len([]) == 0 and null_head_len(blocks[2:]) == 0
    assert [b.block_id for b in trim_null_head(blocks)] == [3, 0]
    assert trim_null_head(blocks[2:]) == blocks[2:] and type(trim_null_head(tuple(blocks))) is tuple


def test_popleft_n_past_the_free_blocks_asserts_as_vllm(impl):
    """``FreeKVCacheBlockQueue.popleft_n(n)`` with fewer than ``n`` free blocks: vLLM
    asserts (kvcy raised ValueError); nothing is popped."""
    blocks = [impl.kv_cache.KVCacheBlock(i) for i in range(3)]
    queue = impl.kv_cache.FreeKVCacheBlockQueue(blocks)
    with pytest.raises(AssertionError):
        queue.popleft_n(4)
    assert queue.num_free_blocks == 3 and [b.block_id for b in queue.get_all_free_blocks()] == [0, 1, 2]


def test_iter_blocks_after_walks_the_free_queue_as_vllm(impl):
    """``FreeKVCacheBlockQueue.iter_blocks_after(cursor)``: the free blocks after ``cursor``
    in eviction order (from the head for None), read lazily (values recorded from vLLM)."""
    blocks = [impl.kv_cache.KVCacheBlock(i) for i in range(6)]
    queue = impl.kv_cache.FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[2])
    queue.append(blocks[2])
    queue.popleft()
    walk = lambda cursor: [b.block_id for b in queue.iter_blocks_after(cursor)]  # noqa: E731
    assert walk(None) == [1, 3, 4, 5, 2]
    assert [walk(c) for c in (blocks[1], blocks[3], blocks[2], blocks[0], queue.fake_free_list_tail)] == \
        [[3, 4, 5, 2], [4, 5, 2], [], [], []]
    it = queue.iter_blocks_after(None)
    first = next(it)
    queue.remove(blocks[3])  # (the walk reads each next block when it gets there)
    assert [first.block_id] + [b.block_id for b in it] == [1, 4, 5, 2]


def test_block_repr_as_vllm(impl):
    """``repr(KVCacheBlock)`` names the same fields as vLLM 0.33.0's, in its order
    (strings recorded from vLLM)."""
    kv = impl.kv_cache
    blocks = [kv.KVCacheBlock(i) for i in range(3)]
    queue = kv.FreeKVCacheBlockQueue(blocks)
    cached = kv.KVCacheBlock(7)
    cached.set_block_hash(b"abcd\x00\x00\x00\x01", 4)
    assert repr(blocks[1]) == ("KVCacheBlock(block_id=1, ref_cnt=0, _block_hash=None, _block_hash_num_tokens=None, "
                               "prev_free_block=0, next_free_block=2)")
    assert repr(cached) == ("KVCacheBlock(block_id=7, ref_cnt=0, _block_hash=b'abcd\\x00\\x00\\x00\\x01', "
                            "_block_hash_num_tokens=4, prev_free_block=None, next_free_block=None)")
    assert queue.num_free_blocks == 3


# ------------------------------------------------- §7 NONE_HASH seed for vLLM's own functions
def test_none_hash_seed_is_random_for_vllms_own_xxhash_functions(monkeypatch):
    """vLLM randomises the seed of its own xxhash and xxhash_cbor (by identity): so does kvcy.

    A stand-in for ``vllm.utils.hashing`` (vLLM itself takes seconds to import);
    test_none_hash_seed_with_vllm checks the real module where it is installed.
    """
    import sys
    import types

    from kvcy import hashing

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)

    def xxhash(obj):  # another function object than kvcy's
        return hashing.xxhash(obj)

    def xxhash_cbor(obj):
        return hashing.xxhash_cbor(obj)

    def sha256(obj):
        return hashing.sha256(obj)

    fake = types.ModuleType("vllm.utils.hashing")
    fake.xxhash, fake.xxhash_cbor, fake.sha256 = xxhash, xxhash_cbor, sha256
    for fn in (xxhash, xxhash_cbor, sha256):
        assert hashing.resolve_none_hash_seed(fn) == "vllm-none-hash"  # vLLM not loaded: unknown functions
    monkeypatch.setitem(sys.modules, "vllm.utils.hashing", fake)
    for fn in (xxhash, xxhash_cbor):
        a, b = hashing.resolve_none_hash_seed(fn), hashing.resolve_none_hash_seed(fn)
        assert a != b and len(a) == 64
    assert hashing.resolve_none_hash_seed(sha256) == "vllm-none-hash"
    assert hashing.resolve_none_hash_seed(lambda obj: b"x") == "vllm-none-hash"
    hashing.init_none_hash(xxhash)
    seed = hashing.get_none_hash_seed()
    assert seed != "vllm-none-hash" and hashing.NONE_HASH == xxhash(seed)
    # kvcy's extra non-collision-resistant functions keep their random seed.
    for name in ("xxhash", "xxhash_cbor", "xxh3_raw", "builtin", "sha256_cbor_64bit"):
        fn = hashing.get_hash_fn_by_name(name)
        assert hashing.resolve_none_hash_seed(fn) != hashing.resolve_none_hash_seed(fn)
    monkeypatch.setenv("PYTHONHASHSEED", "9")
    assert hashing.resolve_none_hash_seed(xxhash) == "9"
    hashing.init_none_hash(hashing.sha256)


def test_none_hash_seed_with_vllm(monkeypatch):
    """The real vLLM 0.33.0 functions, where vLLM is installed."""
    vllm_hashing = pytest.importorskip("vllm.utils.hashing")
    from kvcy import hashing

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    for fn in (vllm_hashing.xxhash, vllm_hashing.xxhash_cbor):
        assert hashing.resolve_none_hash_seed(fn) != hashing.resolve_none_hash_seed(fn)
    for fn in (vllm_hashing.sha256, vllm_hashing.sha256_cbor):
        assert hashing.resolve_none_hash_seed(fn) == "vllm-none-hash"


def test_kv_cache_block_is_null_keyword(impl):
    kv = impl.kv_cache
    assert kv.KVCacheBlock(3, is_null=True).is_null is True
    assert kv.KVCacheBlock(3).is_null is False
    with pytest.raises(TypeError, match="is_null must be a bool"):
        kv.KVCacheBlock(3, is_null=1)


# =================================================================================================
# vLLM 0.33.0 drop-in, hashing side: incremental multimodal keys, hash lookahead,
# prompt-embeds keys, and the hashing names vLLM's ``kv_cache_utils`` exports.
# =================================================================================================

ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "xxh3_raw")


NONE_HASH = b"N" * 32


SUPPRESS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


def mm(ident: str, offset: int, length: int) -> MultiModalFeatureSpec:
    return MultiModalFeatureSpec(identifier=ident, mm_position=PlaceholderRange(offset, length))


class Recorder:
    """A generic hash function that remembers the (parent, tokens, keys) it hashed."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, obj) -> bytes:
        self.calls.append(obj)
        return hashlib.sha256(repr(obj).encode()).digest()


def build(impl, tokens, split, bs, *, algo="sha256", hash_fn=None, lookahead=0, **kw):
    """A request whose first ``split`` tokens are the prompt and the rest are appended
    in the chunks ``chunks`` (a list of lengths) -- see ``grow``."""
    hasher = impl.hashing.RequestBlockHasher(bs, algo, lambda: NONE_HASH, hash_fn, lookahead)
    return impl.kv_cache.Request("r", tokens[:split], block_hasher=hasher, **kw)


def grow(req, tokens, split, chunks):
    pos = split
    for n in chunks:
        req.append_output_token_ids(tokens[pos:pos + n])
        pos += n
    assert pos == len(tokens)
    return req


@st.composite
def mm_requests(draw):
    """Tokens, multimodal items (sorted by offset; overlapping, block-spanning or
    sharing an offset allowed), a prompt/append split, LoRA, salt, block size."""
    n = draw(st.integers(0, 48))
    tokens = draw(st.lists(st.integers(-(2**40), 2**40), min_size=n, max_size=n))
    split = draw(st.integers(0, n))
    items = []
    if split:
        offsets = sorted(draw(st.lists(st.integers(0, split - 1), max_size=6)))
        for i, off in enumerate(offsets):
            length = draw(st.integers(1, split - off))
            items.append(mm(draw(st.sampled_from(["a", "b", "img"])) + str(i), off, length))
    chunks = []
    left = n - split
    while left:
        c = draw(st.integers(1, left))
        chunks.append(c)
        left -= c
    lora = draw(st.none() | st.just(LoRARequest("ad", 1, "/p")))
    salt = draw(st.sampled_from([None, "", "salt"]))
    bs = draw(st.integers(1, 8))
    lookahead = draw(st.sampled_from([0, 0, 1, 3]))
    return tokens, split, chunks, items, lora, salt, bs, lookahead


# --------------------------------------------------------------------------- overlapping items
# Recorded from vLLM 0.33.0 itself (its get_request_block_hasher on vllm.v1.request.Request, the
# hash function recording each block's extra keys): the items, the prompt length, the block size,
# the token count, the keys when every token is in the prompt ("at once"), and the keys when the
# tokens after the prompt are appended one at a time ("incremental").  vLLM's incremental hasher
# resumes by bisecting on the items' ends, which are not sorted when items overlap, so its two
# answers differ; kvcy gives the at-once keys both ways (docs/vllm-dropin-gaps.md, section 7).
VLLM_OVERLAPPING = [
    ([("A", 4, 13), ("B", 5, 10), ("C", 14, 4)], 20, 8, 25,
     [(("mm", "A", 4),), (("mm", "A", -4),), (("mm", "A", -12), ("mm", "C", -2))],
     [(("mm", "A", 4),), (("mm", "A", -4),), (("mm", "C", -2),)]),
    ([("A", 1, 10), ("B", 2, 2), ("C", 8, 2)], 12, 8, 37,
     [(("mm", "A", 1),), (("mm", "A", -7), ("mm", "C", 0)), None, None],
     [(("mm", "A", 1),), (("mm", "C", 0),), None, None]),
    ([("i0", 0, 9), ("i1", 2, 12), ("i2", 5, 3), ("i3", 8, 6)], 15, 8, 19,
     [(("mm", "i0", 0),), (("mm", "i0", -8), ("mm", "i1", -6), ("mm", "i3", 0))],
     [(("mm", "i0", 0),), (("mm", "i3", 0),)]),
    ([("i0", 1, 2), ("i1", 1, 2), ("i2", 1, 1), ("i3", 1, 2)], 3, 2, 10,
     [(("mm", "i0", 1),), (("mm", "i0", -1), ("mm", "i1", -1), ("mm", "i3", -1)), None, None, None],
     [(("mm", "i0", 1),), (("mm", "i3", -1),), None, None, None]),
]


def _vllm_keys(tokens, split, items, bs):
    """vLLM 0.33.0's extra keys per block, hashing ``tokens[:split]`` as the prompt and
    appending the rest one token at a time."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec as VSpec
    from vllm.multimodal.inputs import PlaceholderRange as VRange
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core import kv_cache_utils as vku
    from vllm.v1.request import Request as VRequest

    rec = Recorder()
    vku.init_none_hash(rec)
    features = [VSpec(data=None, modality="image", identifier=i, mm_position=VRange(o, ln)) for i, o, ln in items]
    req = VRequest("r", list(tokens[:split]), SamplingParams(max_tokens=8), None, mm_features=features,
                   block_hasher=vku.get_request_block_hasher(bs, rec))
    for t in tokens[split:]:
        req.append_output_token_ids(t)
    return [c[2] for c in rec.calls if isinstance(c, tuple)]


# --------------------------------------------------------------------------- kept positions
# The compiled hasher keeps the parsed positions of a request whose items are still open where it
# resumes, and must never hash with positions that no longer match the request (section 8).  The
# pure-Python twin reads them again on each call (keeping them measured no faster there); the
# tests below run on both, so the twins must agree.
READS = {"offset": 0}


@dataclasses.dataclass(frozen=True)
class CountedRange:
    """A frozen placeholder range that counts reads of its ``offset``."""

    offset: int
    length: int

    def __getattribute__(self, name):
        if name == "offset":
            READS["offset"] += 1
        return object.__getattribute__(self, name)


@dataclasses.dataclass
class MutableSpec:
    """vLLM's ``MultiModalFeatureSpec`` is a plain (mutable) dataclass."""

    identifier: str
    mm_position: object
    modality: str = "image"


@dataclasses.dataclass
class MutableRange:
    offset: int
    length: int


class PlainRequest:
    """The fields the hasher reads, on a plain object (weak references allowed)."""

    def __init__(self, tokens, features, num_tokens):
        self.all_token_ids = tokens
        self.num_tokens = num_tokens
        self.mm_features = features
        self.block_hashes = []
        self.lora_request = None
        self.cache_salt = None
        self.prompt_embeds = None


def _same_as_unkept(impl, req, hasher, bs):
    """The kept hasher's next hashes are what a hasher with nothing kept computes."""
    want = impl.hashing.RequestBlockHasher(bs, hasher.algo, lambda: NONE_HASH, hasher.hash_fn)(req)
    got = hasher(req)
    assert got == want
    req.block_hashes.extend(got)


@st.composite
def edit_scripts(draw):
    bs = draw(st.integers(1, 6))
    n = draw(st.integers(8, 60))
    ops = draw(st.lists(st.sampled_from(
        ["grow", "grow", "grow", "append_item", "replace_item", "pop_item", "new_list", "as_tuple",
         "reassign_position", "reassign_identifier", "mutable_range", "truncate", "new_request"]),
        min_size=1, max_size=25))
    seed = draw(st.integers(0, 2**16))
    return bs, n, ops, seed


# --------------------------------------------------------------------------- item 1
def test_appended_token_completing_a_block_keeps_every_mm_item(impl):
    """Block 1 = tokens 4..7 holds image A (4-5) and image B (6): both enter its keys
    when token 7 is appended, exactly as when the 8 tokens come at once."""
    rec_inc, rec_fresh = Recorder(), Recorder()
    items = [mm("A", 4, 2), mm("B", 6, 1)]
    inc = build(impl, list(range(8)), 7, 4, algo=None, hash_fn=rec_inc, mm_features=items)
    inc.append_output_token_ids(7)
    fresh = build(impl, list(range(8)), 8, 4, algo=None, hash_fn=rec_fresh, mm_features=items)
    assert rec_inc.calls[-1][2] == (("mm", "A", 0), ("mm", "B", 2))
    assert rec_fresh.calls[-1][2] == (("mm", "A", 0), ("mm", "B", 2))
    assert inc.block_hashes == fresh.block_hashes


@pytest.mark.parametrize("algo", ALGOS)
def test_requests_differing_only_in_an_earlier_image_do_not_collide(impl, algo):
    hashes = []
    for ident in ("A", "other-A"):
        req = build(impl, list(range(8)), 7, 4, algo=algo, mm_features=[mm(ident, 4, 2), mm("B", 6, 1)])
        req.append_output_token_ids(7)
        fresh = build(impl, list(range(8)), 8, 4, algo=algo, mm_features=[mm(ident, 4, 2), mm("B", 6, 1)])
        assert req.block_hashes == fresh.block_hashes
        hashes.append(req.block_hashes)
    assert hashes[0][0] == hashes[1][0]  # block 0 holds no image
    assert hashes[0][1] != hashes[1][1]


@pytest.mark.parametrize("algo", [*ALGOS, None])
@settings(max_examples=40, deadline=None, suppress_health_check=SUPPRESS)
@given(case=mm_requests())
def test_incremental_hashes_equal_hashes_at_once(impl, algo, case):
    """Any split of the tokens into a prompt and appended chunks gives the hashes that
    the whole token list gives at once (algo None: a generic hash function)."""
    tokens, split, chunks, items, lora, salt, bs, lookahead = case
    kw = dict(mm_features=items or None, lora_request=lora, cache_salt=salt)
    fn = None if algo else Recorder()
    inc = grow(build(impl, tokens, split, bs, algo=algo, hash_fn=fn, lookahead=lookahead, **kw),
               tokens, split, chunks)
    fresh = build(impl, tokens, len(tokens), bs, algo=algo, hash_fn=fn, lookahead=lookahead, **kw)
    assert inc.block_hashes == fresh.block_hashes
    assert len(inc.block_hashes) == max(0, len(tokens) - lookahead) // bs


@settings(max_examples=60, deadline=None, suppress_health_check=SUPPRESS)
@given(case=mm_requests())
def test_mm_keys_are_the_items_overlapping_each_block(impl, case):
    """With items that do not overlap each other, a block's mm keys are exactly the
    items overlapping it, each with its offset from the block start (vLLM's keys)."""
    tokens, split, chunks, items, lora, salt, bs, _ = case
    kept = []  # a chain of the items that do not overlap each other
    for it in items:
        if not kept or it.mm_position.offset >= kept[-1].mm_position.offset + kept[-1].mm_position.length:
            kept.append(it)
    rec = Recorder()
    grow(build(impl, tokens, split, bs, algo=None, hash_fn=rec, mm_features=kept or None), tokens, split, chunks)
    for i, (_, _, keys) in enumerate(rec.calls):
        lo, hi = i * bs, (i + 1) * bs
        want = [("mm", it.identifier, it.mm_position.offset - lo) for it in kept
                if it.mm_position.offset < hi and it.mm_position.offset + it.mm_position.length > lo]
        assert list(keys or ()) == want


@pytest.mark.parametrize("case", range(len(VLLM_OVERLAPPING)))
def test_overlapping_items_get_vllms_at_once_keys_both_ways(impl, case):
    items, split, bs, n, at_once, vllm_incremental = VLLM_OVERLAPPING[case]
    features = [mm(*it) for it in items]
    tokens = list(range(n))
    keys = []
    for prompt_len in (n, split):
        rec = Recorder()
        grow(build(impl, tokens, prompt_len, bs, algo=None, hash_fn=rec, mm_features=features),
             tokens, prompt_len, [1] * (n - prompt_len))
        keys.append([c[2] for c in rec.calls])
    assert keys == [at_once, at_once]
    assert vllm_incremental != at_once  # (what kvcy does not copy)


@pytest.mark.parametrize("algo", ALGOS)
def test_overlapping_items_do_not_give_a_false_hit_incrementally(impl, algo):
    """vLLM's incremental keys for case 2 leave out item i1, so two requests that differ only
    in i1's image hash alike there (a false prefix hit); kvcy's hashes differ."""
    items, split, bs, n = VLLM_OVERLAPPING[2][:4]
    hashes = []
    for ident in ("i1", "other-i1"):
        features = [mm(ident if i == "i1" else i, o, ln) for i, o, ln in items]
        req = grow(build(impl, [0] * n, split, bs, algo=algo, mm_features=features), [0] * n, split, [1] * (n - split))
        hashes.append(req.block_hashes)
    assert hashes[0][0] == hashes[1][0]  # block 0 holds i1's start only as vLLM's walk skips it
    assert hashes[0][1] != hashes[1][1]


@settings(max_examples=60, deadline=None, suppress_health_check=SUPPRESS)
@given(case=mm_requests())
def test_live_vllm_keys(impl, case):
    """Against vLLM 0.33.0 when it is importable: kvcy's keys, however the tokens arrive,
    are vLLM's keys for the tokens at once; for items that do not overlap they are also
    vLLM's incremental keys."""
    pytest.importorskip("vllm.v1.request")
    tokens, split, _, items, _, _, bs, _ = case
    triples = [(f.identifier, f.mm_position.offset, f.mm_position.length) for f in items]
    rec = Recorder()
    grow(build(impl, tokens, split, bs, algo=None, hash_fn=rec, mm_features=items), tokens, split,
         [1] * (len(tokens) - split))
    kvcy_keys = [c[2] for c in rec.calls]
    assert kvcy_keys == _vllm_keys(tokens, len(tokens), triples, bs)
    ends = [o + ln for _, o, ln in triples]
    if all(ends[i] <= triples[i + 1][1] for i in range(len(triples) - 1)):
        assert kvcy_keys == _vllm_keys(tokens, split, triples, bs)


def test_open_items_are_read_once_per_request(impl):
    """32 images still open, blocks completing one call at a time: each call of the compiled
    hasher reads a few positions, not all 32 again (the Python twin: those up to the resume
    point, as vLLM's walk does)."""
    n_items, bs = 32, 16
    tokens = list(range(32 * 64))
    features = [MultiModalFeatureSpec(f"img{i}", CountedRange(i * 64 + 8, 32)) for i in range(n_items)]
    hasher = impl.hashing.RequestBlockHasher(bs, "sha256", lambda: NONE_HASH)
    req = PlainRequest(tokens, features, bs)
    req.block_hashes = hasher(req)
    READS["offset"] = 0
    calls = 0
    for n in range(2 * bs, len(tokens) - 64, bs):
        req.num_tokens = n
        req.block_hashes.extend(hasher(req))
        calls += 1
    if impl.name == "cython":
        assert READS["offset"] <= n_items + 6 * calls
    fresh = PlainRequest(tokens, features, req.num_tokens)
    assert impl.hashing.RequestBlockHasher(bs, "sha256", lambda: NONE_HASH)(fresh) == req.block_hashes


@pytest.mark.parametrize("edit", ["replace_item", "reassign_position", "reassign_identifier", "mutable_range",
                                  "insert_item", "new_list"])
def test_each_edit_of_open_items_is_seen(impl, edit):
    """Item a ended before the resume point, b is open; then a is edited to reach past the next
    block (or b renamed): the next block's keys are the edited items', as a hasher that kept
    nothing finds them."""
    bs = 4
    tokens = list(range(40))
    a = MutableSpec("a", PlaceholderRange(0, 5)) if edit != "replace_item" else mm("a", 0, 5)
    b = MutableSpec("b", PlaceholderRange(6, 20))
    req = PlainRequest(tokens, [a, b], bs)
    rec = Recorder()
    hasher = impl.hashing.RequestBlockHasher(bs, None, lambda: NONE_HASH, rec)
    req.block_hashes = hasher(req)
    for n in (8, 12):  # the second call resumes at 4 with b open: its positions are kept
        req.num_tokens = n
        req.block_hashes.extend(hasher(req))
    wide = PlaceholderRange(0, 30)
    if edit == "replace_item":
        req.mm_features[0] = mm("A", 0, 30)
    elif edit == "reassign_position":
        a.mm_position = wide
    elif edit == "reassign_identifier":
        b.identifier = "B"
    elif edit == "mutable_range":
        a.mm_position = MutableRange(0, 5)
        req.num_tokens = 16
        _same_as_unkept(impl, req, hasher, bs)
        a.mm_position.length = 30
    elif edit == "insert_item":
        req.mm_features.insert(0, mm("A", 0, 30))
    elif edit == "new_list":
        req.mm_features = [mm("A", 0, 30), b]
    req.num_tokens = len(req.block_hashes) * bs + bs
    start = req.num_tokens - bs
    want_id = "B" if edit == "reassign_identifier" else ("a" if edit in ("reassign_position", "mutable_range") else "A")
    want = (("mm", "B", 6 - start),) if edit == "reassign_identifier" else (("mm", want_id, -start),)
    _same_as_unkept(impl, req, hasher, bs)
    assert rec.calls[-1][2] == want


@settings(max_examples=80, deadline=None, suppress_health_check=SUPPRESS)
@given(script=edit_scripts())
def test_kept_positions_never_go_stale(impl, script):
    """Any edit of a request's items between calls (in place, a new list, vLLM's mutable
    specs reassigned, hashes truncated as vLLM's streaming sessions do, a new request that
    may reuse the old one's id) gives the hashes of a hasher that kept nothing."""
    import random

    bs, n, ops, seed = script
    rng = random.Random(seed)
    tokens = list(range(n))

    def item(i):
        off = rng.randrange(0, n - 1)
        length = rng.randrange(1, n - off + 1)
        if rng.random() < 0.5:
            return MutableSpec(f"m{i}-{rng.randrange(9)}", PlaceholderRange(off, length))
        return mm(f"k{i}-{rng.randrange(9)}", off, length)

    def items(k):
        return sorted((item(i) for i in range(k)), key=lambda f: f.mm_position.offset)

    hasher = impl.hashing.RequestBlockHasher(bs, "sha256", lambda: NONE_HASH)
    req = PlainRequest(tokens, items(rng.randrange(1, 6)), min(n, bs))
    _same_as_unkept(impl, req, hasher, bs)
    for op in ops:
        f = req.mm_features
        if op == "grow":
            req.num_tokens = min(n, req.num_tokens + rng.randrange(1, 2 * bs))
        elif op == "append_item":
            f.append(item(len(f)))
            f.sort(key=lambda x: x.mm_position.offset)
        elif op == "replace_item" and f:
            k = rng.randrange(len(f))
            f[k] = item(k)
            f.sort(key=lambda x: x.mm_position.offset)
        elif op == "pop_item" and f:
            f.pop()
        elif op == "new_list":
            req.mm_features = items(rng.randrange(0, 6))
        elif op == "as_tuple":
            req.mm_features = tuple(f)
            _same_as_unkept(impl, req, hasher, bs)
            req.mm_features = list(req.mm_features)
        elif op in ("reassign_position", "reassign_identifier", "mutable_range"):
            mutable = [x for x in f if isinstance(x, MutableSpec)]
            if mutable:
                x = rng.choice(mutable)
                if op == "reassign_identifier":
                    x.identifier = x.identifier + "'"
                else:
                    old = x.mm_position
                    cls = MutableRange if op == "mutable_range" else PlaceholderRange
                    x.mm_position = cls(old.offset, max(1, old.length + rng.choice([-2, -1, 1, 2])))
        elif op == "truncate":
            del req.block_hashes[rng.randrange(0, len(req.block_hashes) + 1):]
        elif op == "new_request":
            old = req
            req = PlainRequest(tokens, items(rng.randrange(1, 6)), old.num_tokens)
            del old
            gc.collect()
        if isinstance(req.mm_features, list):
            req.mm_features.sort(key=lambda x: x.mm_position.offset)
        _same_as_unkept(impl, req, hasher, bs)


def test_kept_positions_die_with_their_request(impl):
    """What a hasher keeps for a request goes when the request does (no leak, and no
    reuse by a later object that gets the same id)."""
    bs = 4
    spec = MutableSpec("img", PlaceholderRange(2, 12))
    hasher = impl.hashing.RequestBlockHasher(bs, "sha256", lambda: NONE_HASH)
    req = PlainRequest(list(range(16)), [spec], bs)
    req.block_hashes = hasher(req)
    req.num_tokens = 8
    req.block_hashes.extend(hasher(req))  # resumes with the image open: kept
    alive = weakref.ref(spec)
    del req, spec
    gc.collect()
    assert alive() is None


def test_kvcy_requests_keep_their_positions_too(impl):
    """kvcy's own Request (both twins) takes weak references, so the compiled hasher can keep
    its positions; a prompt whose last image is still open when output tokens complete the
    next blocks hashes as the whole token list at once."""
    bs = 4
    tokens = list(range(40))
    features = [mm("a", 2, 5), mm("b", 9, 21)]
    req = build(impl, tokens, 30, bs, mm_features=features)
    assert weakref.ref(req)() is req
    grow(req, tokens, 30, [1] * 10)
    assert req.block_hashes == build(impl, tokens, 40, bs, mm_features=features).block_hashes


def test_a_hasher_that_kept_positions_pickles(impl):
    import pickle

    bs = 4
    hasher = impl.hashing.RequestBlockHasher(bs, "sha256", hashing.get_none_hash, None, 0)
    req = PlainRequest(list(range(16)), [mm("img", 2, 12)], bs)
    req.block_hashes = hasher(req)
    req.num_tokens = 8
    req.block_hashes.extend(hasher(req))  # resumes with the image open: kept
    copy = pickle.loads(pickle.dumps(hasher))
    assert (copy.block_size, copy.algo, copy.num_hash_lookahead_tokens) == (4, "sha256", 0)
    req.num_tokens = 12
    assert copy(req) == hasher(req)


def test_requests_without_weak_references_are_hashed_right(impl):
    from types import SimpleNamespace

    bs = 4
    tokens = list(range(24))
    features = [mm("a", 1, 9), mm("b", 10, 9)]
    hasher = impl.hashing.RequestBlockHasher(bs, "sha256", lambda: NONE_HASH)
    req = SimpleNamespace(all_token_ids=tokens, num_tokens=bs, mm_features=features, block_hashes=[],
                          lora_request=None, cache_salt=None, prompt_embeds=None)
    for n in range(bs, 25, bs):
        req.num_tokens = n
        req.block_hashes.extend(hasher(req))
    features[1] = mm("c", 10, 9)
    del req.block_hashes[2:]
    req.block_hashes.extend(hasher(req))
    fresh = PlainRequest(tokens, features, 24)
    assert req.block_hashes == impl.hashing.RequestBlockHasher(bs, "sha256", lambda: NONE_HASH)(fresh)


# --------------------------------------------------------------------------- lookahead
def test_lookahead_keys_and_timing(impl):
    """L=2: a block is hashed once the 2 tokens after it exist; its keys are (E, t, t')
    with E the keys of the block and those tokens; an item that the lookahead already
    walked past still enters the next block's keys."""
    rec = Recorder()
    req = build(impl, list(range(100, 107)), 7, 4, algo=None, hash_fn=rec, lookahead=2,
                mm_features=[mm("A", 3, 3)], cache_salt="s")
    assert len(req.block_hashes) == 1
    assert rec.calls[0] == (NONE_HASH, (100, 101, 102, 103), ((("mm", "A", 3), ("cache_salt", "s")), 104, 105))
    req.append_output_token_ids([107, 108])
    assert len(req.block_hashes) == 1
    req.append_output_token_ids(109)
    assert len(req.block_hashes) == 2
    assert rec.calls[1] == (req.block_hashes[0], (104, 105, 106, 107), ((("mm", "A", -1),), 108, 109))


def test_lookahead_one_token_and_no_keys(impl):
    rec = Recorder()
    build(impl, [1, 2, 3, 4, 5], 5, 4, algo=None, hash_fn=rec, lookahead=1)
    assert rec.calls == [(NONE_HASH, (1, 2, 3, 4), (None, 5))]


@pytest.mark.parametrize("algo", ALGOS)
def test_lookahead_twins_agree(impl, algo):
    from types import SimpleNamespace

    from kvcy._fast import load

    py = SimpleNamespace(**load("python"))
    out = []
    for twin in (impl, py):
        req = build(twin, list(range(30)), 9, 4, algo=algo, lookahead=3,
                    mm_features=[mm("A", 2, 5), mm("B", 7, 1)], lora_request=LoRARequest("l", 1, "/l"))
        grow(req, list(range(30)), 9, [1, 5, 15])
        out.append(req.block_hashes)
    assert out[0] == out[1] and len(out[0]) == 6


def test_lookahead_argument(impl):
    for bad in (-1, 1.0, "2"):
        with pytest.raises(ValueError, match="num_hash_lookahead_tokens"):
            impl.hashing.RequestBlockHasher(4, "sha256", lambda: NONE_HASH, None, bad)
    # a bool is an int (0 or 1), as in vLLM, whose own tests pass lookahead=True
    flagged = impl.hashing.RequestBlockHasher(4, "sha256", lambda: NONE_HASH, None, True)
    assert flagged.num_hash_lookahead_tokens == 1 and type(flagged.num_hash_lookahead_tokens) is int
    h = impl.hashing.RequestBlockHasher(4, "sha256", lambda: NONE_HASH, num_hash_lookahead_tokens=2)
    assert h.num_hash_lookahead_tokens == 2


def test_get_request_block_hasher_signature():
    params = list(inspect.signature(hashing.get_request_block_hasher).parameters.values())
    assert [p.name for p in params] == ["hash_block_size", "caching_hash_fn", "num_hash_lookahead_tokens"]
    assert params[2].default == 0
    h = hashing.get_request_block_hasher(4, hashing.sha256, 2)
    assert (h.block_size, h.algo, h.num_hash_lookahead_tokens) == (4, "sha256", 2)
    g = hashing.get_request_block_hasher(4, hashing.builtin, 1)
    assert (g.algo, g.num_hash_lookahead_tokens) == (None, 1)


# --------------------------------------------------------------------------- prompt embeds
def test_prompt_embeds_keys_past_the_prompt_and_bf16(impl):
    """vLLM hashes ``prompt_embeds[start:end]`` unclamped: a block past the prompt
    carries the digest of the empty slice.  bf16 embeddings hash their raw bytes."""
    torch = pytest.importorskip("torch")
    embeds = torch.arange(8 * 2, dtype=torch.float32).reshape(8, 2)
    req = impl.kv_cache.Request("r", list(range(8)), prompt_embeds=embeds)
    keys, _ = impl.hashing.generate_block_hash_extra_keys(req, 8, 12, 0)
    assert keys == (("prompt_embeds", hashlib.sha256(b"").digest()),)
    bf = embeds.to(torch.bfloat16)
    req = impl.kv_cache.Request("r", list(range(8)), prompt_embeds=bf)
    keys, _ = impl.hashing.generate_block_hash_extra_keys(req, 4, 8, 0)
    want = hashlib.sha256(bf[4:8].flatten().view(torch.uint8).numpy().tobytes()).digest()
    assert keys == (("prompt_embeds", want),)


# --------------------------------------------------------------------------- names
def test_kv_cache_utils_names():
    from kvcy import kv_cache_utils as u

    for name in ("NONE_HASH", "DEFAULT_NONE_HASH_SEED", "resolve_none_hash_seed", "get_none_hash_seed",
                 "get_request_block_hasher", "BlockHashListWithBlockSize", "resolve_block_hashes",
                 "maybe_convert_block_hash", "to_event_extra_keys", "ExternalBlockHash"):
        assert getattr(u, name) is not None, name
    assert u.DEFAULT_NONE_HASH_SEED == "vllm-none-hash"
    hashing.init_none_hash(hashing.sha256)
    assert u.NONE_HASH == hashing.NONE_HASH == hashing.sha256("vllm-none-hash")


def test_none_hash_seed(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert hashing.resolve_none_hash_seed(hashing.sha256) == "vllm-none-hash"
    assert hashing.resolve_none_hash_seed(hashing.sha256_cbor) == "vllm-none-hash"
    assert hashing.resolve_none_hash_seed(lambda obj: b"x") == "vllm-none-hash"
    a, b = (hashing.resolve_none_hash_seed(hashing.xxhash) for _ in range(2))
    assert a != b and len(a) == 64
    hashing.init_none_hash(hashing.xxhash_cbor)
    seed = hashing.get_none_hash_seed()
    assert seed != "vllm-none-hash" and hashing.NONE_HASH == hashing.xxhash_cbor(seed)
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    assert hashing.resolve_none_hash_seed(hashing.xxhash) == "7"
    hashing.init_none_hash(hashing.sha256)
    assert hashing.get_none_hash_seed() == "7"
    monkeypatch.delenv("PYTHONHASHSEED")
    hashing.init_none_hash(hashing.sha256)
    assert hashing.get_none_hash_seed() == "vllm-none-hash"


def test_maybe_convert_block_hash(monkeypatch):
    h = bytes(range(32))
    monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    assert hashing.maybe_convert_block_hash(h) == int.from_bytes(h, "big") & (2**64 - 1)
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    assert hashing.maybe_convert_block_hash(h) == h
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "yes")
    with pytest.raises(ValueError, match="VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"):
        hashing.maybe_convert_block_hash(h)


def test_to_event_extra_keys():
    assert hashing.to_event_extra_keys(None) is None
    assert hashing.to_event_extra_keys([]) is None
    keys = [None, (("lora", "ad", "/p"), ("mm", "img", -2), ("cache_salt", "s"), ("prompt_embeds", b"d"))]
    assert hashing.to_event_extra_keys(keys) == [None, ("ad", ("img", -2), "s", b"d")]
    assert hashing.to_event_extra_keys(iter([None])) == [None]


def test_block_hash_list_with_block_size():
    hashes = [bytes([i]) for i in range(7)]
    view = hashing.BlockHashListWithBlockSize(hashes, 4, 12)
    assert len(view) == 2 and view.scale_factor == 3
    assert view[0] == hashes[2] and view[1] == hashes[5] and list(view) == [hashes[2], hashes[5]]
    assert view[0:2] == [hashes[2], hashes[5]] and view[::-1] == [hashes[5], hashes[2]]
    hashes.extend([b"x", b"y"])  # lazy: the view follows the list
    assert len(view) == 3 and view[2] == b"y"
    with pytest.raises(TypeError):
        view["0"]
    with pytest.raises(AssertionError):
        hashing.BlockHashListWithBlockSize(hashes, 4, 6)


def test_resolve_block_hashes():
    hashes = [bytes([i]) for i in range(8)]
    assert hashing.resolve_block_hashes(hashes, 4, 4) is hashes
    view = hashing.resolve_block_hashes(hashes, 4, 16)
    assert isinstance(view, hashing.BlockHashListWithBlockSize) and list(view) == [hashes[3], hashes[7]]
    assert hashing.resolve_block_hashes(view, 4, 16) is view
    with pytest.raises(AssertionError):
        hashing.resolve_block_hashes(view, 4, 8)
    fine = hashing.resolve_block_hashes(hashes, 4, 16, supports_fine_grained_hash_lookup=True, alignment_tokens=4)
    assert fine is hashes
    coarse = hashing.resolve_block_hashes(hashes, 4, 16, supports_fine_grained_hash_lookup=True, alignment_tokens=16)
    assert isinstance(coarse, hashing.BlockHashListWithBlockSize)
    with pytest.raises(AssertionError):
        hashing.resolve_block_hashes(hashes, 4, 6)


# =================================================================================================
# The free-block queue on its own: order, membership, ownership, against both twins.
#
# The compiled queue keeps its blocks in an array indexed by position (removal
# from the middle leaves a hole; the array grows, wraps around and squeezes
# holes out), and a block only records the queue and position it was last put
# at.  These tests drive the queue through what exercises that: removal
# anywhere, batches at both ends, growth past the first array, blocks moving
# between queues, blocks with duplicate or negative ids, and teardown.
# =================================================================================================

def assert_queue_is(q, model, loose=()):
    """``q`` holds exactly ``model`` (identity, in order) and its links agree."""
    got = q.get_all_free_blocks()
    assert len(got) == len(model) and all(a is b for a, b in zip(got, model))
    assert q.num_free_blocks == len(q) == len(model)
    head, tail = q.fake_free_list_head, q.fake_free_list_tail
    chain = [head, *model, tail]
    assert head.prev_free_block is None and tail.next_free_block is None
    for before, block, after in zip(chain, chain[1:], chain[2:]):
        assert block.prev_free_block is before and block.next_free_block is after
    assert head.next_free_block is chain[1] and tail.prev_free_block is chain[-2]
    for block in loose:
        assert block.prev_free_block is None and block.next_free_block is None


SUPPRESS_free_queue = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


# --------------------------------------------------------------------------- compiled twin only
@pytest.fixture
def cy(impl):
    if impl.name != "cython":
        pytest.skip("reference ownership and memory safety of the compiled queue")
    return impl.kv_cache


def refcounts(blocks):
    return [sys.getrefcount(b) for b in blocks]


@settings(max_examples=80, deadline=None, suppress_health_check=SUPPRESS_free_queue)
@given(data=st.data())
def test_queue_matches_a_list_model(impl, data):
    """Random operations on two queues sharing a set of blocks behave like two lists."""
    m = impl.kv_cache
    # Duplicate and negative ids on purpose: the queue must go by identity.
    blocks = [m.KVCacheBlock(i % 7 - 3) for i in range(40)]
    queues = [m.FreeKVCacheBlockQueue(blocks[:20]), m.FreeKVCacheBlockQueue([])]
    models = [list(blocks[:20]), []]
    fake_ends = [e for q in queues for e in (q.fake_free_list_head, q.fake_free_list_tail)]

    def queued(block):
        return any(block is b for model in models for b in model)

    for _ in range(data.draw(st.integers(1, 60), label="steps")):
        k = data.draw(st.integers(0, 1), label="queue")
        q, model = queues[k], models[k]
        op = data.draw(st.sampled_from(["popleft", "popleft_n", "remove", "append", "append_n", "prepend_n"]))
        if op == "popleft":
            if model:
                assert q.popleft() is model.pop(0)
            else:
                with pytest.raises(ValueError, match="No free blocks available"):
                    q.popleft()
        elif op == "popleft_n":
            n = data.draw(st.integers(0, len(model) + 2), label="n")
            if n <= len(model):
                got = q.popleft_n(n)
                assert len(got) == n and all(a is b for a, b in zip(got, model[:n]))
                del model[:n]
            else:
                with pytest.raises(AssertionError, match="Cannot pop"):  # (vLLM asserts)
                    q.popleft_n(n)
        elif op == "remove":
            # A block of this queue, or one in no queue (removing another
            # queue's block is a caller bug the twins treat differently).
            candidates = model + [b for b in blocks if not queued(b)] + fake_ends
            block = data.draw(st.sampled_from(candidates), label="block")
            if any(block is b for b in model):
                q.remove(block)
                model[:] = [b for b in model if b is not block]
            else:
                with pytest.raises(RuntimeError, match="invalid block"):
                    q.remove(block)
        elif op == "append":
            block = data.draw(st.sampled_from(blocks + fake_ends), label="block")
            if queued(block) or any(block is e for e in fake_ends):
                with pytest.raises(RuntimeError, match="already in the free queue"):
                    q.append(block)
            else:
                q.append(block)
                model.append(block)
        else:
            batch = data.draw(st.lists(st.sampled_from(blocks + fake_ends), max_size=12), label="batch")
            expected = None
            for i, block in enumerate(batch):
                if any(block is e for e in fake_ends):
                    # (the pure twin calls an empty queue's own fake tail a repeat)
                    expected = "already in the free queue|appears twice in one batch"
                elif queued(block):
                    expected = "already in the free queue"
                elif any(block is b for b in batch[:i]):
                    expected = "appears twice in one batch"
                if expected:
                    break
            if expected:
                with pytest.raises(RuntimeError, match=expected):
                    getattr(q, op)(batch)
            else:
                getattr(q, op)(batch)
                model[:] = model + batch if op == "append_n" else batch + model
        for q_, model_ in zip(queues, models):
            assert_queue_is(q_, model_, loose=[b for b in blocks if not queued(b)])


def test_rotation_through_a_large_queue(impl):
    """Popping at the head and refilling the tail, round and round, keeps the order."""
    m = impl.kv_cache
    blocks = [m.KVCacheBlock(i) for i in range(1000)]
    q = m.FreeKVCacheBlockQueue(blocks)
    expected = list(blocks)
    for step in range(40):
        n = 97 + step  # not a divisor of the queue or array size
        got = q.popleft_n(n)
        assert got == expected[:n]
        q.append_n(got)
        expected = expected[n:] + got
    q.remove(expected[500])  # a hole in the middle, then pops across it
    del expected[500]
    for _ in range(12):
        got = q.popleft_n(90)
        assert got == expected[:90]
        q.append_n(got)
        expected = expected[90:] + got
    assert_queue_is(q, expected)


def test_holes_are_skipped_and_squeezed_out(impl):
    """Many removals from the middle, then batches that need the room the holes take."""
    m = impl.kv_cache
    blocks = [m.KVCacheBlock(i) for i in range(96)]
    q = m.FreeKVCacheBlockQueue(blocks[:32])
    expected = list(blocks[:32])
    for b in blocks[1:31]:
        if b.block_id % 4:
            q.remove(b)
            expected.remove(b)
    assert_queue_is(q, expected)
    q.append_n(blocks[32:64])  # more than the free room unless the holes go
    q.prepend_n(blocks[64:96])  # and at the other end
    expected = blocks[64:96] + expected + blocks[32:64]
    assert_queue_is(q, expected)
    for b in expected[::3]:
        q.remove(b)
    expected = [b for i, b in enumerate(expected) if i % 3]
    assert q.popleft_n(len(expected)) == expected
    assert_queue_is(q, [], loose=blocks)


def test_block_moves_between_queues(impl):
    m = impl.kv_cache
    a, b, c = (m.KVCacheBlock(i) for i in range(3))
    q1 = m.FreeKVCacheBlockQueue([a, b, c])
    q2 = m.FreeKVCacheBlockQueue([])
    with pytest.raises(RuntimeError, match="already in the free queue"):
        q2.append(b)  # still in q1
    with pytest.raises(RuntimeError, match="already in the free queue"):
        q2.prepend_n([c])
    q1.remove(b)
    q2.append(b)
    assert_queue_is(q1, [a, c])
    assert_queue_is(q2, [b])
    moved = q1.popleft_n(2)
    assert_queue_is(q1, [], loose=[a, c])
    q2.prepend_n(moved)
    assert_queue_is(q2, [a, c, b])
    q1.append_n(q2.popleft_n(3))  # and back
    assert_queue_is(q1, [a, c, b])
    assert_queue_is(q2, [])
    with pytest.raises(RuntimeError, match="already in the free queue"):
        q2.append(q1.fake_free_list_head)  # another live queue's fake end


def test_duplicate_and_negative_block_ids(impl):
    """Block ids are the caller's business: equal or negative ids are distinct blocks."""
    m = impl.kv_cache
    blocks = [m.KVCacheBlock(i) for i in (5, 5, -3, -1, 5, -1)]
    q = m.FreeKVCacheBlockQueue(blocks)
    assert ids(q.get_all_free_blocks()) == [5, 5, -3, -1, 5, -1]
    q.remove(blocks[1])
    q.remove(blocks[3])
    assert_queue_is(q, [blocks[0], blocks[2], blocks[4], blocks[5]], loose=[blocks[1], blocks[3]])
    q.prepend_n([blocks[3], blocks[1]])
    assert q.popleft() is blocks[3] and q.popleft() is blocks[1]
    with pytest.raises(RuntimeError, match="appears twice"):
        q.prepend_n([blocks[1], blocks[3], blocks[1]])
    assert_queue_is(q, [blocks[0], blocks[2], blocks[4], blocks[5]], loose=[blocks[1], blocks[3]])


def test_block_subclasses_are_blocks(impl):
    m = impl.kv_cache

    class Tagged(m.KVCacheBlock):
        pass

    blocks = [Tagged(0), m.KVCacheBlock(1), Tagged(2)]
    q = m.FreeKVCacheBlockQueue(blocks)
    assert q.popleft_n(3) == blocks
    q.prepend_n(blocks)
    assert_queue_is(q, blocks)
    pool = m.BlockPool(4, enable_caching=True, hash_block_size=4)
    got = pool.get_new_blocks(1)
    pool.free_blocks(got)
    assert pool.get_num_free_blocks() == 3


def test_teardown_releases_every_reference(cy):
    blocks = [cy.KVCacheBlock(i) for i in range(50)]
    before = refcounts(blocks)
    q = cy.FreeKVCacheBlockQueue(blocks[:40])
    q.append_n(blocks[40:])
    q.remove(blocks[10])  # a hole
    q.remove(blocks[0])  # and one at the head
    held = q.popleft_n(5)  # handed to the caller
    assert refcounts(blocks)[12:40] == [r + 1 for r in before[12:40]]
    head = q.fake_free_list_head
    del q
    assert head.next_free_block is None
    assert all(b.prev_free_block is None and b.next_free_block is None for b in blocks)
    assert refcounts(blocks)[1:6] == [r + 1 for r in before[1:6]]  # the caller's list's
    assert refcounts(blocks)[6:] == before[6:]
    del held
    assert refcounts(blocks) == before
    q2 = cy.FreeKVCacheBlockQueue(blocks)  # the blocks can be queued again
    assert q2.get_all_free_blocks() == blocks


def test_failed_batches_and_frees_keep_reference_counts(cy):
    pool = cy.BlockPool(8, enable_caching=True, hash_block_size=4)
    blocks = pool.get_new_blocks(3)
    before = refcounts(pool.blocks)
    with pytest.raises(TypeError):
        pool.free_blocks([blocks[0], blocks[1], "x"])
    with pytest.raises(RuntimeError):
        pool.free_blocks([blocks[2], blocks[2]])
    q = cy.FreeKVCacheBlockQueue([])
    loose = cy.KVCacheBlock(100)  # free, in no queue: taken, then given back
    with pytest.raises(RuntimeError, match="already in the free queue"):
        q.append_n([loose, pool.free_block_queue.get_all_free_blocks()[0]])
    with pytest.raises(RuntimeError, match="only free blocks are queued"):
        q.append_n([loose, blocks[0]])
    assert q.num_free_blocks == 0 and sys.getrefcount(loose) == 2
    assert refcounts(pool.blocks) == before
    assert [b.ref_cnt for b in blocks] == [1, 1, 1]


def test_objects_lying_about_their_class_are_refused(cy):
    class Impostor:
        __class__ = property(lambda self: cy.KVCacheBlock)

    fake = Impostor()
    assert isinstance(fake, cy.KVCacheBlock)  # isinstance believes it; the queue must not
    q = cy.FreeKVCacheBlockQueue([cy.KVCacheBlock(0)])
    with pytest.raises(TypeError, match="KVCacheBlock"):
        q.append_n([fake])
    pool = cy.BlockPool(4, enable_caching=True, hash_block_size=4)
    got = pool.get_new_blocks(1)
    with pytest.raises(TypeError, match="KVCacheBlock"):
        pool.free_blocks([got[0], fake])
    assert got[0].ref_cnt == 1 and pool.get_num_free_blocks() == 2
    assert ids(q.get_all_free_blocks()) == [0]


def test_bad_arguments_raise_instead_of_crashing(cy):
    q = cy.FreeKVCacheBlockQueue([cy.KVCacheBlock(0), cy.KVCacheBlock(1)])
    for call in (q.append, q.remove, q.append_n, q.prepend_n, cy.FreeKVCacheBlockQueue):
        with pytest.raises(TypeError):
            call(None)
    other = cy.FreeKVCacheBlockQueue([cy.KVCacheBlock(2)])
    with pytest.raises(RuntimeError, match="invalid block"):
        q.remove(other.get_all_free_blocks()[0])  # another queue's block
    assert len(other) == 1 and len(q) == 2
    q.num_free_blocks = 5  # public, as in vLLM; the array is what counts
    with pytest.raises(RuntimeError, match="holds 2 blocks"):
        q.popleft_n(4)
    q.num_free_blocks = 2
    assert ids(q.popleft_n(2)) == [0, 1]


def test_reinitialising_a_queued_block_keeps_it_queued(cy):
    blocks = [cy.KVCacheBlock(i) for i in range(3)]
    q = cy.FreeKVCacheBlockQueue(blocks)
    blocks[1].__init__(7)
    assert_queue_is(q, blocks)
    assert ids(q.popleft_n(3)) == [0, 7, 2]


def test_many_short_lived_queues(cy):
    blocks = [cy.KVCacheBlock(i) for i in range(8)]
    for _ in range(2000):
        q = cy.FreeKVCacheBlockQueue(blocks)
        assert q.popleft() is blocks[0]
        assert blocks[1].prev_free_block is q.fake_free_list_head
        del q
        assert all(b.prev_free_block is None for b in blocks)


BS = 4


# --------------------------------------------------------------------------- item 3
def test_a_queued_block_cannot_take_references(impl):
    """A free block whose public ref_cnt was raised used to be queued a second time when it
    was freed (the compiled twin then handed it out twice: [1, 1, 2, 3] from a 3-block pool).
    A queued block's count now stays 0: the assignment is refused, and nothing changes."""
    pool = impl.kv_cache.BlockPool(5, enable_caching=True, hash_block_size=BS)
    held = pool.get_new_blocks(1)[0]
    queue_before = ids(pool.free_block_queue.get_all_free_blocks())
    for block in (pool.blocks[2], pool.free_block_queue.fake_free_list_head):
        with pytest.raises(RuntimeError, match="is in a free queue"):
            block.ref_cnt = 1
        assert block.ref_cnt == 0
    held.ref_cnt = 2  # a held block's count may be moved
    held.ref_cnt = 1
    assert ids(pool.free_block_queue.get_all_free_blocks()) == queue_before
    pool.free_blocks([held])
    got = ids(pool.get_new_blocks(pool.get_num_free_blocks()))
    assert sorted(got) == [1, 2, 3, 4]  # each block once


def test_a_block_queued_in_another_pool_cannot_take_references(impl):
    pool_a = impl.kv_cache.BlockPool(4, enable_caching=True, hash_block_size=BS)
    pool_b = impl.kv_cache.BlockPool(4, enable_caching=True, hash_block_size=BS)
    stray = pool_b.blocks[2]  # free, in pool_b's queue
    with pytest.raises(RuntimeError, match="is in a free queue"):
        stray.ref_cnt = 1
    with pytest.raises(RuntimeError, match="already in the free queue"):
        pool_a.free_block_queue.append(stray)
    assert ids(pool_a.free_block_queue.get_all_free_blocks()) == [1, 2, 3]
    assert ids(pool_b.free_block_queue.get_all_free_blocks()) == [1, 2, 3]


@pytest.mark.parametrize("how", ["append", "append_n", "prepend_n"])
def test_only_free_blocks_are_queued(impl, how):
    """The other way in: a held block put in the queue by hand would be queued again when it
    is freed.  Refused, nothing changes."""
    pool = impl.kv_cache.BlockPool(5, enable_caching=True, hash_block_size=BS)
    a, b = pool.get_new_blocks(2)
    pool.free_blocks([a])  # a is free again, b is held
    a = pool.get_new_blocks(1)[0]
    a.ref_cnt = 0  # (held, its count dropped by hand: free to queue)
    queue = pool.free_block_queue
    before = (queue.num_free_blocks, ids(queue.get_all_free_blocks()))
    with pytest.raises(RuntimeError, match=f"block {b.block_id} has ref_cnt 1: only free blocks are queued"):
        if how == "append":
            queue.append(b)
        else:
            getattr(queue, how)([a, b])
    assert (queue.num_free_blocks, ids(queue.get_all_free_blocks())) == before
    pool.free_blocks([b])
    assert sorted(ids(pool.get_new_blocks(pool.get_num_free_blocks()))) == sorted(
        {1, 2, 3, 4} - {a.block_id})


def test_queue_remove_of_another_queues_block_is_refused(impl):
    m = impl.kv_cache
    q1 = m.FreeKVCacheBlockQueue([m.KVCacheBlock(i) for i in range(3)])
    other = [m.KVCacheBlock(i) for i in range(3)]
    q2 = m.FreeKVCacheBlockQueue(other)
    with pytest.raises(RuntimeError, match="remove\\(\\) called on an invalid block"):
        q1.remove(other[1])
    assert (q1.num_free_blocks, ids(q1.get_all_free_blocks())) == (3, [0, 1, 2])
    assert (q2.num_free_blocks, ids(q2.get_all_free_blocks())) == (3, [0, 1, 2])
    q2.remove(other[1])
    assert ids(q2.get_all_free_blocks()) == [0, 2]
