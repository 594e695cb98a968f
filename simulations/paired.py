"""Paired differences between the cells of a grid: the same seed means the same partition,
initialization and sampling, so cell - baseline per seed removes most of the seed-to-seed
spread that an unpaired mean +- std comparison carries (issue 16: "means, spreads and paired
differences"; "a paired test of the difference").

Two p-values per difference, both two-sided: Student's paired t-test (assumes normal
differences) and the exact sign-flip permutation test (assumes only that, without an effect, a
difference is as likely positive as negative). With n seeds the smallest sign-flip p is
2 / 2^n: 0.25 at 3 seeds, 0.0625 at 5, so a "significant" result needs at least 6 seeds there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedapps.errors import ConfigError


def t_test_p(diffs: Sequence[float]) -> float | None:
    """Two-sided p of the paired t-test on these differences (None below 2 pairs)."""
    d = np.asarray(diffs, dtype=np.float64)
    if len(d) < 2:
        return None
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return 1.0 if float(d.mean()) == 0.0 else 0.0
    from scipy.stats import t as student_t

    t = float(d.mean()) / (sd / math.sqrt(len(d)))
    return float(2 * student_t.sf(abs(t), len(d) - 1))


def sign_flip_p(diffs: Sequence[float]) -> float | None:
    """Exact two-sided p: the share of the 2^n sign patterns whose mean is at least as far
    from 0 as the observed one (None without pairs; n is at most 20 here)."""
    d = np.abs(np.asarray(diffs, dtype=np.float64))
    if len(d) == 0:
        return None
    if len(d) > 20:
        raise ValueError(f"{len(d)} pairs: the exact test enumerates 2^n patterns (n <= 20)")
    observed = abs(float(np.sum(diffs)))
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
    sums = np.abs(signs @ d)
    return float(np.mean(sums >= observed - 1e-9 * max(1.0, observed)))


def pairs(base: list[dict[str, Any]], other: list[dict[str, Any]], key: str
          ) -> list[tuple[int, float, float]]:
    """(seed, baseline value, cell value) for the seeds both cells completed with `key`."""
    by_seed = {d["seed"]: d["summary"].get(key) for d in base}
    out = []
    for d in other:
        b, v = by_seed.get(d["seed"]), d["summary"].get(key)
        if b is not None and v is not None:
            out.append((d["seed"], float(b), float(v)))
    return sorted(out)


def comparisons(by_cell: dict[str, list[dict[str, Any]]], baseline: str = "",
                pairs_given: Sequence[Sequence[str]] = ()) -> list[tuple[str, str]]:
    """(cell, baseline) pairs with completed runs on both sides: the given ones (a grid's
    `paired`, which may be run in parts), or every other cell against `baseline`, which must
    have runs (else a one-line ConfigError)."""
    if pairs_given:
        return [(str(a), str(b)) for a, b in pairs_given if a in by_cell and b in by_cell]
    if baseline not in by_cell:
        raise ConfigError(f"--paired-against {baseline}: no completed run of that cell; cells "
                          f"with runs: {', '.join(by_cell) or 'none'}")
    return [(label, baseline) for label in by_cell if label != baseline]


def paired_table(by_cell: dict[str, list[dict[str, Any]]], wanted: Sequence[tuple[str, str]],
                 metrics: Sequence[tuple[str, str, float]]) -> str:
    """Markdown: for every (cell, baseline), per metric the mean paired difference
    (cell - baseline) +- its sample std over the common seeds, with the t-test and sign-flip
    p."""
    present = [(k, n, s) for k, n, s in metrics
               if any(d["summary"].get(k) is not None for docs in by_cell.values()
                      for d in docs)]
    lines = ["| cell - baseline | seeds | "
             + " | ".join(f"{name} diff | p (t) | p (sign-flip)" for _, name, _ in present)
             + " |", "|" + " --- |" * (2 + 3 * len(present))]
    for label, baseline in wanted:
        cells, seeds = [], set()
        for key, _, scale in present:
            got = pairs(by_cell[baseline], by_cell[label], key)
            seeds |= {s for s, _, _ in got}
            diffs = [scale * (v - b) for _, b, v in got]
            if not diffs:
                cells += ["-", "-", "-"]
                continue
            mean = float(np.mean(diffs))
            spread = f" ± {np.std(diffs, ddof=1):.2f}" if len(diffs) > 1 else ""
            p_t, p_s = t_test_p(diffs), sign_flip_p(diffs)
            cells += [f"{mean:+.2f}{spread}", "-" if p_t is None else f"{p_t:.3f}",
                      f"{p_s:.3f}"]
        lines.append(f"| {label} - {baseline} | {len(seeds)} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"
