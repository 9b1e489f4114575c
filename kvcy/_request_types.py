"""The value types around a request: status, LoRA adapter, multimodal items.

Shared by both twins' ``Request`` (``kvcy/_fast/_kv_cache_{c,py}``) and
re-exported by :mod:`kvcy.request`; kept apart so that the twins can import
them while ``kvcy._fast`` is still loading.  ``KVCacheBlockCopy`` (what the
managers' ``take_kv_cache_block_copies`` returns) lives here for the same
reason; :mod:`kvcy.kv_cache_utils` re-exports it.  So does ``SpecGroup`` (an entry of
a hybrid coordinator's ``attention_groups``), re-exported by :mod:`kvcy.kv_cache_coordinator`.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "FinishReason",
    "KVCacheBlockCopy",
    "LoRARequest",
    "check_request_args",
    "check_skip_reading_prefix_cache",
    "MultiModalFeatureSpec",
    "PlaceholderRange",
    "RequestStatus",
    "SpecGroup",
    "validate_token_ids",
]


class FinishReason(enum.IntEnum):
    """Why a request finished, with vLLM's names and int values."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4

    def __str__(self) -> str:
        return self.name.lower()


class RequestStatus(enum.IntEnum):
    """Status of a request, with vLLM 0.33.0's names and int values.

    Managers compare a status by value, so vLLM's own ``RequestStatus`` (or
    any int enum with these values) works the same as this one.
    """

    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything after PREEMPTED is finished.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> FinishReason | None:
        """The finish reason a finished status reports (None for the others)."""
        return _FINISHED_REASON_MAP.get(status)


# Ignored requests had prompts longer than the model allows, hence "length";
# a streaming request waiting for its next input reports its chunk as stopped.
_FINISHED_REASON_MAP = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_IGNORED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
    RequestStatus.WAITING_FOR_STREAMING_REQ: FinishReason.STOP,
    RequestStatus.FINISHED_REPETITION: FinishReason.REPETITION,
}


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


def check_request_args(
    request_id: Any,
    prompt_token_ids: Iterable[int] | None,
    max_tokens: Any,
    mm_features: Any,
    cache_salt: Any,
    prompt_embeds: Any,
    kv_cache_report_mode: Any,
    session_id: Any = None,
    skip_reading_prefix_cache: Any = False,
) -> tuple[list[int], list[MultiModalFeatureSpec]]:
    """Validate a ``Request``'s constructor arguments (both twins call this).

    Returns:
        The prompt as a list of ints and the multimodal items as a list (empty
        when there are none, as vLLM's ``Request`` keeps them).

    Raises:
        TypeError / ValueError: an argument is malformed.
    """
    if not isinstance(request_id, str):
        raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
    if prompt_token_ids is None:
        # An embeddings-only prompt, as vLLM takes it: its token ids are zeros (placeholders
        # that keep the prompt's length); the embeddings' rows are the prompt.
        if prompt_embeds is None:
            raise ValueError("Neither prompt_token_ids nor prompt_embeds were defined.")
        prompt = [0] * len(prompt_embeds)
    else:
        prompt = validate_token_ids(prompt_token_ids, "prompt_token_ids")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0):
        raise ValueError(f"max_tokens must be a non-negative int or None, got {max_tokens!r}")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise TypeError(f"cache_salt must be a str or None, got {type(cache_salt).__name__}")
    if kv_cache_report_mode not in ("incremental", "full"):
        raise ValueError(
            f"kv_cache_report_mode must be 'incremental' or 'full', got {kv_cache_report_mode!r}"
        )
    if session_id is not None and not isinstance(session_id, str):
        raise TypeError(f"session_id must be a str or None, got {type(session_id).__name__}")
    check_skip_reading_prefix_cache(skip_reading_prefix_cache)
    features = list(mm_features) if mm_features else []
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
    return prompt, features


def check_skip_reading_prefix_cache(value: Any) -> bool:
    """``skip_reading_prefix_cache`` as both twins' ``Request`` take it: a bool.

    vLLM's ``Request`` takes it from its sampling or pooling parameters, where
    it is a bool; anything else (an int, None, a string) is refused rather
    than read by truth value.

    Raises:
        TypeError: ``value`` is not a bool.
    """
    if value is not True and value is not False:
        raise TypeError(f"skip_reading_prefix_cache must be a bool, got {type(value).__name__}")
    return value


class KVCacheBlockCopy(NamedTuple):
    """One block copy the worker runs: ``src_block_id``'s KV into ``dst_block_id``."""

    src_block_id: int
    dst_block_id: int


class SpecGroup(NamedTuple):
    """KV-cache groups with one spec, looked up together for a cache hit: an entry of
    ``HybridKVCacheCoordinator.attention_groups``.

    ``use_eagle`` holds when any member is an EAGLE/MTP group; the members share their
    hits, so the last-block drop is decided for all of them at once.
    """

    spec: Any
    group_ids: list[int]
    manager_cls: type
    use_eagle: bool
