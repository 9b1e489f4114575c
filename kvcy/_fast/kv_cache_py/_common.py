"""Module-level helpers the pure-Python twin's concepts share.

Argument checks (counts, indices, request ids), ``cdiv``, and ``_Checked``: the
attribute-assignment rules that make the twin's objects refuse what the compiled
twin's typed ``cdef class`` fields refuse.  No vLLM counterpart (``cdiv`` is
``vllm.utils.math_utils.cdiv``).
"""

from __future__ import annotations

import operator
from typing import Any



def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_count(name: str, value: Any) -> int:
    """A non-negative int argument, or a clear TypeError / ValueError."""
    if value.__class__ is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    if value > 2**62:
        raise ValueError(f"{name} is too large: {value}")
    return value



def _as_index(name: str, value: Any) -> int:
    """An integer field as the compiled twin's C integer fields take it (any int, bools
    included, within 64 bits), or TypeError / OverflowError."""
    value = operator.index(value)
    if not -(2**63) <= value < 2**63:
        raise OverflowError("Python int too large to convert to C ssize_t")
    return value


def _list_or_none(name: str, value: Any) -> Any:
    if value is not None and value.__class__ is not list:
        raise TypeError(f"Expected list, got {type(value).__name__}")
    return value


def _tuple_or_none(name: str, value: Any) -> Any:
    if value is not None and value.__class__ is not tuple:
        raise TypeError(f"Expected tuple, got {type(value).__name__}")
    return value


_READ_ONLY = None  # a rule: set once (by the constructor), never again


def _no_arguments(cls: type) -> str:
    """The refusal of an object made without its arguments (``cls.__new__(cls)`` alone), as the compiled twin's."""
    return (f"{cls.__name__} cannot be made without its arguments (by __new__ alone); "
            f"construct it as {cls.__name__}(...)")


class _NeedsArguments:
    """Refuses ``cls.__new__(cls)`` without arguments: the compiled twin's object would hold no pool or coordinator."""

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            raise TypeError(_no_arguments(cls))
        return super().__new__(cls)


class _Checked:
    """Attribute assignment as the compiled twin's typed fields allow it.

    ``_RULES`` maps a public name to ``_READ_ONLY`` (the constructor sets it
    once; later assignments and deletions raise AttributeError, as for a
    ``readonly`` C field) or to a function ``(name, value) -> value`` that
    checks (and may convert) what is assigned.  Other names are free.  Reads
    are plain attribute reads, so hot paths pay nothing; the twin's own code
    re-sets a read-only field with ``object.__setattr__``.
    """

    __slots__ = ()
    _RULES: dict[str, Any] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        rules = self._RULES
        if name in rules:
            rule = rules[name]
            if rule is _READ_ONLY:
                if _has_attr(self, name):
                    raise AttributeError(f"attribute '{name}' of '{type(self).__name__}' objects is not writable")
            else:
                value = rule(name, value)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._RULES:
            raise AttributeError(f"attribute '{name}' of '{type(self).__name__}' objects is not writable")
        object.__delattr__(self, name)


def _has_attr(obj: Any, name: str) -> bool:
    try:
        object.__getattribute__(obj, name)
    except AttributeError:
        return False
    return True


def _request_id(request: Any) -> str:
    try:
        request_id = request.request_id
    except AttributeError:
        raise TypeError(f"expected a Request, got {type(request).__name__}") from None
    if request_id.__class__ is not str:
        _check_rid(request_id)
    return request_id


def _lookahead_count(name: str, value: Any) -> int:
    # A lookahead token count (the constructors' keywords): a non-negative int (a bool is one,
    # as in vLLM, whose own tests pass lookahead=True for one token).
    if not isinstance(value, int) or not 0 <= value <= 2**62:
        raise ValueError(f"{name} must be a non-negative int (at most 2**62), got {value!r}")
    return int(value)


def _hashed(request: Any, num_tokens: int, hash_block_size: int) -> int:
    # Of the first num_tokens tokens, those the request has block hashes for.
    n = len(request.block_hashes) * hash_block_size
    return num_tokens if num_tokens < n else n


def _check_rid(request_id: Any) -> None:
    if not isinstance(request_id, str):
        raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
