"""Reproduce a paper table: run an experiment over a grid and seeds, then tabulate and plot.

A grid file `conf/grid/<name>.yaml` names an experiment, the seeds, the axes to sweep (e.g.
algorithm x data.alpha) and the paper's numbers for each cell. The axis `variant` sweeps named
bundles of settings (`variants: {name: [KEY=VALUE, ...]}`), for a figure whose lines differ in
several keys at once (FedAvg with raised E and rounds beside phase-shift); `exclude` drops cells
by label (combinations the paper does not run). Runs land in
`<output-dir>/<grid>/<cell>-s<seed>/`; a finished run (results.json with status completed) is
never redone, so an interrupted grid resumes where it stopped. What the runner does with a run
it finds unfinished is the runner's (simulations/cli.py: continue it from its checkpoint when
its settings allow, fedapps/rundir.py RESUME_UNFINISHED, else start it again from scratch with
a new run id, REDO_UNFINISHED); a run another process holds is skipped. The table and plots
are rebuilt from whatever runs exist, runs in outputs/ or kept ones (`--keep DIR` copies
finished runs into DIR in the kept form, simulations/kept_runs.py; `--table-only --output-dir
DIR` tabulates and plots them).
"""

from __future__ import annotations

import glob
import itertools
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from fedapps.config import available, load_config, override_key
from fedapps.errors import ConfigError
from fedapps.metrics import mean_std, metric_scale
from fedapps.paths import CONF_DIR
from fedapps.preflight import check_device, check_output_dir
from fedapps.rundir import RunCompleted, RunDirBusy
from fedapps.validation import validate
from simulations.kept_runs import keep_run, read_results

# (summary key without the metric, column name): accuracies in %, R^2 as it is
METRICS = (("best_global", "best G"), ("best_personal", "best P"), ("final_global", "final G"),
           ("final_personal", "final P"))
# model-heterogeneous methods: the global model on the official test split (seed 004's "global")
OFFICIAL = (("best_official_test", "best official test"),
            ("final_official_test", "final official test"))
# and the per-client cost of seed 004 Table 3.6, in millions
COSTS = (("mean_client_params", "params/client (M)", 1e-6),
         ("mean_client_flops", "MFLOPs/client", 1e-6))


def columns(metric: str, official: bool) -> list[tuple[str, str, float]]:
    """(summary key, column name, scale) of a table for runs reporting `metric`."""
    scale = metric_scale(metric)
    named = METRICS + (OFFICIAL if official else ())
    cols = [(f"{key}_{metric}", name + (f" {metric}" if metric != "accuracy" else ""), scale)
            for key, name in named]
    return cols + (list(COSTS) if official else [])


def has_official(by_cell: dict[str, list[dict[str, Any]]], metric: str) -> bool:
    """Whether any run reports the official test split (model-heterogeneous methods): its
    columns are added and it becomes the headline."""
    return any(f"best_official_test_{metric}" in d["summary"]
               for docs in by_cell.values() for d in docs)


@dataclass
class Grid:
    name: str
    experiment: str
    seeds: list[int]
    axes: dict[str, list[Any]] = field(default_factory=dict)
    reference: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = ""
    cell_overrides: dict[str, list[str]] = field(default_factory=dict)  # by cell label
    overrides: list[str] = field(default_factory=list)  # for every cell (the table's setting)
    variants: dict[str, list[str]] = field(default_factory=dict)  # values of the axis `variant`
    exclude: list[str] = field(default_factory=list)  # labels of cells not to run
    # extra columns: the best metric within the first share of the rounds (seed 004 Table 2.4)
    budgets: list[float] = field(default_factory=list)
    paired_against: str = ""  # a cell label: paired.md compares every other cell with it
    paired: list[list[str]] = field(default_factory=list)  # or these [cell, baseline] pairs
    # an extra column: the metric's mean over the last share of the rounds, a steadier readout
    # than the final round of a curve that swings from round to round (0: none)
    tail: float = 0.0

    def every_cell(self) -> list[dict[str, Any]]:
        """Every combination of the axes' values, excluded ones too."""
        keys = list(self.axes)
        return [dict(zip(keys, values, strict=True))
                for values in itertools.product(*(self.axes[k] for k in keys))]

    def cells(self) -> list[dict[str, Any]]:
        return [c for c in self.every_cell() if cell_label(c) not in self.exclude]

    def cell_sets(self, cell: dict[str, Any]) -> list[str]:
        """The overrides that make a cell: the grid's, then the axes' values (a variant's
        bundle in its place), then the cell's own."""
        axes = [s for k, v in cell.items()
                for s in (self.variants[str(v)] if k == VARIANT else [f"{k}={v}"])]
        return [*self.overrides, *axes, *self.cell_overrides.get(cell_label(cell), [])]


VARIANT = "variant"  # the axis whose values name bundles of settings


def cell_label(cell: dict[str, Any]) -> str:
    """'fedreb' for an algorithm-only (or variant-only) grid, else
    'algorithm=fedreb,data.alpha=0.5'."""
    if list(cell) in (["algorithm"], [VARIANT]):
        return str(next(iter(cell.values())))
    return ",".join(f"{k}={v}" for k, v in cell.items()) or "run"


def grid_file(name: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A grid file's keys; `extends: OTHER` takes every key of grid OTHER that the file does not
    set itself (e.g. a figure's CIFAR-10 grid: FMNIST's cells under another experiment)."""
    path = CONF_DIR / "grid" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"grid {seen[-1]}: extends {name}, but there is no conf/grid/"
                          f"{name}.yaml")
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    assert isinstance(raw, dict)
    base = raw.pop("extends", None)
    if base is None:
        return raw
    if str(base) in (*seen, name):
        raise ConfigError(f"grid {name}: extends {base}, which extends it back "
                          f"({' -> '.join((*seen, name, str(base)))})")
    return {**grid_file(str(base), (*seen, name)), **raw}


def load_grid(name: str) -> Grid:
    """A grid file, or an experiment preset run as a one-cell grid over seeds 0..2."""
    path = CONF_DIR / "grid" / f"{name}.yaml"
    if path.is_file():
        raw = grid_file(name)
        ref = raw.get("reference") or {}
        grid = Grid(name, str(raw["experiment"]), [int(s) for s in raw.get("seeds", [0, 1, 2])],
                    {str(k): list(v) for k, v in (raw.get("grid") or {}).items()},
                    {str(k): dict(v) for k, v in (ref.get("values") or {}).items()},
                    str(ref.get("source", "")),
                    {str(k): [str(x) for x in v]
                     for k, v in (raw.get("cell-overrides") or {}).items()},
                    [str(x) for x in raw.get("overrides") or []],
                    {str(k): [str(x) for x in v or []]
                     for k, v in (raw.get("variants") or {}).items()},
                    [str(x) for x in raw.get("exclude") or []],
                    [float(b) for b in raw.get("budgets") or []],
                    str(raw.get("paired-against") or ""),
                    [[str(x) for x in pair] for pair in raw.get("paired") or []],
                    float(raw.get("tail") or 0.0))
        if any(len(pair) != 2 for pair in grid.paired):
            raise ConfigError(f"grid {name}: paired: {grid.paired} must be [cell, baseline] "
                              "pairs")
        if not 0 <= grid.tail <= 1:
            raise ConfigError(f"grid {name}: tail {grid.tail} must be a share of the rounds in "
                              "(0, 1], or 0 for none")
        if any(not 0 < b <= 1 for b in grid.budgets):
            raise ConfigError(f"grid {name}: budgets {grid.budgets} must be shares of the "
                              "rounds in (0, 1]")
        unknown = sorted(str(v) for v in grid.axes.get(VARIANT, []) if str(v) not in grid.variants)
        if unknown:
            raise ConfigError(f"grid {name}: variant {', '.join(unknown)} not under variants:; "
                              f"variants: {', '.join(grid.variants) or 'none'}")
        every = {cell_label(cell) for cell in grid.every_cell()}
        for key, labels in (("cell-overrides", grid.cell_overrides), ("exclude", grid.exclude)):
            stray = [label for label in labels if label not in every]
            if stray:  # a typo would silently run the cell without its settings
                raise ConfigError(f"grid {name}: {key} names no cell of the grid: "
                                  f"{', '.join(stray)} (labels look like {min(every)})")
        running = {cell_label(cell) for cell in grid.cells()}
        named = [c for pair in grid.paired for c in pair] + [grid.paired_against] * bool(
            grid.paired_against)
        stray = sorted({label for label in named if label not in running})
        if stray:  # a typo would silently drop the comparison from paired.md
            raise ConfigError(f"grid {name}: paired names no cell the grid runs: "
                              f"{', '.join(stray)} (labels look like {min(running or every)})")
        return grid
    if name in available("experiment"):
        return Grid(name, name, [0, 1, 2])
    raise ConfigError(f"grid {name!r}: no conf/grid/{name}.yaml and no such experiment; grids: "
                      f"{', '.join(available('grid'))}")


def run_dir_for(out_root: Path, grid: Grid, cell: dict[str, Any], seed: int) -> Path:
    label = cell_label(cell).replace("=", "-").replace(",", "_")
    return out_root / grid.name / f"{label}-s{seed}"


def completed_results(run_dir: Path) -> dict[str, Any] | None:
    """A finished run's results (results.json, or a kept run's results.json.gz); None for a
    run that is unfinished, failed or absent."""
    doc = read_results(run_dir)
    return doc if doc is not None and doc.get("summary", {}).get("status") == "completed" else None


def is_complete(run_dir: Path) -> bool:
    return completed_results(run_dir) is not None


Runner = Callable[[str, list[str], int, Path], str]


def split_cells(pieces: Sequence[str], labels: Sequence[str]) -> list[str]:
    """Cell labels from `--cells` pieces split at commas: a label of several axes holds commas
    itself (`data.target-emd=1.4,variant=fedavg`), so consecutive pieces are joined until they
    form a label of the grid; pieces that never do are returned as they are (reported as
    unknown)."""
    known, out, current = set(labels), [], ""
    for piece in pieces:
        current = f"{current},{piece}" if current else piece
        if current in known:
            out.append(current)
            current = ""
    if current:
        out.extend(current.split(","))
    return out


def selected_cells(grid: Grid, only: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The grid's cells, or those `--cells` names (its pieces joined back into labels); a name
    that is no cell of the grid is a one-line error listing the cells."""
    labels = [cell_label(c) for c in grid.cells()]
    named = split_cells(only, labels)
    unknown = sorted(set(named) - set(labels))
    if unknown:
        raise ConfigError(f"--cells {','.join(unknown)}: not a cell of grid {grid.name}; cells: "
                          f"{', '.join(labels)}")
    return [c for c in grid.cells() if not named or cell_label(c) in named]


def keep_runs(grid: Grid, out_root: Path, keep_root: Path, only: Sequence[str] = (),
              log: Callable[[str], None] = print) -> list[Path]:
    """Copy the finished runs of the grid's seeds (and `only`'s cells) from <out_root>/<grid>/
    to <keep_root>/<grid>/ in the kept form (simulations/kept_runs.py); returns the runs newly
    kept. A run kept before is left as it is, an unfinished one is named and skipped."""
    kept = []
    for cell in selected_cells(grid, only):
        for seed in grid.seeds:
            src = run_dir_for(out_root, grid, cell, seed)
            dst = run_dir_for(keep_root, grid, cell, seed)
            if not is_complete(src):
                if src.exists():
                    log(f"keep: {src.name}: not finished, not kept")
            elif not keep_run(src, dst):
                log(f"keep: {src.name}: kept earlier in {dst.parent}, left as it is")
            else:
                log(f"keep: {src.name} -> {dst}")
                kept.append(dst)
    return kept


def shadowed_sets(overrides: Sequence[str], own: Sequence[str]) -> list[tuple[str, str]]:
    """(command-line setting, the cell's) for each key a cell sets to another value itself."""
    cells = {override_key(s): s for s in own}
    return [(s, cells[k]) for s in overrides
            if (k := override_key(s)) in cells and cells[k] != s]


def run_grid(grid: Grid, overrides: Sequence[str], out_root: Path, runner: Runner,
             log: Callable[[str], None] = print, only: Sequence[str] = (), jobs: int = 1,
             on_interrupt: Callable[[], None] = lambda: None,
             ) -> list[tuple[dict[str, Any], int, Path]]:
    """Run every (cell, seed) not yet complete; returns all (cell, seed, run dir).

    `only` restricts the runs to the cells with these labels (e.g. to redo one method).
    `jobs` > 1 runs that many at a time (each its own SuperLink); `on_interrupt` then stops the
    runs still going when Ctrl-C/SIGTERM reaches this thread.
    """
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: must be at least 1")
    cells = selected_cells(grid, only)
    check_output_dir(out_root / grid.name, "--output-dir")
    plan = []
    for cell in cells:
        # the command line's overrides sit between the grid's and the cell's, as before: a
        # cell's own settings define it, so they win, and the user is told which --set lost
        own = grid.cell_sets(cell)[len(grid.overrides):]
        for given, kept in shadowed_sets(overrides, own):
            log(f"--set {given}: cell {cell_label(cell)} sets {kept} itself, which wins")
        for seed in grid.seeds:
            sets = [f"wandb.group={grid.name}", *grid.overrides, *overrides, *own,
                    f"seed={seed}"]
            cfg = load_config(grid.experiment, sets)
            validate(cfg)  # every cell is checked before the first run starts
            check_device(str(cfg.device), str(cfg.train.precision))
            plan.append((cell, seed, sets, int(cfg.federation["num-clients"])))
    done, pending = [], []
    for i, (cell, seed, sets, n_clients) in enumerate(plan, 1):
        target = run_dir_for(out_root, grid, cell, seed)
        tag = f"[{i}/{len(plan)}] {cell_label(cell)} seed {seed}"
        if is_complete(target):
            log(f"{tag}: done earlier, kept")
        else:
            sets = [*sets, f"output.output-dir={target.parent}", f"output.run-name={target.name}"]
            pending.append((tag, sets, n_clients, target))
        done.append((cell, seed, target))

    stopping = threading.Event()

    def execute(tag: str, sets: list[str], n_clients: int, target: Path) -> None:
        if stopping.is_set():
            return
        log(f"{tag} -> {target}")
        try:
            status = runner(grid.experiment, sets, n_clients, target)
        except RunCompleted:
            log(f"{tag}: completed meanwhile by another process, kept")
            return
        except RunDirBusy as err:
            log(f"{tag}: skipped, {err}")
            return
        if stopping.is_set():
            log(f"{tag}: stopped; it reruns when the grid is resumed")
        elif status != "finished:completed":
            log(f"{tag}: failed ({status}); the grid goes on")
        elif jobs > 1:
            log(f"{tag}: finished")

    if jobs == 1:
        for job in pending:
            execute(*job)
        return done
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = []
        try:
            for job in pending:
                futures.append(pool.submit(execute, *job))
            for future in futures:
                future.result()
        except BaseException:
            stopping.set()
            on_interrupt()
            pool.shutdown(wait=True, cancel_futures=True)  # the stopped runs report first
            raise
    return done


def collect(grid: Grid, out_root: Path) -> dict[str, list[dict[str, Any]]]:
    """Every completed run of each cell found on disk (any seed), grouped by cell label; each
    run's seed (from its directory name) under "seed"."""
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for cell in grid.cells():
        prefix = run_dir_for(out_root, grid, cell, 0).name[: -len("-s0")]
        # cell names may hold glob characters (algo.hidden-[2_4_8]): escape them
        runs = sorted((out_root / grid.name).glob(f"{glob.escape(prefix)}-s*"),
                      key=lambda p: p.name)
        docs = []
        for r in runs:
            doc = completed_results(r) if r.name[len(prefix) + 2:].isdigit() else None
            if doc is not None:
                doc["seed"] = int(r.name[len(prefix) + 2:])  # pairs runs across cells
                docs.append(doc)
        if docs:
            by_cell[cell_label(cell)] = docs
    return by_cell


def headline_key(rounds: list[dict[str, Any]], metric: str) -> str:
    """The per-round key a run is judged by: the official test split's metric where the run
    has one (seed 004's global accuracy, FedAIoT's centralized test), else G."""
    official = f"official_test_{metric}"
    return official if any(r.get(official) is not None for r in rounds) else f"global_{metric}"


def best_within(doc: dict[str, Any], metric: str, share: float) -> float | None:
    """The best metric over the first ceil(share x rounds) rounds of a run."""
    rounds = doc.get("rounds", [])
    budget = math.ceil(share * len(rounds) - 1e-9)  # tabulated runs are complete
    key = headline_key(rounds, metric)
    vals = [r[key] for r in rounds if r["round"] <= budget and r.get(key) is not None]
    return max(vals) if vals else None


def tail_mean(doc: dict[str, Any], metric: str, share: float) -> float | None:
    """The mean metric over the last ceil(share x rounds) rounds of a run (the rounds among
    them that were evaluated)."""
    rounds = doc.get("rounds", [])
    first = len(rounds) - math.ceil(share * len(rounds) - 1e-9)
    key = headline_key(rounds, metric)
    vals = [r[key] for r in rounds if r["round"] > first and r.get(key) is not None]
    return float(np.mean(vals)) if vals else None


def tail_column(by_cell: dict[str, list[dict[str, Any]]], grid: Grid,
                metric: str) -> list[tuple[str, str, float]]:
    """Puts each run's tail mean into its summary (in memory, for the table and paired.md) and
    returns its column, or no column when the grid has no `tail`."""
    if not grid.tail:
        return []
    key = f"tail_mean_{metric}"
    for docs in by_cell.values():
        for doc in docs:
            doc["summary"][key] = tail_mean(doc, metric, grid.tail)
    kind = "official test" if any(headline_key(d.get("rounds", []), metric).startswith("official")
                                  for docs in by_cell.values() for d in docs) else "G"
    return [(key, f"{kind} mean of last {100 * grid.tail:g}% of rounds", metric_scale(metric))]


def table(by_cell: dict[str, list[dict[str, Any]]], grid: Grid) -> str:
    """Markdown: mean +- sample std of best/final G and P (%) per cell, beside the paper's G and P,
    and the mean wall-clock minutes per run (what a grid costs on the machine that ran it).

    A cell with a single seed shows its value without a spread.
    """
    from fedapps.plots import run_metric

    metric = run_metric(by_cell)
    metrics = columns(metric, has_official(by_cell, metric))
    scale = metric_scale(metric)
    metrics += [(f"@{share:g}", f"best within {100 * share:g}% of rounds", scale)
                for share in grid.budgets]
    metrics += tail_column(by_cell, grid, metric)
    extra = {k for ref in grid.reference.values() for k in ref} - {"G", "P"}
    paper_keys = ["G", "P", *sorted(extra)]
    rows = []
    for label, docs in by_cell.items():
        cells = []
        for key, _, scale in metrics:
            if key.startswith("@"):
                got = [best_within(d, metric, float(key[1:])) for d in docs]
                vals = [v for v in got if v is not None]
            else:
                vals = [d["summary"][key] for d in docs if d["summary"].get(key) is not None]
            if vals:
                m, s = mean_std([scale * v for v in vals])
                # One seed has no spread: print the value alone rather than a misleading "± 0.00".
                digits = 2 if scale == 100.0 else 4  # R^2 and costs in millions: more digits
                cells.append(f"{m:.{digits}f} ± {s:.{digits}f}" if len(vals) > 1
                             else f"{m:.{digits}f}")
            else:
                cells.append("-")
        ref = grid.reference.get(label) or {}
        paper = [str(ref[k]) if ref.get(k) is not None else "-" for k in paper_keys]
        walls = [d["summary"]["wall_seconds"] for d in docs if "wall_seconds" in d["summary"]]
        minutes = f"{np.mean(walls) / 60:.1f}" if walls else "-"
        rows.append((label, len(docs), cells, paper, minutes))
    # a column no run fills (G and P of a run without client evaluation) is left out
    keep = [i for i in range(len(metrics)) if any(r[2][i] != "-" for r in rows)] \
        if rows else list(range(len(metrics)))
    lines = [f"| cell | seeds | {' | '.join(metrics[i][1] for i in keep)} | "
             f"{' | '.join(f'paper {k}' for k in paper_keys)} | min/run |",
             "|" + " --- |" * (len(keep) + len(paper_keys) + 3)]
    for label, n, cells, paper, minutes in rows:
        lines.append(f"| {label} | {n} | {' | '.join(cells[i] for i in keep)} | "
                     f"{' | '.join(paper)} | {minutes} |")
    short = short_runs(by_cell)
    if short:
        lines.append("\nRuns with answers missing (a client crashed, or a step outlasted "
                     "federation.round-timeout: raise it for a slower machine or more --jobs): "
                     + "; ".join(short) + ". A missing fit answer leaves that client out of the "
                     "round's average; a round with an incomplete evaluation is left out of "
                     "best and final G (unless eval.allow-partial).")
    if grid.source:
        lines.append(f"\nPaper: {grid.source}.")
    return "\n".join(lines) + "\n"


def short_runs(by_cell: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each tabulated run that lost answers, as `cell seed N: what`: a grid's numbers must not
    quietly rest on fewer clients than it planned (a step past the round timeout on a busy
    machine drops the slowest clients, and the run still completes)."""
    out = []
    for label, docs in by_cell.items():
        for doc in docs:
            failures = doc["summary"].get("total_failures") or 0
            partial = doc["summary"].get("partial_rounds") or []
            lost = ([f"{failures} fit answers missing or rejected"] if failures else []) + \
                ([f"evaluation incomplete (rounds {', '.join(map(str, partial))})"]
                 if partial else [])
            if lost:
                out.append(f"{label} seed {doc.get('seed', '?')}: {', '.join(lost)}")
    return out


def numeric_axes(grid: Grid) -> list[str]:
    """The grid's axes with two or more numeric values (an EMD, an alpha, a width)."""
    return [k for k, values in grid.axes.items() if len(set(values)) > 1
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)]


def lines_along(grid: Grid, by_cell: dict[str, list[dict[str, Any]]], axis: str
                ) -> dict[str, list[tuple[float, list[dict[str, Any]]]]]:
    """The finished runs of each setting of the other axes (named by its cell label), by the
    value of `axis`, in the grid's order."""
    lines: dict[str, list[tuple[float, list[dict[str, Any]]]]] = {}
    for cell in grid.cells():
        docs = by_cell.get(cell_label(cell))
        if docs:
            rest = {k: v for k, v in cell.items() if k != axis}
            name = cell_label(rest) if rest else grid.name
            lines.setdefault(name, []).append((float(cell[axis]), docs))
    return lines


def axis_table(grid: Grid, by_cell: dict[str, list[dict[str, Any]]], axis: str) -> str:
    """The best-by-axis plot as numbers: one row per setting of the other axes, one column per
    value of `axis`, each run's best headline metric (official test, else G), mean ± sample
    std over seeds; where the axis is a target a split only approaches (data.target-emd), the
    value reached, mean over the seeds, in brackets."""
    from fedapps.plots import REACHED, best_points, run_metric

    metric = run_metric(by_cell)
    official = has_official(by_cell, metric)
    key = f"best_{'official_test' if official else 'global'}_{metric}"
    head, scale = next((name, sc) for k, name, sc in columns(metric, official) if k == key)
    reached = REACHED.get(axis, (None, ""))[0]
    values = sorted({float(v) for v in grid.axes[axis]})
    lines = [f"| {head} by {axis} | {' | '.join(f'{v:g}' for v in values)} |",
             "|" + " --- |" * (len(values) + 1)]
    for name, points in lines_along(grid, by_cell, axis).items():
        at = {p.value: p for p in best_points(points, key, scale, reached)}
        row = []
        for v in values:
            p = at.get(v)
            if p is None:
                row.append("-")
                continue
            text = f"{p.mean:.2f} ± {p.std:.2f}" if p.n > 1 else f"{p.mean:.2f}"
            row.append(f"{text} ({p.x:.3f})" if p.reached else text)
        lines.append(f"| {name} | {' | '.join(row)} |")
    note = f" (in brackets: the {reached.upper()} reached, mean over seeds)" if reached else ""
    return "\n".join(lines) + f"\n\nMean ± sample std over seeds{note}.\n"


PLOT_KINDS = ("curves", "transfer", "best", "clients", "labels")
"""`--plots`' names: curves.png, curves_by_transfer.png, best_by_<axis>.png,
client_accuracy.png, label_distribution.png."""


def parse_plots(text: str) -> tuple[str, ...]:
    """`--plots curves,best` (or `none`): only these PNGs, so rebuilding a kept folder's table
    leaves no plot behind that its write-up does not show."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    if kinds == ("none",):
        return ()
    unknown = [k for k in kinds if k not in PLOT_KINDS]
    if unknown or not kinds:
        raise ConfigError(f"--plots {text}: give none or some of {', '.join(PLOT_KINDS)}")
    return kinds


def plot_all(by_cell: dict[str, list[dict[str, Any]]], out: Path, title: str,
             grid: Grid | None = None, kinds: Sequence[str] = PLOT_KINDS) -> list[Path]:
    """The grid's PNGs of `kinds` (PLOT_KINDS): curves (per MB too where cells' traffic
    differs), per-client scores, the first run's label heatmap, and, given the grid, each
    run's best metric against each numeric axis where a line has two or more of its values."""
    from fedapps.plots import (
        plot_best_by_axis,
        plot_client_distribution,
        plot_curves_with_bands,
        plot_label_heatmap,
        transfers_differ,
    )

    paths = []
    if "curves" in kinds:
        paths.append(plot_curves_with_bands(by_cell, out / "curves.png", title))
    if "transfer" in kinds and transfers_differ(by_cell):  # e.g. phase-shift against FedAvg
        paths.append(plot_curves_with_bands(by_cell, out / "curves_by_transfer.png", title,
                                            x="transfer"))
    for axis in numeric_axes(grid) if grid and "best" in kinds else []:
        lines = lines_along(grid, by_cell, axis)
        if any(len(points) > 1 for points in lines.values()):
            paths.append(plot_best_by_axis(lines, out / f"best_by_{axis}.png", title, axis))
    if "clients" in kinds:
        paths.append(plot_client_distribution(by_cell, out / "client_accuracy.png", title))
    first = next(iter(by_cell.values()), [])
    if "labels" in kinds and first and first[0]["partition"].get("class_counts") is not None:
        part = first[0]["partition"]  # not for regression
        paths.append(plot_label_heatmap(part["class_counts"], part["emd"],
                                        out / "label_distribution.png"))
    return paths


def parse_seeds(text: str) -> int | list[int]:
    """`--seeds`: a bare N means seeds 0..N-1 (the grid's first N); a list of seeds and
    ranges ("1,3", "1-3", "0,2-3"; seed 2 alone "2-2") names the seeds themselves, so a grid's
    seeds can be split over machines or sessions without rerunning the ones done elsewhere."""
    if text.strip().isdigit():
        return int(text)
    seeds: set[int] = set()
    for piece in text.split(","):
        lo, dash, hi = piece.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or (dash and int(hi) < int(lo)):
            raise ConfigError(f"--seeds {text}: give N (seeds 0..N-1) or seeds and ranges "
                              f"such as 1,3 or 1-3")
        seeds.update(range(int(lo), int(hi if dash else lo) + 1))
    return sorted(seeds)


def reproduce(name: str, seeds: int | Sequence[int] | None, overrides: Sequence[str],
              out_root: Path,
              runner: Runner, log: Callable[[str], None] = print,
              table_only: bool = False, only: Sequence[str] = (), jobs: int = 1,
              on_interrupt: Callable[[], None] = lambda: None,
              paired_against: str | None = None, keep_root: Path | None = None,
              plots: Sequence[str] = PLOT_KINDS) -> Path:
    """Run (or resume) a grid, then write table.md and plots under <out_root>/<grid>/.

    `table_only` tabulates the finished runs already on disk without starting any.
    `keep_root` (`--keep DIR`) then copies the finished runs of the seeds and cells asked for
    to <keep_root>/<grid>/ in the kept form (config.yaml, metrics.csv, results.json.gz), which
    `--table-only --output-dir DIR` tabulates and plots like runs in outputs/.
    `paired_against` (or the grid's `paired-against`) names a cell: paired.md then gives every
    other cell's per-seed differences from it with paired tests (simulations/paired.py); a
    grid's `paired: [[cell, baseline], ...]` names the pairs instead. `plots` names the
    PNGs to write (PLOT_KINDS; `--plots`).
    """
    grid = load_grid(name)
    if isinstance(seeds, int) and seeds < 1:
        raise ConfigError(f"--seeds {seeds}: must be >= 1 (runs seeds 0..N-1)")
    if seeds is not None:
        grid.seeds = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if keep_root is not None:  # checked before hours of runs, not after them
        if keep_root.resolve() == out_root.resolve():
            raise ConfigError(f"--keep {keep_root}: the runs are already there (--output-dir); "
                              "keep them in another folder, e.g. docs/results")
        check_output_dir(keep_root / grid.name, "--keep")
    if not table_only:
        run_grid(grid, overrides, out_root, runner, log, only, jobs, on_interrupt)
    if keep_root is not None:
        keep_runs(grid, out_root, keep_root, only, log)
    by_cell = collect(grid, out_root)
    out = out_root / grid.name
    out.mkdir(parents=True, exist_ok=True)
    md = table(by_cell, grid)
    for axis in numeric_axes(grid) if by_cell else []:
        md += "\n" + axis_table(grid, by_cell, axis)
    (out / "table.md").write_text(f"# {grid.name}\n\n{md}")
    if by_cell:
        plot_all(by_cell, out, grid.name, grid, plots)
    log(md)
    baseline = paired_against or grid.paired_against
    given = [] if paired_against else grid.paired
    if (baseline or given) and by_cell:
        from fedapps.plots import run_metric
        from simulations.paired import comparisons, paired_table

        metric = run_metric(by_cell)
        paired = paired_table(by_cell, comparisons(by_cell, baseline, given),
                              columns(metric, has_official(by_cell, metric))[:6]
                              + tail_column(by_cell, grid, metric))
        (out / "paired.md").write_text(
            f"# {grid.name}: paired differences\n\n{paired}\n"
            "Mean ± sample std over the seeds both cells completed; two-sided p of the paired "
            "t-test and of the exact sign-flip test (simulations/paired.py).\n")
        log(paired)
    return out
