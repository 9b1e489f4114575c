"""The value types around a request: status, LoRA adapter, multimodal items.

Shared by both twins' ``Request`` (``kvcy/_fast/_kv_cache_{c,py}``) and
re-exported by :mod:`kvcy.request`; kept apart so that the twins can import
them while ``kvcy._fast`` is still loading.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LoRARequest",
    "MultiModalFeatureSpec",
    "PlaceholderRange",
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
