"""Paired differences and their tests (simulations/paired.py) against hand-computed values and
SciPy's own paired t-test."""

import json

import pytest
from scipy.stats import ttest_rel
from test_reproduce import GRID, VALUES, FakeRunner, fake_doc

from fedapps.errors import ConfigError
from simulations.paired import comparisons, paired_table, pairs, sign_flip_p, t_test_p
from simulations.reproduce import collect, columns, reproduce, run_grid


def test_t_test_by_hand_and_equal_to_scipy():
    # d = 1, 2, 3: mean 2, sd 1, t = 2 / (1 / sqrt 3) = 3.4641 at 2 df: two-sided p 0.07418
    assert t_test_p([1.0, 2.0, 3.0]) == pytest.approx(0.074180, abs=1e-6)
    a, b = [81.7, 80.9, 86.0, 83.1], [83.7, 84.2, 87.0, 82.9]
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    assert t_test_p(diffs) == pytest.approx(ttest_rel(b, a).pvalue, rel=1e-12)
    assert t_test_p([0.5]) is None
    assert t_test_p([2.0, 2.0]) == 0.0 and t_test_p([0.0, 0.0]) == 1.0


def test_sign_flip_by_enumeration_by_hand():
    # +-1 +-2 +-3: sums 6 4 2 0 0 -2 -4 -6; |sum| >= 6 in 2 of 8 patterns
    assert sign_flip_p([1, 2, 3]) == 0.25
    assert sign_flip_p([3, 1, 1, 1, 1]) == 2 / 32  # the smallest p five seeds can give
    # 2 1 -1: observed |sum| 2; |+-2 +-1 +-1| >= 2 in 6 of 8 (only 2-1-1 and -2+1+1 give 0)
    assert sign_flip_p([2, 1, -1]) == 6 / 8
    assert sign_flip_p([1, -1]) == 1.0
    assert sign_flip_p([]) is None


def test_runs_are_paired_by_seed_only_where_both_cells_have_it():
    base = [{"seed": s, "summary": {"k": v}} for s, v in ((0, 0.5), (1, 0.6), (2, 0.7))]
    other = [{"seed": s, "summary": {"k": v}} for s, v in ((1, 0.65), (2, None), (3, 0.9))]
    assert pairs(base, other, "k") == [(1, 0.6, 0.65)]


def test_paired_table_by_hand(tmp_path):
    run_grid(GRID, [], tmp_path, FakeRunner(VALUES), log=lambda s: None)
    by_cell = collect(GRID, tmp_path)
    assert [d["seed"] for d in by_cell["fedreb"]] == [0, 1]
    md = paired_table(by_cell, comparisons(by_cell, "fedavg"), columns("accuracy", False))
    # fedreb - fedavg best G: 85-80 = 5, 89-84 = 5 -> +5.00 +- 0.00, t-test p 0 (no spread),
    # sign-flip 2 of 4; best P: 97-80 = 17, 99-84 = 15 -> +16.00 +- 1.41
    assert md.splitlines()[2].startswith(
        "| fedreb - fedavg | 2 | +5.00 ± 0.00 | 0.000 | 0.500 | +16.00 ± 1.41 | ")
    with pytest.raises(ConfigError, match="--paired-against nope: no completed run"):
        comparisons(by_cell, "nope")
    # grid pairs may name cells not run yet: those pairs are left out
    assert comparisons(by_cell, "", [["fedreb", "fedavg"], ["x", "fedavg"]]) == [
        ("fedreb", "fedavg")]


def test_reproduce_writes_paired_md(tmp_path, monkeypatch):
    import simulations.reproduce as rep

    monkeypatch.setattr(rep, "load_grid", lambda name: GRID)
    rep.run_grid(GRID, [], tmp_path, FakeRunner(VALUES), log=lambda s: None)
    # a third seed of fedavg only: it has no partner and is not paired
    (tmp_path / "g" / "fedavg-s2").mkdir()
    (tmp_path / "g" / "fedavg-s2" / "results.json").write_text(json.dumps(fake_doc(0.1, 0.1)))
    out = reproduce("g", None, [], tmp_path, FakeRunner(VALUES), log=lambda s: None,
                    table_only=True, paired_against="fedavg")
    text = (out / "paired.md").read_text()
    assert "| fedreb - fedavg | 2 | +5.00 ± 0.00 |" in text and "sign-flip" in text
