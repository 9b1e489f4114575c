"""vLLM 0.33.0 drop-in, hashing side (issue 14): incremental multimodal keys, hash lookahead,
prompt-embeds keys, and the hashing names vLLM's ``kv_cache_utils`` exports."""

from __future__ import annotations

import hashlib
import inspect
import logging

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
    for bad in (-1, True, 1.0, "2"):
        with pytest.raises(ValueError, match="num_hash_lookahead_tokens"):
            impl.hashing.RequestBlockHasher(4, "sha256", lambda: NONE_HASH, None, bad)
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
