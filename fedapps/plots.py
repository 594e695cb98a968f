"""PNG plots of a run's results (matplotlib, headless)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedapps.metrics import mean_std  # noqa: E402

# How each task metric is shown: (scale, axis label)
METRIC_AXES = {"accuracy": (100.0, "accuracy (%)"),
               "r2": (1.0, "R² (coefficient of determination)"),
               "map50": (100.0, "mAP-50 (%)")}


SERIES = {"global": "G (global model)", "personal": "P (personalized)",
          "official_test": "official test split"}


def plot_metric(rounds: list[dict[str, Any]], title: str, path: Path,
                metric: str = "accuracy", xlabel: str = "round",
                labels: dict[str, str | None] | None = None) -> Path:
    """G and P per round, in the task's metric, and the official test split's where the
    records have it (model-heterogeneous methods, the centralized baseline). `labels`
    renames series of SERIES (None leaves one out)."""
    scale, axis = METRIC_AXES.get(metric, (1.0, metric))
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, label in {**SERIES, **(labels or {})}.items():
        key = f"{name}_{metric}"
        if label is None:
            continue
        pts = [(r["round"], scale * r[key]) for r in rounds if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", markersize=3, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(axis)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_metric(by_cell: dict[str, list[dict[str, Any]]]) -> str:
    """The task metric of a set of runs (their summaries name it; older runs: accuracy)."""
    docs = [d for ds in by_cell.values() for d in ds]
    return str(docs[0]["summary"].get("metric", "accuracy")) if docs else "accuracy"


# x axes of the curves: per round, or per megabyte of training traffic (models down, updates
# up: `bytes_down` + `bytes_up`, cumulative), where methods that save communication
# (phase-shift, Federated Dropout) are compared at equal transfer rather than equal rounds
X_AXES = {"round": "round", "transfer": "training traffic, models down + updates up (MB)"}


def round_traffic(record: dict[str, Any]) -> int:
    """Bytes of a round's training messages (evaluation's are counted apart)."""
    return (record.get("bytes_down") or 0) + (record.get("bytes_up") or 0)


def transfer_mb(doc: dict[str, Any]) -> dict[int, float]:
    """Cumulative training traffic in MB (10^6 bytes) after each round of a run."""
    total, out = 0, {}
    for r in doc["rounds"]:
        total += round_traffic(r)
        out[r["round"]] = total / 1e6
    return out


def _series(doc: dict[str, Any], key: str, scale: float = 100.0, x: str = "round"
            ) -> tuple[np.ndarray, np.ndarray]:
    where = transfer_mb(doc) if x == "transfer" else None
    pts = [(r["round"] if where is None else where[r["round"]], scale * r[key])
           for r in doc["rounds"] if r.get(key) is not None]
    xs, values = zip(*pts, strict=True) if pts else ((), ())
    return np.asarray(xs), np.asarray(values)


def personalizes(by_cell: dict[str, list[dict[str, Any]]], metric: str) -> bool:
    """Whether any run has a P that differs from its G (a grid of global-model methods has
    P = G in every round, and a P panel would only repeat G's)."""
    return any(r.get(f"personal_{metric}") not in (None, r.get(f"global_{metric}"))
               for docs in by_cell.values() for d in docs for r in d["rounds"])


def transfers_differ(by_cell: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether two cells move different training traffic in a round both ran (each cell's
    first run; then curves per MB tell what curves per round hide, e.g. phase-shift's 3/4 of
    FedAvg's messages a round)."""
    per_round = [{r["round"]: round_traffic(r) for r in docs[0]["rounds"]}
                 for docs in by_cell.values() if docs]
    return any(a[k] != b[k] for a, b in itertools.combinations(per_round, 2)
               for k in a.keys() & b.keys())


PANELS = (("global", "G (global model)"), ("personal", "P (personalized)"))
OFFICIAL_PANEL = ("official_test", "official test split (global model)")


def _panels(by_cell: dict[str, list[dict[str, Any]]], metric: str) -> list[tuple[str, str]]:
    """(series, title) of each panel: G; P where some run's P differs from its G; the
    official test split where runs report it."""
    official = any(r.get(f"{OFFICIAL_PANEL[0]}_{metric}") is not None
                   for docs in by_cell.values() for d in docs for r in d["rounds"])
    shown = PANELS if personalizes(by_cell, metric) else PANELS[:1]
    return list(shown + ((OFFICIAL_PANEL,) if official else ()))


def _panel_figure(count: int) -> tuple[Any, list[Any]]:
    fig, axes = plt.subplots(1, count, figsize=(5.5 * count, 4.5), sharey=True, squeeze=False)
    return fig, list(axes[0])


def _save_panels(fig: Any, axes: list[Any], titles: list[str], xlabel: str, ylabel: str,
                 title: str, path: Path) -> Path:
    """Axis labels, one legend outside the axes (a ten-method comparison stays readable)."""
    for ax, name in zip(axes, titles, strict=True):
        ax.set_xlabel(xlabel)
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_curves_with_bands(by_cell: dict[str, list[dict[str, Any]]], path: Path,
                           title: str, x: str = "round") -> Path:
    """G and P per round (or, `x="transfer"`, per MB of training traffic; and the
    official-test accuracy where runs report it), one panel each and one colour per cell:
    mean over seeds, band = min..max. No P panel where P is G in every run; each cell's seed
    count is in the legend where the cells' counts differ.

    Separate panels and a legend outside the axes keep a ten-method comparison readable.
    """
    if x not in X_AXES:
        raise ValueError(f"x={x!r}: one of {', '.join(X_AXES)}")
    metric = run_metric(by_cell)
    scale, axis = METRIC_AXES.get(metric, (1.0, metric))
    panels = [(f"{key}_{metric}", name) for key, name in _panels(by_cell, metric)]
    fig, axes = _panel_figure(len(panels))
    counts = {len(docs) for docs in by_cell.values()}
    for i, (label, docs) in enumerate(by_cell.items()):
        color = f"C{i % 10}"
        style = "-" if i < 10 else "--"
        name = label if len(counts) == 1 else \
            f"{label} ({len(docs)} seed{'s' if len(docs) != 1 else ''})"
        for ax, (key, _) in zip(axes, panels, strict=True):
            series = [_series(d, key, scale, x) for d in docs]
            n = min((len(v) for _, v in series), default=0)
            if n == 0:
                continue
            xs = np.stack([xv[:n] for xv, _ in series]).mean(0)  # seeds' traffic may differ
            stack = np.stack([v[:n] for _, v in series])
            ax.plot(xs, stack.mean(0), style, color=color, label=name)
            if len(docs) > 1:
                ax.fill_between(xs, stack.min(0), stack.max(0), color=color, alpha=0.15)
    return _save_panels(fig, axes, [name for _, name in panels], X_AXES[x], axis,
                        f"{title}: mean over seeds, band = min..max", path)


# grid axes whose runs report the value they reached (summary key, axis label): a best-by-axis
# plot puts each point at the reached value's mean, as a Dirichlet split misses its target EMD
REACHED = {"data.target-emd": ("emd", "EMD (reached, mean over seeds)")}


class Point(NamedTuple):
    """One point of a best-by-axis line: the runs' best metric at one axis value."""

    value: float  # the axis value (e.g. the target EMD)
    x: float  # where it is drawn: the mean reached value where every run reports it, else value
    mean: float
    std: float  # sample std over the runs (0 for one)
    lo: float
    hi: float
    n: int  # runs
    reached: bool  # x is the reached value's mean


def best_points(points: list[tuple[float, list[dict[str, Any]]]], key: str, scale: float,
                reached: str | None = None) -> list[Point]:
    """A line's points, sorted by x: its runs' summary `key` (a best metric) at each axis
    value, mean, std, min and max over the runs that have it; x is the mean of those runs'
    summary `reached` where every one reports it, else the axis value."""
    out = []
    for value, docs in points:
        runs = [d["summary"] for d in docs if d["summary"].get(key) is not None]
        if not runs:
            continue
        ys = [scale * s[key] for s in runs]
        got = [s.get(reached) for s in runs] if reached else [None]
        has = None not in got
        x = float(np.mean(got)) if has else float(value)
        mean, std = mean_std(ys)
        out.append(Point(float(value), x, mean, std, min(ys), max(ys), len(ys), has))
    return sorted(out, key=lambda p: p.x)


def plot_best_by_axis(lines: dict[str, list[tuple[float, list[dict[str, Any]]]]], path: Path,
                      title: str, axis: str) -> Path:
    """Each run's best metric against a numeric grid axis, one line per setting of the other
    axes (`lines`: name -> [(axis value, runs)]): mean over seeds, bars = min..max, as the
    thesis draws accuracy against EMD. G, and P where it differs, and the official test
    split where runs report it."""
    flat = {f"{name}@{value}": docs for name, pts in lines.items() for value, docs in pts}
    metric = run_metric(flat)
    scale, ylabel = METRIC_AXES.get(metric, (1.0, metric))
    panels = [(f"best_{key}_{metric}", f"best {name}") for key, name in _panels(flat, metric)]
    reached, xlabel = REACHED.get(axis, (None, axis))
    fig, axes = _panel_figure(len(panels))
    counts = {len(docs) for docs in flat.values()}
    for i, (name, pts) in enumerate(lines.items()):
        for ax, (key, _) in zip(axes, panels, strict=True):
            line = best_points(pts, key, scale, reached)
            if not line:
                continue
            xs, mean, lo, hi = (np.asarray([getattr(p, f) for p in line])
                                for f in ("x", "mean", "lo", "hi"))
            n = [p.n for p in line]
            label = name if len(counts) == 1 else f"{name} ({min(n)}-{max(n)} seeds)"
            ax.errorbar(xs, mean, yerr=[mean - lo, hi - mean], marker="o", markersize=4,
                        capsize=3, color=f"C{i % 10}", linestyle="-" if i < 10 else "--",
                        label=label)
    return _save_panels(fig, axes, [name for _, name in panels], xlabel, ylabel,
                        f"{title}: best {metric} by {axis}, mean over seeds, bars = min..max",
                        path)


def _last_round_client_scores(docs: list[dict[str, Any]], key: str, scale: float
                              ) -> list[float]:
    """Per-client scores of each run's last evaluated round, runs pooled."""
    vals: list[float] = []
    for d in docs:
        last = [r for r in d["rounds"] if r.get(key)]
        if last:
            vals += [scale * a for a in last[-1][key] if a is not None]
    return vals


def plot_client_distribution(by_cell: dict[str, list[dict[str, Any]]], path: Path,
                             title: str) -> Path:
    """Per-client score of the last evaluated round, all seeds pooled: a G and a P panel."""
    metric = run_metric(by_cell)
    scale, axis = METRIC_AXES.get(metric, (1.0, metric))
    labels = list(by_cell)
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.1 * len(labels) + 3), 4), sharey=True)
    for ax, key, name in zip(axes, (f"client_global_{metric}", f"client_personal_{metric}"),
                             ("G (global model)", "P (personalized)"), strict=True):
        data = [_last_round_client_scores(by_cell[label], key, scale) for label in labels]
        shown = [(lab, vals) for lab, vals in zip(labels, data, strict=True) if vals]
        if shown:
            ax.boxplot([vals for _, vals in shown])
            ax.set_xticks(range(1, len(shown) + 1), [lab for lab, _ in shown], fontsize=8,
                          rotation=30 if len(shown) > 4 else 0, ha="right" if len(shown) > 4
                          else "center")
        ax.set_title(name)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel(f"client {axis}")
    fig.suptitle(f"{title}: per-client {metric}, final round (seeds pooled)")
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
