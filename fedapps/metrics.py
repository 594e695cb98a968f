"""How task metrics are shown (a leaf without torch: the CLI imports it)."""

from __future__ import annotations

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
