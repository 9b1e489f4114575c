"""Fuzzers of the kv-cache twins' public boundary, run as scripts in a child interpreter.

A crash of the interpreter then shows as the process dying, not as a lost test session.
Each mode prints one line per finding, then ``done``:

* ``python tests/_api_fuzz.py SEED ITERATIONS``: wrong types and counts thrown at the
  compiled twin's pool and manager API; reports exceptions outside what bad input may
  raise, and calls that raised but changed the pool (free queue, ref counts, keys).
* ``python tests/_api_fuzz.py surface IMPL SEED ITERATIONS [LOG|-] [START]``: tamper with
  every attribute Python can assign, then call every public method (see ``run_surface``).
* ``python tests/_api_fuzz.py agree SEED ITERATIONS``: both twins refuse (or accept) the
  same assignments (see ``run_agree``).
"""

from __future__ import annotations

import faulthandler
import gc
import inspect
import os
import random
import sys

from kvcy import _fast
from kvcy._request_types import LoRARequest, MultiModalFeatureSpec, PlaceholderRange
from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

# What bad input may raise.  OverflowError: ints past a typed argument's C range.
EXPECTED = (ValueError, TypeError, RuntimeError, AssertionError, KeyError, IndexError, OverflowError)


def run(seed: int, iterations: int) -> dict:
    kv = _fast.load("cython")["kv_cache"]
    init_none_hash(get_hash_fn_by_name("sha256"))
    hasher = get_request_block_hasher(4, get_hash_fn_by_name("sha256"))
    full = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    swa = SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=6)
    rng = random.Random(seed)
    tagged = type("Tagged", (kv.KVCacheBlock,), {})  # subclasses are blocks too

    def garbage(pool):
        blk = rng.choice(pool.blocks)
        return rng.choice([
            None, -1, 0, 1, 2, 3, 5, 2**31, 2**40, -2**63, 1.5, "x", "r0", b"", b"abc", b"\0" * 36, [], [None],
            [1, 2], (), {}, object(), True, [b"\0" * 32], [[]], ["a"], [-1], blk, [blk], [blk, blk], (blk,),
            [pool.null_block], pool.blocks[1:3], [kv.KVCacheBlock(3)], kv.KVCacheBlock(-1), ([blk],),
            [[blk], [blk]], kv.KVCacheBlocks(([blk],)), rng.choice(pool.blocks).block_hash, [2**70],
            tagged(4), [tagged(6)], kv.KVCacheBlocks(([blk, kv.KVCacheBlock(9)],)),
        ])

    def pool_state(pool):
        return ([b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
                [(b.ref_cnt, b.block_hash) for b in pool.blocks])

    unexpected: dict = {}
    for _ in range(iterations):
        groups = [KVCacheGroupSpec(["f"], full)] + ([KVCacheGroupSpec(["s"], swa)] if rng.random() < 0.4 else [])
        cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=groups)
        mgr = kv.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=4, hash_block_size=4,
                                enable_kv_cache_events=rng.random() < 0.5, log_stats=rng.random() < 0.5)
        mgr.refuse_unservable = False  # (the set-up admits what fits; the rest waits, as in vLLM)
        reqs = [kv.Request(f"r{i}", [rng.randrange(6) for _ in range(rng.randrange(1, 30))], block_hasher=hasher)
                for i in range(3)]
        for req in reqs[:2]:
            blocks, hit, _ = mgr.get_computed_blocks(req)
            if mgr.allocate_slots(req, req.num_tokens - hit, num_new_computed_tokens=hit,
                                  new_computed_blocks=blocks) is not None:
                req.num_computed_tokens = req.num_tokens
        pool, queue = mgr.block_pool, mgr.block_pool.free_block_queue
        table = pool.cached_block_hash_to_block
        single = mgr.coordinator.single_type_managers[0]

        def free_any(a):
            mgr.free(rng.choice(reqs))

        calls = [
            lambda a: queue.popleft_n(a[0]), lambda a: queue.append(a[0]), lambda a: queue.append_n(a[0]),
            lambda a: queue.prepend_n(a[0]), lambda a: queue.remove(a[0]),
            lambda a: table.insert(a[0], a[1]), lambda a: table.pop(a[0], a[1]), lambda a: table.get_one_block(a[0]),
            lambda a: pool.get_cached_block(a[0], a[1]), lambda a: pool.evict_blocks(a[0]),
            lambda a: pool.cache_full_blocks(reqs[0], a[0], a[1], a[2], a[3], 0),
            lambda a: pool.get_new_blocks(a[0]), lambda a: pool.free_blocks(a[0]), lambda a: pool.touch(a[0]),
            lambda a: pool.move_block_hashes(a[0], a[1]), lambda a: pool.is_block_writable(a[0]),
            lambda a: single.remove_skipped_blocks(a[0], a[1]),
            lambda a: single.add_local_computed_blocks(a[0], a[1], a[2], a[3]),
            lambda a: single.cache_blocks(a[0], a[1]), lambda a: single.free(a[0]),
            # (no external tokens: it takes their blocks without checking the pool has them --
            # allocate_slots counts them first, as vLLM's does)
            lambda a: mgr.coordinator.allocate_new_computed_blocks("r2", a[0], a[1], 0),
            lambda a: mgr.allocate_slots(rng.choice(reqs), a[0], num_new_computed_tokens=a[1],
                                         new_computed_blocks=a[2], num_lookahead_tokens=a[3]),
            lambda a: mgr.allocate_slots(rng.choice(reqs), 1, num_external_computed_tokens=a[0],
                                         num_encoder_tokens=a[1], reserved_blocks=a[2]),
            lambda a: mgr.get_computed_blocks(a[0]), lambda a: mgr.get_block_ids(a[0]), lambda a: mgr.free(a[0]),
            free_any, lambda a: setattr(kv.KVCacheBlock(5), "block_hash", a[0]),
            lambda a: setattr(rng.choice(pool.blocks), "block_hash_num_tokens", a[0]),
            lambda a: reqs[2].append_output_token_ids(a[0]), lambda a: kv.Request(a[0], a[1], block_hasher=hasher),
        ]
        for _ in range(10):
            call = rng.randrange(len(calls))
            args = [garbage(pool) if rng.random() < 0.7 else rng.randrange(-2, 20) for _ in range(4)]
            before = pool_state(pool)
            try:
                calls[call](args)
            except EXPECTED as exc:
                # A call that raised changed nothing -- except KVCacheManager.free after the
                # pool API freed the request's blocks behind its back (see the closing notes).
                if calls[call] is not free_any and pool_state(pool) != before:
                    key = f"call {call}: {type(exc).__name__} changed the pool: {exc}"[:160]
                    unexpected[key] = unexpected.get(key, 0) + 1
            except Exception as exc:  # noqa: BLE001 - collected and reported
                key = f"call {call}: {type(exc).__name__}: {exc}"[:160]
                unexpected[key] = unexpected.get(key, 0) + 1
    return unexpected



# =============================================================================
# The writable surface: tamper with any attribute Python can assign, then call
# =============================================================================
#
# ``surface``: for every object of a small kv-cache world (requests, blocks, the free
# queue, the block map, the pool, each single-type manager, the coordinator, the
# manager, a KVCacheBlocks), the attributes Python may assign are found by
# introspection, then random steps assign None / 0 / -1 / huge ints / wrong types /
# objects from another manager to them, read attributes, and call every public method
# with plausible and implausible arguments.  Any Python exception is an answer; the
# interpreter dying (a signal), hanging, or a SystemError is not.  Each step is written,
# unbuffered, to a log file before it runs, so the parent can print the reproducing
# sequence after a crash.
#
# ``agree``: the same assignment, to the same attribute of the same object, is refused
# (or accepted) by both twins, with the same exception type.

def _attn(cls, bs, **kw):
    return cls(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16", **kw)


# name -> (group specs, scheduler block size, hash block size)
SURFACE_CONFIGS = {
    "full": (lambda: [_attn(FullAttentionSpec, 4)], 4, 4),
    "swa": (lambda: [_attn(SlidingWindowSpec, 4, sliding_window=6)], 4, 4),
    "chunked": (lambda: [_attn(ChunkedLocalAttentionSpec, 4, attention_chunk_size=8)], 4, 4),
    "mamba": (lambda: [MambaSpec(block_size=4, shapes=((2,),), dtypes=("float32",))], 4, 4),
    "cross": (lambda: [_attn(CrossAttentionSpec, 4)], 4, 4),
    "full+swa": (lambda: [_attn(FullAttentionSpec, 4), _attn(SlidingWindowSpec, 4, sliding_window=6)], 4, 4),
    "full+chunked": (lambda: [_attn(FullAttentionSpec, 4),
                              _attn(ChunkedLocalAttentionSpec, 4, attention_chunk_size=8)], 4, 4),
    "full+mamba": (lambda: [_attn(FullAttentionSpec, 4),
                            MambaSpec(block_size=4, shapes=((2,),), dtypes=("float32",))], 4, 4),
    "full+cross": (lambda: [_attn(FullAttentionSpec, 4), _attn(CrossAttentionSpec, 4)], 4, 4),
    "full8+swa4/hash4": (lambda: [_attn(FullAttentionSpec, 8), _attn(SlidingWindowSpec, 4, sliding_window=6)], 8, 4),
}

_INTS = [None, 0, -1, 1, 2, 7, 2**31 - 1, 2**31, -2**31 - 1, 2**63 - 1, 2**63, 2**64, -2**63, 2**100]
_OTHERS = [1.5, float("nan"), "x", "r0", b"", b"\0" * 36, [], [None], [0], [-1], [2**70], (), (None,), {}, {0: 1},
           set(), object(), True, False, [[]], ["a"]]


def _draw_world_recipe(rng: random.Random) -> dict:
    """Everything a world is built from, drawn once so that several twins/copies can be built alike."""
    name = rng.choice(sorted(SURFACE_CONFIGS))
    reqs = []
    for i in range(3):
        n = rng.randrange(1, 26)
        feats = {}
        if rng.random() < 0.2:
            feats["lora_request"] = LoRARequest("l", 1, "/l")
        if rng.random() < 0.2:
            feats["cache_salt"] = "salt"
        if rng.random() < 0.2 and n > 3:
            feats["mm_features"] = [MultiModalFeatureSpec("img", PlaceholderRange(1, 2))]
        reqs.append((f"r{i}", [rng.randrange(6) for _ in range(n)], feats))
    return dict(
        # (a Mamba group never caches: vLLM 0.33.0 caches Mamba states only in align mode)
        config=name, num_blocks=rng.randrange(4, 20), caching=rng.random() < 0.85 and "mamba" not in name,
        events=rng.random() < 0.5, stats=rng.random() < 0.5,
        eagle=rng.random() < 0.2 and "chunked" not in name, reqs=reqs, admit=rng.randrange(0, 3),
        encoder=rng.randrange(0, 9),
    )


def _build_world(kv, recipe: dict, prefix: str = "") -> tuple[dict, dict]:
    """(targets by path, names by object id) for one twin."""
    make_specs, sbs, hbs = SURFACE_CONFIGS[recipe["config"]]
    specs = make_specs()
    cfg = KVCacheConfig(num_blocks=recipe["num_blocks"], kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
    mgr = kv.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=sbs, hash_block_size=hbs,
                            enable_caching=recipe["caching"], use_eagle=recipe["eagle"],
                            enable_kv_cache_events=recipe["events"], log_stats=recipe["stats"])
    hasher = get_request_block_hasher(hbs, get_hash_fn_by_name("sha256"))
    reqs = [kv.Request(rid, toks, max_tokens=8, block_hasher=hasher, **feats) for rid, toks, feats in recipe["reqs"]]
    computed = mgr.empty_kv_cache_blocks
    for req in reqs[:recipe["admit"]]:
        try:
            computed, hit, _ = mgr.get_computed_blocks(req)
            if mgr.allocate_slots(req, req.num_tokens - hit, num_new_computed_tokens=hit, new_computed_blocks=computed,
                                  num_encoder_tokens=recipe["encoder"]) is not None:
                req.num_computed_tokens = req.num_tokens
        except (ValueError, TypeError):  # cross attention without encoder tokens, ...
            pass
    pool = mgr.block_pool
    targets = {"manager": mgr, "coordinator": mgr.coordinator, "pool": pool, "queue": pool.free_block_queue,
               "map": pool.cached_block_hash_to_block, "null_block": pool.null_block,
               "block": pool.blocks[-1], "blocks": computed, "empty_blocks": mgr.empty_kv_cache_blocks}
    for i, stm in enumerate(mgr.coordinator.single_type_managers):
        targets[f"stm{i}"] = stm
    for req in reqs:
        targets[req.request_id] = req
    names = {id(v): prefix + k for k, v in targets.items()}
    for b in pool.blocks:
        names[id(b)] = f"{prefix}pool.blocks[{b.block_id}]"
    targets["_blocks"] = list(pool.blocks)  # a snapshot: pool.blocks itself may be reassigned
    targets["_reqs"] = reqs
    targets["_hashes"] = [h for r in reqs for h in r.block_hashes]
    targets["_specs"] = specs
    return targets, names


_WRITABLE: dict[type, list[str]] = {}
_METHODS: dict[type, list[str]] = {}
_READABLE: dict[type, list[str]] = {}
_DUNDERS = ("__len__", "__repr__", "__eq__", "__add__", "__getitem__")


def _discover(obj) -> None:
    """Fill the writable / method / readable tables for obj's type, by introspection.

    Writable: every name with a data descriptor on the type (or in the instance dict)
    that does not answer AttributeError when given back its own value.  ``obj`` is
    a throwaway (the probe assigns).
    """
    t = type(obj)
    if t in _WRITABLE:
        return
    names = set(getattr(obj, "__dict__", ()))
    for klass in t.__mro__[:-1]:
        for name, d in vars(klass).items():
            if not name.startswith("__") and hasattr(type(d), "__set__"):
                names.add(name)
    writable, readable = [], []
    for name in sorted(names):
        try:
            cur = getattr(obj, name)
        except Exception:  # noqa: BLE001 - an unset slot
            cur = None
        readable.append(name)
        try:
            setattr(obj, name, cur)
        except AttributeError:
            continue
        except Exception:  # noqa: BLE001 - validated, so writable
            pass
        writable.append(name)
    methods = []
    for name in dir(t):
        if name.startswith("_") and name not in _DUNDERS:
            continue
        static = inspect.getattr_static(t, name, None)
        if name in names or isinstance(static, property) or static is None:
            continue
        if callable(getattr(t, name, None)):
            methods.append(name)
    _WRITABLE[t], _METHODS[t], _READABLE[t] = writable, methods, readable


def _desc(v, names: dict, depth: int = 0) -> str:
    """A short, safe description of a value (never calls a kvcy object's repr)."""
    if id(v) in names:
        return names[id(v)]
    if v is None or isinstance(v, (bool, int, float)):
        return repr(v)
    if isinstance(v, (str, bytes)):
        r = repr(v)
        return r if len(r) < 40 else r[:30] + "...'"
    if isinstance(v, (list, tuple, set, frozenset)) and depth < 2:
        items = list(v)
        inner = ", ".join(_desc(x, names, depth + 1) for x in items[:4]) + (", ..." if len(items) > 4 else "")
        if isinstance(v, list):
            return f"[{inner}]"
        if isinstance(v, tuple):
            return f"({inner}{',' if len(items) == 1 else ''})"
        return f"{{{inner}}}" if items else "set()"
    if isinstance(v, dict):
        return "{...}" if v else "{}"
    return f"<{type(v).__name__}>"


class _Surface:
    """One iteration: a world, another world of the same twin, and random steps on them."""

    def __init__(self, kv, rng: random.Random, log):
        self.kv, self.rng, self.log = kv, rng, log
        recipe = _draw_world_recipe(rng)
        probe, _ = _build_world(kv, recipe)
        for k, v in probe.items():
            if not k.startswith("_"):
                _discover(v)
        self.world, names = _build_world(kv, recipe)
        other_recipe = _draw_world_recipe(rng)
        self.other, other_names = _build_world(kv, other_recipe, "other.")
        self.names = {**other_names, **names}
        self.paths = sorted(k for k in self.world if not k.startswith("_"))
        self.engines = ["manager", "coordinator", "pool", "queue"] + [p for p in self.paths if p.startswith("stm")]
        log(f"# world {recipe}")
        log(f"# other {other_recipe}")

    def value(self, obj, name):
        rng, w, o = self.rng, self.world, self.other
        r = rng.random()
        if r < 0.3:
            return rng.choice(_INTS)
        if r < 0.45:
            return rng.choice(_OTHERS)
        if r < 0.6:  # the same attribute of another manager's object
            twin = o.get(rng.choice(self.paths))
            return getattr(twin, name, None) if twin is not None else None
        if r < 0.75:  # another attribute's value: a well-typed object in the wrong place
            cands = _READABLE.get(type(obj)) or [name]
            try:
                return getattr(rng.choice([w, o])[rng.choice(self.paths)] if rng.random() < 0.5 else obj,
                               rng.choice(cands))
            except Exception:  # noqa: BLE001
                return None
        return self.arg("x")

    def arg(self, pname: str):
        rng, w = self.rng, self.rng.choice([self.world] * 4 + [self.other])
        if rng.random() < 0.25:
            return rng.choice(_INTS + _OTHERS)
        blocks = w["_blocks"]
        n = rng.randrange(0, 4)
        if pname in ("request", "req"):
            return rng.choice(w["_reqs"])
        if pname.endswith("request_id"):
            return rng.choice([r.request_id for r in w["_reqs"]] + ["nope"])
        if pname == "block_ids":
            return {rng.randrange(-1, len(blocks) + 1) for _ in range(n)}
        if pname in ("new_computed_blocks", "other"):
            return rng.choice([w["blocks"], w["empty_blocks"],
                               tuple([rng.choice(blocks) for _ in range(n)] for _ in w["_specs"])])
        if pname in ("blocks", "ordered_blocks"):
            one = [rng.choice(blocks) for _ in range(n)]
            return rng.choice([one, [one], [one] * len(w["_specs"]), w["blocks"]])
        if pname == "block":
            return rng.choice(blocks)
        if pname in ("block_hash", "key"):
            h = rng.choice(w["_hashes"]) if w["_hashes"] else b"\0" * 32
            return rng.choice([h, h + bytes(4), b"", h[:3]])
        if pname == "block_hashes":
            return rng.choice(w["_reqs"]).block_hashes
        if pname == "kv_cache_group_ids":
            return rng.choice([[0], list(range(len(w["_specs"]))), [], [5]])
        if pname == "kv_cache_spec":
            return rng.choice(w["_specs"])
        if pname == "block_pool":
            return w["pool"]
        if pname in ("drop_eagle_block", "allow_none", "delay_cache_blocks", "full_sequence_must_fit",
                     "has_scheduled_reqs"):
            return rng.random() < 0.5
        if pname == "token_ids":
            return [rng.randrange(6) for _ in range(n)]
        if pname in ("block_size", "alignment_tokens"):
            return rng.choice([4, 8, 1])
        return rng.randrange(-1, 12)

    def step(self, tamper: bool) -> None:
        rng = self.rng
        # After the tampering, half the calls go to the objects whose methods walk the others.
        path = rng.choice(self.paths if tamper or rng.random() < 0.5 else self.engines)
        obj = self.world[path]
        t = type(obj)
        r = 0.0 if tamper else rng.random()
        if r < 0.15 and _WRITABLE.get(t):
            name = rng.choice(_WRITABLE[t])
            v = self.value(obj, name)
            self.log(f"{path}.{name} = {_desc(v, self.names)}")
            setattr(obj, name, v)
        elif r < 0.25 and _READABLE.get(t):
            name = rng.choice(_READABLE[t])
            self.log(f"{path}.{name}")
            getattr(obj, name)
        elif _METHODS.get(t):
            name = rng.choice(_METHODS[t])
            fn = getattr(obj, name)
            try:
                params = [p for p in inspect.signature(fn).parameters.values()
                          if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            except (TypeError, ValueError):
                params = []
            args, kwargs = [], {}
            for p in params:
                if p.default is p.empty:
                    args.append(self.arg(p.name))
                elif rng.random() < 0.4:
                    kwargs[p.name] = self.arg(p.name)
            shown = [_desc(a, self.names) for a in args] + [f"{k}={_desc(v, self.names)}" for k, v in kwargs.items()]
            self.log(f"{path}.{name}({', '.join(shown)})")
            fn(*args, **kwargs)


def run_surface(impl: str, seed: int, iterations: int, log_path: str | None = None,
                start: int = 0, steps: int = 16) -> dict:
    """Tamper-then-call iterations ``start .. iterations-1``; returns {kind of SystemError: count}.

    Iteration ``i`` runs from seed ``seed * 1_000_003 + i`` alone, so ``start=i,
    iterations=i+1`` replays it.
    """
    kv = _fast.load(impl)["kv_cache"]
    init_none_hash(get_hash_fn_by_name("sha256"))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if log_path else None

    last = [""]

    def log(line: str) -> None:
        last[0] = line
        if fd is not None:
            os.write(fd, (line + "\n").encode())

    unexpected: dict = {}
    for i in range(start, iterations):
        if fd is not None:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        log(f"# {impl} seed {seed} iteration {i}")
        faulthandler.dump_traceback_later(30, exit=True)  # a hang is a failure too
        rng = random.Random(seed * 1_000_003 + i)
        surface = _Surface(kv, rng, log)
        tamper = rng.randrange(1, 4)  # first a few assignments, then mostly calls
        for k in range(steps):
            try:
                surface.step(k < tamper)
            except SystemError as exc:  # the C API misused: a bug even when it did not crash
                key = f"SystemError: {exc} (seed {seed} iteration {i}, at {last[0][:200]})"
                unexpected[key] = unexpected.get(key, 0) + 1
            except Exception:  # noqa: BLE001 - any other answer is an answer
                pass
        log("# dropping the worlds")
        del surface
        gc.collect()  # a tampered object's dealloc runs inside the iteration that tampered
    faulthandler.cancel_dump_traceback_later()
    return unexpected


def run_agree(seed: int, iterations: int) -> dict:
    """Assign the same values to both twins' attributes; {disagreement: count}."""
    kvs = [_fast.load(impl)["kv_cache"] for impl in ("cython", "python")]
    init_none_hash(get_hash_fn_by_name("sha256"))
    disagree: dict = {}
    for i in range(iterations):
        rng = random.Random(seed * 1_000_003 + i)
        recipe, other = _draw_world_recipe(rng), _draw_world_recipe(rng)
        worlds = [_build_world(kv, recipe)[0] for kv in kvs]
        others = [_build_world(kv, other)[0] for kv in kvs]
        paths = sorted(k for k in worlds[0] if not k.startswith("_"))
        for w in worlds:
            for p in paths:
                _discover(w[p])
        for path in paths:
            a, b = (w[path] for w in worlds)
            names = {n for n in _WRITABLE[type(a)] + _WRITABLE[type(b)] if not n.startswith("_")}
            for name in sorted(names):
                kind = rng.randrange(len(_INTS) + len(_OTHERS) + 2)
                outcomes = []
                wrong = rng.choice(paths)
                for w, o, twin_obj in zip(worlds, others, (a, b)):
                    if kind < len(_INTS) + len(_OTHERS):
                        v = (_INTS + _OTHERS)[kind]
                    elif kind == len(_INTS) + len(_OTHERS):  # the same attribute of another manager
                        v = getattr(o.get(path), name, None)
                    else:  # a well-typed object of the wrong kind
                        v = w[wrong]
                    try:
                        setattr(twin_obj, name, v)
                        outcomes.append("accepted")
                    except Exception as exc:  # noqa: BLE001 - compared between the twins
                        outcomes.append(type(exc).__name__)
                if outcomes[0] != outcomes[1]:
                    key = f"{type(a).__name__}.{name}: cython {outcomes[0]}, python {outcomes[1]}"
                    disagree.setdefault(key, set()).add(_desc(v, {}))
        del worlds, others
        gc.collect()
    return {f"{k}, e.g. = {' / '.join(sorted(v)[:3])}": len(v) for k, v in disagree.items()}


def _main(argv: list[str]) -> None:
    if argv and argv[0] in ("surface", "agree"):
        # Counts nobody bounds (a token count of 2**40 makes a list of 2**38 null blocks, in
        # either twin, as in vLLM) must fail fast as MemoryError, not swap a shared machine.
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    if argv and argv[0] == "surface":
        # surface IMPL SEED ITERATIONS [LOG|-] [START]
        impl, seed, iterations = argv[1], int(argv[2]), int(argv[3])
        log = argv[4] if len(argv) > 4 and argv[4] != "-" else None
        start = int(argv[5]) if len(argv) > 5 else 0
        found = run_surface(impl, seed, iterations, log, start)
    elif argv and argv[0] == "agree":
        found = run_agree(int(argv[1]), int(argv[2]))
    else:
        found = run(int(argv[0]), int(argv[1]))
    for line, count in sorted(found.items()):
        print(f"{count} x {line}")
    print("done")


if __name__ == "__main__":
    _main(sys.argv[1:])
