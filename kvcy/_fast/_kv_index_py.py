"""Pure-Python twin of the KV-aware routing index (``kvcy.kv_index.KVIndex``).

A fleet of vLLM / kvcy instances each publish KV-cache events
(``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``); the index folds
them into "which instance holds which block hash, in which medium" and answers
a router's question: for a request's chained block hashes, how many leading
blocks does each instance hold?  ``_kv_index_c.pyx`` is the compiled twin, with
the same names, signatures, docstrings, messages and decisions; this one keeps
the entries in dicts and each set of instances as an int bitmask (one bit per
instance), so that a query narrows the running set with one ``&`` per hash.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from kvcy.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, as_kv_event_batch

__all__ = ["IMPLEMENTATION", "MAX_INSTANCES", "MAX_INSTANCE_MEDIUMS", "MAX_MEDIUMS", "KVIndex"]

IMPLEMENTATION = "python"

#: At most this many instances are known at once (``remove_instance`` frees a place).
MAX_INSTANCES = 65536
#: At most this many distinct mediums (``None`` is one) in use at once; ``None``, ``"GPU"``,
#: ``"CPU"`` and ``"STORAGE"`` always find a place.
MAX_MEDIUMS = 256
#: At most this many mediums besides those four may one instance use (until it is removed).
MAX_INSTANCE_MEDIUMS = 8

#: The mediums vLLM's events name (and None): never refused, counted in no instance's bound.
_COMMON_MEDIUMS = frozenset((None, "GPU", "CPU", "STORAGE"))

_HASH_LIMIT = 1 << 64

Hash = int | bytes
Medium = str | None


def _instance_name(instance: object, what: str = "instance") -> str:
    """``instance`` as a plain ``str`` (a subclass's value, without its methods)."""
    if type(instance) is str:
        return instance
    if not isinstance(instance, str):
        raise TypeError(f"{what} must be a str, got {type(instance).__name__}")
    return str.__str__(instance)


def _check_hash(h: object, where: str) -> Hash:
    """``h`` as the index keeps it: an ``int`` subclass's value as a plain ``int`` (its own
    ``__hash__``/``__eq__`` must not decide a lookup: the compiled twin keys by the value)."""
    if isinstance(h, int) and not isinstance(h, bool):
        if h < 0 or h >= _HASH_LIMIT:
            raise ValueError(f"{where}: block hash {h} is not an unsigned 64-bit int")
        return h if type(h) is int else int.__int__(h)
    if type(h) is not bytes:
        raise TypeError(f"{where}: a block hash is an int or bytes, got {type(h).__name__}")
    return h  # type: ignore[return-value]


def _checked_hashes(hashes: Sequence[Any], where: str) -> Sequence[Hash]:
    """``hashes`` checked, as the index keeps them (a new list only if an ``int`` subclass is in).

    Plain hashes (an ``int`` in range, a ``bytes``) pass inline, with no call or message made
    per hash; the first other one sends the whole sequence through :func:`_check_hash`."""
    for h in hashes:
        t = type(h)
        if t is bytes or (t is int and 0 <= h < _HASH_LIMIT):
            continue
        return [_check_hash(h, f"{where}[{j}]") for j, h in enumerate(hashes)]
    return hashes


def _check_medium(medium: object, where: str) -> None:
    if medium is not None and type(medium) is not str:
        raise TypeError(f"{where} must be a str or None, got {type(medium).__name__}")


def _check_mediums(index: Any, instance: str, new: list[Medium]) -> None:
    """Refuse ``new`` (mediums new to ``instance``) past the instance's or the index's bound."""
    if not new:
        return
    used = index._mediums_of.get(instance, ())
    mine = sum(m not in _COMMON_MEDIUMS for m in used) + sum(m not in _COMMON_MEDIUMS for m in new)
    if mine > MAX_INSTANCE_MEDIUMS:
        raise ValueError(f"instance {instance!r} names more than {MAX_INSTANCE_MEDIUMS} mediums "
                         "besides GPU, CPU, STORAGE and None")
    others = sum(m not in _COMMON_MEDIUMS and m not in index._users for m in new)
    if index._others + others > MAX_MEDIUMS - len(_COMMON_MEDIUMS):
        raise ValueError(f"the index holds at most {MAX_MEDIUMS} mediums")


def _query_hashes(block_hashes: object) -> Sequence[Any]:
    """``block_hashes`` as a sequence to walk: a list or tuple as is, a buffer of unsigned
    64-bit ints read as ints, any other iterable as a list (``str``/``bytes`` refused)."""
    if isinstance(block_hashes, (list, tuple)):
        return block_hashes
    if isinstance(block_hashes, (str, bytes, bytearray)):
        raise TypeError(f"block_hashes must be a sequence of block hashes, got {type(block_hashes).__name__}")
    try:
        view = memoryview(block_hashes)  # type: ignore[arg-type]
    except TypeError:
        items: list[Any] = list(block_hashes)  # type: ignore[call-overload]
        return items
    with view:
        if view.ndim != 1 or view.itemsize != 8 or view.format not in ("Q", "L", "@Q", "@L", "=Q", "<Q") \
                or not view.c_contiguous:
            raise TypeError("block_hashes as a buffer must be a 1-D C-contiguous array of unsigned 64-bit ints "
                            f"(format 'Q' or 'L'), got format {view.format!r} with {view.ndim} dimension(s)")
        ints: list[Any] = view.tolist()
        return ints


class KVIndex:
    """Which instance of a fleet holds which KV-cache block, from their KV events.

    Each instance (any ``str``, kept as a plain ``str``: ``"host:port"``, ``"host:port/dp0"``)
    publishes ``KVEventBatch``es; :meth:`apply_batch` / :meth:`apply_events` fold them into
    entries, one per ``(instance, medium, block hash)``; :meth:`longest_prefix` tells, for a
    request's chained block hashes (hash ``i`` stands for the prefix up to block ``i``), how
    many leading blocks each instance holds, and :meth:`best_instance` picks the longest.

    Semantics, the same in both twins:

    * An entry is reference-counted: each ``BlockStored`` hash adds one, each ``BlockRemoved``
      hash takes one away, and the entry is gone at zero.  A hash stored twice in one medium
      (by two KV-cache groups of a hybrid model, or by two blocks of one group, as vLLM's
      prefix cache allows) and removed once is still held: vLLM evicts, and reports, each
      copy apart.  (With vLLM's ``kv_cache_report_mode="full"``, prefix hits are re-reported
      as ``BlockStored`` with no removal to match, so an entry can outlive its blocks until
      ``AllBlocksCleared`` or :meth:`remove_instance`.)  ``group_idx`` is not kept otherwise.
    * Mediums are apart: a hash in ``"GPU"`` and ``"CPU"`` is two entries; removing one leaves
      the other.  ``None`` is a medium of its own; ``medium=None`` in a query means any.  A
      medium is in use from the first event of an instance that names it until every instance
      that named one is removed; one instance may name at most ``MAX_INSTANCE_MEDIUMS``
      mediums besides ``None``, ``"GPU"``, ``"CPU"`` and ``"STORAGE"`` (so that no instance
      can fill the index's ``MAX_MEDIUMS`` and refuse the others' stores), and those four
      always find a place.
    * A ``BlockRemoved`` hash not held in that medium is a no-op, counted
      (``stats["removals_unknown"]``).  ``AllBlocksCleared`` forgets all the instance holds,
      in every medium (vLLM sends it when its prefix cache is reset).
    * Hashes are kept as received: ``int`` (vLLM's default, the low 64 bits) or ``bytes``
      (``use_int_block_hashes=False``); ``5`` and ``b"\\x05"`` differ, so do not mix the forms
      in one fleet.  ``bool`` and ``bytes`` subclasses are no hashes.  LoRA fields are ignored
      (vLLM's hashes cover the adapter's name), and so is ``data_parallel_rank`` (name the
      instances per rank to tell the ranks apart).
    * With ``max_blocks``, a store that would make one entry too many first drops the least
      recently stored entry (storing one again makes it the most recent), whatever its count,
      counted in ``stats["entries_dropped"]``; a later removal of it counts as unknown.

    Bad input raises before the call changes anything: ``TypeError`` for a name that is not a
    ``str``, an event not of the three classes, ``block_hashes`` not a list or tuple, a hash
    neither ``int`` nor ``bytes``, a medium neither ``str`` nor ``None``; ``ValueError`` for an
    ``int`` hash outside ``[0, 2**64)`` or more than ``MAX_INSTANCES`` instances,
    ``MAX_MEDIUMS`` mediums or ``MAX_INSTANCE_MEDIUMS`` other mediums of one instance.
    """

    def __init__(self, max_blocks: int | None = 1048576) -> None:
        """Make an empty index, holding at most ``max_blocks`` entries (``None``: no bound).

        Over the bound the least recently stored entry goes first: it is the likeliest to have
        left its instance's cache already, as vLLM evicts its least recently used blocks first.
        The default bound, 2**20 entries (``memory_bytes`` about 130 MiB in the compiled twin,
        410 MiB in the pure one), keeps one flood of events from taking gigabytes; a fleet
        holding more blocks passes its own (``max_blocks`` and ``stats["entries_dropped"]``
        report it).

        Raises:
            TypeError: ``max_blocks`` is not an int or None.
            ValueError: ``max_blocks`` is below 1.
        """
        if max_blocks is not None:
            if not isinstance(max_blocks, int) or isinstance(max_blocks, bool):
                raise TypeError(f"max_blocks must be an int or None, got {type(max_blocks).__name__}")
            if max_blocks < 1:
                raise ValueError(f"max_blocks must be at least 1 (or None), got {max_blocks}")
        self._max_blocks = max_blocks
        # (instance, medium, hash) -> count, least recently stored first.
        self._entries: OrderedDict[tuple[str, Medium, Hash], int] = OrderedDict()
        # instance -> its (medium, hash) entries; the keys are the known instances, first seen first.
        self._by_instance: dict[str, dict[tuple[Medium, Hash], None]] = {}
        # Each known instance has a bit (a small id, reused once free); sets of instances are
        # ints with their bits set, so a query narrows them with one ``&`` per hash.
        self._bit: dict[str, int] = {}
        self._names: dict[int, str] = {}  # bit number -> instance
        self._alive = 0  # the known instances' bits
        # medium -> hash -> the instances holding it there; hash -> those holding it anywhere.
        self._by_medium: dict[Medium, dict[Hash, int]] = {}
        self._any: dict[Hash, int] = {}
        # instance -> the mediums its events named; medium -> the instances that named it.
        self._mediums_of: dict[str, set[Medium]] = {}
        self._users: dict[Medium, int] = {}
        self._others = 0  # mediums in use besides the common four
        self._stats = {
            "events_applied": 0,
            "batches_applied": 0,
            "blocks_stored": 0,
            "blocks_removed": 0,
            "removals_unknown": 0,
            "all_blocks_cleared": 0,
            "entries_cleared": 0,
            "entries_dropped": 0,
            "instances_removed": 0,
        }

    def __reduce__(self) -> str | tuple[Any, ...]:  # an index is rebuilt from KV events, never copied
        raise TypeError("a KVIndex cannot be pickled or copied: build a new one from the instances' KV events")

    # ------------------------------------------------------------------ properties
    @property
    def max_blocks(self) -> int | None:
        """The bound on entries held (``None``: unbounded)."""
        return self._max_blocks

    @property
    def instances(self) -> tuple[str, ...]:
        """The known instances, first seen first (``remove_instance`` forgets one)."""
        return tuple(self._by_instance)

    @property
    def mediums(self) -> tuple[str | None, ...]:
        """The mediums in use (named by a known instance's events), first seen first."""
        return tuple(self._by_medium)

    @property
    def memory_bytes(self) -> int:
        """An estimate of the memory the index holds, in bytes.

        ``sys.getsizeof`` of every container and of each distinct hash object
        (the instance and medium names are counted once).  It walks the whole
        index: time proportional to its size.
        """
        size = sys.getsizeof(self) + sys.getsizeof(self._entries) + sys.getsizeof(self._by_instance)
        size += sys.getsizeof(self._by_medium) + sys.getsizeof(self._any) + sys.getsizeof(self._stats)
        for key in self._entries:
            size += sys.getsizeof(key)
        for name, entries in self._by_instance.items():
            size += sys.getsizeof(name) + sys.getsizeof(entries)
            size += sum(sys.getsizeof(k) for k in entries)
        for per_hash in self._by_medium.values():
            size += sys.getsizeof(per_hash) + sum(sys.getsizeof(s) for s in per_hash.values())
        for h, holders in self._any.items():
            size += sys.getsizeof(h) + sys.getsizeof(holders)
        size += sys.getsizeof(self._bit) + sys.getsizeof(self._names)
        size += sys.getsizeof(self._mediums_of) + sys.getsizeof(self._users)
        size += sum(sys.getsizeof(s) for s in self._mediums_of.values())
        return size

    @property
    def stats(self) -> dict[str, int]:
        """Counters since the index was made (``clear()`` keeps them) and its size now.

        ``events_applied``: events applied; ``batches_applied``: ``apply_batch``
        calls; ``blocks_stored``: hashes in ``BlockStored`` events;
        ``blocks_removed``: ``BlockRemoved`` hashes that were held;
        ``removals_unknown``: those that were not (no-ops); ``all_blocks_cleared``:
        ``AllBlocksCleared`` events; ``entries_cleared``: entries they forgot;
        ``entries_dropped``: entries dropped by ``max_blocks``;
        ``instances_removed``: instances ``remove_instance`` forgot; then the size
        now: ``instances``, ``entries`` and ``hashes`` (distinct hash values held).
        """
        return {**self._stats, "instances": len(self._by_instance), "entries": len(self._entries),
                "hashes": len(self._any)}

    def num_blocks(self, instance: str | None = None) -> int:
        """Entries held by ``instance`` (a hash in two mediums counts twice), or by all with None.

        An unknown instance holds none.

        Raises:
            TypeError: ``instance`` is not a str or None.
        """
        if instance is None:
            return len(self._entries)
        instance = _instance_name(instance)
        entries = self._by_instance.get(instance)
        return 0 if entries is None else len(entries)

    # ------------------------------------------------------------------ events
    def apply_batch(self, instance: str, batch: KVEventBatch) -> int:
        """Apply one ``KVEventBatch`` published by ``instance`` (of any data-parallel rank; vLLM's
        own ``KVEventBatch`` is read as its msgpack form decodes: ``as_kv_event_batch``).

        Returns:
            The number of events applied (all of the batch's).

        Raises:
            TypeError, ValueError: as :meth:`apply_events`, or ``batch`` is not a ``KVEventBatch``.
        """
        instance = _instance_name(instance)
        batch = batch if isinstance(batch, KVEventBatch) else as_kv_event_batch(batch)  # (no call when it is one)
        applied = self.apply_events(instance, batch.events)
        self._stats["batches_applied"] += 1
        return applied

    def apply_events(self, instance: str, events: Sequence[BlockStored | BlockRemoved | AllBlocksCleared]) -> int:
        """Apply ``instance``'s events, in order; the instance becomes known (even with no events).

        Returns:
            The number of events applied.

        Raises:
            TypeError, ValueError: bad input (see the class docstring); nothing is applied then.
        """
        instance = _instance_name(instance)
        if type(events) is not tuple:  # a snapshot, as the compiled twin takes: checks cannot change it
            events = tuple(events)
        staged = self._stage_events(events)
        new_mediums = self._mediums_new_to(instance, staged)
        self._make_room(instance)
        self._commit_names(instance, new_mediums)
        self._apply_staged(instance, staged)
        self._stats["events_applied"] += len(events)
        return len(events)

    # The phases of apply_events, with the compiled twin's names: everything that can fail runs
    # before anything changes.
    def _stage_events(self, events: tuple) -> list[tuple[int, Medium, Sequence[Hash]]]:
        """Check every event; each one's kind (0 stored, 1 removed, 2 cleared), medium and hashes,
        read once (as the compiled twin does), so that they are applied as checked."""
        staged: list[tuple[int, Medium, Sequence[Hash]]] = []
        for i, ev in enumerate(events):
            if isinstance(ev, AllBlocksCleared):
                staged.append((2, None, ()))
                continue
            if not isinstance(ev, (BlockStored, BlockRemoved)):
                raise TypeError(f"events[{i}] is not a BlockStored, BlockRemoved or AllBlocksCleared: "
                                f"{type(ev).__name__}")
            hashes = ev.block_hashes
            if not isinstance(hashes, (list, tuple)):
                raise TypeError(f"events[{i}].block_hashes must be a list of block hashes, "
                                f"got {type(hashes).__name__}")
            hashes = _checked_hashes(tuple(hashes), f"events[{i}].block_hashes")
            medium = ev.medium
            _check_medium(medium, f"events[{i}].medium")
            staged.append((0 if isinstance(ev, BlockStored) else 1, medium, hashes))
        return staged

    def _mediums_new_to(self, instance: str, staged: list[tuple[int, Medium, Sequence[Hash]]]) -> list[Medium]:
        """The mediums the events name that ``instance`` has not named yet, in order of first
        appearance; refused if they take the instance past its bound."""
        used = self._mediums_of.get(instance, ())
        new_mediums: list[Medium] = []
        for kind, medium, _ in staged:
            if kind != 2 and medium not in used and medium not in new_mediums:
                new_mediums.append(medium)
        _check_mediums(self, instance, new_mediums)
        return new_mediums

    def _make_room(self, instance: str) -> None:
        """Refuse a new instance past ``MAX_INSTANCES`` (the compiled twin also reserves memory here)."""
        if instance not in self._by_instance and len(self._by_instance) >= MAX_INSTANCES:
            raise ValueError(f"the index holds at most {MAX_INSTANCES} instances")

    def _commit_names(self, instance: str, new_mediums: list[Medium]) -> None:
        """Register ``instance`` if it is new, and its new mediums."""
        if instance not in self._by_instance:
            self._by_instance[instance] = {}
            bit = next(b for b in range(len(self._names) + 1) if b not in self._names)
            self._bit[instance] = bit
            self._names[bit] = instance
            self._alive |= 1 << bit
        mine = self._mediums_of.setdefault(instance, set())
        for medium in new_mediums:
            mine.add(medium)
            if medium not in self._users:
                self._by_medium[medium] = {}
                self._users[medium] = 0
                self._others += medium not in _COMMON_MEDIUMS
            self._users[medium] += 1

    def _apply_staged(self, instance: str, staged: list[tuple[int, Medium, Sequence[Hash]]]) -> None:
        """Apply the checked events, in order."""
        for kind, medium, hashes in staged:
            if kind == 0:
                for h in hashes:
                    self._store(instance, medium, h)
                self._stats["blocks_stored"] += len(hashes)
            elif kind == 1:
                for h in hashes:
                    self._remove(instance, medium, h)
            else:
                self._stats["all_blocks_cleared"] += 1
                self._stats["entries_cleared"] += len(self._by_instance[instance])
                self._forget(instance)

    def _store(self, instance: str, medium: Medium, h: Hash) -> None:
        key = (instance, medium, h)
        count = self._entries.get(key)
        if count is not None:
            self._entries[key] = count + 1
            self._entries.move_to_end(key)
            return
        if self._max_blocks is not None and len(self._entries) >= self._max_blocks:
            self._drop(*next(iter(self._entries)))
            self._stats["entries_dropped"] += 1
        self._entries[key] = 1
        self._by_instance[instance][(medium, h)] = None
        bit = 1 << self._bit[instance]
        per_hash = self._by_medium[medium]
        per_hash[h] = per_hash.get(h, 0) | bit
        self._any[h] = self._any.get(h, 0) | bit

    def _remove(self, instance: str, medium: Medium, h: Hash) -> None:
        key = (instance, medium, h)
        count = self._entries.get(key)
        if count is None:
            self._stats["removals_unknown"] += 1
            return
        self._stats["blocks_removed"] += 1
        if count > 1:
            self._entries[key] = count - 1
        else:
            self._drop(instance, medium, h)

    def _drop(self, instance: str, medium: Medium, h: Hash) -> None:
        """Forget one entry, whatever its count."""
        del self._entries[(instance, medium, h)]
        del self._by_instance[instance][(medium, h)]
        bit = 1 << self._bit[instance]
        per_hash = self._by_medium[medium]
        holders = per_hash[h] & ~bit
        if holders:
            per_hash[h] = holders
        else:
            del per_hash[h]
        if not any(m.get(h, 0) & bit for m in self._by_medium.values()):
            anywhere = self._any[h] & ~bit
            if anywhere:
                self._any[h] = anywhere
            else:
                del self._any[h]

    def _forget(self, instance: str) -> None:
        for medium, h in list(self._by_instance[instance]):
            self._drop(instance, medium, h)

    def remove_instance(self, instance: str) -> None:
        """Forget ``instance`` and all it holds (it restarted, or fell silent); unknown: a no-op.

        Raises:
            TypeError: ``instance`` is not a str.
        """
        instance = _instance_name(instance)
        if instance not in self._by_instance:
            return
        self._forget(instance)
        del self._by_instance[instance]
        for medium in self._mediums_of.pop(instance, ()):  # released with the last one to name it
            self._users[medium] -= 1
            if not self._users[medium]:
                del self._users[medium]
                del self._by_medium[medium]
                self._others -= medium not in _COMMON_MEDIUMS
        bit = self._bit.pop(instance)
        del self._names[bit]
        self._alive &= ~(1 << bit)
        self._stats["instances_removed"] += 1

    def clear(self) -> None:
        """Forget every instance, entry and medium (the counters of ``stats`` are kept)."""
        self._entries.clear()
        self._by_instance.clear()
        self._by_medium.clear()
        self._any.clear()
        self._mediums_of.clear()
        self._users.clear()
        self._others = 0
        self._bit.clear()
        self._names.clear()
        self._alive = 0

    # ------------------------------------------------------------------ queries
    def longest_prefix(self, block_hashes: Sequence[int | bytes], medium: str | None = None) -> dict[str, int]:
        """For each known instance (first seen first), how many leading ``block_hashes`` it holds.

        Hash ``i`` of a chained sequence stands for the whole prefix up to block
        ``i``, so an instance's count is the index of the first hash it does not
        hold.  ``medium=None`` counts blocks held in any medium.  Time is
        proportional to the number of hashes, not to the index's size.

        Args:
            block_hashes: the request's block hashes, ints or bytes as the events
                carry them; also an ``array('Q')`` (or another 1-D C-contiguous
                buffer of unsigned 64-bit ints, format ``'Q'`` or ``'L'``).
            medium: count only blocks held in this medium (``None``: any).

        Returns:
            ``{instance: number of leading blocks it holds}``, 0 included.

        Raises:
            TypeError, ValueError: a hash (every one is checked) or ``medium`` is bad.
        """
        _check_medium(medium, "medium")
        hashes = _checked_hashes(_query_hashes(block_hashes), "block_hashes")
        result = dict.fromkeys(self._by_instance, 0)
        table = self._any if medium is None else self._by_medium.get(medium, {})
        alive = self._alive  # the instances still in the running
        depth = 0
        for h in hashes:
            if not alive:
                break
            kept = alive & table.get(h, 0)
            gone = alive ^ kept
            while gone:  # those that do not hold this block stop here
                low = gone & -gone
                result[self._names[low.bit_length() - 1]] = depth
                gone ^= low
            alive = kept
            depth += 1
        while alive:  # the others hold every block
            low = alive & -alive
            result[self._names[low.bit_length() - 1]] = depth
            alive ^= low
        return result

    def best_instance(
        self,
        block_hashes: Sequence[int | bytes],
        medium: str | None = None,
        candidates: Sequence[str] | None = None,
    ) -> tuple[str | None, int]:
        """The instance holding the longest prefix of ``block_hashes``, and its length.

        Among ``candidates`` (all known instances when None; an unknown one holds
        nothing), the first with the longest prefix wins a tie, in the
        candidates' order (first seen first without them).

        Returns:
            ``(instance, number of leading blocks)``; ``(None, 0)`` with no candidates.

        Raises:
            TypeError, ValueError: as :meth:`longest_prefix`, or a candidate is not a str.
        """
        if candidates is not None:
            if isinstance(candidates, (str, bytes)):
                raise TypeError(f"candidates must be a sequence of instance names, got {type(candidates).__name__}")
            candidates = [_instance_name(c, "a candidate") for c in candidates]
        prefix = self.longest_prefix(block_hashes, medium)
        names: Iterable[str] = prefix if candidates is None else candidates
        best: str | None = None
        best_len = -1
        for name in names:
            n = prefix.get(name, 0)
            if n > best_len:
                best, best_len = name, n
        return (best, best_len) if best is not None else (None, 0)
