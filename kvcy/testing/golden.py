"""Replay golden vectors recorded from vLLM 0.33.0 through kvcy's public API.

Usage::

    python -m kvcy.testing.golden DIR [DIR ...] [-v] [-k SUBSTRING]

Every ``hashes.jsonl``, ``manager.jsonl`` and ``offload.jsonl`` under the
directories is replayed (format: ``shared/golden/README.md``; ``offload.jsonl``
is section 5).  One line per scenario (hash cases are grouped by file), then
``N passed, M failed`` with the count per file kind; exit status 0 only when all
pass.  A failing scenario is reported with its name and the index of the first
op that differs.
The implementation is whatever ``kvcy`` selected (``KVCY_NO_EXTENSIONS=1``
forces pure Python); ``--impl`` picks one explicitly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from kvcy import _fast, hashing
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from kvcy.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange, Request, RequestStatus

__all__ = [
    "GoldenMismatch",
    "iter_golden_files",
    "main",
    "replay_hash_case",
    "replay_offload_scenario",
    "replay_scenario",
]


class GoldenMismatch(AssertionError):
    """A replayed value differs from the recorded one."""


@contextmanager
def _hash_seed(seed: str) -> Iterator[None]:
    old = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = seed
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYTHONHASHSEED"]
        else:
            os.environ["PYTHONHASHSEED"] = old


def _init_none_hash(algo: str, seed: str, expected_hex: str) -> Any:
    fn = hashing.get_hash_fn_by_name(algo)
    with _hash_seed(seed):
        none_hash = hashing.init_none_hash(fn)
    if none_hash.hex() != expected_hex:
        raise GoldenMismatch(f"NONE_HASH {none_hash.hex()} != recorded {expected_hex}")
    return fn


def _mm_features(items: list[dict] | None) -> list[MultiModalFeatureSpec] | None:
    if not items:
        return None
    # Fresh str objects per item: vLLM's identifiers are distinct objects, so
    # pickle must not memoise one item's identifier for another's.
    return [
        MultiModalFeatureSpec(
            identifier="".join(list(it["identifier"])),
            mm_position=PlaceholderRange(offset=it["offset"], length=it["length"]),
        )
        for it in items
    ]


def _lora(d: dict | None) -> LoRARequest | None:
    if not d:
        return None
    return LoRARequest(lora_name=d["name"], lora_int_id=d.get("int_id", 1), lora_path=d["path"])


# --------------------------------------------------------------------------- hashes
def replay_hash_case(case: dict) -> None:
    """Replay one ``hashes.jsonl`` line; raise GoldenMismatch on any difference."""
    fn = _init_none_hash(case["algo"], case["none_hash_seed"], case["none_hash"])
    hasher = hashing.get_request_block_hasher(case["block_size"], fn)
    request = Request(
        "golden",
        case["token_ids"],
        max_tokens=16,
        lora_request=_lora(case.get("lora")),
        mm_features=_mm_features(case.get("mm")),
        cache_salt=case.get("cache_salt"),
        block_hasher=hasher,
    )
    for tokens in case.get("appends", []):
        request.append_output_token_ids(list(tokens))
    got = [h.hex() for h in request.block_hashes]
    want = case["block_hashes"]
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise GoldenMismatch(
            f"{case['name']}: block hash {first} differs ({len(got)} vs {len(want)} hashes)"
        )


# --------------------------------------------------------------------------- manager
_SPECS = {
    "full": lambda g: FullAttentionSpec(**_attn(g)),
    "sliding_window": lambda g: SlidingWindowSpec(sliding_window=g["sliding_window"], **_attn(g)),
    "chunked_local": lambda g: ChunkedLocalAttentionSpec(attention_chunk_size=g["attention_chunk_size"], **_attn(g)),
}


def _attn(g: dict) -> dict:
    return {
        "block_size": g["block_size"],
        "num_kv_heads": g["num_kv_heads"],
        "head_size": g["head_size"],
        "dtype": g["dtype"],
    }


def build_manager(config: dict, kv_cache: ModuleType):
    """A KVCacheManager of the given twin module for a golden ``config``."""
    groups = [KVCacheGroupSpec(layer_names=list(g["layer_names"]), kv_cache_spec=_SPECS[g["kind"]](g))
              for g in config["groups"]]
    kv_config = KVCacheConfig(num_blocks=config["num_blocks"], kv_cache_tensors=[], kv_cache_groups=groups)
    return kv_cache.KVCacheManager(
        kv_config,
        max_model_len=config["max_model_len"],
        scheduler_block_size=config["scheduler_block_size"],
        hash_block_size=config["hash_block_size"],
        max_in_flight_tokens=config["max_in_flight_tokens"],
        enable_caching=config["enable_caching"],
        use_eagle=config["use_eagle"],
        enable_kv_cache_events=config["enable_kv_cache_events"],
        watermark=config["watermark"],
        use_int_block_hashes=bool(config.get("kv_events_use_int_block_hashes")),
    )


def _hash_out(h: Any) -> Any:
    if h is None:
        return None
    if isinstance(h, bytes):
        return h.hex()
    return format(h, "016x")


def _jsonable(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, bytes):
        return x.hex()
    return x


def encode_event(event: Any) -> dict:
    """An event as the golden files encode it (section 3.4 of their README)."""
    out: dict[str, Any] = {"type": type(event).__name__}
    for name in event.__struct_fields__:
        value = getattr(event, name)
        if name == "block_hashes":
            value = [_hash_out(h) for h in value]
        elif name == "parent_block_hash":
            value = _hash_out(value)
        elif name == "extra_keys":
            value = _jsonable(value)
        out[name] = value
    return out


def _expect(what: str, got: Any, want: Any, op_index: int) -> None:
    if got != want:
        raise GoldenMismatch(f"op {op_index} ({what}): got {got!r}, expected {want!r}")


def replay_scenario(scenario: dict, kv_cache: ModuleType | None = None) -> int:
    """Replay one ``manager.jsonl`` scenario; return the number of ops run.

    Raises:
        GoldenMismatch: the first op whose result differs from vLLM's.
    """
    kv_cache = kv_cache or _fast.kv_cache
    config = scenario["config"]
    fn = _init_none_hash(config["hash_algo"], config["none_hash_seed"], config["none_hash"])
    hasher = hashing.get_request_block_hasher(config["hash_block_size"], fn)
    manager = build_manager(config, kv_cache)
    requests: dict[str, Request] = {}
    last_computed: dict[str, Any] = {}
    for i, op in enumerate(scenario["ops"]):
        kind = op["op"]
        if kind == "add_request":
            req = kv_cache.Request(
                op["req"],
                op["prompt"],
                max_tokens=op["max_tokens"],
                lora_request=_lora(op.get("lora")),
                mm_features=_mm_features(op.get("mm")),
                cache_salt=op.get("cache_salt"),
                block_hasher=hasher,
                kv_cache_report_mode=op.get("kv_cache_report_mode", "incremental"),
            )
            requests[op["req"]] = req
            _expect("num_block_hashes", len(req.block_hashes), op["expect"]["num_block_hashes"], i)
        elif kind == "get_computed_blocks":
            req = requests[op["req"]]
            blocks, n, boundary = manager.get_computed_blocks(req)
            last_computed[op["req"]] = blocks
            exp = op["expect"]
            _expect("block_ids", [list(g) for g in blocks.get_block_ids()], exp["block_ids"], i)
            _expect("num_computed_tokens", n, exp["num_computed_tokens"], i)
            _expect("shared_prefix_boundary", boundary, exp["shared_prefix_boundary"], i)
        elif kind == "allocate_slots":
            req = requests[op["req"]]
            blocks = last_computed[op["req"]] if op.get("use_computed_blocks_from") else None
            result = manager.allocate_slots(
                req,
                op["num_new_tokens"],
                num_new_computed_tokens=op["num_new_computed_tokens"],
                new_computed_blocks=blocks,
                num_lookahead_tokens=op["num_lookahead_tokens"],
                delay_cache_blocks=op["delay_cache_blocks"],
                full_sequence_must_fit=op["full_sequence_must_fit"],
                has_scheduled_reqs=op["has_scheduled_reqs"],
            )
            got = None if result is None else [list(g) for g in result.get_block_ids()]
            _expect("new_block_ids", got, op["expect"]["new_block_ids"], i)
        elif kind == "set_status":
            requests[op["req"]].status = RequestStatus[op["status"]]
            if op["status"] == "PREEMPTED":
                requests[op["req"]].num_preemptions += 1
        elif kind == "set_num_computed_tokens":
            requests[op["req"]].num_computed_tokens = op["value"]
        elif kind == "append_output_tokens":
            req = requests[op["req"]]
            req.append_output_token_ids(op["tokens"])
            _expect("num_block_hashes", len(req.block_hashes), op["expect"]["num_block_hashes"], i)
        elif kind == "free":
            manager.free(requests[op["req"]])
        elif kind == "reset_prefix_cache":
            _expect("reset_prefix_cache", manager.reset_prefix_cache(), op["expect"], i)
        elif kind == "check":
            exp = op["expect"]
            pool = manager.block_pool
            _expect("num_free_blocks", pool.get_num_free_blocks(), exp["num_free_blocks"], i)
            _expect(
                "free_queue",
                [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
                exp["free_queue"],
                i,
            )
            if abs(manager.usage - exp["usage"]) > 1e-9:
                raise GoldenMismatch(f"op {i} (usage): got {manager.usage}, expected {exp['usage']}")
            hashed = sum(1 for b in pool.blocks if b.block_hash is not None)
            _expect("num_hashed_blocks", hashed, exp["num_hashed_blocks"], i)
            for rid, want in exp["blocks"].items():
                _expect(f"blocks[{rid}]", [list(g) for g in manager.get_block_ids(rid)], want, i)
            holders = [rid for rid in requests if manager.coordinator.holds(rid)]
            _expect("requests holding blocks", sorted(holders), sorted(exp["blocks"]), i)
        elif kind == "take_events":
            got = [encode_event(e) for e in manager.take_events()]
            if got != op["expect"]:
                first = next((j for j, (a, b) in enumerate(zip(got, op["expect"])) if a != b), None)
                detail = (
                    f"event {first}: got {got[first]!r}, expected {op['expect'][first]!r}"
                    if first is not None
                    else f"{len(got)} events, expected {len(op['expect'])}"
                )
                raise GoldenMismatch(f"op {i} (take_events): {detail}")
        else:
            raise GoldenMismatch(f"op {i}: unknown op {kind!r}")
    return len(scenario["ops"])


# --------------------------------------------------------------------------- offloading
_NO_EXPECT = object()


def _hexes(keys: Any) -> list[str]:
    return [bytes(k).hex() for k in keys]


def _keys(hexes: list[str]) -> list[bytes]:
    return [bytes.fromhex(h) for h in hexes]


def encode_offload_event(event: Any) -> dict:
    """An ``OffloadingEvent`` as ``offload.jsonl`` encodes it (section 5.3 of the README)."""
    return {
        "keys": _hexes(event.keys),
        "medium": event.medium.value,
        "removed": event.removed,
        "locality": None if event.locality is None else event.locality.value,
        "ownership": None if event.ownership is None else event.ownership.value
        if hasattr(event.ownership, "value") else event.ownership,
        "removal_expected": event.removal_expected,
        "metadata_only": event.metadata_only,
    }


def _close(a: Any, b: Any) -> bool:
    """Equality, with floats (and lists / dicts of them) within 1e-9."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= 1e-9
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


def offload_check_state(manager: Any) -> dict:
    """The ``check`` observation of section 5.6, read from the manager's internals.

    Reads the attributes vLLM's replayer reads: ``manager._policy``,
    ``_free_list``, ``_num_allocated_chunks``, ``_num_evictable_cache_chunks``,
    ``_num_write_pending_chunks``, ``counts``; ``policy.chunks`` / ``_ranks``
    (LRU) or ``t1`` / ``t2`` / ``b1`` / ``b2`` / ``target_t1_size`` (ARC).
    """
    policy = manager._policy
    arc = hasattr(policy, "t1")
    if arc:
        resident = list(policy.t1.items()) + list(policy.t2.items())
    else:
        resident = list(policy.chunks.items())
    state: dict[str, Any] = {
        "resident": sorted(([k.hex(), c.chunk_id, c.ref_cnt] for k, c in resident), key=lambda r: r[1]),
        "free_list": list(manager._free_list),
        "num_allocated_chunks": manager._num_allocated_chunks,
        "num_evictable": manager._num_evictable_cache_chunks,
        "num_write_pending": manager._num_write_pending_chunks,
    }
    if arc:
        state["arc"] = {
            "t1": [c.chunk_id for c in policy.t1.values()],
            "t2": [c.chunk_id for c in policy.t2.values()],
            "b1": _hexes(policy.b1),
            "b2": _hexes(policy.b2),
            "target_t1_size": policy.target_t1_size,
        }
    else:
        ranks = policy._ranks
        order = sorted(policy.chunks.items(), key=lambda kc: (ranks[kc[0]], kc[0]))
        state["lru_order"] = [c.chunk_id for _, c in order]
    if manager.counts is not None:
        state["tracker"] = [[k.hex(), n] for k, n in manager.counts.items()]
    return state


def _offload_call(manager: Any, op: dict, ctx: dict, base: ModuleType, i: int) -> Any:
    kind = op["op"]
    if kind == "prepare_load":
        keys = _keys(op["keys"])
        if "record_access" in op:
            spec = manager._prepare_load(keys, ctx[op["req"]], record_access=op["record_access"])
        else:
            spec = manager.prepare_load(keys, ctx[op["req"]])
        return {"chunk_ids": [int(x) for x in spec.block_ids]}
    if kind == "complete_load":
        manager.complete_load(_keys(op["keys"]), ctx[op["req"]])
        return _NO_EXPECT
    if kind == "prepare_store":
        out = manager.prepare_store(_keys(op["keys"]), ctx[op["req"]])
        if out is None:
            return None
        return {
            "keys_to_store": _hexes(out.keys_to_store),
            "chunk_ids": [int(x) for x in out.store_spec.block_ids],
            "evicted_keys": _hexes(out.evicted_keys),
        }
    raise GoldenMismatch(f"op {i}: {kind!r} cannot carry an error")


def replay_offload_scenario(scenario: dict, offload: ModuleType | None = None) -> int:
    """Replay one ``offload.jsonl`` scenario; return the number of ops run.

    Args:
        scenario: one parsed line of ``offload.jsonl``.
        offload: the offloading twin module (default: the live one).

    Raises:
        GoldenMismatch: the first op whose result differs from vLLM's.
    """
    from kvcy.kv_offload import base

    offload = offload or _fast.offload
    config = scenario["config"]
    manager = offload.CPUOffloadingManager(
        num_chunks=config["num_chunks"],
        cache_policy=config["cache_policy"],
        enable_events=config["enable_events"],
        store_threshold=config["store_threshold"],
        max_tracker_size=config["max_tracker_size"],
    )
    ctx: dict[str, Any] = {}
    for i, op in enumerate(scenario["ops"]):
        kind = op["op"]
        exp = op.get("expect")
        if "error" in op:
            want = op["error"]
            try:
                _offload_call(manager, op, ctx, base, i)
            except Exception as exc:  # noqa: BLE001 - compared below
                if type(exc).__name__ != want["type"] or str(exc) != want["message"]:
                    raise GoldenMismatch(
                        f"op {i} ({kind}): raised {type(exc).__name__}({str(exc)!r}), "
                        f"expected {want['type']}({want['message']!r})"
                    ) from None
            else:
                raise GoldenMismatch(f"op {i} ({kind}): no exception, expected {want['type']}({want['message']!r})")
        elif kind == "new_context":
            ctx[op["req"]] = base.ReqContext(req_id=op["req"])
        elif kind == "set_positions":
            c = ctx[op["req"]]
            for key, pos in op["positions"]:
                c.set_offload_key_position(bytes.fromhex(key), pos)
        elif kind == "on_new_request":
            got = manager.on_new_request(ctx[op["req"]])
            _expect("on_new_request", {"policy": got.policy.value}, exp, i)
        elif kind == "lookup":
            c = ctx[op["req"]]
            _expect("lookup", [manager.lookup(k, c).name for k in _keys(op["keys"])], exp, i)
        elif kind == "get_load_source":
            _expect("get_load_source", manager.get_load_source(bytes.fromhex(op["key"]), ctx[op["req"]]).value, exp, i)
        elif kind in ("prepare_load", "complete_load", "prepare_store"):
            got = _offload_call(manager, op, ctx, base, i)
            if got is not _NO_EXPECT:
                _expect(kind, got, exp, i)
        elif kind == "touch":
            manager.touch(_keys(op["keys"]), ctx[op["req"]])
        elif kind == "complete_store":
            manager.complete_store(_keys(op["keys"]), ctx[op["req"]], success=op["success"])
        elif kind == "on_request_finished":
            manager.on_request_finished(ctx[op["req"]])
        elif kind == "on_schedule_end":
            manager.on_schedule_end(
                base.ScheduleEndContext(new_req_ids=op["new_req_ids"], preempted_req_ids=op["preempted_req_ids"])
            )
        elif kind == "reset_cache":
            manager.reset_cache()
        elif kind == "take_events":
            got = [encode_offload_event(e) for e in manager.take_events()]
            if got != exp:
                first = next((j for j, (a, b) in enumerate(zip(got, exp)) if a != b), None)
                detail = (
                    f"event {first}: got {got[first]!r}, expected {exp[first]!r}"
                    if first is not None
                    else f"{len(got)} events, expected {len(exp)}"
                )
                raise GoldenMismatch(f"op {i} (take_events): {detail}")
        elif kind == "get_stats":
            stats = manager.get_stats()
            got = {name: by_label[()] for name, by_label in stats.data["data"].items()}
            if not _close(got, exp):
                raise GoldenMismatch(f"op {i} (get_stats): got {got!r}, expected {exp!r}")
        elif kind == "has_pending_work":
            _expect("has_pending_work", manager.has_pending_work(), exp, i)
        elif kind == "config_info":
            _expect("config_info", [dict(m) for m in manager.config_info()], exp, i)
        elif kind == "check":
            state = offload_check_state(manager)
            for field, want in exp.items():
                if field not in state:
                    raise GoldenMismatch(f"op {i} (check): no {field!r} to compare")
                if not _close(state[field], want):
                    raise GoldenMismatch(f"op {i} (check {field}): got {state[field]!r}, expected {want!r}")
            extra = set(state) - set(exp)
            if extra:
                raise GoldenMismatch(f"op {i} (check): recorded no {sorted(extra)}")
            # The public view agrees: resident keys look up as HIT / HIT_PENDING.
            probe = base.ReqContext(req_id="golden-check")
            for key, _, ref_cnt in exp["resident"]:
                want_lookup = "HIT_PENDING" if ref_cnt == -1 else "HIT"
                _expect(f"check lookup {key}", manager.lookup(bytes.fromhex(key), probe).name, want_lookup, i)
        else:
            raise GoldenMismatch(f"op {i}: unknown op {kind!r}")
    return len(scenario["ops"])


# --------------------------------------------------------------------------- driver
#: File kinds, by name prefix, in replay order.
KINDS = ("hashes", "manager", "offload")


def iter_golden_files(dirs: list[Path], kinds: tuple[str, ...] = KINDS) -> list[Path]:
    """The golden files under ``dirs`` (or the files themselves), grouped by kind."""
    files: list[Path] = []
    for d in dirs:
        d = Path(d)
        if d.is_file():
            files.append(d)
            continue
        if not d.is_dir():
            raise FileNotFoundError(f"no such golden directory: {d}")
        for kind in kinds:
            files.extend(sorted(d.rglob(f"{kind}*.jsonl")))
    return files


def _kind(path: Path) -> str:
    for kind in KINDS:
        if path.name.startswith(kind):
            return kind
    raise ValueError(f"not a golden file (hashes*, manager*, offload*.jsonl): {path}")


def run(dirs: list[Path], impl: str | None = None, verbose: bool = False, keyword: str | None = None,
        out=sys.stdout, kinds: tuple[str, ...] = KINDS, tally: dict[str, list[int]] | None = None) -> tuple[int, int]:
    """Replay everything under ``dirs``; return (passed, failed).

    Args:
        impl: ``"cython"`` or ``"python"`` (default: the live twins).
        kinds: which file kinds to replay (``KINDS``).
        tally: if given, filled with ``{kind: [passed, failed]}``.
    """
    kv_cache = _fast.load(impl)["kv_cache"] if impl else _fast.kv_cache
    offload = None
    passed = failed = 0
    tally = {} if tally is None else tally
    for path in iter_golden_files(dirs, kinds):
        kind = _kind(path)
        if kind not in kinds:
            continue
        counts = tally.setdefault(kind, [0, 0])
        with open(path, encoding="utf-8") as fh:
            lines = [json.loads(line) for line in fh if line.strip()]
        if kind == "hashes":
            groups: dict[str, list[str]] = {}
            n_ok = 0
            for case in lines:
                if keyword and keyword not in case["name"]:
                    continue
                try:
                    replay_hash_case(case)
                    n_ok += 1
                except Exception as exc:  # noqa: BLE001 - every failure is reported
                    groups.setdefault(case["name"].split("/")[0], []).append(f"{case['name']}: {exc!r}")
            n_bad = sum(len(v) for v in groups.values())
            status = "PASS" if n_bad == 0 else "FAIL"
            print(f"{status} {path.name}: {n_ok} hash cases match, {n_bad} differ", file=out)
            for msgs in groups.values():
                for m in msgs[: 5 if not verbose else None]:
                    print(f"    {m}", file=out)
            passed += n_ok
            failed += n_bad
            counts[0] += n_ok
            counts[1] += n_bad
            continue
        if kind == "offload" and offload is None:
            offload = _fast.load(impl)["offload"] if impl else _fast.offload
        for scenario in lines:
            name = scenario["name"]
            if keyword and keyword not in name:
                continue
            t0 = time.perf_counter()
            try:
                if kind == "offload":
                    n_ops = replay_offload_scenario(scenario, offload)
                else:
                    n_ops = replay_scenario(scenario, kv_cache)
            except Exception as exc:  # noqa: BLE001
                failed += 1
                counts[1] += 1
                print(f"FAIL {name}: {type(exc).__name__}: {exc}", file=out)
            else:
                passed += 1
                counts[0] += 1
                print(f"PASS {name} ({n_ops} ops, {1000 * (time.perf_counter() - t0):.0f} ms)", file=out)
    return passed, failed


def summary(passed: int, failed: int, tally: dict[str, list[int]]) -> str:
    """``N passed, M failed`` and, per file kind, how many of its cases passed."""
    parts = [f"{kind} {ok}/{ok + bad}" for kind, (ok, bad) in tally.items()]
    return f"{passed} passed, {failed} failed" + (f" ({', '.join(parts)})" if parts else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcy.testing.golden", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path, help="directories (or files) with golden JSONL")
    parser.add_argument("--impl", choices=["cython", "python"], help="twin to replay (default: the selected one)")
    parser.add_argument("-k", dest="keyword", help="only scenarios / cases whose name contains this")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every failing hash case")
    args = parser.parse_args(argv)
    try:
        impl_name = args.impl or _fast.IMPLEMENTATION
        print(f"kvcy golden replay, implementation: {impl_name}")
        offload_name = args.impl or _fast.offload.IMPLEMENTATION
        if offload_name != impl_name:
            print(f"offloading twin: {offload_name} (the compiled offloading twin is not available)")
        tally: dict[str, list[int]] = {}
        passed, failed = run(args.dirs, args.impl, args.verbose, args.keyword, tally=tally)
    except (FileNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary(passed, failed, tally))
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
