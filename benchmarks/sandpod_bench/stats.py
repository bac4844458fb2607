"""Summaries of latency samples (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The `fraction` quantile (0..1) with linear interpolation between closest ranks
    (numpy's default "linear" method)."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction {fraction} is not within 0..1")
    ordered = sorted(samples)
    position = fraction * (len(ordered) - 1)
    lower = math.floor(position)
    upper = math.ceil(position)
    weight = position - lower
    return ordered[lower] + (ordered[upper] - ordered[lower]) * weight


@dataclass(frozen=True)
class Summary:
    """Seconds. `failures` counts attempts that produced no (correct) result."""

    count: int
    failures: int
    mean: float
    p50: float
    p95: float
    p99: float
    minimum: float
    maximum: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(samples: Sequence[float], failures: int = 0) -> Summary | None:
    """None when there is no successful sample at all."""
    if not samples:
        return None
    return Summary(
        count=len(samples),
        failures=failures,
        mean=sum(samples) / len(samples),
        p50=percentile(samples, 0.50),
        p95=percentile(samples, 0.95),
        p99=percentile(samples, 0.99),
        minimum=min(samples),
        maximum=max(samples),
    )


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def median(values: Sequence[float]) -> float:
    return percentile(values, 0.5)
