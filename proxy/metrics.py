"""Counters and latency histograms, served as Prometheus text at `GET /metrics`.

Deliberately small: labelled counters, fixed-bucket histograms, and gauges read
from callbacks at scrape time (engine state, store commits, session counts).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


class Metrics:
    def __init__(self) -> None:
        self._counters: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
        self._hist: dict[str, dict[tuple, list[float]]] = defaultdict(dict)
        self._gauges: dict[str, Callable[[], float]] = {}
        self._help: dict[str, str] = {}

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        self._counters[name][tuple(sorted(labels.items()))] += value

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        buckets = self._hist[name].get(key)
        if buckets is None:
            buckets = self._hist[name][key] = [0.0] * (len(_BUCKETS) + 2)  # buckets.., count, sum
        buckets[bisect.bisect_left(_BUCKETS, seconds)] += 1 if seconds <= _BUCKETS[-1] else 0
        buckets[-2] += 1
        buckets[-1] += seconds

    def gauge(self, name: str, fn: Callable[[], float], help_text: str = "") -> None:
        self._gauges[name] = fn
        self._help[name] = help_text

    def counter_value(self, name: str, **labels: str) -> float:
        return self._counters[name].get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        lines: list[str] = []
        for name, series in sorted(self._counters.items()):
            lines.append(f"# TYPE {name} counter")
            for key, value in series.items():
                lines.append(f"{name}{_labels(dict(key))} {value:g}")
        for name, series in sorted(self._hist.items()):
            lines.append(f"# TYPE {name} histogram")
            for key, b in series.items():
                labels = dict(key)
                cumulative = 0.0
                for bound, count in zip(_BUCKETS, b):
                    cumulative += count
                    lines.append(f"{name}_bucket{_labels({**labels, 'le': f'{bound:g}'})} {cumulative:g}")
                lines.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {b[-2]:g}")
                lines.append(f"{name}_count{_labels(labels)} {b[-2]:g}")
                lines.append(f"{name}_sum{_labels(labels)} {b[-1]:.6f}")
        for name, fn in sorted(self._gauges.items()):
            if self._help.get(name):
                lines.append(f"# HELP {name} {self._help[name]}")
            lines.append(f"# TYPE {name} gauge")
            try:
                lines.append(f"{name} {float(fn()):g}")
            except Exception:  # a broken gauge must not break the scrape
                lines.append(f"{name} NaN")
        return "\n".join(lines) + "\n"
