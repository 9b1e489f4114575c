"""The offloading transfer worker: handlers that move KV blocks between media, and their router.

* :mod:`.worker`: the API (``TransferSpec``, ``TransferResult``,
  ``OffloadingHandler``, the routing ``OffloadingWorker``);
* :mod:`.cpu_gpu`: the CPU tier (``SingleDirectionOffloadingHandler``,
  ``CPUOffloadingWorker``), built on :mod:`kvcy.ops`.

Needs torch.
"""

from kvcy.kv_offload.worker.cpu_gpu import CPUOffloadingWorker, SingleDirectionOffloadingHandler
from kvcy.kv_offload.worker.worker import OffloadingHandler, OffloadingWorker, TransferResult, TransferSpec

__all__ = [
    "CPUOffloadingWorker",
    "OffloadingHandler",
    "OffloadingWorker",
    "SingleDirectionOffloadingHandler",
    "TransferResult",
    "TransferSpec",
]
