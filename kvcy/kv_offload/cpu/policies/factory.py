"""Cache policies by name (``vllm.v1.kv_offload.cpu.policies.factory``).

Built in: ``"lru"`` and ``"arc"``.  More can be registered by module path and
class name, and are imported only when first asked for.
"""

from __future__ import annotations

import importlib
from typing import ClassVar

from kvcy import _fast

__all__ = ["CachePolicyFactory"]


def _policy_bases() -> tuple[type, ...]:
    bases = [_fast.offload.CachePolicy]
    python = _fast.load("python")["offload"].CachePolicy
    if python not in bases:
        bases.append(python)
    return tuple(bases)


class CachePolicyFactory:
    """A registry of cache-policy classes by name, imported lazily."""

    _registry: ClassVar[dict[str, tuple[str, str]]] = {
        "lru": ("kvcy.kv_offload.cpu.policies.lru", "LRUCachePolicy"),
        "arc": ("kvcy.kv_offload.cpu.policies.arc", "ARCCachePolicy"),
    }

    @classmethod
    def register_cache_policy(cls, name: str, module_path: str, class_name: str) -> None:
        """Make ``name`` resolve to ``module_path.class_name`` (imported when first asked for).

        Raises:
            TypeError: an argument is not a str.
            ValueError: ``name`` is already registered.
        """
        for arg, value in (("name", name), ("module_path", module_path), ("class_name", class_name)):
            if not isinstance(value, str):
                raise TypeError(f"{arg} must be a str, got {type(value).__name__}")
        if name in cls._registry:
            raise ValueError(f"Cache policy '{name}' is already registered.")
        cls._registry[name] = (module_path, class_name)

    @classmethod
    def get_cache_policy_cls(cls, name: str, module_path: str | None = None) -> type:
        """The policy class registered as ``name``; else, with ``module_path``, the class
        ``name`` of that module (an out-of-tree policy, no registration needed).

        Raises:
            TypeError: ``name`` is not a str, or what ``module_path`` holds under
                ``name`` is not a class.
            ValueError: ``name`` is not registered and no ``module_path`` is given
                (the message lists the registered names).
            ImportError: the module does not import.
            AttributeError: the module has no ``name``.
            AssertionError: what was found is not a ``CachePolicy`` subclass (vLLM asserts).
        """
        if not isinstance(name, str):
            raise TypeError(f"cache policy name must be a str, got {type(name).__name__}")
        entry = cls._registry.get(name)
        if entry is not None:
            module_path, class_name = entry
        elif module_path is None:
            raise ValueError(
                f"Unknown cache policy: {name!r}. Supported: {list(cls._registry)}. "
                "For an out-of-tree policy, also set cache_policy_module_path."
            )
        else:
            class_name = name
        policy_cls = getattr(importlib.import_module(module_path), class_name)
        if entry is None:
            if not isinstance(policy_cls, type):
                raise TypeError(f"{module_path}.{class_name} is not a class")
            assert issubclass(policy_cls, _policy_bases())
        return policy_cls
