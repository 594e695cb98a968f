"""PNG plots of a run's results (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

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


def _series(doc: dict[str, Any], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(r["round"], 100 * r[key]) for r in doc["rounds"] if r.get(key) is not None]
    rounds, values = zip(*pts, strict=True) if pts else ((), ())
    return np.asarray(rounds), np.asarray(values)


def plot_curves_with_bands(by_cell: dict[str, list[dict[str, Any]]], path: Path,
                           title: str) -> Path:
    """G (solid) and P (dashed) per round for each cell: mean over seeds, band = min..max."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, docs) in enumerate(by_cell.items()):
        color = f"C{i % 10}"
        for key, style, name in (("global_accuracy", "-", "G"),
                                 ("personal_accuracy", "--", "P")):
            series = [_series(d, key) for d in docs]
            n = min((len(v) for _, v in series), default=0)
            if n == 0:
                continue
            rounds = series[0][0][:n]
            stack = np.stack([v[:n] for _, v in series])
            ax.plot(rounds, stack.mean(0), style, color=color, label=f"{label} {name}")
            if len(docs) > 1:
                ax.fill_between(rounds, stack.min(0), stack.max(0), color=color, alpha=0.15)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"{title}: G and P (mean over seeds, band = min..max)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_client_distribution(by_cell: dict[str, list[dict[str, Any]]], path: Path,
                             title: str) -> Path:
    """Per-client accuracy of the last evaluated round, all seeds pooled: G and P per cell."""
    data, labels = [], []
    for label, docs in by_cell.items():
        for key, name in (("client_global_accuracy", "G"), ("client_personal_accuracy", "P")):
            vals = []
            for d in docs:
                last = [r for r in d["rounds"] if r.get(key)]
                if last:
                    vals += [100 * a for a in last[-1][key] if a is not None]
            if vals:
                data.append(vals)
                labels.append(f"{label}\n{name}")
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(data)), 4))
    if data:
        ax.boxplot(data)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set_ylabel("client accuracy (%)")
    ax.set_title(f"{title}: per-client accuracy, final round")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_label_heatmap(counts: list[list[int]], emd: float, path: Path) -> Path:
    """Clients x classes sample counts of the partition, with its EMD in the title."""
    arr = np.asarray(counts)
    fig, ax = plt.subplots(figsize=(max(4, 0.45 * arr.shape[1] + 2), max(3, 0.25 * len(arr) + 1)))
    im = ax.imshow(arr, aspect="auto", cmap="viridis")
    fig.colorbar(im, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client (partition id)")
    ax.set_title(f"label distribution, EMD = {emd:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
