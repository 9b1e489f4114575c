"""Run vLLM 0.33.0's own ``Scheduler`` on kvcy's ``KVCacheManager``.

:func:`install` rebinds the one name vLLM's scheduler module builds its KV-cache manager
from (``vllm.v1.core.sched.scheduler.KVCacheManager``) to a factory that converts vLLM's
``KVCacheConfig`` into kvcy's and builds kvcy's manager with the keywords the scheduler
passes.  Nothing else of vLLM changes: the scheduler keeps vLLM's config, requests and
queues; only the block bookkeeping it delegates is kvcy's.  :func:`uninstall` puts vLLM's
class back; :func:`installed` does both around a ``with`` block.

:func:`install` also makes the request block hasher vLLM's engine core builds
(``get_request_block_hasher``, which it imports from ``vllm.v1.core.kv_cache_utils``) kvcy's
(:func:`make_request_block_hasher`): the same ``BlockHash`` bytes for every algorithm vLLM
0.33.0 offers and every extra key (LoRA, multimodal, cache salt, prompt embeddings), hashed in
the selected twin of ``kvcy._fast.hashing``.  ``install(block_hasher=False)`` or
``KVCY_VLLM_BLOCK_HASHER=vllm`` keeps vLLM's hasher and replaces only the manager.

vLLM loads this module's :func:`load_general_plugin` in every process when kvcy is installed
(the ``vllm.general_plugins`` entry point ``kvcy``), unless ``VLLM_PLUGINS`` names the
plugins to load and leaves ``kvcy`` out.

``import kvcy`` never imports vLLM; this module imports it only when one of its functions
runs, and refuses any version but 0.33.0.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "SUPPORTED_VLLM_VERSION",
    "convert_kv_cache_config",
    "convert_kv_cache_group_spec",
    "convert_kv_cache_spec",
    "install",
    "installed",
    "is_installed",
    "block_hasher_installed",
    "load_general_plugin",
    "make_kv_cache_manager",
    "make_request_block_hasher",
    "uninstall",
]

SUPPORTED_VLLM_VERSION = "0.33.0"

# vLLM fills an attention spec's head_size_v in from head_size when it is not given; its MLA
# specs store 0 ("no separate V").  Either value is what kvcy derives on its own.
_NO_V = {"MLAAttentionSpec": 0, "HiddenStateCacheSpec": 0, "SlidingWindowMLASpec": 0}

_lock = threading.Lock()
_vllm_manager_class: Any = None  # vLLM's KVCacheManager while kvcy is installed
_vllm_hasher_factory: Any = None  # vLLM's get_request_block_hasher while kvcy's replaces it
_HASHER_ENV = "KVCY_VLLM_BLOCK_HASHER"  # "vllm": install() keeps vLLM's request block hasher
# Modules that hold vLLM's get_request_block_hasher under that name: where it is defined, and the
# engine core that builds the hasher every request of an engine is hashed with.
_HASHER_MODULES = ("vllm.v1.core.kv_cache_utils", "vllm.v1.engine.core")


def _scheduler_module() -> Any:
    """vLLM's scheduler module, after checking that the installed vLLM is 0.33.0.

    Raises:
        ImportError: vLLM is not installed.
        RuntimeError: another vLLM version is.
    """
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"kvcy.vllm needs vLLM {SUPPORTED_VLLM_VERSION} installed: {exc}") from exc
    version = getattr(vllm, "__version__", None)
    if version != SUPPORTED_VLLM_VERSION:
        raise RuntimeError(
            f"kvcy.vllm supports vLLM {SUPPORTED_VLLM_VERSION} only (kvcy reproduces that release's "
            f"KV-cache manager); the installed vLLM is {version}"
        )
    from vllm.v1.core.sched import scheduler

    return scheduler


# ---------------------------------------------------------------------------------------------
# vLLM -> kvcy: specs, groups, tensors, configs
# ---------------------------------------------------------------------------------------------


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _convert_value(owner: str, name: str, value: Any) -> Any:
    """A vLLM field value in kvcy's terms (nested specs, vLLM's enums)."""
    from vllm.v1.kv_cache_interface import KVCacheSpec as VllmKVCacheSpec

    from kvcy import kv_cache_interface as ki

    if isinstance(value, VllmKVCacheSpec):
        return convert_kv_cache_spec(value)
    if isinstance(value, dict):
        return {k: _convert_value(owner, name, v) for k, v in value.items()}
    if name == "kv_quant_mode":
        return ki.KVQuantMode[value.name]
    if name == "role" and isinstance(value, enum.Enum):
        return ki.KVCacheGroupRole(value.value)
    if name == "cache_role" and isinstance(value, enum.Enum):
        return ki.SparseCacheRole(value.value)  # an MLA spec's sparse-cache role
    if name == "block_stride_alignment" and type(value).__name__ == "MultipleOf":
        return ki.MultipleOf(value.base)  # vLLM's own MultipleOf (vllm.v1.attention.backend)
    if name == "mamba_type" and isinstance(value, enum.Enum):
        return value.name.lower()  # kvcy names the Mamba kind as a string ("mamba2")
    return value


def _convert_dataclass(obj: Any, kvcy_cls: type, owner: str) -> dict[str, Any]:
    """Keyword arguments for ``kvcy_cls`` from the vLLM dataclass ``obj``, field by field.

    A field kvcy's class lacks is dropped when it holds vLLM's default (the feature is off)
    and refused otherwise.

    Raises:
        NotImplementedError: ``obj`` sets a field kvcy does not implement.
    """
    kvcy_fields = {f.name for f in dataclasses.fields(kvcy_cls) if f.init}
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(obj):
        if not field.init:
            continue
        value = getattr(obj, field.name)
        if field.name == "head_size_v" and value in (getattr(obj, "head_size", None), _NO_V.get(owner)):
            continue  # what vLLM derives when head_size_v is not given; kvcy derives the same
        if field.name in kvcy_fields:
            kwargs[field.name] = _convert_value(owner, field.name, value)
            continue
        default = _default(field)
        if default is dataclasses.MISSING or value != default:
            raise NotImplementedError(
                f"{owner}.{field.name}={value!r}: this vLLM feature is not supported by kvcy "
                f"(only its default, {default!r}, is)"
                if default is not dataclasses.MISSING
                else f"{owner}.{field.name}: this vLLM feature is not supported by kvcy"
            )
    return kwargs


def convert_kv_cache_spec(spec: Any) -> Any:
    """kvcy's spec (same class name, same field values) for one of vLLM 0.33.0's specs.

    Raises:
        NotImplementedError: a spec class kvcy does not have (the HiSparse specs, a
            model's own subclass), or a
            field set away from vLLM's default that kvcy does not implement.
        TypeError: ``spec`` is not a vLLM ``KVCacheSpec``.
    """
    from vllm.v1 import kv_cache_interface as vki

    from kvcy import kv_cache_interface as ki

    if not isinstance(spec, vki.KVCacheSpec):
        raise TypeError(f"expected a vLLM KVCacheSpec, got {type(spec).__name__}")
    name = type(spec).__name__
    if getattr(vki, name, None) is not type(spec):
        raise NotImplementedError(f"{type(spec).__module__}.{name}: KV-cache spec types outside vLLM 0.33.0's "
                                  "kv_cache_interface are not supported by kvcy")
    kvcy_cls = getattr(ki, name, None)
    if not (isinstance(kvcy_cls, type) and issubclass(kvcy_cls, ki.KVCacheSpec)):
        raise NotImplementedError(f"{name}: this vLLM KV-cache spec is not supported by kvcy")
    converted = kvcy_cls(**_convert_dataclass(spec, kvcy_cls, name))
    try:
        sizes = (spec.page_size_bytes, converted.page_size_bytes)
    except NotImplementedError:  # a spec with no page size in one of the two
        return converted
    if sizes[0] != sizes[1]:
        raise NotImplementedError(
            f"{name}: vLLM 0.33.0 gives this spec a page of {sizes[0]} bytes, kvcy {sizes[1]}; "
            f"kvcy does not support it ({spec!r})"
        )
    return converted


def convert_kv_cache_group_spec(group: Any) -> Any:
    """kvcy's ``KVCacheGroupSpec`` for one of vLLM's.

    Raises:
        NotImplementedError: a group role other than the default (HiSparse), a host-resident
            group, or a spec kvcy does not support.
    """
    from kvcy import kv_cache_interface as ki

    # vLLM's role maps onto kvcy's KVCacheGroupRole (_convert_value); kvcy's
    # KVCacheGroupSpec refuses the HiSparse roles and host residency itself.
    kwargs = _convert_dataclass(group, ki.KVCacheGroupSpec, "KVCacheGroupSpec")
    kwargs["layer_names"] = list(kwargs["layer_names"])
    return ki.KVCacheGroupSpec(**kwargs)


def convert_kv_cache_config(config: Any) -> Any:
    """kvcy's ``KVCacheConfig`` for vLLM 0.33.0's: blocks, tensors and groups, field by field.

    The fields vLLM's engine core resolves for its workers and connectors
    (``kv_cache_layout``, ``hash_block_size``, ``cache_hit_alignment_tokens``,
    ``kv_tp_replicas``) are carried over as they are; neither manager reads them.  A config
    that is kvcy's already is returned as it is.

    Raises:
        NotImplementedError: HiSparse settings, or a group or spec kvcy does not support.
    """
    from kvcy import kv_cache_interface as ki

    if isinstance(config, ki.KVCacheConfig):
        return config  # already kvcy's (a caller that builds kvcy's specs itself)
    kvcy_fields = {f.name for f in dataclasses.fields(ki.KVCacheConfig)}
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name == "kv_cache_groups":
            kwargs[field.name] = [convert_kv_cache_group_spec(g) for g in value]
        elif field.name == "kv_cache_tensors":
            kwargs[field.name] = [
                ki.KVCacheTensor(**_convert_dataclass(t, ki.KVCacheTensor, "KVCacheTensor")) for t in value
            ]
        elif field.name in kvcy_fields:
            kwargs[field.name] = value
        elif value != _default(field):
            raise NotImplementedError(
                f"KVCacheConfig.{field.name}={value!r}: this vLLM feature is not supported by kvcy"
            )
    return ki.KVCacheConfig(**kwargs)


# ---------------------------------------------------------------------------------------------
# The factory vLLM's scheduler calls, and switching it on and off
# ---------------------------------------------------------------------------------------------


def make_kv_cache_manager(kv_cache_config: Any, *args: Any, **kwargs: Any) -> Any:
    """kvcy's ``KVCacheManager`` built from vLLM's config and the scheduler's arguments.

    This is what ``vllm.v1.core.sched.scheduler.KVCacheManager`` names while kvcy is
    installed; every argument but the config passes through unchanged.  A request that
    can never fit gets None from ``allocate_slots``, as from vLLM's manager (vLLM's engine
    sizes its pool so that none occurs), not kvcy's ValueError: the scheduler sees what
    vLLM's manager would give it.  Hits handed to ``allocate_slots`` are taken as they
    are, as vLLM's manager takes them, without kvcy's stale-hit check.
    """
    from kvcy.kv_cache_manager import KVCacheManager

    manager = KVCacheManager(convert_kv_cache_config(kv_cache_config), *args, **kwargs)
    manager.refuse_unservable = False
    manager.refuse_stale_hits = False
    return manager


def is_installed() -> bool:
    """Whether vLLM's scheduler builds kvcy's manager now (never imports vLLM)."""
    return _vllm_manager_class is not None


def install(*, block_hasher: bool | None = None) -> None:
    """Make vLLM 0.33.0's ``Scheduler`` build kvcy's ``KVCacheManager``, and vLLM's engine core
    hash requests with kvcy's block hasher.

    Idempotent.  Schedulers (and hashers) built before the call keep the ones they have.

    Args:
        block_hasher: whether ``get_request_block_hasher`` becomes kvcy's
            (:func:`make_request_block_hasher`); ``None`` (the default): yes, unless the
            environment variable ``KVCY_VLLM_BLOCK_HASHER`` is ``vllm``.  With ``False`` an
            earlier install's hasher is given back.

    Raises:
        ImportError / RuntimeError: vLLM is missing, or is not 0.33.0.
        RuntimeError: something else has already replaced the scheduler's ``KVCacheManager``
            or vLLM's ``get_request_block_hasher``.
        ValueError: ``KVCY_VLLM_BLOCK_HASHER`` is neither ``kvcy`` nor ``vllm``.
    """
    global _vllm_manager_class
    if block_hasher is None:
        choice = os.environ.get(_HASHER_ENV, "kvcy")
        if choice not in ("kvcy", "vllm"):
            raise ValueError(f"{_HASHER_ENV} must be 'kvcy' or 'vllm', got {choice!r}")
        block_hasher = choice == "kvcy"
    scheduler = _scheduler_module()
    with _lock:
        current = scheduler.KVCacheManager
        if current is not make_kv_cache_manager:
            from vllm.v1.core.kv_cache_manager import KVCacheManager as vllm_manager

            if current is not vllm_manager:
                raise RuntimeError(
                    "vllm.v1.core.sched.scheduler.KVCacheManager is neither vLLM's nor kvcy's "
                    f"({current!r}); kvcy will not replace another replacement"
                )
        if block_hasher:
            _install_hasher()
        else:
            _uninstall_hasher()
        if current is not make_kv_cache_manager:
            _vllm_manager_class = current
            scheduler.KVCacheManager = make_kv_cache_manager


def uninstall() -> None:
    """Give vLLM's scheduler its own ``KVCacheManager`` back, and vLLM's engine core its own
    block hasher (a no-op when kvcy is not installed)."""
    global _vllm_manager_class
    with _lock:
        _uninstall_hasher()
        if _vllm_manager_class is None:
            return
        from vllm.v1.core.sched import scheduler

        if scheduler.KVCacheManager is make_kv_cache_manager:
            scheduler.KVCacheManager = _vllm_manager_class
        _vllm_manager_class = None


@contextmanager
def installed() -> Iterator[None]:
    """kvcy's manager inside the ``with`` block, whatever was in place before it after."""
    was_installed = is_installed()
    install()
    try:
        yield
    finally:
        if not was_installed:
            uninstall()


def load_general_plugin() -> None:
    """vLLM's ``vllm.general_plugins`` entry point: :func:`install`.

    vLLM calls it in every process it starts (engine core, workers) before it builds a
    scheduler.  Select or leave out plugins with ``VLLM_PLUGINS`` (a comma-separated list of
    plugin names; kvcy's is ``kvcy``).

    With ``KVCY_VLLM_OFFLOADING=1`` it also makes vLLM's default offloading spec,
    ``"CPUOffloadingSpec"``, load kvcy's CPU tier (:func:`kvcy.kv_offload.vllm_spec.install`).
    """
    install()
    if os.environ.get("KVCY_VLLM_OFFLOADING") == "1":
        from kvcy.kv_offload import vllm_spec

        vllm_spec.install()


# ---------------------------------------------------------------------------------------------
# vLLM's request block hasher on kvcy
# ---------------------------------------------------------------------------------------------


def _vllm_none_hash() -> Any:
    """vLLM's current ``NONE_HASH`` (set by its ``init_none_hash``), read when a request's first
    block is hashed, as vLLM's own hasher reads it."""
    from vllm.v1.core import kv_cache_utils

    return kv_cache_utils.NONE_HASH


def _vllm_algorithm(caching_hash_fn: Any) -> str | None:
    """The name of vLLM's hash function ``caching_hash_fn`` (``vllm.utils.hashing``), if it is one."""
    from vllm.utils import hashing

    for name in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"):
        if caching_hash_fn is getattr(hashing, name, None):
            return name
    return None


def make_request_block_hasher(hash_block_size: int, caching_hash_fn: Any, num_hash_lookahead_tokens: int = 0) -> Any:
    """vLLM 0.33.0's ``get_request_block_hasher`` on kvcy: the callable vLLM's ``Request`` calls
    to hash its not-yet-hashed full blocks, returning the same ``BlockHash`` bytes as vLLM's.

    vLLM's own algorithms (``vllm.utils.hashing``: sha256, sha256_cbor, xxhash, xxhash_cbor)
    run in the selected twin of ``kvcy._fast.hashing`` (the whole chain and the extra keys in
    one call), chained to vLLM's ``NONE_HASH``; any other function gets vLLM's own hasher.
    """
    algo = _vllm_algorithm(caching_hash_fn)
    if algo is None:
        return _vllm_get_request_block_hasher()(hash_block_size, caching_hash_fn, num_hash_lookahead_tokens)
    from kvcy import _fast

    return _fast.hashing.RequestBlockHasher(hash_block_size, algo, _vllm_none_hash,
                                            num_hash_lookahead_tokens=num_hash_lookahead_tokens)


def _vllm_get_request_block_hasher() -> Any:
    """vLLM's own ``get_request_block_hasher``, whether or not kvcy's replaces it now."""
    if _vllm_hasher_factory is not None:
        return _vllm_hasher_factory
    from vllm.v1.core import kv_cache_utils

    return kv_cache_utils.get_request_block_hasher


def _install_hasher() -> None:
    """Points every module of :data:`_HASHER_MODULES` that is imported at kvcy's hasher (the
    engine core, imported later, takes it from ``kv_cache_utils``).  Called with the lock held."""
    global _vllm_hasher_factory
    from vllm.v1.core import kv_cache_utils

    current = kv_cache_utils.get_request_block_hasher
    if current is not make_request_block_hasher:
        vllms_own = (getattr(current, "__module__", None) == kv_cache_utils.__name__
                     and getattr(current, "__qualname__", None) == "get_request_block_hasher")
        if not vllms_own:
            raise RuntimeError(
                "vllm.v1.core.kv_cache_utils.get_request_block_hasher is neither vLLM's nor kvcy's "
                f"({current!r}); kvcy will not replace another replacement"
            )
        _vllm_hasher_factory = current
    for name in _HASHER_MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "get_request_block_hasher", None) is _vllm_hasher_factory:
            module.get_request_block_hasher = make_request_block_hasher


def _uninstall_hasher() -> None:
    """Gives every module kvcy's hasher was put into vLLM's back.  Called with the lock held."""
    global _vllm_hasher_factory
    if _vllm_hasher_factory is None:
        return
    for name in _HASHER_MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "get_request_block_hasher", None) is make_request_block_hasher:
            module.get_request_block_hasher = _vllm_hasher_factory
    _vllm_hasher_factory = None


def block_hasher_installed() -> bool:
    """Whether vLLM's ``get_request_block_hasher`` is kvcy's now (never imports vLLM)."""
    return _vllm_hasher_factory is not None
