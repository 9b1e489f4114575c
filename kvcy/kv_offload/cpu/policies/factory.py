"""Cache policies by name (``vllm.v1.kv_offload.cpu.policies.factory``).

Built in: ``"lru"`` and ``"arc"``.  More can be registered by module path and
class name, and are imported only when first asked for.
"""

from __future__ import annotations

import importlib
from typing import ClassVar

from kvcy.kv_offload import _twin

__all__ = ["CachePolicyFactory"]


def _policy_bases() -> tuple[type, ...]:
    bases = [_twin.twin.CachePolicy]
    python = _twin.load("python").CachePolicy
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
        """Make ``name`` resolve to ``module_path.class_name``.

        Raises:
            TypeError: an argument is not a str.
            ValueError: ``name`` is already registered.
        """
        for arg, value in (("name", name), ("module_path", module_path), ("class_name", class_name)):
            if not isinstance(value, str):
                raise TypeError(f"{arg} must be a str, got {type(value).__name__}")
        if name in cls._registry:
            raise ValueError(f"cache policy {name!r} is already registered")
        cls._registry[name] = (module_path, class_name)

    @classmethod
    def get_cache_policy_cls(cls, name: str, module_path: str | None = None) -> type:
        """The policy class registered as ``name``, or the class ``name`` of ``module_path``.

        Raises:
            ValueError: ``name`` is not registered (the message lists the known names).
            ImportError: the module does not import.
            TypeError: what was found is not a ``CachePolicy`` subclass.
        """
        if not isinstance(name, str):
            raise TypeError(f"cache policy name must be a str, got {type(name).__name__}")
        if module_path is None:
            entry = cls._registry.get(name)
            if entry is None:
                known = ", ".join(repr(n) for n in sorted(cls._registry))
                raise ValueError(f"unknown cache policy {name!r}; known policies: {known}")
            module_path, class_name = entry
        else:
            class_name = name
        module = importlib.import_module(module_path)
        try:
            policy_cls = getattr(module, class_name)
        except AttributeError:
            raise ValueError(f"module {module_path!r} has no cache policy class {class_name!r}") from None
        if not (isinstance(policy_cls, type) and issubclass(policy_cls, _policy_bases())):
            raise TypeError(f"{module_path}.{class_name} is not a CachePolicy subclass")
        return policy_cls
