"""The request object a serving loop hands to :class:`kvcy.KVCacheManager`.

It mirrors the parts of vLLM's ``vllm.v1.request.Request`` that the KV-cache
manager reads: the token lists, ``num_computed_tokens``, ``status`` and the
block hashes, which are kept up to date incrementally as output tokens are
appended (only newly completed blocks are hashed).
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LoRARequest",
    "MultiModalFeatureSpec",
    "PlaceholderRange",
    "Request",
    "RequestStatus",
    "validate_token_ids",
]


class RequestStatus(enum.IntEnum):
    """Status of a request, with vLLM's names and order."""

    WAITING = enum.auto()
    WAITING_FOR_FSM = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything from here on is finished.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


@dataclass(frozen=True)
class LoRARequest:
    """The LoRA adapter a request uses; name and path enter the block hashes."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""


@dataclass(frozen=True)
class PlaceholderRange:
    """Where a multimodal item's placeholder tokens sit in the prompt."""

    offset: int
    length: int


@dataclass(frozen=True)
class MultiModalFeatureSpec:
    """One multimodal item: its content identifier and its placeholder range."""

    identifier: str
    mm_position: PlaceholderRange
    modality: str = "image"
    data: Any = None


_INT64 = "q"


def validate_token_ids(token_ids: Iterable[int], what: str = "token ids") -> list[int]:
    """Check that every token id is an int that fits in 64 bits; return a list.

    Raises:
        TypeError: an element is not an int (bools are rejected too).
        ValueError: an element does not fit in a signed 64-bit integer.
    """
    if isinstance(token_ids, (str, bytes)):
        raise TypeError(f"{what} must be a sequence of ints, got {type(token_ids).__name__}")
    tokens = token_ids if isinstance(token_ids, list) else list(token_ids)
    try:
        array(_INT64, tokens)
    except TypeError:
        bad = next(t for t in tokens if not isinstance(t, int))
        raise TypeError(f"{what} must be ints, got {type(bad).__name__} ({bad!r})") from None
    except OverflowError:
        bad = next(t for t in tokens if not -(2**63) <= t < 2**63)
        raise ValueError(f"{what} must fit in a signed 64-bit integer, got {bad}") from None
    for t in tokens:
        if t.__class__ is bool:
            raise TypeError(f"{what} must be ints, got bool ({t!r})")
    return tokens


class Request:
    """A request as the KV-cache manager sees it.

    Args:
        request_id: unique id of the request.
        prompt_token_ids: the prompt's token ids (ints that fit in 64 bits).
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
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
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
    ) -> None:
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        prompt = validate_token_ids(prompt_token_ids, "prompt_token_ids")
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0):
            raise ValueError(f"max_tokens must be a non-negative int or None, got {max_tokens!r}")
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise TypeError(f"cache_salt must be a str or None, got {type(cache_salt).__name__}")
        if kv_cache_report_mode not in ("incremental", "full"):
            raise ValueError(
                f"kv_cache_report_mode must be 'incremental' or 'full', got {kv_cache_report_mode!r}"
            )
        features = list(mm_features) if mm_features else None
        if features:
            offsets = [f.mm_position.offset for f in features]
            if offsets != sorted(offsets):
                raise ValueError("mm_features must be sorted by placeholder offset")
            for f in features:
                p = f.mm_position
                if p.offset < 0 or p.length <= 0 or p.offset + p.length > len(prompt):
                    raise ValueError(
                        f"multimodal item {f.identifier!r} at [{p.offset}, {p.offset + p.length}) "
                        f"is not inside the {len(prompt)}-token prompt"
                    )
        if prompt_embeds is not None and len(prompt_embeds) != len(prompt):
            raise ValueError(
                f"prompt_embeds has {len(prompt_embeds)} rows for {len(prompt)} prompt tokens"
            )

        self.request_id = request_id
        self.prompt_token_ids = prompt
        self.max_tokens = max_tokens
        self.lora_request = lora_request
        self.mm_features = features
        self.cache_salt = cache_salt
        self.prompt_embeds = prompt_embeds
        self.kv_cache_report_mode = kv_cache_report_mode
        self.arrival_time = arrival_time
        self.skip_reading_prefix_cache = skip_reading_prefix_cache

        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.num_preemptions = 0
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
            f"computed={self.num_computed_tokens}, status={self.status.name})"
        )
