"""Metrics an offloading manager reports through ``get_stats()``.

:class:`OffloadingConnectorStats` mirrors vLLM 0.33.0's
``vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics.OffloadingConnectorStats``:
its ``data`` is ``{"types": {name: kind}, "data": {name: {labels: value}},
"info": {name: documentation}}``, where ``labels`` is a tuple of label values
(``()`` for unlabelled metrics) and a histogram's value is the list of its
observations.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OffloadingConnectorStats"]

GAUGE = "gauge"
COUNTER = "counter"
HISTOGRAM = "histogram"


class OffloadingConnectorStats:
    """Gauges, counters and histogram observations collected over one interval.

    Args:
        data: an earlier ``data`` dict to continue from (default: empty).
    """

    def __init__(self, data: dict[str, Any] | None = None):
        if data is None:
            data = {"types": {}, "data": {}, "info": {}}
        self.data: dict[str, Any] = data

    def _slot(self, name: str, kind: str, documentation: str | None) -> dict[tuple, Any]:
        types = self.data["types"]
        known = types.get(name)
        if known is None:
            types[name] = kind
            self.data["data"][name] = {}
            if documentation is not None:
                self.data["info"][name] = documentation
        elif known != kind:
            raise ValueError(f"metric {name!r} is a {known}, not a {kind}")
        return self.data["data"][name]

    def set_gauge(self, name: str, value: float, labelvalues: tuple = (),
                  documentation: str | None = None) -> None:
        """Set gauge ``name`` (for these label values) to ``value``."""
        self._slot(name, GAUGE, documentation)[tuple(labelvalues)] = value

    def increase_counter(self, name: str, value: int | float, labelvalues: tuple = (),
                         documentation: str | None = None) -> None:
        """Add ``value`` to counter ``name`` (it is created at 0, so 0 is reported)."""
        slot = self._slot(name, COUNTER, documentation)
        key = tuple(labelvalues)
        slot[key] = slot.get(key, 0) + value

    def observe_histogram(self, name: str, value: int | float, labelvalues: tuple = (),
                          documentation: str | None = None) -> None:
        """Record one observation of histogram ``name``."""
        self._slot(name, HISTOGRAM, documentation).setdefault(tuple(labelvalues), []).append(value)

    def is_empty(self) -> bool:
        """Whether nothing was recorded."""
        return not self.data["data"]

    def reset(self) -> None:
        """Forget everything recorded."""
        self.data = {"types": {}, "data": {}, "info": {}}

    def aggregate(self, other: OffloadingConnectorStats) -> OffloadingConnectorStats:
        """Fold ``other`` into this one: gauges take its value, counters add, histograms extend."""
        for name, kind in other.data["types"].items():
            doc = other.data["info"].get(name)
            for labels, value in other.data["data"][name].items():
                if kind == GAUGE:
                    self.set_gauge(name, value, labels, doc)
                elif kind == COUNTER:
                    self.increase_counter(name, value, labels, doc)
                else:
                    for v in value:
                        self.observe_histogram(name, v, labels, doc)
        return self

    def __repr__(self) -> str:
        return f"OffloadingConnectorStats({self.data['data']!r})"
