"""Benchmark results: a figure for Courier, one for its ceiling, and their ratio."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Measurement:
    rate: float
    latency_ms: float = 0.0


@dataclass(frozen=True)
class ScenarioResult:
    scenario: str
    variant: str
    unit: str
    courier: Measurement
    ceiling: Measurement | None
    target_ratio: float | None = None
    target_absolute: float | None = None
    notes: str = ""
    # A cost (bytes, buffers per message) rather than a rate: the target is a ratio at most target_ratio.
    lower_is_better: bool = False

    @property
    def ratio(self) -> float | None:
        if self.ceiling is None or self.ceiling.rate == 0:
            return None
        return self.courier.rate / self.ceiling.rate

    @property
    def meets_target(self) -> bool | None:
        checks = []
        if self.target_ratio is not None and self.ratio is not None:
            checks.append(self.ratio <= self.target_ratio if self.lower_is_better else self.ratio >= self.target_ratio)
        if self.target_absolute is not None:
            checks.append(self.courier.rate >= self.target_absolute)
        return all(checks) if checks else None

    def as_dict(self) -> dict[str, object]:
        return {
            "scenario": self.scenario, "variant": self.variant, "unit": self.unit,
            "courier": self.courier.rate, "courier_latency_ms": self.courier.latency_ms,
            "ceiling": self.ceiling.rate if self.ceiling else None,
            "ceiling_latency_ms": self.ceiling.latency_ms if self.ceiling else None,
            "ratio": self.ratio, "target_ratio": self.target_ratio,
            "target_absolute": self.target_absolute, "meets_target": self.meets_target,
            "lower_is_better": self.lower_is_better,
            "notes": self.notes,
        }


def measure_rounds(runs: dict[str, Callable[[], Measurement]], rounds: int) -> dict[str, Measurement]:
    """Run every measurement once per round, interleaved, so that machine noise hits them
    alike; report each one's median."""
    samples: dict[str, list[Measurement]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(run())
    return {
        name: Measurement(statistics.median(m.rate for m in ms), statistics.median(m.latency_ms for m in ms))
        for name, ms in samples.items()
    }
