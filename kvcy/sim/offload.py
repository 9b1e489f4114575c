"""The replay's CPU tier: a ``CPUOffloadingManager`` driven the way vLLM's offloading connector drives it.

vLLM 0.33.0's ``OffloadingConnectorScheduler`` sits between the scheduler and
the offloading manager.  The offloading twin's ``ReplayConnector`` (compiled
in ``kvcy/_fast/offload_c/offloading_connector.pyx``, pure Python in
``kvcy/_fast/offload_py/offloading_connector.py``; :func:`build_tier` picks the one that
goes with the KV-cache manager's twin) plays that part inside the replay's
synchronous loop, with one offloaded block (a *chunk*) per GPU block and one
KV-cache group, so an offload key is a block hash plus group index 0
(:func:`~kvcy.kv_offload.make_offload_key`):

* **Admission** (``get_num_new_matched_tokens``): after the GPU prefix hit, the
  blocks that follow are looked up in the CPU tier until the first one that is
  not a ``HIT`` (one ``count_hits`` call); never the block holding the prompt's last
  token, which is always computed (vLLM loads that block too and then
  recomputes only the last token; here at most one block of such a hit is
  computed instead of loaded).  When the allocation succeeds the hit is loaded
  (``prepare_load``; ``update_state_after_alloc``) and the loaded tokens count
  as computed at once: the load completes (``complete_load``) at the end of
  the step, as a worker would report it.
* **Stores** (``build_connector_meta``): every step, each scheduled request
  offers the prompt blocks that this step's tokens complete, from the first
  block it has not offered yet (``prepare_store``, prompt blocks only: vLLM's
  ``offload_prompt_only``); a ``None`` offers them again next step.  Requests
  that finished in the previous step then make their final offer and end
  (``on_request_finished``).  Stores complete (``complete_store``) at the end
  of the step.
* Each request has a ``ReqContext`` (created, with ``on_new_request``, when the
  scheduler first looks at it) holding every key's end-token position, as the
  connector sets them, so that LRU ranks a request's blocks head to tail.

Every decision (hits, chunk ids loaded, keys stored with their chunks, keys
evicted, refused stores, finished requests) is appended to the step's
decision list, so the replay's digest covers offloading too.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_tier", "cpu_blocks_from_spec", "offload_twin"]


def offload_twin(impl: str) -> tuple[str, Any]:
    """``(implementation, module)`` of the offloading twin that goes with the KV-cache manager's ``impl``.

    The compiled offloading twin is used with the compiled manager when it is
    built; otherwise the pure-Python one (and the implementation says so).
    """
    from kvcy import _fast

    if impl == "cython":
        try:
            return "cython", _fast.load("cython")["offload"]
        except ImportError:
            pass
    return "python", _fast.load("python")["offload"]


def build_tier(impl: str, num_blocks: int, policy: str, block_size: int) -> tuple[str, Any]:
    """``(implementation, connector)``: a CPU tier of ``num_blocks`` chunks behind a ``ReplayConnector``.

    The manager (``CPUOffloadingManager``, ``policy``) and the connector come
    from the offloading twin that goes with the KV-cache manager's ``impl``
    (:func:`offload_twin`).
    """
    from kvcy import _fast

    name, twin = offload_twin(impl)
    manager = twin.CPUOffloadingManager(num_chunks=num_blocks, cache_policy=policy)
    return name, _fast.load(name)["offload"].ReplayConnector(manager, block_size)


def cpu_blocks_from_spec(text: str, gpu_blocks: int, bytes_per_block: int) -> int:
    """Blocks of a ``--cpu-offload`` value: ``8x`` (times ``gpu_blocks``, the GPU pool's usable blocks) or a size (``64GiB``).

    Raises:
        ValueError: not a multiple or a size, or less than one block.
    """
    from kvcy.cli import parse_size

    spec = text.strip()
    if spec[-1:] in ("x", "X"):
        try:
            factor = float(spec[:-1])
        except ValueError:
            factor = float("nan")
        if not 0 < factor <= 1024:
            raise ValueError(f"--cpu-offload {text!r}: a multiple of the GPU pool must be > 0 and <= 1024")
        return max(1, int(round(gpu_blocks * factor)))
    n = parse_size(spec) // bytes_per_block
    if n < 1:
        raise ValueError(f"--cpu-offload {text!r} holds no block of {bytes_per_block:,} bytes")
    return n
