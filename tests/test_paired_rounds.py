"""The per-round paired difference (simulations/paired_rounds.py) against hand values."""

import pytest
from scipy.stats import ttest_rel

from fedapps.errors import ConfigError
from simulations.paired_rounds import main, round_differences, round_table


def run(seed, accuracies):
    return {"seed": seed, "rounds": [{"round": i + 1, "global_accuracy": a}
                                     for i, a in enumerate(accuracies)]}


BASE = [run(0, [0.50, 0.70, 0.80]), run(1, [0.40, 0.60, 0.90]), run(2, [0.45, 0.65, 0.85])]
CELL = [run(0, [0.60, 0.75, 0.80]), run(1, [0.50, 0.60, 0.85]), run(3, [0.9, 0.9, 0.9])]


def test_rounds_are_paired_by_seed():
    # seed 3 has no baseline run, seed 2 no cell run: only seeds 0 and 1 pair
    got = round_differences(BASE, CELL, "global_accuracy")
    assert [r for r, _ in got] == [1, 2, 3]
    assert got[0][1] == pytest.approx([10.0, 10.0]) and got[1][1] == pytest.approx([5.0, 0.0])
    assert got[2][1] == pytest.approx([0.0, -5.0])


def test_the_table_gives_mean_spread_and_the_paired_t_test():
    lines = round_table({"a": CELL, "b": BASE}, "a", "b").splitlines()
    assert lines[0] == "| round | seeds | a - b | p (t) | p (sign-flip) |"
    assert lines[2] == "| 1 | 2 | +10.00 ± 0.00 | 0.000 | 0.500 |"  # no spread: t's p 0
    p = ttest_rel([0.75, 0.60], [0.70, 0.60]).pvalue  # round 2: differences 5 and 0
    assert lines[3] == f"| 2 | 2 | +2.50 ± 3.54 | {p:.3f} | 1.000 |"
    assert lines[4].startswith("| 3 | 2 | -2.50 ± 3.54 |")
    with pytest.raises(ConfigError, match="c: no completed run of that cell; cells with runs: "
                                          "a, b"):
        round_table({"a": CELL, "b": BASE}, "c", "b")
    with pytest.raises(ConfigError, match="loss: no round of a and b has it"):
        round_table({"a": CELL, "b": BASE}, "a", "b", key="loss")


def test_an_unknown_grid_is_a_one_line_error(capsys):
    assert main(["no-such-grid", "--cell", "a", "--baseline", "b"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
