"""Which manager serves a spec class, and which spec classes may share a group:
:class:`KVCacheSpecRegistry` and the :func:`register_kv_cache_spec` decorator.

As in vLLM 0.33.0, a spec class is looked up by walking its MRO to the nearest
registered class, so a subclass of a built-in spec is served like its base.
The built-in specs are registered on first use, with the managers of the
selected twin (``kvcy._fast``).  kvcy's coordinators pick managers from their
own map by the same MRO rule; the registry answers for grouping
(:meth:`KVCacheSpec.is_uniform_with_collection`) and for callers that ask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["KVCacheSpecMetadata", "KVCacheSpecRegistry", "register_kv_cache_spec"]


@dataclass(frozen=True)
class KVCacheSpecMetadata:
    """One registration: the spec class, its manager, and the base class whose
    instances may share a KV-cache group with it."""

    kvcache_spec_cls: type
    manager_class: type
    uniform_type_base_spec: type


_REGISTRY: dict[type, KVCacheSpecMetadata] = {}
_ROLE_MANAGERS: dict[str, type] = {}
_builtins_registered = False


class KVCacheSpecRegistry:
    """Registry of KV-cache spec classes (class methods only, one global table)."""

    @classmethod
    def _ensure_registered(cls) -> None:
        global _builtins_registered
        if _builtins_registered:
            return
        _builtins_registered = True
        from kvcy import kv_cache_interface as ki
        from kvcy._fast import kv_cache as twin

        full = twin.FullAttentionManager
        for spec_cls, manager, base in (
            (ki.FullAttentionSpec, full, ki.FullAttentionSpec),
            (ki.SlidingWindowSpec, twin.SlidingWindowManager, ki.SlidingWindowSpec),
            (ki.SlidingWindowMLASpec, twin.SlidingWindowManager, ki.SlidingWindowMLASpec),
            (ki.CircularBufferSpec, twin.CircularBufferManager, ki.CircularBufferSpec),
            (ki.MambaSpec, twin.MambaManager, ki.MambaSpec),
            (ki.ChunkedLocalAttentionSpec, twin.ChunkedLocalAttentionManager, ki.ChunkedLocalAttentionSpec),
            (ki.CrossAttentionSpec, twin.CrossAttentionManager, ki.CrossAttentionSpec),
            # full-attention subclasses group with full attention
            (ki.MLAAttentionSpec, full, ki.FullAttentionSpec),
            (ki.RSWASpec, twin.RSWAManager, ki.FullAttentionSpec),
            (ki.HiddenStateCacheSpec, full, ki.FullAttentionSpec),
            (ki.SinkFullAttentionSpec, twin.SinkFullAttentionManager, ki.FullAttentionSpec),
            (ki.TQFullAttentionSpec, full, ki.FullAttentionSpec),
        ):
            if spec_cls not in _REGISTRY:
                cls.register(spec_cls, manager, uniform_type_base_spec=base)

    @classmethod
    def register(
        cls,
        kvcache_spec_cls: type,
        manager_class: type | None = None,
        uniform_type_base_spec: type | None = None,
    ) -> None:
        """Register ``kvcache_spec_cls``, served by ``manager_class``, grouping with
        ``uniform_type_base_spec`` (itself when None).

        Raises:
            AssertionError: no manager class, a base the class does not inherit
                from, or a registration that conflicts with an earlier one (as in vLLM).
        """
        assert manager_class is not None, "manager_class is required"
        if uniform_type_base_spec is None:
            uniform_type_base_spec = kvcache_spec_cls
        assert isinstance(kvcache_spec_cls, type) and issubclass(kvcache_spec_cls, uniform_type_base_spec), (
            f"{getattr(kvcache_spec_cls, '__name__', kvcache_spec_cls)} must inherit from its declared "
            f"uniform_type_base_spec {uniform_type_base_spec.__name__}."
        )
        known = _REGISTRY.get(kvcache_spec_cls)
        if known is not None:
            assert (known.manager_class, known.uniform_type_base_spec) == (manager_class, uniform_type_base_spec), (
                f"Conflicting registration for KVCacheSpec : {kvcache_spec_cls.__name__}"
            )
        _REGISTRY[kvcache_spec_cls] = KVCacheSpecMetadata(kvcache_spec_cls, manager_class, uniform_type_base_spec)

    @classmethod
    def register_role_manager(cls, role: str, manager_class: type) -> None:
        """Serve every group of ``role`` with ``manager_class``.

        Raises:
            AssertionError: the role already has another manager (as in vLLM).
        """
        known = _ROLE_MANAGERS.get(role)
        assert known is None or known is manager_class, f"Conflicting manager registration for group role {role}"
        _ROLE_MANAGERS[role] = manager_class

    @classmethod
    def _lookup(cls, kvcache_spec: Any) -> KVCacheSpecMetadata | None:
        cls._ensure_registered()
        for base in type(kvcache_spec).__mro__:
            if base in _REGISTRY:
                return _REGISTRY[base]
        return None

    @classmethod
    def get_manager_class(cls, kvcache_spec: Any, role: str | None = None) -> type | None:
        """The manager class for a spec (a role's manager first), or None if unregistered."""
        cls._ensure_registered()
        if role is not None and role in _ROLE_MANAGERS:
            return _ROLE_MANAGERS[role]
        found = cls._lookup(kvcache_spec)
        return None if found is None else found.manager_class

    @classmethod
    def get_uniform_type_base_spec(cls, kvcache_spec: Any) -> type | None:
        """The class a spec groups with, or None if its class is unregistered."""
        found = cls._lookup(kvcache_spec)
        return None if found is None else found.uniform_type_base_spec

    @classmethod
    def check_kv_cache_spec_registry(cls, kv_cache_spec: dict[str, Any]) -> None:
        """Check that every layer's spec class is registered.

        Raises:
            ValueError: a layer whose spec class is not registered (as in vLLM).
        """
        for layer_name, spec in kv_cache_spec.items():
            if cls._lookup(spec) is None:
                raise ValueError(
                    f"Unsupported KV cache spec type for layer {layer_name}: {type(spec)}. "
                    "Please register it using @register_kv_cache_spec decorator."
                )


def register_kv_cache_spec(manager_class: type | None = None, uniform_type_base_spec: type | None = None):
    """Class decorator: :meth:`KVCacheSpecRegistry.register` the decorated spec class."""

    def decorator(kvcache_spec_cls: type) -> type:
        KVCacheSpecRegistry.register(kvcache_spec_cls, manager_class, uniform_type_base_spec)
        return kvcache_spec_cls

    return decorator
