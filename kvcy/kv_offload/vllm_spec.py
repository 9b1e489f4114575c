"""kvcy's CPU tier inside vLLM 0.33.0's own ``OffloadingConnector``.

vLLM's connector builds its scheduler-side manager from an ``OffloadingSpec`` it
finds by name in ``kv_connector_extra_config``; this module holds one,
:class:`KvcyCPUOffloadingSpec`, for vLLM to load::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "KvcyCPUOffloadingSpec",
        "spec_module_path": "kvcy.kv_offload.vllm_spec", "cpu_bytes_to_use": 8000000000}}'

The spec is vLLM's ``CPUOffloadingSpec`` with one thing changed: ``get_manager()``
returns kvcy's ``CPUOffloadingManager`` (the live twin: compiled, or pure Python
under ``KVCY_NO_EXTENSIONS=1``), built from the same ``extra_config`` keys as
vLLM's (``cpu_bytes_to_use``, ``block_size`` / ``blocks_per_chunk``,
``eviction_policy``, ``store_threshold``, ``max_tracker_size``, ...) and answering
in vLLM's own classes (``LookupResult``, ``OffloadingEvent``, ``Medium``,
``CPULoadStoreSpec``, ``PrepareStoreOutput``, ``OffloadingConnectorStats``), so the
connector cannot tell it from vLLM's manager except by its CPU time.

Everything else is vLLM's: the number of CPU chunks (from ``cpu_bytes_to_use`` and
the KV bytes per block), the worker (``get_worker`` is vLLM's
``CPUOffloadingWorker``, with its shared host region and copy kernels: kvcy's
manager decides which chunk holds which key, not where or how the bytes move),
the metrics and their config labels.

``eviction_policy`` names a policy of kvcy's ``CachePolicyFactory`` (``"lru"``,
``"arc"``, or one registered there); a policy written for vLLM's factory
(``cache_policy_module_path``) must derive from kvcy's ``CachePolicy`` to serve.

:func:`install` makes vLLM's default spec name, ``"CPUOffloadingSpec"``, load this
class, so an unchanged ``{"kv_connector": "OffloadingConnector", ...}`` config runs
kvcy's tier; kvcy's vLLM plugin calls it when ``KVCY_VLLM_OFFLOADING=1``
(see :func:`kvcy.vllm.load_general_plugin`).

Importing this module never imports vLLM: the spec class is made on first access.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = [
    "KvcyCPUOffloadingSpec",
    "install",
    "is_installed",
    "uninstall",
    "use_vllm_types",
]

_lock = threading.Lock()
_spec_class: Any = None
_vllm_loader: Any = None  # vLLM's registry entry for "CPUOffloadingSpec" while kvcy's replaces it


def use_vllm_types(manager: Any) -> Any:
    """Make ``manager`` (kvcy's ``CPUOffloadingManager``) answer in vLLM's classes; returns it.

    Results keep their values (the same chunk ids, keys and flags); only their
    classes change, to the ones vLLM's connector compares with and asserts.
    """
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
    from vllm.v1.kv_offload import base
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    manager._use_api_types(
        LookupResult=base.LookupResult,
        Medium=base.Medium,
        CacheHitSource=CacheHitSource,
        OffloadingEvent=base.OffloadingEvent,
        PrepareStoreOutput=base.PrepareStoreOutput,
        CPULoadStoreSpec=CPULoadStoreSpec,
        OffloadingConnectorStats=OffloadingConnectorStats,
        RequestOffloadingContext=base.RequestOffloadingContext,
        ReqContext=base.ReqContext,
    )
    if not isinstance(manager, base.OffloadingManager):
        base.OffloadingManager.register(type(manager))
    return manager


def _make_spec_class() -> type:
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    class KvcyCPUOffloadingSpec(CPUOffloadingSpec):
        """vLLM's ``CPUOffloadingSpec`` whose scheduler-side manager is kvcy's.

        Same ``extra_config`` keys, same chunk count, same worker, same metrics;
        ``get_manager()`` is kvcy's ``CPUOffloadingManager`` speaking vLLM's types.
        """

        def get_manager(self) -> Any:
            if self._manager is None:
                from kvcy.kv_offload.cpu import CPUOffloadingManager

                # (the defaults vLLM's CPUOffloadingSpec applies to the same keys)
                manager = CPUOffloadingManager(
                    num_chunks=self.num_chunks,
                    cache_policy=self.eviction_policy,
                    cache_policy_module_path=self.cache_policy_module_path,
                    enable_events=self.kv_events_config.enable_kv_cache_events,
                    store_threshold=int(self.extra_config.get("store_threshold", 0)),
                    max_tracker_size=int(self.extra_config.get("max_tracker_size", 64_000)),
                    info=self.cpu_info,
                )
                self._manager = use_vllm_types(manager)
            return self._manager

    KvcyCPUOffloadingSpec.__module__ = __name__
    return KvcyCPUOffloadingSpec


def _get_spec_class() -> type:
    global _spec_class
    with _lock:
        if _spec_class is None:
            _spec_class = _make_spec_class()
        return _spec_class


def __getattr__(name: str) -> Any:
    if name == "KvcyCPUOffloadingSpec":
        return _get_spec_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def install() -> None:
    """Make vLLM's ``"CPUOffloadingSpec"`` (the connector's default spec) load kvcy's spec.

    Idempotent.  Connectors built before the call keep the spec they have.

    Raises:
        ImportError / RuntimeError: vLLM is missing, or is not 0.33.0.
    """
    global _vllm_loader
    from kvcy.vllm import _scheduler_module

    _scheduler_module()  # (the version check)
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    spec_cls = _get_spec_class()
    with _lock:
        if _vllm_loader is not None:
            return
        _vllm_loader = OffloadingSpecFactory._registry["CPUOffloadingSpec"]
        OffloadingSpecFactory._registry["CPUOffloadingSpec"] = lambda: spec_cls


def uninstall() -> None:
    """Give ``"CPUOffloadingSpec"`` back to vLLM's own spec (a no-op when not installed)."""
    global _vllm_loader
    with _lock:
        if _vllm_loader is None:
            return
        from vllm.v1.kv_offload.factory import OffloadingSpecFactory

        OffloadingSpecFactory._registry["CPUOffloadingSpec"] = _vllm_loader
        _vllm_loader = None


def is_installed() -> bool:
    """Whether vLLM's default offloading spec name loads kvcy's spec now (never imports vLLM)."""
    return _vllm_loader is not None
