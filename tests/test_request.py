"""``Request`` and ``RequestStatus``: vLLM 0.33.0's fields, defaults, checks and statuses, both twins.
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.request import Request, RequestStatus


BS = 4


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


def hasher(bs=BS):
    return get_request_block_hasher(bs, get_hash_fn_by_name("sha256"))


def test_bad_tokens_rejected_without_change():
    with pytest.raises(TypeError):
        Request("a", [1, 2, "x"])
    with pytest.raises(ValueError):
        Request("a", [1, 2**64])
    req = Request("a", [1, 2, 3], block_hasher=hasher())
    with pytest.raises(TypeError):
        req.append_output_token_ids([4, None])
    with pytest.raises(ValueError):
        req.append_output_token_ids([-(2**70)])
    assert req.all_token_ids == [1, 2, 3] and req.num_tokens == 3


# --------------------------------------------------------------------------- Request twins
def test_request_twins_match():
    from kvcy import _fast

    impls = _fast.available()
    reqs = []
    for name in impls:
        R = _fast.load(name)["kv_cache"].Request
        r = R("r", list(range(10)), max_tokens=4, block_hasher=hasher(), cache_salt="s")
        r.append_output_token_ids(7)
        r.append_output_token_ids([8, 9])
        r.num_computed_tokens = 5
        r.status = RequestStatus.RUNNING
        r.extra = "free attribute"
        reqs.append(r)
        for bad, exc in ((True, TypeError), (2**63, ValueError), ([1, "x"], TypeError), ([1.0], TypeError)):
            with pytest.raises(exc):
                r.append_output_token_ids(bad)
        assert r.num_tokens == 13 and r.output_token_ids == [7, 8, 9]  # nothing appended by the failures
    fields = ("request_id", "num_tokens", "num_output_tokens", "all_token_ids", "block_hashes",
              "num_computed_tokens", "status", "num_prompt_tokens", "cache_salt", "max_tokens", "extra")
    for r in reqs[1:]:
        assert {f: getattr(r, f) for f in fields} == {f: getattr(reqs[0], f) for f in fields}
    assert len(reqs[0].block_hashes) == 3


def test_embeddings_only_prompt_as_vllm(impl):
    """vLLM's ``Request`` takes ``prompt_token_ids=None`` with ``prompt_embeds``: the prompt
    is as long as the embeddings, its token ids are zeros, and its blocks are keyed by the
    embeddings' digests; with neither, vLLM's ValueError.  kvcy raised TypeError."""
    import hashlib

    torch = pytest.importorskip("torch")
    embeds = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    hasher = get_request_block_hasher(BS, get_hash_fn_by_name("sha256"))
    req = impl.kv_cache.Request("r", None, prompt_embeds=embeds, block_hasher=hasher)
    assert req.prompt_token_ids is None
    assert (req.num_prompt_tokens, req.num_tokens, list(req.all_token_ids)) == (10, 10, [0] * 10)
    same = impl.kv_cache.Request("s", [0] * 10, prompt_embeds=embeds, block_hasher=hasher)
    assert req.block_hashes == same.block_hashes and len(req.block_hashes) == 2
    digest = hashlib.sha256(embeds[:4].numpy().tobytes()).digest()
    from kvcy.hashing import generate_block_hash_extra_keys
    assert generate_block_hash_extra_keys(req, 0, 4, 0) == ((("prompt_embeds", digest),), 0)
    with pytest.raises(ValueError, match="Neither prompt_token_ids nor prompt_embeds were defined."):
        impl.kv_cache.Request("r", None)
