"""Metrics an offloading manager reports through ``get_stats()``.

:class:`OffloadingConnectorStats` mirrors vLLM 0.33.0's
``vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics.OffloadingConnectorStats``:
its ``data`` is ``{"types": {name: kind}, "data": {name: {labels: value}},
"info": None | [ {label: value}, ... ]}``, where ``labels`` is a tuple of label
values (``()`` for unlabelled metrics), a histogram's value is the list of its
observations, and ``info`` holds the managers' static ``config_info()`` series
(``None`` until one is set with :meth:`~OffloadingConnectorStats.set_info`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OffloadingConnectorStats"]

GAUGE = "gauge"
COUNTER = "counter"
HISTOGRAM = "histogram"


@dataclass
class OffloadingConnectorStats:
    """Gauges, counters and histogram observations collected over one interval.

    A metric's kind is fixed by its first record; later records of another
    kind are added to its values as vLLM does (counters add, gauges replace,
    histograms append).

    Args:
        data: an earlier ``data`` dict to continue from (default: empty).
    """

    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "data" not in self.data:
            self.reset()

    @property
    def _types(self) -> dict[str, str]:
        return self.data["types"]

    @property
    def _values(self) -> dict[str, Any]:
        return self.data["data"]

    def to_dict(self) -> dict[str, Any]:
        """The serializable payload: ``data`` itself."""
        return self.data

    def metric_sections(self) -> tuple[dict[str, Any], ...]:
        """The kinds section and the values section (live references), in that order."""
        return (self._types, self._values)

    def reset(self) -> None:
        """Forget everything recorded, ``info`` included."""
        self.data = {"types": {}, "data": {}, "info": None}

    def is_empty(self) -> bool:
        """Whether nothing was recorded and no ``info`` was set."""
        return not self.data.get("data") and self.data.get("info") is None

    def set_gauge(self, gauge_name: str, gauge_value: int | float, labelvalues: tuple[str, ...] = ()) -> None:
        """Set gauge ``gauge_name`` (for these label values) to ``gauge_value``."""
        self._types.setdefault(gauge_name, GAUGE)
        self._values.setdefault(gauge_name, {})[labelvalues] = gauge_value

    def increase_counter(self, counter_name: str, counter_increase_value: int | float = 1,
                         labelvalues: tuple[str, ...] = ()) -> None:
        """Add ``counter_increase_value`` to counter ``counter_name`` (0 is reported too)."""
        self._types.setdefault(counter_name, COUNTER)
        values = self._values.setdefault(counter_name, {})
        values[labelvalues] = values.get(labelvalues, 0) + counter_increase_value

    def observe_histogram(self, histogram_name: str, histogram_value: int | float,
                          labelvalues: tuple[str, ...] = ()) -> None:
        """Record one observation of histogram ``histogram_name``."""
        self._types.setdefault(histogram_name, HISTOGRAM)
        self._values.setdefault(histogram_name, {}).setdefault(labelvalues, []).append(histogram_value)

    def set_info(self, info: Sequence[Mapping[str, Any]]) -> None:
        """Put the static configuration series (as ``config_info()`` returns them) on the payload."""
        self.data["info"] = [dict(series) for series in info]

    def aggregate(self, other: OffloadingConnectorStats) -> OffloadingConnectorStats:
        """Fold ``other`` into this one: gauges take its value, counters add, histograms extend.

        ``other``'s ``info``, when set, replaces this one's.

        Raises:
            AssertionError: ``other`` is not an ``OffloadingConnectorStats``, or
                has a value of a metric with no (or an unknown) kind, or observations
                of a histogram this one recorded as a counter or gauge (vLLM asserts).
        """
        if other.is_empty():
            return self
        assert isinstance(other, OffloadingConnectorStats)
        other_info = other.data.get("info")
        if other_info is not None:
            self.data["info"] = [dict(series) for series in other_info]
        other_types = other._types
        for name, by_label in other._values.items():
            kind = other_types.get(name)
            if kind is None:
                raise AssertionError(f"Unknown offloading stats key: {name}")
            self._types.setdefault(name, kind)
            mine = self._values.setdefault(name, {})
            for labels, value in by_label.items():
                if kind == HISTOGRAM:
                    assert isinstance(value, list)
                    if labels not in mine:
                        mine[labels] = list(value)
                    else:
                        assert isinstance(mine[labels], list)  # (recorded here as another kind)
                        mine[labels].extend(value)
                elif kind == COUNTER:
                    assert isinstance(value, int | float)
                    mine[labels] = mine.get(labels, 0) + value
                elif kind == GAUGE:
                    assert isinstance(value, int | float)
                    mine[labels] = value
                else:
                    raise AssertionError(f"Unknown metric type '{kind}' for key: {name}")
        return self

    def reduce(self) -> dict[str, int | float]:
        """One number per series for a log line: counters and gauges as they are,
        a histogram as ``<name>_count`` and ``<name>_sum`` (labelled series are
        named ``<name>:<labels>``).

        Raises:
            AssertionError: a metric has no (or an unknown) kind (vLLM asserts).
        """
        out: dict[str, int | float] = {}
        for name, by_label in self._values.items():
            kind = self._types.get(name)
            if kind is None:
                raise AssertionError(f"Unknown offloading stats key: {name}")
            for labels, value in by_label.items():
                label = f"{name}:{labels}" if labels else name
                if kind == HISTOGRAM:
                    assert isinstance(value, list)
                    out[f"{label}_count"] = len(value)
                    out[f"{label}_sum"] = sum(value)
                elif kind in (COUNTER, GAUGE):
                    assert isinstance(value, int | float)
                    out[label] = value
                else:
                    raise AssertionError(f"Unknown metric type '{kind}' for key: {name}")
        return out
