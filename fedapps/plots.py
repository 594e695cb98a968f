"""PNG plots of a run's results (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_accuracy(rounds: list[dict[str, Any]], title: str, path: Path) -> Path:
    """G and P per round."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("global_accuracy", "G (global model)"),
                       ("personal_accuracy", "P (personalized)")):
        pts = [(r["round"], 100 * r[key]) for r in rounds if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", markersize=3, label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
