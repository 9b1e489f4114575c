"""vLLM 0.33.0 drop-in, hashing side (issue 14): incremental multimodal keys, hash lookahead,
prompt-embeds keys, and the hashing names vLLM's ``kv_cache_utils`` exports."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import inspect
import logging
import weakref

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcy import hashing
from kvcy.kv_events import BlockRemoved, BlockStored, KVEventBatch
from kvcy.metrics import CacheHitSource, PrefixCacheStats
from kvcy.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange

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


def _same_as_unkept(impl, req, hasher, bs):
    """The kept hasher's next hashes are what a hasher with nothing kept computes."""
    want = impl.hashing.RequestBlockHasher(bs, hasher.algo, lambda: NONE_HASH, hasher.hash_fn)(req)
    got = hasher(req)
    assert got == want
    req.block_hashes.extend(got)


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


def test_manager_events_default_to_int_hashes(impl, monkeypatch):
    """vLLM reads VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES as on when it is unset."""
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    hashing.init_none_hash(hashing.sha256)
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    cfg = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    for env, want_int in ((None, True), ("0", False), ("1", True)):
        if env is None:
            monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
        else:
            monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", env)
        mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=4, hash_block_size=4,
                                           enable_kv_cache_events=True)
        req = impl.kv_cache.Request("r", list(range(8)),
                                    block_hasher=hashing.get_request_block_hasher(4, hashing.sha256))
        mgr.allocate_slots(req, 8)
        (ev,) = mgr.take_events()
        want = [int.from_bytes(h, "big") & (2**64 - 1) for h in req.block_hashes] if want_int else req.block_hashes
        assert ev.block_hashes == want


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


# --------------------------------------------------------------------------- events and stats
def test_block_stored_fields_and_encoding():
    """vLLM's field order, ``session_id``, per-block lookahead lists, and its wire form:
    the batch array-like, each event a map tagged by class name."""
    names = list(BlockStored.__struct_fields__)
    assert names[-2:] == ["session_id", "lookahead_token_ids"]
    ev = BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[1, 2], block_size=2,
                     lora_id=None, medium="GPU", lora_name=None, session_id="s1",
                     lookahead_token_ids=[[3, 4]])
    raw = msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=[ev, BlockRemoved(block_hashes=[1], medium="GPU")]))
    decoded = msgspec.msgpack.decode(raw)
    assert isinstance(decoded, list) and decoded[0] == 1.0
    assert decoded[1][0]["type"] == "BlockStored" and decoded[1][0]["session_id"] == "s1"
    assert decoded[1][0]["lookahead_token_ids"] == [[3, 4]]
    assert decoded[1][1] == {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}
    assert msgspec.msgpack.decode(raw, type=KVEventBatch).events[0] == ev
    assert len({ev, BlockStored(**{f: getattr(ev, f) for f in names})}) == 1


def test_prefix_cache_stats_hits_by_source(caplog):
    stats = PrefixCacheStats()
    stats.record(100, 48, False, hits_by_source={CacheHitSource.DEVICE: 32, CacheHitSource.HOST: 16})
    stats.record(10, 0, False, hits_by_source={CacheHitSource.DISK: 0})
    stats.record(50, 50, True, hits_by_source={CacheHitSource.DEVICE: 50})
    assert stats.hits_by_source == {CacheHitSource.DEVICE: 32, CacheHitSource.HOST: 16}
    assert (stats.requests, stats.queries, stats.hits, stats.preempted_hits) == (2, 110, 48, 50)
    with caplog.at_level(logging.WARNING):
        stats.record(20, 8, False, hits_by_source={CacheHitSource.P2P: 3})
    assert stats.hits_by_source[CacheHitSource.EXTERNAL_UNSPECIFIED] == 8
    assert CacheHitSource.P2P not in stats.hits_by_source
    assert "EXTERNAL_UNSPECIFIED" in caplog.text.upper()
    assert CacheHitSource.outermost([CacheHitSource.HOST, CacheHitSource.DEVICE]) is CacheHitSource.HOST
