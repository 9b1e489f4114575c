"""Type stub for the compiled twin; the pure twin ``_hashing_py`` has the same API."""

from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "ALGORITHMS",
    "BACKEND",
    "RequestBlockHasher",
    "block_message",
    "digest",
    "generate_block_hash_extra_keys",
    "hash_blocks",
]

ALGORITHMS: tuple[str, ...]
BACKEND: dict[str, str]

def digest(algo: str, obj: Any) -> bytes: ...
def block_message(algo: str, parent: Any, token_ids: Sequence[Any], extra_keys: Any = None) -> bytes: ...
def hash_blocks(
    algo: str,
    parent: bytes,
    token_ids: Sequence[int],
    start: int,
    num_blocks: int,
    block_size: int,
    extra_keys: Sequence[tuple[Any, ...] | None] | None = None,
) -> list[bytes]: ...
def generate_block_hash_extra_keys(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]: ...

class RequestBlockHasher:
    block_size: int
    algo: str | None
    hash_fn: Callable[[Any], bytes] | None
    num_hash_lookahead_tokens: int
    def __init__(
        self,
        block_size: int,
        algo: str | None,
        none_hash: Callable[[], bytes],
        hash_fn: Callable[[Any], bytes] | None = None,
        num_hash_lookahead_tokens: int = 0,
    ) -> None: ...
    def __call__(self, request: Any) -> list[bytes]: ...
