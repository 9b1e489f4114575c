"""Block hashing: both twins byte-identical to vLLM 0.33.0's recipe and to the xxh3_raw spec.

The reference is computed here, independently of kvcy: ``pickle.dumps(obj,
protocol=5)`` / ``cbor2.dumps(obj, canonical=True)`` digested with hashlib's
SHA-256 / the xxhash package's XXH3-128, and for ``xxh3_raw`` the recipe of
docs/hashing.md written with ``struct``.
"""

from __future__ import annotations

import enum
import hashlib
import json
import pickle
import struct
import sys
from array import array

import cbor2
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcy import hashing
from kvcy.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange, Request

VLLM_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
ALGOS = (*VLLM_ALGOS, "xxh3_raw")
PICKLE_ALGOS = ("sha256", "xxhash")

TAGS = [sys.intern(t) for t in ("lora", "mm", "cache_salt", "prompt_embeds")]
EDGE_INTS = [
    0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, -1, -24, -25,
    -128, -129, -256, -257, -(2**31), -(2**31) - 1, -(2**32), 2**40, -(2**40), 2**63 - 1, -(2**63),
]
# Where LONG1 (pickle) and the CBOR head change length.
EDGE_INTS += [s * 2 ** (8 * k - 1) + d for k in range(4, 9) for s in (1, -1) for d in (-1, 0, 1)
              if -(2**63) <= s * 2 ** (8 * k - 1) + d < 2**63]
EDGE_INTS += [2**64 - 1 - 2**63, 2**16 - 1, 2**8 - 1]
BIG_INTS = [2**63, -(2**63) - 1, 2**64 - 1, 2**64, -(2**64), -(2**64) - 1, 10**30, -(10**30)]

SUPPRESS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=SUPPRESS)


# --------------------------------------------------------------------------- the reference
def ref_message(algo, parent, tokens, keys):
    if algo == "xxh3_raw":
        msg = parent + struct.pack(f"<{len(tokens)}q", *tokens)
        return msg if keys is None else msg + cbor2.dumps(keys, canonical=True)
    obj = (parent, tuple(tokens), keys)
    if algo in PICKLE_ALGOS:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return cbor2.dumps(obj, canonical=True)


def ref_digest(algo, msg):
    if algo.startswith("sha256"):
        return hashlib.sha256(msg).digest()
    return xxhash.xxh3_128_digest(msg)


def ref_chain(algo, parent, tokens, start, num_blocks, block_size, extra_keys=None):
    out = []
    for i in range(num_blocks):
        lo = start + i * block_size
        keys = None if extra_keys is None else extra_keys[i]
        parent = ref_digest(algo, ref_message(algo, parent, tokens[lo : lo + block_size], keys))
        out.append(parent)
    return out


def outcome(fn, *args):
    """("ok", value) or ("err", exception type): what a call does."""
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - compared, not swallowed
        return "err", type(exc)


# --------------------------------------------------------------------------- golden vectors
def _golden_cases(golden_dir):
    with open(golden_dir / "hashes.jsonl") as f:
        return [json.loads(line) for line in f]


def _to_tuples(keys):
    if keys is None:
        return None
    # The tag is the interned constant; JSON gives every other string its own object.
    return tuple((sys.intern(k[0]), *k[1:]) for k in keys)


def _golden_request(case, hasher):
    lora = case["lora"]
    mm = [
        MultiModalFeatureSpec(
            identifier=m["identifier"], mm_position=PlaceholderRange(offset=m["offset"], length=m["length"])
        )
        for m in case["mm"]
    ]
    req = Request(
        "golden",
        case["token_ids"],
        16,
        lora_request=LoRARequest(lora["name"], 1, lora["path"]) if lora else None,
        mm_features=mm or None,
        cache_salt=case["cache_salt"],
        block_hasher=hasher,
    )
    for a in case["appends"]:
        req.append_output_token_ids(list(a))
    return req


def test_golden_hashes(impl, golden_dir):
    """All of hashes.jsonl: NONE_HASH, the request hasher, the extra keys, one-call chains."""
    cases = _golden_cases(golden_dir)
    assert cases
    twin = impl.hashing
    for case in cases:
        algo, bs = case["algo"], case["block_size"]
        none_hash = bytes.fromhex(case["none_hash"])
        assert twin.digest(algo, case["none_hash_seed"]) == none_hash, case["name"]
        req = _golden_request(case, twin.RequestBlockHasher(bs, algo, lambda nh=none_hash: nh))
        assert [h.hex() for h in req.block_hashes] == case["block_hashes"], case["name"]

        n = len(case["block_hashes"])
        keys = [twin.generate_block_hash_extra_keys(req, i * bs, (i + 1) * bs, 0)[0] for i in range(n)]
        as_lists = [None if k is None else [list(t) for t in k] for k in keys]
        assert as_lists == case["extra_keys"], case["name"]

        tokens = list(case["token_ids"]) + [t for a in case["appends"] for t in a]
        extras = [_to_tuples(k) for k in case["extra_keys"]]
        got = twin.hash_blocks(algo, none_hash, tokens, 0, n, bs, extras)
        assert [h.hex() for h in got] == case["block_hashes"], case["name"]


def test_golden_through_public_api(golden_dir, monkeypatch):
    """kvcy.hashing (the selected twin) from init_none_hash to Request.block_hashes."""
    for case in _golden_cases(golden_dir)[::7]:
        monkeypatch.setenv("PYTHONHASHSEED", case["none_hash_seed"])
        fn = hashing.get_hash_fn_by_name(case["algo"])
        assert hashing.init_none_hash(fn).hex() == case["none_hash"]
        req = _golden_request(case, hashing.get_request_block_hasher(case["block_size"], fn))
        assert [h.hex() for h in req.block_hashes] == case["block_hashes"], case["name"]


def test_golden_pickle_memo_case_exists(golden_dir):
    """The vectors do exercise the pickle memo rule (a block with two "mm" tags)."""
    cases = _golden_cases(golden_dir)
    assert any(
        c["algo"] in PICKLE_ALGOS and any(k and sum(t[0] == "mm" for t in k) >= 2 for k in c["extra_keys"])
        for c in cases
    )


# --------------------------------------------------------------------------- strategies
int64s = st.integers(-(2**63), 2**63 - 1)
any_ints = st.one_of(int64s, st.sampled_from(EDGE_INTS + BIG_INTS), st.integers(0, 300), st.integers())


@st.composite
def extra_keys_st(draw, int_values=any_ints, odd=True):
    """None, or a tuple of tagged keys; strings are drawn from a pool so that the
    same object can occur twice in one block (a pickle memo reference)."""
    if draw(st.integers(0, 3)) == 0:
        return None
    texts = st.text(max_size=8) | st.text(min_size=250, max_size=300) | st.sampled_from(["", "a", "é", "mm"])
    pool = draw(st.lists(texts | st.binary(max_size=300), min_size=1, max_size=6))
    pool = [x[:1] + x[1:] for x in pool]  # fresh objects where CPython makes them
    item = st.one_of(st.sampled_from(range(len(pool))).map(pool.__getitem__), int_values, st.binary(max_size=20))
    if odd:
        item = item | st.sampled_from([None, True, False, 1.5, ()])
    tag = st.sampled_from(TAGS) | st.sampled_from(range(len(pool))).map(pool.__getitem__)
    keys = draw(st.lists(st.tuples(tag, st.lists(item, max_size=4)).map(lambda t: (t[0], *t[1])), max_size=5))
    if keys and draw(st.booleans()):
        keys.append(keys[0])  # the same key object twice
    return tuple(keys)


parents = st.binary(min_size=0, max_size=300) | st.binary(min_size=16, max_size=16) | st.binary(min_size=32, max_size=32)


# --------------------------------------------------------------------------- differential
@pytest.mark.parametrize("algo", VLLM_ALGOS)
@SETTINGS
@given(data=st.data())
def test_block_bytes_match_reference(impl, algo, data):
    parent = data.draw(parents | st.sampled_from([None, "text-parent"]), "parent")
    tokens = data.draw(st.lists(any_ints, max_size=40), "tokens")
    keys = data.draw(extra_keys_st(), "keys")
    want = outcome(ref_message, algo, parent, tokens, keys)
    assert outcome(impl.hashing.block_message, algo, parent, tokens, keys) == want
    obj = (parent, tuple(tokens), keys)
    want_digest = want if want[0] == "err" else ("ok", ref_digest(algo, want[1]))
    assert outcome(impl.hashing.digest, algo, obj) == want_digest


@pytest.mark.parametrize("algo", ALGOS)
@settings(max_examples=60, deadline=None, suppress_health_check=SUPPRESS)
@given(data=st.data())
def test_chain_matches_reference(impl, algo, data):
    raw = algo == "xxh3_raw"
    bs = data.draw(st.integers(1, 40), "block_size")
    num_blocks = data.draw(st.integers(0, 4), "num_blocks")
    start = data.draw(st.integers(0, 3 * bs), "start")
    tail = data.draw(st.integers(0, bs), "tail")
    n = start + num_blocks * bs + tail
    tokens = data.draw(st.lists(int64s if raw else any_ints, min_size=n, max_size=n), "tokens")
    parent = data.draw(parents, "parent")
    extras = None
    if data.draw(st.booleans()):
        extras = [data.draw(extra_keys_st(int64s, odd=not raw), "keys") for _ in range(num_blocks)]
    want = ref_chain(algo, parent, tokens, start, num_blocks, bs, extras)
    assert impl.hashing.hash_blocks(algo, parent, tokens, start, num_blocks, bs, extras) == want
    assert impl.hashing.hash_blocks(algo, parent, tuple(tokens), start, num_blocks, bs, extras) == want
    if raw or all(-(2**63) <= t < 2**63 for t in tokens):
        arr = array("q", tokens)
        assert impl.hashing.hash_blocks(algo, parent, arr, start, num_blocks, bs, extras) == want


@SETTINGS
@given(parent=st.binary(max_size=40), tokens=st.lists(int64s, max_size=40), keys=extra_keys_st(int64s, odd=False))
def test_xxh3_raw_matches_spec_recipe(impl, parent, tokens, keys):
    want = ref_message("xxh3_raw", parent, tokens, keys)
    assert impl.hashing.block_message("xxh3_raw", parent, tokens, keys) == want
    assert impl.hashing.digest("xxh3_raw", (parent, tuple(tokens), keys)) == xxhash.xxh3_128_digest(want)
    assert impl.hashing.digest("xxh3_raw", (parent, list(tokens), keys)) == xxhash.xxh3_128_digest(want)


def test_edge_ints_every_algo(impl):
    parent = bytes(range(16))
    for algo in VLLM_ALGOS:
        for t in EDGE_INTS + BIG_INTS:
            for tokens in ([t], [t, 7], [t, 1, 2, 3], [t] * 5):
                assert impl.hashing.block_message(algo, parent, tokens) == ref_message(algo, parent, tokens, None)
    for tokens in ([], [0], EDGE_INTS):
        assert impl.hashing.block_message("xxh3_raw", parent, tokens) == ref_message("xxh3_raw", parent, tokens, None)


def test_small_objects(impl):
    """digest() of any object, including pickles too short for a FRAME (< 4 bytes)."""
    objs = [None, True, False, 0, 5, 300, -1, 2**40, 2**70, "", "x", "vllm-none-hash", b"", b"ab", (), (1,),
            ("a", "a"), ((),), 1.5, [1, 2], {"a": 1}]
    for algo in VLLM_ALGOS:
        for obj in objs:
            want = outcome(lambda: ref_digest(algo, pickle.dumps(obj, protocol=5) if algo in PICKLE_ALGOS
                                               else cbor2.dumps(obj, canonical=True)))
            assert outcome(impl.hashing.digest, algo, obj) == want, (algo, obj)


def test_block_shaped_objects(impl):
    """digest() of (parent, tokens, extra) triples whose parts share objects."""
    t = (1, 2, 3, 4, 5)
    objs = [((t,), t, None), (b"x", t, (t,)), (b"x", t, ((t, "a"),)), ("s", t, None), (t, t, None),
            (b"x" * 300, t, None), (b"x", (1,), None), (b"x", (2**70, 1), None), (b"x", (True, 1), None),
            (b"x", (), None), (None, t, None), (b"x", t, [1])]
    for algo in VLLM_ALGOS:
        for obj in objs:
            msg = pickle.dumps(obj, protocol=5) if algo in PICKLE_ALGOS else cbor2.dumps(obj, canonical=True)
            assert impl.hashing.digest(algo, obj) == ref_digest(algo, msg), (algo, obj)


def test_memo_rule_repeated_tag(impl):
    """Two "mm" keys in one block: the second tag is a memo reference (BINGET)."""
    mm = sys.intern("mm")
    keys = ((mm, "img-a", 0), (mm, "img-b", -3))
    msg = impl.hashing.block_message("sha256", b"p" * 32, [1, 2], keys)
    assert msg == pickle.dumps((b"p" * 32, (1, 2), keys), protocol=5)
    assert msg.count(b"\x8c\x02mm") == 1 and b"h" in msg
    # Equal strings that are different objects are written twice.
    other = ("m" + "m"[:1], "img-b", -3)
    assert other[0] is not mm
    msg2 = impl.hashing.block_message("sha256", b"p" * 32, [1, 2], ((mm, "img-a", 0), other))
    assert msg2 == pickle.dumps((b"p" * 32, (1, 2), ((mm, "img-a", 0), other)), protocol=5)
    assert msg2.count(b"\x8c\x02mm") == 2


@pytest.mark.parametrize("algo", VLLM_ALGOS)
def test_large_blocks_fall_back_correctly(impl, algo):
    """Pickles past the 64 KiB frame size, strings past 255 bytes, memos past 256 entries."""
    parent = b"q" * 32
    tokens = [2**40 + i for i in range(12000)]  # ~96 KB of LONG1: several pickle frames
    assert impl.hashing.block_message(algo, parent, tokens) == ref_message(algo, parent, tokens, None)
    keys = (("mm", "x" * 70000, 1),)
    assert impl.hashing.block_message(algo, parent, [1], keys) == ref_message(algo, parent, [1], keys)
    many = tuple(("mm", f"id-{i}", i) for i in range(300))
    assert impl.hashing.block_message(algo, parent, [1], many) == ref_message(algo, parent, [1], many)
    got = impl.hashing.hash_blocks(algo, parent, tokens, 0, 2, 6000)
    assert got == ref_chain(algo, parent, tokens, 0, 2, 6000)


# --------------------------------------------------------------------------- bad input
class _Color(enum.IntEnum):
    RED = 3


class _Index:
    def __index__(self):
        return 5


WEIRD_TOKENS = [1.5, "7", None, b"x", [1], (2,), True, False, _Color.RED, _Index(), object(), 2**100, lambda: 0]


@pytest.mark.parametrize("algo", VLLM_ALGOS)
def test_bad_tokens_like_reference(impl, algo):
    """Whatever the reference does with a non-int token (hash it, or raise), the twin does too."""
    parent = b"z" * 16
    for bad in WEIRD_TOKENS:
        tokens = [1, bad, 3]
        want = outcome(lambda: ref_chain(algo, parent, tokens, 0, 1, 3))
        assert outcome(impl.hashing.hash_blocks, algo, parent, tokens, 0, 1, 3) == want, bad
        want = outcome(lambda: ref_digest(algo, ref_message(algo, parent, tokens, None)))
        assert outcome(impl.hashing.digest, algo, (parent, tuple(tokens), None)) == want, bad


@pytest.mark.parametrize("algo", VLLM_ALGOS)
def test_bad_extra_keys_like_reference(impl, algo):
    parent = b"z" * 16
    for keys in (["lora", "a"], {"a": 1}, {1, 2}, (("mm", 1.5, 2),), (("mm", ["x"], 2),), 5, "salt",
                 (("s", "\ud800"),), (("mm", object()),), (("mm", lambda: 0),)):
        want = outcome(lambda: ref_chain(algo, parent, [1, 2], 0, 1, 2, [keys]))
        assert outcome(impl.hashing.hash_blocks, algo, parent, [1, 2], 0, 1, 2, [keys]) == want, keys


def test_xxh3_raw_rejects_bad_input(impl):
    h = impl.hashing
    p = b"p" * 16
    for bad in (1.5, "7", None, b"x", [1]):
        with pytest.raises(TypeError):
            h.hash_blocks("xxh3_raw", p, [1, bad], 0, 1, 2)
    for big in (2**63, -(2**63) - 1, 10**30):
        with pytest.raises(ValueError, match="signed 64-bit"):
            h.hash_blocks("xxh3_raw", p, [1, big], 0, 1, 2)
    # operator.index semantics: bool and __index__ objects are their int value.
    assert h.hash_blocks("xxh3_raw", p, [True, _Index()], 0, 1, 2) == h.hash_blocks("xxh3_raw", p, [1, 5], 0, 1, 2)
    with pytest.raises(TypeError, match="parent must be bytes"):
        h.hash_blocks("xxh3_raw", "p", [1], 0, 1, 1)
    with pytest.raises(TypeError, match="extra_keys"):
        h.hash_blocks("xxh3_raw", p, [1], 0, 1, 1, [{"a": 1}])
    with pytest.raises(TypeError):
        h.digest("xxh3_raw", 5)
    with pytest.raises(TypeError):
        h.digest("xxh3_raw", (p, [1]))
    with pytest.raises(UnicodeEncodeError):
        h.digest("xxh3_raw", "\ud800")


def test_argument_errors_match_between_twins(impl):
    from kvcy._fast import load

    py = load("python")["hashing"]
    calls = [
        ("nope", b"", [1], 0, 1, 1, None),
        ("sha256", b"", [1], 0, 1, 0, None),
        ("sha256", b"", [1], 0, 2, 1, None),
        ("sha256", b"", [1], -1, 1, 1, None),
        ("sha256", b"", [1], 0, -1, 1, None),
        ("sha256", b"", [1, 2], 0, 2, 1, [None]),
        ("sha256", b"", [1], 0, 2**62, 2**62, None),
        (None, b"", [1], 0, 1, 1, None),
    ]
    for args in calls:
        with pytest.raises(ValueError) as want:
            py.hash_blocks(*args)
        with pytest.raises(ValueError) as got:
            impl.hashing.hash_blocks(*args)
        assert str(got.value) == str(want.value)
    assert impl.hashing.hash_blocks("sha256", b"", [1, 2], 2, 0, 1) == []


def test_list_shrinking_during_fallback_does_not_crash(impl):
    """A token whose pickling empties the list: an error or a result, never a crash."""
    tokens: list = []

    class Evil:
        def __reduce__(self):
            tokens.clear()
            return (int, (1,))

    tokens.extend([Evil()] + list(range(63)))
    try:
        impl.hashing.hash_blocks("sha256", b"x" * 32, tokens, 0, 4, 16)
    except (RuntimeError, ValueError):
        pass


def test_buffer_inputs(impl):
    np = pytest.importorskip("numpy")
    tokens = list(range(-50, 1000, 7))
    bs = 8
    nb = len(tokens) // bs
    for algo in ALGOS:
        want = impl.hashing.hash_blocks(algo, b"p" * 16, tokens, 0, nb, bs)
        assert impl.hashing.hash_blocks(algo, b"p" * 16, array("q", tokens), 0, nb, bs) == want
        assert impl.hashing.hash_blocks(algo, b"p" * 16, memoryview(array("q", tokens)), 0, nb, bs) == want
        assert impl.hashing.hash_blocks(algo, b"p" * 16, array("i", tokens), 0, nb, bs) == want
    # xxh3_raw is defined on values: any int array gives the same hashes.
    want = impl.hashing.hash_blocks("xxh3_raw", b"p" * 16, tokens, 0, nb, bs)
    for dtype in ("int64", "int32", "uint32"):
        arr = np.array([t % 2**32 if dtype == "uint32" else t for t in tokens], dtype=dtype)
        if dtype == "uint32":
            continue
        assert impl.hashing.hash_blocks("xxh3_raw", b"p" * 16, arr, 0, nb, bs) == want
    assert impl.hashing.hash_blocks("xxh3_raw", b"p" * 16, np.array(tokens)[::1], 3, nb - 1, bs) == ref_chain(
        "xxh3_raw", b"p" * 16, tokens, 3, nb - 1, bs
    )
    # For vLLM's algorithms a numpy array hashes its numpy scalars, like the reference.
    arr = np.array(tokens[:bs], dtype="int64")
    want = outcome(lambda: ref_chain("sha256", b"p" * 16, arr, 0, 1, bs))
    assert outcome(impl.hashing.hash_blocks, "sha256", b"p" * 16, arr, 0, 1, bs) == want


# --------------------------------------------------------------------------- the request hasher
@st.composite
def requests_st(draw):
    prompt = draw(st.lists(st.integers(0, 2**31 - 1), max_size=120))
    mm = []
    pos = 0
    ids = ["img", "img-2", "a", "", "x" * 300]
    while prompt and draw(st.booleans()) and pos < len(prompt):
        off = draw(st.integers(pos, len(prompt) - 1))
        length = draw(st.integers(1, len(prompt) - off))
        ident = draw(st.sampled_from(ids))
        mm.append(MultiModalFeatureSpec(identifier=ident[:1] + ident[1:], mm_position=PlaceholderRange(off, length)))
        pos = off + draw(st.integers(0, length))
    lora = draw(st.none() | st.builds(LoRARequest, st.sampled_from(["ad", "", "é"]), st.just(1), st.sampled_from(["/p", ""])))
    salt = draw(st.sampled_from([None, "", "salt", "s"]))
    appends = draw(st.lists(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=20), max_size=4))
    return prompt, mm, lora, salt, appends


@pytest.mark.parametrize("algo", ALGOS)
@settings(max_examples=60, deadline=None, suppress_health_check=SUPPRESS)
@given(spec=requests_st(), bs=st.integers(1, 20))
def test_request_hasher_twins_agree(impl, algo, spec, bs):
    from kvcy._fast import load

    py = load("python")["hashing"]
    prompt, mm, lora, salt, appends = spec
    none_hash = hashlib.sha256(b"none").digest()[: 32 if algo.startswith("sha") else 16]
    reqs = []
    for twin in (impl.hashing, py):
        req = Request("r", prompt, lora_request=lora, mm_features=mm or None, cache_salt=salt,
                      block_hasher=twin.RequestBlockHasher(bs, algo, lambda: none_hash))
        for a in appends:
            req.append_output_token_ids(a)
        reqs.append(req)
    got, want = reqs[0].block_hashes, reqs[1].block_hashes
    assert got == want
    tokens = reqs[1].all_token_ids
    assert len(got) == len(tokens) // bs
    # The keys as vLLM computes them for the whole token list at once: one walk
    # over the mm items from the first block on (appending must not change them).
    keys: list = []
    mm_idx = 0
    for i in range(len(tokens) // bs):
        k, mm_idx = py.generate_block_hash_extra_keys(reqs[1], i * bs, (i + 1) * bs, mm_idx)
        keys.append(k)
    assert got == ref_chain(algo, none_hash, tokens, 0, len(got), bs, keys)


def test_request_hasher_unusual_mm_positions(impl):
    """Offsets that are not plain ints (a float, a huge int) take the block-by-block path."""
    from types import SimpleNamespace

    from kvcy._fast import load

    py = load("python")["hashing"]
    for off, length in ((2.0, 5), (3, 4.0), (2**70, 1), (1, True)):
        mm = [SimpleNamespace(identifier="img", mm_position=SimpleNamespace(offset=off, length=length))]
        req = SimpleNamespace(block_hashes=[], num_tokens=12, all_token_ids=list(range(12)), num_prompt_tokens=12,
                              lora_request=None, mm_features=mm, cache_salt=None, prompt_embeds=None)
        for algo in ("sha256", "xxh3_raw"):
            want = outcome(py.RequestBlockHasher(4, algo, lambda: b"n" * 16), req)
            assert outcome(impl.hashing.RequestBlockHasher(4, algo, lambda: b"n" * 16), req) == want


def test_request_hasher_generic_function(impl):
    """An unregistered hash function runs the same chain, once per block."""
    calls = []

    def my_hash(obj):
        calls.append(obj)
        return hashlib.md5(repr(obj).encode()).digest()

    hasher = impl.hashing.RequestBlockHasher(4, None, lambda: b"NONE", my_hash)
    req = Request("r", list(range(10)), lora_request=LoRARequest("l", 1, "/l"), block_hasher=hasher)
    assert len(req.block_hashes) == 2
    assert calls[0] == (b"NONE", (0, 1, 2, 3), (("lora", "l", "/l"),))
    assert calls[1][0] == req.block_hashes[0]
    req.append_output_token_ids([10, 11])
    assert len(req.block_hashes) == 3 and len(calls) == 3
    assert hasher.block_size == 4 and hasher.algo is None


def test_request_hasher_arguments(impl):
    for bad in (0, -1, True, 2.0, "4"):
        with pytest.raises(ValueError):
            impl.hashing.RequestBlockHasher(bad, "sha256", lambda: b"")
    with pytest.raises(ValueError):
        impl.hashing.RequestBlockHasher(4, "md5", lambda: b"")
    with pytest.raises(ValueError):
        impl.hashing.RequestBlockHasher(4, None, lambda: b"")
    h = impl.hashing.RequestBlockHasher(4, "xxh3_raw", lambda: b"")
    assert (h.block_size, h.algo) == (4, "xxh3_raw")


def test_prompt_embeds_keys(impl):
    torch = pytest.importorskip("torch")
    from kvcy._fast import load

    py = load("python")["hashing"]
    embeds = torch.arange(10 * 3, dtype=torch.float32).reshape(10, 3)
    none_hash = b"n" * 32
    hashes = []
    for twin in (impl.hashing, py):
        req = Request("r", list(range(10)), prompt_embeds=embeds, cache_salt="s",
                      block_hasher=twin.RequestBlockHasher(4, "sha256", lambda: none_hash))
        req.append_output_token_ids([1, 2, 3, 4])
        hashes.append(req.block_hashes)
        keys, _ = twin.generate_block_hash_extra_keys(req, 4, 8, 0)
        assert keys == (("prompt_embeds", hashlib.sha256(embeds[4:8].numpy().tobytes()).digest()),)
        keys, _ = twin.generate_block_hash_extra_keys(req, 8, 12, 0)
        assert keys == (("prompt_embeds", hashlib.sha256(embeds[8:10].numpy().tobytes()).digest()),)
        # Past the prompt vLLM hashes the empty slice (it does not clamp).
        keys, _ = twin.generate_block_hash_extra_keys(req, 12, 16, 0)
        assert keys == (("prompt_embeds", hashlib.sha256(b"").digest()),)
    assert hashes[0] == hashes[1] and len(hashes[0]) == 3


# --------------------------------------------------------------------------- public API
def test_public_hash_functions():
    obj = (b"p" * 32, (1, 2, 3), (("lora", "a", "b"),))
    for name in VLLM_ALGOS:
        fn = hashing.get_hash_fn_by_name(name)
        assert fn(obj) == ref_digest(name, ref_message(name, *obj))
        assert hashing.hash_fn_name(fn) == name
    assert hashing.sha256_cbor_64bit(obj) == hashing.sha256_cbor(obj)[-8:]
    assert hashing.get_hash_fn_by_name("xxh3_raw")(obj) == xxhash.xxh3_128_digest(ref_message("xxh3_raw", *obj))
    assert hashing.xxh3_raw("seed") == xxhash.xxh3_128_digest(b"seed")
    assert hashing.builtin(obj) == hash(obj).to_bytes(8, "big", signed=True)
    with pytest.raises(ValueError):
        hashing.get_hash_fn_by_name("md5")


def test_none_hash_seeds(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "42")
    assert hashing.init_none_hash(hashing.xxh3_raw) == xxhash.xxh3_128_digest(b"42")
    monkeypatch.delenv("PYTHONHASHSEED")
    assert hashing.init_none_hash(hashing.sha256) == hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=5)).digest()
    a = hashing.init_none_hash(hashing.xxh3_raw)
    assert len(a) == 16 and hashing.init_none_hash(hashing.xxh3_raw) != a  # random seed
    hashing.init_none_hash(hashing.sha256)


def test_hash_block_tokens_and_request_hasher():
    hashing.init_none_hash(hashing.sha256)
    nh = hashing.get_none_hash()
    h0 = hashing.hash_block_tokens(hashing.sha256, None, [1, 2, 3, 4])
    assert h0 == ref_digest("sha256", ref_message("sha256", nh, [1, 2, 3, 4], None))
    hasher = hashing.get_request_block_hasher(4, hashing.sha256)
    assert (hasher.block_size, hasher.algo) == (4, "sha256")
    req = Request("r", [1, 2, 3, 4, 5], block_hasher=hasher)
    assert req.block_hashes == [h0]
    generic = hashing.get_request_block_hasher(4, hashing.sha256_cbor_64bit)
    assert generic.algo is None
    req = Request("r", [1, 2, 3, 4], block_hasher=generic)
    assert req.block_hashes == [hashing.sha256_cbor_64bit((nh, (1, 2, 3, 4), None))]
    with pytest.raises(ValueError):
        hashing.get_request_block_hasher(0, hashing.sha256)


def test_xxh3_raw_documented_vector(impl):
    """The worked example of docs/hashing.md."""
    h = impl.hashing
    none_hash = h.digest("xxh3_raw", "kvcy")
    assert none_hash.hex() == XXH3_RAW_VECTOR["none_hash"]
    b0, b1 = h.hash_blocks(
        "xxh3_raw", none_hash, [1, 2, 3, 4, 5, -1, 2**40, 150000], 0, 2, 4,
        [None, ((sys.intern("lora"), "my-adapter", "/adapters/a"), (sys.intern("mm"), "img-0", -2))],
    )
    assert b0.hex() == XXH3_RAW_VECTOR["block0"]
    assert b1.hex() == XXH3_RAW_VECTOR["block1"]


XXH3_RAW_VECTOR = {
    "none_hash": "efd309b20e29696ef912689093a45ad7",
    "block0": "ef3d5ba0d3e5a55e7a1d6e5baa3ccb15",
    "block1": "45dbbdfabb8723b855e0874c6e016276",
}
