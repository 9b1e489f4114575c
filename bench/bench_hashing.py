"""Block hashing: the compiled twin vs the pure-Python twin (the reference recipe).

Run: ``python -m pytest bench/bench_hashing.py --benchmark-only``.

One group per (what, algorithm, block size) with a ``cython`` and a ``python``
row.  What is timed, for a 32,768-token prompt (random ids below 150,000):

* ``request hasher``: ``RequestBlockHasher`` on a fresh request (what
  ``kvcy.Request`` runs at creation).  The Python row is vLLM 0.33.0's
  ``request_block_hasher`` recipe: per block ``generate_block_hash_extra_keys``,
  a slice, ``tuple()``, then ``hash_fn((parent, tokens, extra_keys))``.
* ``request hasher + extra keys``: the same with a LoRA adapter, a cache salt
  and a 64-token image every 1,024 tokens.
* ``request hasher, block by block + extra keys``: the same extra keys, but
  the hasher is called once per completed block, as when a request's tokens
  arrive one step at a time (each call resumes the walk over the images).
* ``request hasher, decode + extra keys``: after that prompt, 4,096 output
  tokens hashed one completed block per call (every image is behind).
* ``chain``: ``hash_blocks`` over the prompt with no extra keys; the Python row
  is the bare ``tuple()`` + ``pickle.dumps`` / ``cbor2.dumps`` + digest loop.
* ``one block``: ``digest(algo, (parent, tuple16, None))``, one 16-token block
  per call (``hash_block_tokens``'s cost; per-call overhead dominates).
* ``xxh3_raw from an int64 array``: ``hash_blocks`` on ``array('q')``.

At the end of the module a summary prints, per group, ns per block, tokens per
second and the python/cython time ratio (means of one run).  ``extra_info``
(``--benchmark-json``) carries ns/block and tokens/s for every row.
"""

from __future__ import annotations

import os
import random
from array import array

import pytest

from kvcy.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange

ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "xxh3_raw"]
PROMPT_TOKENS = 32_768

_rng = random.Random(0)
TOKENS = [_rng.randrange(0, 150_000) for _ in range(PROMPT_TOKENS)]
PARENT = {16: os.urandom(16), 32: os.urandom(32)}
RESULTS: dict[str, dict[str, tuple[float, int, int]]] = {}  # group -> impl -> (mean s, blocks, tokens)


def _digest_size(algo: str) -> int:
    return 32 if algo.startswith("sha256") else 16


class _Request:
    """The fields the hasher reads from a request (a plain object, as vLLM's ``Request``:
    the compiled hasher keeps a request's parsed multimodal positions while it lives)."""

    def __init__(self, **fields) -> None:
        self.__dict__.update(fields)


def _request(extra: bool) -> _Request:
    """What the hasher reads from a kvcy.Request, fresh (no hashes yet)."""
    mm = None
    if extra:
        mm = [
            MultiModalFeatureSpec(identifier=f"image-{i}", mm_position=PlaceholderRange(offset=i * 1024 + 100, length=64))
            for i in range(PROMPT_TOKENS // 1024)
        ]
    return _Request(
        block_hashes=[],
        num_tokens=PROMPT_TOKENS,
        all_token_ids=TOKENS,
        num_prompt_tokens=PROMPT_TOKENS,
        lora_request=LoRARequest("adapter", 1, "/adapters/adapter") if extra else None,
        mm_features=mm,
        cache_salt="tenant-7" if extra else None,
        prompt_embeds=None,
    )


def _run(benchmark, impl, group: str, fn, blocks: int, tokens: int) -> None:
    benchmark.group = group
    fn()  # warm up
    benchmark(fn)
    if benchmark.stats is None:  # --benchmark-disable: ran once, nothing timed
        return
    mean = benchmark.stats.stats.mean
    benchmark.extra_info["ns_per_block"] = round(mean / blocks * 1e9, 1)
    benchmark.extra_info["tokens_per_s"] = round(tokens / mean)
    RESULTS.setdefault(group, {})[impl.name] = (mean, blocks, tokens)


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("algo", ALGOS)
def test_request_hasher(benchmark, impl, algo, block_size):
    none_hash = PARENT[_digest_size(algo)]
    hasher = impl.hashing.RequestBlockHasher(block_size, algo, lambda: none_hash)
    req = _request(extra=False)
    blocks = PROMPT_TOKENS // block_size
    assert len(hasher(req)) == blocks
    _run(benchmark, impl, f"request hasher {algo}, bs{block_size}", lambda: hasher(req), blocks, blocks * block_size)


@pytest.mark.parametrize("algo", ["sha256", "xxh3_raw"])
def test_request_hasher_lookahead(benchmark, impl, algo):
    """Hash lookahead (num_hash_lookahead_tokens=4): each block's hash also covers the 4 tokens after it."""
    none_hash = PARENT[_digest_size(algo)]
    hasher = impl.hashing.RequestBlockHasher(16, algo, lambda: none_hash, num_hash_lookahead_tokens=4)
    plain = impl.hashing.RequestBlockHasher(16, algo, lambda: none_hash)
    req = _request(extra=False)
    blocks = (PROMPT_TOKENS - 4) // 16
    hashes = hasher(req)
    assert len(hashes) == blocks and hashes[0] != plain(req)[0]  # the lookahead tokens are in the hash
    _run(benchmark, impl, f"request hasher {algo}, bs16, lookahead 4", lambda: hasher(req), blocks, blocks * 16)


@pytest.mark.parametrize("algo", ["sha256", "xxh3_raw"])
def test_request_hasher_block_by_block(benchmark, impl, algo):
    none_hash = PARENT[_digest_size(algo)]
    hasher = impl.hashing.RequestBlockHasher(16, algo, lambda: none_hash)
    req = _request(extra=True)
    blocks = PROMPT_TOKENS // 16

    def run():
        req.block_hashes = hashes = []
        for n in range(16, PROMPT_TOKENS + 1, 16):
            req.num_tokens = n
            hashes.extend(hasher(req))
        return hashes

    assert run() == hasher(_request(extra=True))
    _run(benchmark, impl, f"request hasher, block by block + extra keys {algo}, bs16", run, blocks, PROMPT_TOKENS)


@pytest.mark.parametrize("algo", ["sha256", "xxh3_raw"])
def test_request_hasher_decode(benchmark, impl, algo):
    none_hash = PARENT[_digest_size(algo)]
    hasher = impl.hashing.RequestBlockHasher(16, algo, lambda: none_hash)
    req = _request(extra=True)
    prompt_hashes = hasher(req)
    req.all_token_ids = TOKENS + TOKENS[:4096]
    blocks = 4096 // 16

    def run():
        req.block_hashes = hashes = list(prompt_hashes)
        for n in range(PROMPT_TOKENS + 16, PROMPT_TOKENS + 4096 + 1, 16):
            req.num_tokens = n
            hashes.extend(hasher(req))
        return hashes

    fresh = _request(extra=True)
    fresh.all_token_ids, fresh.num_tokens = req.all_token_ids, PROMPT_TOKENS + 4096
    assert run() == hasher(fresh)
    _run(benchmark, impl, f"request hasher, decode + extra keys {algo}, bs16", run, blocks, 4096)


@pytest.mark.parametrize("algo", ALGOS)
def test_request_hasher_extra_keys(benchmark, impl, algo):
    none_hash = PARENT[_digest_size(algo)]
    hasher = impl.hashing.RequestBlockHasher(16, algo, lambda: none_hash)
    req = _request(extra=True)
    blocks = PROMPT_TOKENS // 16
    _run(benchmark, impl, f"request hasher + extra keys {algo}, bs16", lambda: hasher(req), blocks, PROMPT_TOKENS)


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("algo", ALGOS)
def test_chain(benchmark, impl, algo, block_size):
    parent = PARENT[_digest_size(algo)]
    blocks = PROMPT_TOKENS // block_size
    hash_blocks = impl.hashing.hash_blocks

    def run():
        return hash_blocks(algo, parent, TOKENS, 0, blocks, block_size)

    _run(benchmark, impl, f"chain {algo}, bs{block_size}", run, blocks, PROMPT_TOKENS)


@pytest.mark.parametrize("algo", ALGOS)
def test_one_block(benchmark, impl, algo):
    obj = (PARENT[_digest_size(algo)], tuple(TOKENS[:16]), None)
    digest = impl.hashing.digest
    _run(benchmark, impl, f"one block {algo}, 16 tokens", lambda: digest(algo, obj), 1, 16)


@pytest.mark.parametrize("block_size", [16, 64])
def test_xxh3_raw_int64_array(benchmark, impl, block_size):
    tokens = array("q", TOKENS)
    blocks = PROMPT_TOKENS // block_size
    hash_blocks = impl.hashing.hash_blocks

    def run():
        return hash_blocks("xxh3_raw", PARENT[16], tokens, 0, blocks, block_size)

    _run(benchmark, impl, f"xxh3_raw from an int64 array, bs{block_size}", run, blocks, PROMPT_TOKENS)


@pytest.fixture(scope="module", autouse=True)
def _summary(write_summary):
    yield
    if not RESULTS:
        return
    lines = ["", "kvcy hashing: ns per block, tokens/s, python/cython time (means of this run)"]
    for group, rows in RESULTS.items():
        parts = []
        for name in ("cython", "python"):
            if name in rows:
                mean, blocks, tokens = rows[name]
                parts.append(f"{name} {mean / blocks * 1e9:9.1f} ns/blk {tokens / mean / 1e6:8.1f} Mtok/s")
        if "cython" in rows and "python" in rows:
            parts.append(f"ratio {rows['python'][0] / rows['cython'][0]:6.1f}x")
        lines.append(f"  {group:<44} " + " | ".join(parts))
    write_summary(lines)
