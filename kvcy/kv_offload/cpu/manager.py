"""The CPU tier's scheduler-side manager (``vllm.v1.kv_offload.cpu.manager``).

``CPUOffloadingManager`` is the live twin's class (``kvcy.kv_offload._twin``).
"""

from kvcy.kv_offload._twin import twin as _twin

CPUOffloadingManager = _twin.CPUOffloadingManager

__all__ = ["CPUOffloadingManager"]
