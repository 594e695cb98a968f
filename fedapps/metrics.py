"""How task metrics are shown (a leaf without torch: the CLI imports it)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

# metrics shown in percent (tables, plots, progress lines); others (R^2) as plain numbers
PERCENT_METRICS = ("accuracy", "map50")


def metric_scale(metric: str) -> float:
    """100 for a metric shown in percent, else 1."""
    return 100.0 if metric in PERCENT_METRICS else 1.0


def show_metric(v: float | None, metric: str) -> str:
    """A metric value as the progress lines print it: accuracy as a percentage, mAP-50 as a
    named percentage, anything else (R^2) named, as a plain number; "-" when undefined."""
    if v is None:
        return "-"
    text = f"{v * 100:.2f}%" if metric in PERCENT_METRICS else f"{v:.4f}"
    return text if metric == "accuracy" else f"{metric} {text}"


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value), as tables and
    best-by-axis plots summarise runs over seeds."""
    vals = [float(v) for v in values]
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0
