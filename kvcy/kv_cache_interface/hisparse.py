"""HiSparse's two derived specs: :class:`HiSparseHotSpec` (a per-request hot
buffer) and :class:`HiSparseResidentSpec` (reclaimable device pages of
host-backed KV), and :func:`check_no_hisparse_groups`, which the coordinators
call to refuse what of a config they cannot serve.

Both specs size memory and group layouts exactly as vLLM 0.33.0's do, so
capacity planning over a HiSparse config gives vLLM's figures; neither takes
part in prefix caching, gets per-layer views or a slot mapping.  kvcy's
managers do not run HiSparse's host pool, so building a manager over a
config with HiSparse groups raises ``NotImplementedError``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvcy.kv_cache_interface._checks import _check_int, _setting, cdiv
from kvcy.kv_cache_interface.base import KVCacheSpec

__all__ = ["HiSparseHotSpec", "HiSparseResidentSpec", "check_no_hisparse_groups", "check_no_hisparse_spec"]


@dataclass(frozen=True, kw_only=True)
class HiSparseHotSpec(KVCacheSpec):
    """A fixed hot buffer of ``blocks_per_request`` pages that each running
    request holds while HiSparse streams its KV in from the host."""

    page_size: int
    """Bytes of one page of the buffer."""
    blocks_per_request: int
    """Pages one request holds, whatever its length."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int("HiSparseHotSpec", "page_size", self.page_size)
        _check_int("HiSparseHotSpec", "blocks_per_request", self.blocks_per_request)

    @property
    def prefix_cacheable(self) -> bool:
        return False

    @property
    def page_size_bytes(self) -> int:
        return self.page_size

    @property
    def block_table_token_alignment(self) -> int | None:
        return None

    def max_memory_usage_bytes(self, config: Any) -> int:
        return self.blocks_per_request * self.page_size

    def max_num_blocks_per_req(self, config: Any, max_len: int) -> int:
        return self.blocks_per_request

    @property
    def has_layer_views(self) -> bool:
        return False

    @property
    def uses_slot_mapping(self) -> bool:
        return False


@dataclass(frozen=True, kw_only=True)
class HiSparseResidentSpec(KVCacheSpec):
    """Device pages that mirror host-resident KV while a request is in flight;
    they can be reclaimed once the host copy is durable, so a request pins at
    most its in-flight window of them."""

    page_size: int
    """Bytes of one resident page."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int("HiSparseResidentSpec", "page_size", self.page_size)

    @property
    def prefix_cacheable(self) -> bool:
        return False

    @property
    def page_size_bytes(self) -> int:
        return self.page_size

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int, max_model_len: int) -> int:
        """Pages one request can pin: its in-flight tokens, capped at the model length."""
        return cdiv(min(max_in_flight_tokens, max_model_len), self.block_size)

    def max_memory_usage_bytes(self, config: Any) -> int:
        # vLLM's config names the in-flight bound; kvcy's settings carry the
        # per-step budget, which is the same bound with one batch in flight.
        in_flight = getattr(config, "max_in_flight_tokens", None)
        if in_flight is None:
            in_flight = _setting(config, "max_num_batched_tokens", "scheduler_config")
        blocks = self.max_admission_blocks_per_request(
            max_in_flight_tokens=in_flight,
            max_model_len=_setting(config, "max_model_len", "model_config"),
        )
        return blocks * self.page_size

    @property
    def has_layer_views(self) -> bool:
        return False


def check_no_hisparse_spec(spec: KVCacheSpec) -> None:
    """Refuse a HiSparse-derived spec, which no kvcy manager serves.

    Raises:
        NotImplementedError: ``spec`` is a :class:`HiSparseHotSpec` or a
            :class:`HiSparseResidentSpec`.
    """
    if isinstance(spec, (HiSparseHotSpec, HiSparseResidentSpec)):
        raise NotImplementedError(f"{type(spec).__name__} (HiSparse) is not implemented in kvcy's managers")


def check_no_hisparse_groups(groups: Iterable[Any]) -> None:
    """Refuse KV-cache groups that need HiSparse's host pool.

    kvcy's managers serve the device pool only; a host-resident group, a
    HiSparse role or a HiSparse-derived spec needs vLLM's host pool, deferred
    frees and residency tracking, which the coordinators do not have.

    Raises:
        NotImplementedError: naming the first such group.
    """
    for i, group in enumerate(groups):
        role = getattr(group, "role", None)
        role = getattr(role, "value", role)
        if getattr(group, "host_resident", False):
            what = "is host-resident"
        elif role not in (None, "default"):
            what = f"has role {role!r}"
        elif isinstance(group.kv_cache_spec, (HiSparseHotSpec, HiSparseResidentSpec)):
            what = f"has a {type(group.kv_cache_spec).__name__}"
        else:
            continue
        raise NotImplementedError(f"KV-cache group {i} {what}: HiSparse is not implemented in kvcy's managers")
