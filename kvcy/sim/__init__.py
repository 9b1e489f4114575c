"""``kvcy.sim``: replay request traces through the KV-cache manager.

* :mod:`kvcy.sim.traces`: the Mooncake JSONL reader and the bundled trace head;
* :mod:`kvcy.sim.synthetic`: a seeded shared-prefix / multi-turn generator;
* :mod:`kvcy.sim.scheduler`: the continuous-batching loop (:func:`replay`);
* :mod:`kvcy.sim.offload`: an optional CPU tier behind the GPU pool, driven as
  vLLM's offloading connector drives ``CPUOffloadingManager``;
* :mod:`kvcy.sim.report`, :mod:`kvcy.sim.plot`, :mod:`kvcy.sim.cli`: ``kvcy replay``.
"""

from kvcy.sim.scheduler import Divergence, ReplayConfig, ReplayResult, replay
from kvcy.sim.synthetic import SyntheticConfig, synthetic_trace
from kvcy.sim.traces import Trace, TraceRequest, bundled_trace_path, read_mooncake

__all__ = [
    "Divergence",
    "ReplayConfig",
    "ReplayResult",
    "SyntheticConfig",
    "Trace",
    "TraceRequest",
    "bundled_trace_path",
    "read_mooncake",
    "replay",
    "synthetic_trace",
]
