"""The request as the KV-cache manager sees it (pure-Python twin).

From vLLM 0.33.0's ``vllm/v1/request.py`` (``Request``): the token lists, counts
and block hashes the manager reads, kept up to date as output tokens arrive.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

from kvcy._request_types import (
    LoRARequest,
    MultiModalFeatureSpec,
    RequestStatus,
    check_request_args,
    check_skip_reading_prefix_cache,
    validate_token_ids,
)
from kvcy._fast.kv_cache_py._common import _READ_ONLY, _Checked, _check_count


def _count_rule(name: str, value: Any) -> int:
    return _check_count(name, value)


def _checked_block_hashes(name: str, value: Any) -> list:
    # Block hashes as assigned from outside: a list of bytes.
    if value.__class__ is not list:
        raise TypeError(f"block_hashes must be a list of bytes, got {type(value).__name__}")
    for h in value:
        if h.__class__ is not bytes:
            raise TypeError(f"block hashes must be bytes, got {type(h).__name__}")
    return value


def _spec_token_ids_rule(name: str, value: Any) -> list:
    return validate_token_ids(value, "spec_token_ids")


def _skip_rule(name: str, value: Any) -> bool:
    return check_skip_reading_prefix_cache(value)


class Request(_Checked):
    """A request as the KV-cache manager sees it.

    Args:
        request_id: unique id of the request.
        prompt_token_ids: the prompt's token ids (ints that fit in 64 bits), or None
            for a prompt of embeddings only (its tokens are then zeros, as in vLLM).
        max_tokens: how many output tokens the request may produce (informative
            for a serving loop; the manager does not read it).
        lora_request: the LoRA adapter, if any (enters every block hash).
        mm_features: multimodal items sorted by placeholder offset.
        cache_salt: isolates this request's prefix cache (enters the hash of
            the block that starts at token 0).
        prompt_embeds: optional prompt embeddings (a tensor ``[num_prompt_tokens,
            hidden]``); their bytes enter the block hashes.
        block_hasher: from :func:`kvcy.hashing.get_request_block_hasher`; without
            one the request has no block hashes and never hits the cache.
        kv_cache_report_mode: ``"full"`` makes ``get_computed_blocks`` re-emit
            ``BlockStored`` events for prefix hits.
        arrival_time: free for the serving loop's use.
        skip_reading_prefix_cache: True: ``get_computed_blocks`` finds no hit
            for this request (vLLM sets it for prompt logprobs and all-token
            pooling); its blocks are still cached.  A bool.
        session_id: the streaming session the request belongs to, if any; the
            ``BlockStored`` events of its blocks carry it.

    The serving loop (the scheduler) owns these; the manager reads them and
    never writes them:

    - ``num_computed_tokens``: tokens whose KV is in the cache.  Set it to the
      hit length on admission (``get_computed_blocks``' second value) and add
      the step's scheduled tokens once the forward pass has written their KV.
      ``allocate_slots`` sizes every allocation from it: a loop that does not
      advance it gets no new blocks for decode.  0 again on preemption.
    - ``status``: a ``RequestStatus``.  ``allocate_slots`` keeps the watermark
      free while admitting a WAITING or PREEMPTED request; set RUNNING once
      admitted, PREEMPTED when preempted, a FINISHED_* one when done.
    - ``num_preemptions``: add 1 at each preemption (``record_prefix_cache_stats``
      counts the lookups of preempted requests apart).
    - ``num_in_flight_tokens``: scheduled tokens whose KV is not written yet
      (asynchronous scheduling; 0 otherwise): sliding-window groups keep
      their blocks.
    - ``shared_prefix_boundary``: vLLM's, from ``get_computed_blocks``' third
      value (0: none); sparse-retention managers read it.

    Output tokens go in through ``append_output_token_ids``, which also hashes
    the blocks they complete.
    """

    # What shapes the request's hashes or the manager's bookkeeping is set
    # once, by the constructor; counts a scheduler moves are checked when
    # assigned (the compiled twin's C fields behind properties).
    _RULES = {
        **dict.fromkeys(
            ("request_id", "prompt_token_ids", "lora_request", "mm_features", "cache_salt", "prompt_embeds",
             "kv_cache_report_mode", "session_id", "num_prompt_tokens", "_all_token_ids",
             "_output_token_ids", "_block_hasher"),
            _READ_ONLY,
        ),
        "num_computed_tokens": _count_rule,
        "num_in_flight_tokens": _count_rule,
        "num_preemptions": _count_rule,
        "shared_prefix_boundary": _count_rule,
        "skip_reading_prefix_cache": _skip_rule,
        "spec_token_ids": _spec_token_ids_rule,
        "block_hashes": _checked_block_hashes,
    }

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | None,
        max_tokens: int | None = None,
        *,
        lora_request: LoRARequest | None = None,
        mm_features: list[MultiModalFeatureSpec] | None = None,
        cache_salt: str | None = None,
        prompt_embeds: Any = None,
        block_hasher: Callable[[Request], list[bytes]] | None = None,
        kv_cache_report_mode: str = "incremental",
        arrival_time: float = 0.0,
        skip_reading_prefix_cache: bool = False,
        session_id: str | None = None,
    ) -> None:
        prompt, features = check_request_args(
            request_id, prompt_token_ids, max_tokens, mm_features, cache_salt, prompt_embeds,
            kv_cache_report_mode, session_id, skip_reading_prefix_cache,
        )

        self.request_id = request_id
        self.prompt_token_ids = None if prompt_token_ids is None else prompt  # (None: embeddings only, as vLLM)
        self.max_tokens = max_tokens
        self.lora_request = lora_request
        self.mm_features = features
        self.cache_salt = cache_salt
        self.prompt_embeds = prompt_embeds
        self.kv_cache_report_mode = kv_cache_report_mode
        self.arrival_time = arrival_time
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        self.session_id = session_id

        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.num_preemptions = 0
        self.shared_prefix_boundary = 0
        self.num_prompt_tokens = len(prompt)
        self.spec_token_ids: list[int] = []
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(prompt)

        self.block_hashes: list[bytes] = []
        self._block_hasher = block_hasher
        if block_hasher is not None:
            self.block_hashes.extend(block_hasher(self))

    # ------------------------------------------------------------------ tokens
    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """The output tokens so far (do not mutate; use append_output_token_ids)."""
        return self._output_token_ids

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by output tokens (do not mutate)."""
        return self._all_token_ids

    @property
    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Append sampled tokens and hash any blocks they complete.

        Raises:
            TypeError / ValueError: a token is not an int or does not fit in 64
                bits; nothing is appended then.
        """
        if isinstance(token_ids, int) and not isinstance(token_ids, bool):
            tokens = validate_token_ids([token_ids], "output token ids")
        else:
            tokens = validate_token_ids(token_ids, "output token ids")
        self._output_token_ids.extend(tokens)
        self._all_token_ids.extend(tokens)
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def __repr__(self) -> str:
        return (
            f"Request(id={self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, status={_status_text(self.status)})"
        )


def _status_text(status: Any) -> str:
    # An enum member (kvcy's or vLLM's RequestStatus) by name; anything else
    # callers stored (a plain int, say) by its repr.
    return status.name if isinstance(status, enum.Enum) else repr(status)
