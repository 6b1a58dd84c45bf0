"""Gauges computed at scrape time, on registries we own (never the global default).

Some figures are cheaper to read when Prometheus asks than to keep up to date (a table's
statistics, counts over a cache): these collectors read them then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class CallbackGauges(Collector):
    """Gauges computed at scrape time (ProcTable stats, cache sizes)."""

    def __init__(self, read: Callable[[], dict[str, float]], names: dict[str, str]) -> None:
        self._read = read
        self._names = names

    def collect(self) -> Iterator[Any]:
        values = self._read()
        for key, help_text in self._names.items():
            yield GaugeMetricFamily(key, help_text, value=values.get(key, 0.0))


class LabelledGauge(Collector):
    """One gauge whose labelled samples are computed at scrape time."""

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...],
                 read: Callable[[], Mapping[Any, float]]) -> None:
        """``read`` returns each sample's value by its label values (a tuple, in ``labels``' order)."""
        self._name, self._help, self._labels, self._read = name, help_text, labels, read

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(self._name, self._help, labels=list(self._labels))
        for labels, value in sorted(self._read().items()):
            family.add_metric(list(labels), value)
        yield family
