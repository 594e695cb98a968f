"""Grid runner: resume without redoing runs, exact table arithmetic, plots."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from background import Runs, selected_keys

from simulations.reproduce import (
    Grid,
    cell_label,
    collect,
    load_grid,
    run_grid,
    split_cells,
    table,
    tail_column,
    tail_mean,
)


def fake_doc(g, p, status="completed"):
    rounds = [{"round": 1, "global_accuracy": g / 2, "personal_accuracy": p / 2,
               "client_global_accuracy": [g / 2, None], "client_personal_accuracy": [p, p]},
              {"round": 2, "global_accuracy": g, "personal_accuracy": p,
               "client_global_accuracy": [g, g], "client_personal_accuracy": [p, None]}]
    return {"rounds": rounds, "partition": {"class_counts": [[3, 1], [0, 4]], "emd": 0.75},
            "summary": {"status": status, "best_global_accuracy": g, "best_personal_accuracy": p,
                        "final_global_accuracy": g, "final_personal_accuracy": p}}


class FakeRunner:
    """Writes a results.json as a finished run would; records what it was asked to run."""

    def __init__(self, values):
        self.values, self.calls = values, []

    def __call__(self, experiment, sets, n_clients, run_dir):
        self.calls.append((experiment, tuple(sets), run_dir.name))
        algo = next(s.split("=", 1)[1] for s in sets if s.startswith("algorithm="))
        seed = int(next(s.split("=", 1)[1] for s in sets if s.startswith("seed=")))
        run_dir.mkdir(parents=True, exist_ok=True)
        g, p = self.values[algo][seed]
        (run_dir / "results.json").write_text(json.dumps(fake_doc(g, p)))
        return "finished:completed"


GRID = Grid("g", "quickstart", [0, 1], {"algorithm": ["fedavg", "fedreb"]},
            {"fedreb": {"G": 87.29, "P": 98.07}}, "a paper")
VALUES = {"fedavg": {0: (0.80, 0.80), 1: (0.84, 0.84)}, "fedreb": {0: (0.85, 0.97),
                                                                     1: (0.89, 0.99)}}


def test_grid_resumes_without_rerunning_finished_runs(tmp_path):
    runner = FakeRunner(VALUES)
    run_grid(GRID, ["rounds=2"], tmp_path, runner, log=lambda s: None)
    assert len(runner.calls) == 4
    assert {c[2] for c in runner.calls} == {"fedavg-s0", "fedavg-s1", "fedreb-s0", "fedreb-s1"}
    # a crashed half-finished run (status running) is redone; completed ones are kept
    doc = fake_doc(0.1, 0.1, status="running")
    (tmp_path / "g" / "fedreb-s1" / "results.json").write_text(json.dumps(doc))
    again = FakeRunner(VALUES)
    runs = run_grid(GRID, ["rounds=2"], tmp_path, again, log=lambda s: None)
    assert [c[2] for c in again.calls] == ["fedreb-s1"]
    assert ("rounds=2" in again.calls[0][1]) and ("seed=1" in again.calls[0][1])
    assert len(runs) == 4


def test_kept_runs_tabulate_and_plot_as_the_runs_they_came_from(tmp_path):
    """--keep copies a finished run's numbers (no checkpoint) with results.json gzipped; the
    grid reads the kept folder as it reads outputs/, and keeping again replaces nothing."""
    import gzip

    from simulations.reproduce import keep_runs

    out, kept = tmp_path / "out", tmp_path / "kept"
    run_grid(GRID, [], out, FakeRunner(VALUES), log=lambda s: None)
    for run in (out / "g").iterdir():
        (run / "config.yaml").write_text(f"seed: {run.name[-1]}\n")
        (run / "metrics.csv").write_text("round,global_accuracy\n")
        (run / "checkpoint.npz").write_bytes(b"not kept")
    (out / "g" / "fedreb-s1" / "results.json").write_text(json.dumps(fake_doc(0.1, 0.1,
                                                                             "running")))
    said = []
    new = keep_runs(GRID, out, kept, log=said.append)
    assert sorted(p.name for p in new) == ["fedavg-s0", "fedavg-s1", "fedreb-s0"]
    assert "keep: fedreb-s1: not finished, not kept" in said
    run = kept / "g" / "fedavg-s1"
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "metrics.csv",
                                                     "results.json.gz"]
    raw = (out / "g" / "fedavg-s1" / "results.json").read_bytes()
    packed = (run / "results.json.gz").read_bytes()
    assert gzip.decompress(packed) == raw and len(packed) < len(raw)
    assert (run / "config.yaml").read_text() == "seed: 1\n"
    assert collect(GRID, kept) == collect(GRID, out)  # fedreb-s1 unfinished in both

    # the finished rerun is kept; what was kept before stays byte for byte
    (out / "g" / "fedreb-s1" / "results.json").write_text(json.dumps(fake_doc(0.89, 0.99)))
    (out / "g" / "fedavg-s1" / "results.json").write_text(json.dumps(fake_doc(0.5, 0.5)))
    said.clear()
    assert [p.name for p in keep_runs(GRID, out, kept, ["fedreb"], said.append)] == ["fedreb-s1"]
    assert said == ["keep: fedreb-s0: kept earlier in " + str(kept / "g") + ", left as it is",
                    "keep: fedreb-s1 -> " + str(kept / "g" / "fedreb-s1")]
    assert (run / "results.json.gz").read_bytes() == packed
    by_cell = collect(GRID, kept)
    assert by_cell["fedreb"] == collect(GRID, out)["fedreb"]
    assert [d["summary"]["best_global_accuracy"] for d in by_cell["fedavg"]] == [0.80, 0.84]

    # the same run kept twice gives the same bytes (no name or time in the gzip header)
    # and a kept folder kept on elsewhere copies its files as they are
    keep_runs(GRID, out, tmp_path / "again", log=lambda s: None)
    keep_runs(GRID, kept, tmp_path / "on", log=lambda s: None)
    for root in (tmp_path / "again", tmp_path / "on"):
        assert (root / "g" / "fedreb-s0" / "results.json.gz").read_bytes() == \
            (kept / "g" / "fedreb-s0" / "results.json.gz").read_bytes()


def test_a_kept_run_that_cannot_be_read_is_not_a_finished_run(tmp_path):
    from simulations.kept_runs import read_results
    from simulations.reproduce import is_complete

    run = tmp_path / "r"
    run.mkdir()
    assert read_results(run) is None
    (run / "results.json.gz").write_bytes(b"\x1f\x8b not gzip")
    assert read_results(run) is None and not is_complete(run)
    (run / "results.json").write_text(json.dumps(fake_doc(0.5, 0.5)))  # an unzipped copy wins
    assert is_complete(run)


def test_reproduce_keeps_through_the_command_line(tmp_path, capsys):
    """`fedapps reproduce GRID --table-only --keep DIR`, then `--table-only --output-dir DIR`
    gives the same table (with the plots `--plots` names); keeping into the runs' own folder
    is a one-line error."""
    from simulations.cli import main

    out, kept = tmp_path / "out", tmp_path / "kept"
    (out / "quickstart" / "run-s1").mkdir(parents=True)
    (out / "quickstart" / "run-s1" / "results.json").write_text(json.dumps(fake_doc(0.7, 0.8)))
    base = ["reproduce", "quickstart", "--seeds", "1-1", "--table-only"]
    assert main([*base, "--output-dir", str(out), "--keep", str(kept)]) == 0
    assert f"keep: run-s1 -> {kept / 'quickstart' / 'run-s1'}" in capsys.readouterr().out
    assert main([*base, "--output-dir", str(kept), "--plots", "curves"]) == 0
    assert (kept / "quickstart" / "table.md").read_text() == \
        (out / "quickstart" / "table.md").read_text()
    assert sorted(p.name for p in (kept / "quickstart").glob("*.png")) == ["curves.png"]
    assert (out / "quickstart" / "client_accuracy.png").is_file()  # default: every plot
    assert main([*base, "--output-dir", str(out), "--keep", str(out)]) == 2
    assert "--keep" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")  # a folder that cannot be made: named in one line
    assert main([*base, "--output-dir", str(out), "--keep", str(tmp_path / "a-file")]) == 2
    assert f"--keep='{tmp_path / 'a-file' / 'quickstart'}': cannot write there" in \
        capsys.readouterr().err


def test_table_mean_and_sample_std(tmp_path):
    run_grid(GRID, [], tmp_path, FakeRunner(VALUES), log=lambda s: None)
    md = table(collect(GRID, tmp_path), GRID)
    # fedavg best G: 80 and 84 -> mean 82, sample std sqrt(((2^2) * 2) / 1) = 2.83
    assert "| fedavg | 2 | 82.00 ± 2.83 | 82.00 ± 2.83 |" in md
    # fedreb best P: 97 and 99 -> 98.00 ± 1.41; paper numbers beside it
    row = ("| fedreb | 2 | 87.00 ± 2.83 | 98.00 ± 1.41 | 87.00 ± 2.83 | 98.00 ± 1.41 | 87.29 |"
           " 98.07 |")
    assert row in md
    assert "Paper: a paper." in md
    assert md.splitlines()[0].endswith("| paper G | paper P | min/run |")
    assert row + " - |" in md  # the fake runs record no wall time


def test_table_reports_mean_minutes_per_run(tmp_path):
    docs = [fake_doc(0.5, 0.5) for _ in range(2)]
    docs[0]["summary"]["wall_seconds"], docs[1]["summary"]["wall_seconds"] = 300.0, 420.0
    md = table({"fedavg": docs}, Grid("w", "quickstart", [0, 1], {"algorithm": ["fedavg"]}))
    assert md.splitlines()[2].endswith("| - | - | 6.0 |")  # (5 + 7) / 2 minutes


def test_table_names_the_runs_that_lost_answers():
    """A run that completed without some clients' answers (a step past the round timeout on a
    busy machine) is named under the table, with what it lost; a clean grid gets no note."""
    docs = [fake_doc(0.5, 0.5) for _ in range(3)]
    for seed, doc in enumerate(docs):
        doc["seed"] = seed
    docs[1]["summary"]["total_failures"] = 7
    docs[2]["summary"].update(total_failures=0, partial_rounds=[2, 5])
    grid = Grid("w", "quickstart", [0, 1, 2], {"algorithm": ["fedavg"]})
    md = table({"fedavg": docs}, grid)
    assert ("fedavg seed 1: 7 fit answers missing or rejected; "
            "fedavg seed 2: evaluation incomplete (rounds 2, 5).") in md
    assert "seed 0" not in md and "round-timeout" in md
    docs[1]["summary"]["total_failures"] = 0
    docs[2]["summary"]["partial_rounds"] = []
    assert "answers missing" not in table({"fedavg": docs}, grid)


def test_table_counts_every_finished_seed_on_disk(tmp_path):
    run_grid(GRID, [], tmp_path, FakeRunner(VALUES), log=lambda s: None)
    one_seed = Grid("g", "quickstart", [0], {"algorithm": ["fedavg", "fedreb"]})
    assert [len(d) for d in collect(one_seed, tmp_path).values()] == [2, 2]


def test_single_seed_cell_shows_no_spread(tmp_path):
    one_seed = Grid("g", "quickstart", [0], {"algorithm": ["fedavg"]})
    run_grid(one_seed, [], tmp_path, FakeRunner(VALUES), log=lambda s: None)
    md = table(collect(one_seed, tmp_path), one_seed)
    # seed 0 of fedavg: best G 0.80 -> "80.00" alone, no "± 0.00"
    assert "| fedavg | 1 | 80.00 | " in md and "±" not in md


def test_cell_overrides_apply_to_their_cell_only(tmp_path):
    grid = Grid("h", "quickstart", [0], {"algorithm": ["fedavg", "fedreb"]},
                cell_overrides={"fedreb": ["algo.threshold=max"]})
    runner = FakeRunner(VALUES)
    run_grid(grid, [], tmp_path, runner, log=lambda s: None)
    sets = {c[2]: c[1] for c in runner.calls}
    assert "algo.threshold=max" in sets["fedreb-s0"]
    assert not any("threshold" in s for s in sets["fedavg-s0"])


def test_variants_expand_to_their_settings_and_excluded_cells_do_not_run(tmp_path):
    grid = Grid("v", "quickstart", [0], {"data.alpha": [0.1, 0.5], "variant": ["a", "b"]},
                overrides=["rounds=2"], exclude=["data.alpha=0.5,variant=b"],
                variants={"a": ["algorithm=fedavg"],
                          "b": ["algorithm=fedreb", "train.local-epochs=3"]})
    runner = FakeRunner(VALUES)
    run_grid(grid, ["federation.num-clients=4"], tmp_path, runner, log=lambda s: None)
    sets = {c[2]: c[1] for c in runner.calls}
    assert sorted(sets) == ["data.alpha-0.1_variant-a-s0", "data.alpha-0.1_variant-b-s0",
                            "data.alpha-0.5_variant-a-s0"]
    assert sets["data.alpha-0.1_variant-b-s0"] == (
        "wandb.group=v", "rounds=2", "federation.num-clients=4", "data.alpha=0.1",
        "algorithm=fedreb", "train.local-epochs=3", "seed=0", "output.output-dir=" +
        str(tmp_path / "v"), "output.run-name=data.alpha-0.1_variant-b-s0")
    assert not any(s.startswith("variant=") for call in sets.values() for s in call)
    only_variants = Grid("w", "quickstart", [0], {"variant": ["a"]}, variants={"a": []})
    assert [cell_label(c) for c in only_variants.cells()] == ["a"]


def test_extends_takes_the_keys_a_grid_file_does_not_set(tmp_path, monkeypatch):
    from fedapps.errors import ConfigError
    from simulations import reproduce

    grids = tmp_path / "grid"
    grids.mkdir()
    (grids / "base.yaml").write_text(
        "experiment: quickstart\nseeds: [0, 1]\noverrides: [rounds=2]\ngrid:\n"
        "  variant: [a, b]\nvariants:\n  a: []\n  b: [train.local-epochs=2]\n"
        "paired:\n  - [b, a]\nreference:\n  source: base's\n")
    (grids / "child.yaml").write_text(
        "extends: base\nexperiment: fedreb-quick\nreference:\n  source: child's\n")
    (grids / "grandchild.yaml").write_text("extends: child\nseeds: [3]\n")
    monkeypatch.setattr(reproduce, "CONF_DIR", tmp_path)
    base, child, grandchild = (load_grid(n) for n in ("base", "child", "grandchild"))
    assert (child.experiment, child.source) == ("fedreb-quick", "child's")
    assert (child.seeds, child.overrides, child.variants, child.paired) == (
        base.seeds, base.overrides, base.variants, base.paired)
    assert [child.cell_sets(c) for c in child.cells()] == [
        ["rounds=2"], ["rounds=2", "train.local-epochs=2"]]
    assert (grandchild.experiment, grandchild.seeds, grandchild.source) == (
        "fedreb-quick", [3], "child's")
    (grids / "orphan.yaml").write_text("extends: nowhere\n")
    with pytest.raises(ConfigError, match=r"^grid orphan: extends nowhere, but there is no "
                       r"conf/grid/nowhere.yaml$"):
        load_grid("orphan")
    (grids / "loop.yaml").write_text("extends: loop2\nexperiment: quickstart\n")
    (grids / "loop2.yaml").write_text("extends: loop\n")
    with pytest.raises(ConfigError, match=r"^grid loop2: extends loop, which extends it back "
                       r"\(loop -> loop2 -> loop\)$"):
        load_grid("loop")


def test_a_variant_the_grid_file_does_not_define_is_a_one_line_error(tmp_path, monkeypatch):
    from fedapps.errors import ConfigError
    from simulations import reproduce

    (tmp_path / "grid").mkdir()
    (tmp_path / "grid" / "bad.yaml").write_text(
        "experiment: quickstart\ngrid:\n  variant: [a, b]\nvariants:\n  a: []\n")
    monkeypatch.setattr(reproduce, "CONF_DIR", tmp_path)
    with pytest.raises(ConfigError, match="variant b not under variants"):
        load_grid("bad")
    (tmp_path / "grid" / "tail.yaml").write_text("experiment: quickstart\ntail: 10\n")
    with pytest.raises(ConfigError, match=r"grid tail: tail 10.0 must be a share of the rounds"):
        load_grid("tail")  # 10 for 10 %: a share is asked for
    # a cell-override or exclude label that names no cell (a typo: 1.20 for 1.2) is an error,
    # not a cell run silently without its settings
    axes = "experiment: quickstart\ngrid:\n  data.partitioner: [q]\n  data.target-emd: [1.2]\n"
    (tmp_path / "grid" / "typo.yaml").write_text(
        axes + 'cell-overrides:\n  "data.partitioner=q,data.target-emd=1.20": [data.q=0.7]\n')
    with pytest.raises(ConfigError, match=r"grid typo: cell-overrides names no cell of the grid: "
                       r"data.partitioner=q,data.target-emd=1.20 \(labels look like "
                       r"data.partitioner=q,data.target-emd=1.2\)"):
        load_grid("typo")
    (tmp_path / "grid" / "ex.yaml").write_text(axes + "exclude: [data.target-emd=1.2]\n")
    with pytest.raises(ConfigError, match="grid ex: exclude names no cell"):
        load_grid("ex")
    # so is a paired comparison naming a cell that does not run: it would vanish from paired.md
    (tmp_path / "grid" / "pair.yaml").write_text(
        axes + 'paired:\n  - ["data.partitioner=q,data.target-emd=1.2", "q"]\n')
    with pytest.raises(ConfigError, match=r"grid pair: paired names no cell the grid runs: q "
                       r"\(labels look like data.partitioner=q,data.target-emd=1.2\)"):
        load_grid("pair")
    (tmp_path / "grid" / "ok.yaml").write_text(
        axes + 'cell-overrides:\n  "data.partitioner=q,data.target-emd=1.2": [data.q=0.7]\n')
    assert load_grid("ok").cell_sets({"data.partitioner": "q", "data.target-emd": 1.2})[-1] \
        == "data.q=0.7"


def test_mean_std_edge_cases():
    from fedapps.metrics import mean_std

    assert mean_std([5.0]) == (5.0, 0.0)
    m, s = mean_std([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5 and s == pytest.approx(1.2909944)


def test_plots_are_written(tmp_path):
    from simulations.reproduce import plot_all

    run_grid(GRID, [], tmp_path, FakeRunner(VALUES), log=lambda s: None)
    paths = plot_all(collect(GRID, tmp_path), tmp_path, "g")
    assert [p.name for p in paths] == ["curves.png", "client_accuracy.png",
                                       "label_distribution.png"]
    assert all(p.stat().st_size > 2000 for p in paths)


def test_plots_names_the_pngs_written(tmp_path):
    """`--plots curves`: a kept folder's table rebuilt without the PNGs its write-up omits."""
    from fedapps.errors import ConfigError
    from simulations.reproduce import parse_plots, plot_all

    assert parse_plots("curves, labels") == ("curves", "labels") and parse_plots("none") == ()
    for bad in ("curve", "curves,none", ","):
        with pytest.raises(ConfigError, match="give none or some of curves, transfer"):
            parse_plots(bad)
    run_grid(GRID, [], tmp_path, FakeRunner(VALUES), log=lambda s: None)
    by_cell = collect(GRID, tmp_path)
    (tmp_path / "some").mkdir()
    paths = plot_all(by_cell, tmp_path / "some", "g", kinds=("labels", "curves"))
    assert [p.name for p in paths] == ["curves.png", "label_distribution.png"]
    assert sorted(p.name for p in (tmp_path / "some").iterdir()) == [p.name for p in paths]
    assert plot_all(by_cell, tmp_path / "none", "g", kinds=()) == []


def test_curves_per_mb_of_training_traffic_when_cells_move_different_traffic(tmp_path):
    from fedapps.plots import personalizes, transfer_mb, transfers_differ
    from simulations.reproduce import plot_all

    def traffic(doc, per_round):  # (bytes down, bytes up) of each round
        for r, (down, up) in zip(doc["rounds"], per_round, strict=True):
            r.update(bytes_down=down, bytes_up=up, bytes_down_eval=10**9)  # eval not counted
        return doc

    full = traffic(fake_doc(0.8, 0.8), [(4_000_000, 4_000_000), (4_000_000, 4_000_000)])
    # phase-shift's shape: every client gets the model, half of them send theirs back
    half = traffic(fake_doc(0.9, 0.9), [(4_000_000, 2_000_000), (4_000_000, 2_000_000)])
    assert transfer_mb(full) == {1: 8.0, 2: 16.0} and transfer_mb(half) == {1: 6.0, 2: 12.0}
    assert not personalizes({"a": [full]}, "accuracy")  # P = G: no P panel
    assert personalizes({"a": [fake_doc(0.8, 0.9)]}, "accuracy")
    assert transfers_differ({"fedavg": [full], "2p": [half]})
    # equal traffic in every round both ran (a shorter run is not a difference)
    shorter = traffic(fake_doc(0.7, 0.7), [(4_000_000, 4_000_000), (4_000_000, 4_000_000)])
    shorter["rounds"] = shorter["rounds"][:1]
    assert not transfers_differ({"fedavg": [full], "short": [shorter]})
    paths = plot_all({"fedavg": [full], "2p": [half]}, tmp_path, "g")
    assert [p.name for p in paths] == ["curves.png", "curves_by_transfer.png",
                                       "client_accuracy.png", "label_distribution.png"]
    (tmp_path / "same").mkdir()
    paths = plot_all({"fedavg": [full], "short": [shorter]}, tmp_path / "same", "g")
    assert "curves_by_transfer.png" not in [p.name for p in paths]


def test_best_metric_against_a_numeric_axis_at_the_reached_emd(tmp_path):
    """best_by_<axis>.png and its table: x at the EMD the splits reached, not the target."""
    from fedapps.plots import best_points
    from simulations.reproduce import axis_table, lines_along, numeric_axes, plot_all

    assert numeric_axes(load_grid("thesis-fig3.4-fmnist")) == ["data.target-emd"]
    assert numeric_axes(load_grid("table5.6-fmnist")) == []  # algorithms only
    grid = Grid("g", "thesis-fmnist", [0, 1], {"data.partitioner": ["dirichlet", "limit-label"],
                                               "data.target-emd": [0.8, 1.2]})

    def run(best, emd=None):
        doc = fake_doc(best, best)
        doc["summary"]["emd"] = emd
        return doc

    by_cell = {"data.partitioner=dirichlet,data.target-emd=0.8": [run(0.9, 0.75), run(0.8, 0.79)],
               "data.partitioner=dirichlet,data.target-emd=1.2": [run(0.7, 1.1)],
               "data.partitioner=limit-label,data.target-emd=1.2": [run(0.6)]}
    lines = lines_along(grid, by_cell, "data.target-emd")
    assert {name: [v for v, _ in pts] for name, pts in lines.items()} == {
        "data.partitioner=dirichlet": [0.8, 1.2], "data.partitioner=limit-label": [1.2]}
    # x = the reached EMD's mean (0.77, not the target 0.8), y = best G in %: mean, sample
    # std, min, max over the runs
    first, second = best_points(lines["data.partitioner=dirichlet"], "best_global_accuracy",
                                100.0, "emd")
    assert first == (0.8, pytest.approx(0.77), pytest.approx(85.0),
                     pytest.approx(7.0710678), 80.0, 90.0, 2, True)
    assert second == (1.2, 1.1, pytest.approx(70.0), 0.0, 70.0, 70.0, 1, True)
    # a run that does not report the reached value sits at the axis value
    assert best_points(lines["data.partitioner=limit-label"], "best_global_accuracy", 100.0,
                       "emd") == [(1.2, 1.2, 60.0, 0.0, 60.0, 60.0, 1, False)]
    # table.md gives the same points as numbers: mean ± std over seeds, the reached EMD after
    assert axis_table(grid, by_cell, "data.target-emd") == (
        "| best G by data.target-emd | 0.8 | 1.2 |\n| --- | --- | --- |\n"
        "| data.partitioner=dirichlet | 85.00 ± 7.07 (0.770) | 70.00 (1.100) |\n"
        "| data.partitioner=limit-label | - | 60.00 |\n\n"
        "Mean ± sample std over seeds (in brackets: the EMD reached, mean over seeds).\n")
    paths = plot_all(by_cell, tmp_path, "g", grid)
    assert "best_by_data.target-emd.png" in [p.name for p in paths]
    assert (tmp_path / "best_by_data.target-emd.png").stat().st_size > 2000
    # no line with two values of the axis: no plot
    (tmp_path / "one").mkdir()
    one = {k: v for k, v in by_cell.items() if k.endswith("1.2")}
    assert "best_by_data.target-emd.png" not in [p.name for p in
                                                 plot_all(one, tmp_path / "one", "g", grid)]


def test_grid_files_load_and_labels():
    grid = load_grid("table5.6-fmnist")
    assert grid.experiment == "fedreb-fmnist" and grid.seeds == [0, 1, 2]
    labels = [cell_label(c) for c in grid.cells()]
    assert labels[0] == "fedavg" and labels[-1] == "fedreb" and len(labels) == 10
    assert grid.cell_overrides["ditto"] == ["algo.personal-epochs=1"]
    assert grid.reference["fedreb"] == {"G": 87.29, "P": 98.07}
    assert cell_label({"algorithm": "fedavg", "data.alpha": 0.5}) == \
        "algorithm=fedavg,data.alpha=0.5"
    assert load_grid("quickstart").cells() == [{}]


def test_every_grid_file_validates_and_references_its_cells():
    from fedapps.config import available, load_config
    from fedapps.validation import validate

    for name in available("grid"):
        grid = load_grid(name)
        labels = set()
        for cell in grid.cells():
            labels.add(cell_label(cell))
            validate(load_config(grid.experiment, grid.cell_sets(cell)), check_data=False)
        assert set(grid.reference) <= labels, name  # paper numbers only for cells that run
        assert set(grid.cell_overrides) <= labels, name  # no override for a cell that is not
        assert set(grid.variants) <= {str(v) for v in grid.axes.get("variant", [])}, name
        # no stale exclusion
        assert set(grid.exclude) <= {cell_label(c) for c in grid.every_cell()}, name
        paired = {c for pair in grid.paired for c in pair} | ({grid.paired_against} - {""})
        assert paired <= labels, name  # paired comparisons name cells that run


def test_table_only_starts_no_run(tmp_path):
    from simulations.reproduce import reproduce

    calls = []
    out = reproduce("quickstart", 1, [], tmp_path, lambda *a: calls.append(a),
                    log=lambda s: None, table_only=True)
    assert calls == [] and (out / "table.md").read_text().startswith("# quickstart")


def test_seeds_are_a_count_or_the_seeds_themselves(tmp_path):
    """`--seeds 1-2,4` runs those seeds only (a grid split over machines); `--seeds 2` is 0..1."""
    from fedapps.errors import ConfigError
    from simulations.reproduce import parse_seeds, reproduce

    assert parse_seeds("2") == 2
    assert parse_seeds("1-2,4") == [1, 2, 4] and parse_seeds("3,1,1") == [1, 3]
    assert parse_seeds("2-2") == [2]
    for bad in ("", "1-", "3-1", "a", "-1", "1,,2"):
        with pytest.raises(ConfigError, match="give N .seeds 0..N-1. or seeds and ranges"):
            parse_seeds(bad)

    ran = []

    def runner(experiment, sets, n_clients, run_dir):
        ran.append(run_dir.name)
        run_dir.mkdir(parents=True)
        (run_dir / "results.json").write_text(json.dumps(fake_doc(0.5, 0.5)))
        return "finished:completed"

    reproduce("quickstart", [1, 3], [], tmp_path, runner, log=lambda s: None)
    reproduce("quickstart", 2, [], tmp_path, runner, log=lambda s: None)  # seed 1 is kept
    assert ran == ["run-s1", "run-s3", "run-s0"]


def test_model_heterogeneous_runs_add_official_test_and_cost_columns():
    docs = [fake_doc(0.5, 0.9) for _ in range(2)]
    for doc, acc, params in zip(docs, (0.60, 0.64), (2_978_123, 2_978_123), strict=True):
        doc["summary"].update(best_official_test_accuracy=acc, final_official_test_accuracy=acc,
                              mean_client_params=params, mean_client_flops=149_048_384)
    grid = Grid("r", "quickstart", [0, 1], {"algorithm": ["fedrolex"]},
                {"fedrolex": {"G": 69.44}})
    md = table({"fedrolex": docs}, grid)
    assert "| best official test | final official test | params/client (M) | MFLOPs/client |" in md
    # official test 60 and 64 -> 62.00 ± 2.83; costs in millions with four decimals
    assert "| 62.00 ± 2.83 | 62.00 ± 2.83 | 2.9781 ± 0.0000 | 149.0484 ± 0.0000 | 69.44 | - |" in md


def test_only_runs_the_named_cells_and_rejects_unknown_ones(tmp_path):
    from fedapps.config import ConfigError

    runner = FakeRunner(VALUES)
    run_grid(GRID, [], tmp_path, runner, log=lambda s: None, only=["fedreb"])
    assert sorted(c[2] for c in runner.calls) == ["fedreb-s0", "fedreb-s1"]
    with pytest.raises(ConfigError, match="--cells fedrob: not a cell of grid g; cells: fedavg"):
        run_grid(GRID, [], tmp_path, runner, log=lambda s: None, only=["fedrob"])


def test_cells_of_several_axes_are_named_through_their_commas():
    labels = ["a=1,b=x", "a=1,b=y", "a=2,b=x"]
    # the CLI splits --cells at commas; the pieces join back into the grid's labels
    assert split_cells(["a=1", "b=y", "a=2", "b=x"], labels) == ["a=1,b=y", "a=2,b=x"]
    assert split_cells(["fedavg", "fedreb"], ["fedavg", "fedreb"]) == ["fedavg", "fedreb"]
    assert split_cells(["a=1", "b=z"], labels) == ["a=1", "b=z"]  # reported unknown


def test_cells_with_brackets_in_their_values_are_collected(tmp_path):
    from simulations.reproduce import run_dir_for

    grid = Grid("b", "quickstart", [0], {"algo.hidden": ["[2,4,8]", "[32,64,128]"]})
    for cell in grid.cells():
        run = run_dir_for(tmp_path, grid, cell, 0)  # e.g. b/algo.hidden-[2_4_8]-s0
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(fake_doc(0.5, 0.5)))
    assert list(collect(grid, tmp_path)) == ["algo.hidden=[2,4,8]", "algo.hidden=[32,64,128]"]


class SlowRunner(FakeRunner):
    """A FakeRunner whose runs take a while; records how many ran at the same time. The run
    named `ctrl_c_in` sends this process SIGINT, as Ctrl-C would."""

    def __init__(self, values, ctrl_c_in=None):
        super().__init__(values)
        self.running = self.peak = 0
        self.lock, self.ctrl_c_in = threading.Lock(), ctrl_c_in

    def __call__(self, experiment, sets, n_clients, run_dir):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            if run_dir.name == self.ctrl_c_in:
                time.sleep(0.1)  # Ctrl-C while the runs are going, not while one is started
                os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3)
            return super().__call__(experiment, sets, n_clients, run_dir)
        finally:
            with self.lock:
                self.running -= 1


def test_jobs_run_concurrently_and_give_the_same_table(tmp_path):
    runner = SlowRunner(VALUES)
    lines = []
    run_grid(GRID, [], tmp_path / "par", runner, log=lines.append, jobs=2)
    assert runner.peak == 2 and len(runner.calls) == 4
    assert sum(line.endswith(": finished") for line in lines) == 4
    run_grid(GRID, [], tmp_path / "seq", FakeRunner(VALUES), log=lambda s: None)
    assert table(collect(GRID, tmp_path / "par"), GRID) == \
        table(collect(GRID, tmp_path / "seq"), GRID)
    # resumes like the sequential runner: nothing left to run
    again = SlowRunner(VALUES)
    run_grid(GRID, [], tmp_path / "par", again, log=lambda s: None, jobs=2)
    assert again.calls == []


@pytest.fixture
def default_ctrl_c():
    """Python's own Ctrl-C behaviour for this test, whatever an earlier test in the process
    left behind (a replaced SIGINT handler or a blocked SIGINT would swallow the signal)."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    signal.signal(signal.SIGINT, before)


def test_interrupted_parallel_grid_stops_the_running_runs(tmp_path, default_ctrl_c):
    from fedapps.config import ConfigError

    stopped, lines = [], []
    with pytest.raises(KeyboardInterrupt):
        run_grid(GRID, [], tmp_path, SlowRunner(VALUES, ctrl_c_in="fedavg-s1"),
                 log=lines.append, jobs=2, on_interrupt=lambda: stopped.append(True))
    assert stopped == [True]
    # the run beside the interrupted one is reported as stopped, not as a failure; the runs
    # not yet started never start
    assert sorted(line for line in lines if "stopped" in line) == [
        f"[{i}/4] fedavg seed {i - 1}: stopped; it reruns when the grid is resumed"
        for i in (1, 2)]
    assert not any("fedreb" in line for line in lines)
    with pytest.raises(ConfigError, match="--jobs 0: must be at least 1"):
        run_grid(GRID, [], tmp_path, FakeRunner(VALUES), jobs=0)


QUICK = ["reproduce", "quick", "--seeds", "1", "--set", "rounds=4"]  # fedavg-s0 and fedreb-s0


def reproduce_cli(out, *extra):
    cmd = [sys.executable, "-m", "simulations.cli", *QUICK, "--output-dir", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def per_round(root):
    doc = json.loads((root / "quick" / "fedavg-s0" / "results.json").read_text())
    return [(r["global_accuracy"], r["personal_accuracy"]) for r in doc["rounds"]]


REFERENCE = {"test_two_real_simulations_at_once_match_a_run_alone": ["alone"],
             "test_an_interrupted_grid_continues_its_run_from_the_checkpoint": ["alone"]}


@pytest.fixture(scope="module", autouse=True)
def reference_run(request, tmp_path_factory):
    """The quick grid's FedAvg cell run alone, uninterrupted: the reference of the real-run
    tests below, started as the module starts (tests/background.py) while its in-process
    tests go on."""
    out = tmp_path_factory.mktemp("alone")

    def alone(_):
        reproduce_cli(out, "--cells", "fedavg")
        return out

    runs = Runs(alone, selected_keys(request, REFERENCE), workers=1)
    yield runs
    runs.close()


@pytest.fixture
def fedavg_alone(reference_run):
    return reference_run["alone"]


@pytest.mark.integration
def test_two_real_simulations_at_once_match_a_run_alone(tmp_path, fedavg_alone):
    """`fedapps reproduce --jobs 2`: two SuperLinks side by side, each on its share of the CPUs,
    tag their lines and give the numbers the same cell gives when run alone."""
    out = reproduce_cli(tmp_path / "par", "--jobs", "2")
    assert "[fedavg-s0] " in out and "[fedreb-s0] " in out
    assert per_round(tmp_path / "par") == per_round(fedavg_alone)
    assert (tmp_path / "par" / "quick" / "fedreb-s0" / "results.json").is_file()


@pytest.mark.integration
def test_an_interrupted_grid_continues_its_run_from_the_checkpoint(tmp_path, fedavg_alone):
    """A run that died in round 3 after its clients saved their state (SGD momentum, persisted
    by the preset) but before the server's checkpoint of round 3, built exactly: the cell runs
    2 rounds, `fedapps resume` runs round 3, then the checkpoint of round 2 is put back and the
    status set to what a killed run leaves. The grid again continues the run with its run id
    after round 2 and ends with the uninterrupted run's numbers: the redone round 3 reads the
    clients' state from before it, not round 3's."""
    from clients.state_files import written_at

    run = tmp_path / "quick" / "fedavg-s0"
    reproduce_cli(tmp_path, "--cells", "fedavg", "--set", "rounds=2")
    after_2 = (run / "checkpoint.npz").read_bytes()
    proc = subprocess.run([sys.executable, "-m", "fedapps.cli", "resume", str(run), "--set",
                           "rounds=3"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    written = [written_at(f) for f in (tmp_path / "quick" / ".client-state").rglob("*.npz")]
    assert (3, 0) in written  # state the lost round 3 wrote
    (run / "checkpoint.npz").write_bytes(after_2)
    doc = json.loads((run / "results.json").read_text())
    doc["summary"]["status"] = "running"  # a killed run's results.json says so
    (run / "results.json").write_text(json.dumps(doc))
    run_id = (run / "run-id").read_text()
    out = reproduce_cli(tmp_path, "--cells", "fedavg")
    assert "fedavg-s0: continuing the unfinished run after round 2" in out
    assert "round 3/4" in out and "round 1/4" not in out
    assert (run / "run-id").read_text() == run_id
    assert per_round(tmp_path) == per_round(fedavg_alone)
    resumed = json.loads((run / "results.json").read_text())["rounds"]
    assert resumed[2]["clients_state_from_disk"]  # the redone round read the disk


def test_cli_continues_an_unfinished_cell_unless_told_to_restart_it(tmp_path, monkeypatch):
    """The runner `fedapps reproduce` gives the grid: a cell whose run resume_point can
    continue is claimed with RESUME_UNFINISHED and `output.resume=true`; with
    --restart-unfinished, or for a cell with nothing to continue, REDO_UNFINISHED."""
    from fedapps import cli as app_cli
    from fedapps import launcher, rundir
    from simulations.cli import main

    calls = []

    def run_experiment(experiment, sets, n, run_dir, **kwargs):  # what Flower would run
        calls.append((run_dir.name, kwargs["mode"], "output.resume=true" in sets))
        return "stopped"

    monkeypatch.setattr(launcher, "run_experiment", run_experiment)
    monkeypatch.setattr(app_cli, "resume_point",
                        lambda run, experiment, sets: 2 if run.name == "fedavg-s0" else None)
    main(["reproduce", "quick", "--seeds", "1", "--output-dir", str(tmp_path)])
    main(["reproduce", "quick", "--seeds", "1", "--output-dir", str(tmp_path),
          "--restart-unfinished"])
    assert calls == [("fedavg-s0", rundir.RESUME_UNFINISHED, True),
                     ("fedreb-s0", rundir.REDO_UNFINISHED, False),
                     ("fedavg-s0", rundir.REDO_UNFINISHED, False),
                     ("fedreb-s0", rundir.REDO_UNFINISHED, False)]


def test_plots_help_names_every_kind():
    """The parser names --plots' kinds without importing reproduce (start-up): keep them equal."""
    from simulations.cli import build_parser
    from simulations.reproduce import PLOT_KINDS

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    plots = next(a for a in sub.choices["reproduce"]._actions if a.dest == "plots")
    assert all(f"{kind} (" in plots.help for kind in PLOT_KINDS)


def test_cli_refuses_a_bad_jobs_count_in_one_line(capsys):
    from simulations.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["reproduce", "quick", "--jobs", "0"])
    assert exit_info.value.code == 2
    assert "argument --jobs: '0': a whole number of runs, at least 1" in capsys.readouterr().err


def test_tail_column_is_the_mean_over_the_last_share_of_rounds_and_is_paired(tmp_path):
    """A grid's `tail`: the official test metric's mean over the last ceil(share x rounds)
    rounds (G where there is no official split), in table.md and paired.md."""
    from simulations.paired import paired_table

    def doc(seed, official, glob=None):
        rounds = [{"round": i + 1, "global_accuracy": None if glob is None else glob[i],
                   "personal_accuracy": None, "official_test_accuracy": v}
                  for i, v in enumerate(official)]
        return {"seed": seed, "rounds": rounds,
                "summary": {"status": "completed", "final_official_test_accuracy": official[-1]}}
    by_cell = {"a": [doc(0, [0.1, 0.5, 0.3, 0.2, 0.6]), doc(1, [0.3, 0.2, 0.4, 0.7, 0.1])],
               "b": [doc(0, [0.1, 0.1, 0.1, 0.1, 0.2]), doc(1, [0.1, 0.1, 0.1, 0.3, 0.1])]}
    grid = Grid("t", "quickstart", [0, 1], {"x": ["a", "b"]}, tail=0.3)
    md = table(by_cell, grid)
    # last ceil(1.5) = 2 rounds: a (0.2+0.6)/2 = 0.4, (0.7+0.1)/2 = 0.4; b 0.15, 0.2
    assert "| official test mean of last 30% of rounds |" in md
    assert md.splitlines()[2].endswith("| 40.00 ± 0.00 | - | - | - |")
    assert md.splitlines()[3].endswith("| 17.50 ± 3.54 | - | - | - |")
    cols = tail_column(by_cell, grid, "accuracy")
    paired = paired_table(by_cell, [("a", "b")], cols)
    # a - b per seed: 40 - 15 = 25, 40 - 20 = 20 -> +22.50 ± 3.54
    assert "| a - b | 2 | +22.50 ± 3.54 |" in paired
    # a run without an official split: G's tail, skipping rounds that were not evaluated
    g = doc(0, [None] * 4, glob=[0.5, None, 0.7, None])
    assert tail_mean(g, "accuracy", 0.5) == pytest.approx(0.7)
    assert tail_mean(g, "accuracy", 1.0) == pytest.approx(0.6)
    assert tail_column(by_cell, Grid("t", "quickstart", [0]), "accuracy") == []


def test_budget_columns_take_the_best_within_the_first_share_of_rounds():
    """Seed 004 Table 2.4: the best metric within 50/80/100% of the rounds, from the official
    test split when the runs have one (FedAIoT's centralized test), beside extra paper keys."""
    def doc(values):
        rounds = [{"round": i + 1, "global_accuracy": None, "personal_accuracy": None,
                   "official_test_accuracy": v} for i, v in enumerate(values)]
        return {"rounds": rounds, "summary": {"status": "completed",
                                              "best_official_test_accuracy": max(values)}}
    docs = [doc([0.1, 0.5, 0.3, 0.2, 0.6]), doc([0.3, 0.2, 0.4, 0.7, 0.1])]
    grid = Grid("b", "quickstart", [0, 1], {"algorithm": ["fedavg"]},
                {"fedavg": {"G": 68.51, "50%": 58.81}}, budgets=[0.5, 1.0])
    md = table({"fedavg": docs}, grid)
    assert "| best within 50% of rounds | best within 100% of rounds | paper G | paper P | " \
           "paper 50% |" in md
    # first ceil(2.5) = 3 rounds: 0.5 and 0.4 -> 45.00 ± 7.07; all rounds: 0.6, 0.7 -> 65 ± 7.07
    assert "| 45.00 ± 7.07 | 65.00 ± 7.07 | 68.51 | - | 58.81 |" in md
    assert "best G" not in md and "best official test |" in md  # no run fills G: left out


def test_a_set_that_a_cell_overrides_is_reported(tmp_path):
    """`--set rounds=2` on a grid whose cells set rounds themselves: the cell wins (it defines
    the method), and the user is told instead of finding 9 rounds run where 2 were asked."""
    grid = Grid("s", "quickstart", [0], {"variant": ["a", "b"]},
                variants={"a": ["algorithm=fedavg", "rounds=9"], "b": ["algorithm=fedreb"]})
    lines, runner = [], FakeRunner(VALUES)
    run_grid(grid, ["rounds=2", "train.lr=0.1"], tmp_path, runner, log=lines.append)
    sets = {c[2]: c[1] for c in runner.calls}
    assert sets["a-s0"].index("rounds=9") > sets["a-s0"].index("rounds=2")
    assert [ln for ln in lines if ln.startswith("--set")] == [
        "--set rounds=2: cell a sets rounds=9 itself, which wins"]
    lines.clear()  # the same value as the cell's is no conflict
    run_grid(grid, ["rounds=9"], tmp_path / "same", FakeRunner(VALUES), log=lines.append)
    assert not [ln for ln in lines if ln.startswith("--set")]
