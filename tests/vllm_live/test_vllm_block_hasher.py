"""vLLM 0.33.0's request block hasher on kvcy (``kvcy.vllm.install()``): the hasher vLLM's engine
core builds is kvcy's, and every ``BlockHash`` it gives vLLM's ``Request`` is the one vLLM's own
hasher gives, for each of vLLM's algorithms and each kind of extra key, whether the tokens come
in the prompt or are appended one by one.  The switch that keeps vLLM's hasher, and
``uninstall()``, are checked here too.

Runs under whichever twin this process selected (``KVCY_NO_EXTENSIONS``); skipped where vLLM
0.33.0 does not import, unless ``KVCY_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import os
import random
import sys

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import vllm  # noqa: E402

import torch  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

import kvcy  # noqa: E402
import kvcy.vllm  # noqa: E402
from kvcy import _fast  # noqa: E402

ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
VLLM_FACTORY = kv_cache_utils.get_request_block_hasher


@pytest.fixture(autouse=True)
def _clean():
    kvcy.vllm.uninstall()
    yield
    kvcy.vllm.uninstall()
    assert kv_cache_utils.get_request_block_hasher is VLLM_FACTORY


def _features(spec):
    return [MultiModalFeatureSpec(data=None, modality="image", identifier=ident,
                                  mm_position=PlaceholderRange(offset=off, length=n)) for ident, off, n in spec]


def _request(tokens, split, hasher, *, chunk=1, **kw):
    """A vLLM ``Request`` of ``tokens[:split]`` with the rest appended ``chunk`` tokens at a time;
    its block hashes after each step."""
    req = Request("r", list(tokens[:split]), SamplingParams(max_tokens=len(tokens) + 1), None,
                  block_hasher=hasher, **kw)
    seen = [list(req.block_hashes)]
    pos = split
    while pos < len(tokens):
        req.append_output_token_ids(list(tokens[pos:pos + chunk]))
        pos += chunk
        seen.append(list(req.block_hashes))
    return seen


CASES = {
    "plain": {},
    "lora": {"lora_request": LoRARequest("adapter-a", 3, "/loras/a")},
    # Items that do not overlap: for overlapping ones kvcy keeps the keys vLLM gives when the tokens
    # come at once, however they come (tests/test_kv_cache_utils.py), where vLLM's appended-token
    # walk can skip an item.
    "mm": {"mm_features": [(f"img-{i}", off, n) for i, (off, n) in enumerate([(5, 12), (20, 4), (40, 30)])]},
    "cache_salt": {"cache_salt": "tenant-7"},
    "prompt_embeds": {"prompt_embeds": True},
    "everything": {"lora_request": LoRARequest("adapter-b", 9, "/loras/b"), "cache_salt": "s",
                   "mm_features": [("vid", 3, 50)]},
}


@pytest.mark.parametrize("lookahead", [0, 2])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("algo", ALGOS)
def test_kvcy_hashes_equal_vllms(algo, case, lookahead):
    """kvcy's hasher (what ``get_request_block_hasher`` returns while installed) gives a vLLM
    ``Request`` vLLM's own hashes, at creation and after each append, block size 4 and 16."""
    rng = random.Random(f"{algo}/{case}/{lookahead}")
    fn = get_hash_fn_by_name(algo)
    kv_cache_utils.init_none_hash(fn)
    for bs in (4, 16):
        tokens = [rng.randrange(0, 50000) for _ in range(rng.randrange(70, 130))]
        split = rng.randrange(1, 80)
        kw = dict(CASES[case])
        if "mm_features" in kw:
            kw["mm_features"] = _features(kw["mm_features"])
        if kw.pop("prompt_embeds", None):
            kw["prompt_embeds"] = torch.randn(split, 8, generator=torch.Generator().manual_seed(split),
                                              dtype=torch.bfloat16 if bs == 4 else torch.float32)
        for chunk in (1, 5):
            want = _request(tokens, split, VLLM_FACTORY(bs, fn, lookahead), chunk=chunk, **kw)
            kvcy.vllm.install()
            hasher = kv_cache_utils.get_request_block_hasher(bs, fn, lookahead)
            kvcy.vllm.uninstall()
            assert type(hasher) is _fast.hashing.RequestBlockHasher
            got = _request(tokens, split, hasher, chunk=chunk, **kw)
            assert got == want
            assert len(want[-1]) >= (split - lookahead) // bs  # something was hashed


def test_the_engine_core_builds_kvcys_hasher(monkeypatch):
    """The name vLLM's engine core calls is kvcy's while installed (imported before or after the
    install), vLLM's again after ``uninstall()``; the switch keeps vLLM's."""
    import vllm.v1.engine.core as core

    assert core.get_request_block_hasher is VLLM_FACTORY
    kvcy.vllm.install()
    assert kvcy.vllm.block_hasher_installed() and kvcy.vllm.is_installed()
    assert core.get_request_block_hasher is kvcy.vllm.make_request_block_hasher
    assert kv_cache_utils.get_request_block_hasher is kvcy.vllm.make_request_block_hasher
    kvcy.vllm.install()  # idempotent
    kvcy.vllm.uninstall()
    assert core.get_request_block_hasher is VLLM_FACTORY
    assert not kvcy.vllm.block_hasher_installed() and not kvcy.vllm.is_installed()

    kvcy.vllm.install(block_hasher=False)  # the manager only
    assert kvcy.vllm.is_installed() and not kvcy.vllm.block_hasher_installed()
    assert core.get_request_block_hasher is VLLM_FACTORY
    kvcy.vllm.install(block_hasher=True)  # switched on later
    assert core.get_request_block_hasher is kvcy.vllm.make_request_block_hasher
    kvcy.vllm.install(block_hasher=False)  # and off again, the manager staying kvcy's
    assert core.get_request_block_hasher is VLLM_FACTORY and kvcy.vllm.is_installed()
    kvcy.vllm.uninstall()

    monkeypatch.setenv("KVCY_VLLM_BLOCK_HASHER", "vllm")
    kvcy.vllm.install()
    assert kvcy.vllm.is_installed() and core.get_request_block_hasher is VLLM_FACTORY
    kvcy.vllm.uninstall()
    monkeypatch.setenv("KVCY_VLLM_BLOCK_HASHER", "kvcy")
    kvcy.vllm.install()
    assert core.get_request_block_hasher is kvcy.vllm.make_request_block_hasher
    kvcy.vllm.uninstall()
    monkeypatch.setenv("KVCY_VLLM_BLOCK_HASHER", "yes")
    with pytest.raises(ValueError, match="KVCY_VLLM_BLOCK_HASHER must be 'kvcy' or 'vllm', got 'yes'"):
        kvcy.vllm.install()
    assert not kvcy.vllm.is_installed() and not kvcy.vllm.block_hasher_installed()


def test_engine_core_imported_after_install_gets_vllms_back():
    """A module that imported the name while kvcy's was in place gets vLLM's back on uninstall."""
    saved = sys.modules.pop("vllm.v1.engine.core")
    try:
        kvcy.vllm.install()
        import vllm.v1.engine.core as core

        assert core.get_request_block_hasher is kvcy.vllm.make_request_block_hasher
        kvcy.vllm.uninstall()
        assert core.get_request_block_hasher is VLLM_FACTORY
    finally:
        sys.modules["vllm.v1.engine.core"] = saved


def test_a_function_vllm_does_not_name_keeps_vllms_hasher():
    """kvcy hashes vLLM's algorithms only; any other function gets vLLM's own hasher."""
    def mine(obj):
        return repr(obj).encode()[:32]

    kvcy.vllm.install()
    hasher = kv_cache_utils.get_request_block_hasher(16, mine)
    assert type(hasher) is not _fast.hashing.RequestBlockHasher
    assert hasher.__module__ == "vllm.v1.core.kv_cache_utils"


def test_another_replacement_is_not_replaced(monkeypatch):
    def other(*args):
        raise AssertionError("not called")

    monkeypatch.setattr(kv_cache_utils, "get_request_block_hasher", other)
    with pytest.raises(RuntimeError, match="neither vLLM's nor kvcy's"):
        kvcy.vllm.install()
    assert kv_cache_utils.get_request_block_hasher is other
    assert not kvcy.vllm.block_hasher_installed() and not kvcy.vllm.is_installed()
