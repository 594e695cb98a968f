"""When a gap between two cells of a grid opens or closes: the paired difference round by round.

`paired.md` (simulations/paired.py) compares the best and the final round; this follows the
whole run. For each round it pairs the two cells' runs by seed (the same partition and
initialization) and prints the mean difference (cell - baseline) +- its sample std over the
seeds, the paired t-test's and the exact sign-flip test's two-sided p (the smallest sign-flip p
is 2/2^n: 0.25 at 3 seeds). The metric is G (global_accuracy) unless `--metric` names another
per-round key; paired.md's headline may be the official test split's. Used in docs/RESULTS.md:

    python -m simulations.paired_rounds thesis-fig5.2-fmnist \\
        --cell "data.target-emd=1.4,variant=fedaug-0.8" \\
        --baseline "data.target-emd=1.4,variant=fedavg" --output-dir outputs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from fedapps.errors import ConfigError
from simulations.paired import sign_flip_p, t_test_p
from simulations.reproduce import collect, load_grid


def round_differences(base: list[dict[str, Any]], other: list[dict[str, Any]], key: str,
                      scale: float = 100.0) -> list[tuple[int, list[float]]]:
    """(round, [cell - baseline per seed both cells have that round's `key`]) per round."""
    def by_round(doc: dict[str, Any]) -> dict[int, float]:
        return {r["round"]: float(r[key]) for r in doc["rounds"] if r.get(key) is not None}

    base_runs = {d["seed"]: by_round(d) for d in base}
    diffs: dict[int, list[float]] = {}
    for d in sorted(other, key=lambda d: d["seed"]):
        b = base_runs.get(d["seed"])
        if b is None:
            continue
        for rnd, value in by_round(d).items():
            if rnd in b:
                diffs.setdefault(rnd, []).append(scale * (value - b[rnd]))
    return sorted(diffs.items())


def round_table(by_cell: dict[str, list[dict[str, Any]]], cell: str, baseline: str,
                key: str = "global_accuracy", scale: float = 100.0) -> str:
    """Markdown: per round the seeds, the mean paired difference +- std and the two p."""
    for label in (cell, baseline):
        if label not in by_cell:
            raise ConfigError(f"{label}: no completed run of that cell; cells with runs: "
                              f"{', '.join(by_cell) or 'none'}")
    rounds = round_differences(by_cell[baseline], by_cell[cell], key, scale)
    if not rounds:
        raise ConfigError(f"{key}: no round of {cell} and {baseline} has it for a common seed")
    lines = [f"| round | seeds | {cell} - {baseline} | p (t) | p (sign-flip) |",
             "| --- | --- | --- | --- | --- |"]
    for rnd, diffs in rounds:
        spread = f" ± {np.std(diffs, ddof=1):.2f}" if len(diffs) > 1 else ""
        p_t, p_s = t_test_p(diffs), sign_flip_p(diffs)
        lines.append(f"| {rnd} | {len(diffs)} | {np.mean(diffs):+.2f}{spread} | "
                     f"{'-' if p_t is None else f'{p_t:.3f}'} | "
                     f"{'-' if p_s is None else f'{p_s:.3f}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulations.paired_rounds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("grid", help="the grid's name, as given to `fedapps reproduce`")
    p.add_argument("--cell", required=True, help="a cell label, as paired.md writes it")
    p.add_argument("--baseline", required=True, help="the cell to subtract")
    p.add_argument("--metric", default="global_accuracy",
                   help="a per-round key of results.json (default global_accuracy, in %%)")
    p.add_argument("--output-dir", type=Path, default=Path("outputs"),
                   help="where `fedapps reproduce` wrote the grid (default outputs)")
    args = p.parse_args(argv)
    try:
        grid = load_grid(args.grid)
        by_cell = collect(grid, args.output_dir)
        scale = 100.0 if args.metric.endswith("accuracy") else 1.0
        print(round_table(by_cell, args.cell, args.baseline, args.metric, scale))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
