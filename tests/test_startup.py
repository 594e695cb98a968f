"""simulations/startup.py: the phases of a run from its streamed lines, and the pairs' check."""

import json
import time

import pytest

from simulations import startup

LINES = [  # what the launcher's `show` sees, in order, with the seconds to wait before each
    (0.1, "Using SuperLink: fedapps (127.0.0.1:1)"),
    (0.0, "Successfully started run 42"),
    (0.15, "INFO :      [fedapps] quickstart: fedavg on digits, 10 clients ..."),
    (0.25, "INFO :      [fedapps] round 1: waiting for 5 of 5 clients ..."),
    (0.0, "INFO :      [fedapps] round 1/2  G 40.00%  ..."),
    (0.1, "INFO :      [fedapps] round 2/2  G 50.00%  ..."),
]


def fake_run(accuracy=(0.4, 0.5), lines=LINES, cpus=None):
    def run_experiment(experiment, sets, num_supernodes, run_dir, show, total_cpus=None):
        if cpus is not None:
            cpus.append(total_cpus)
        for wait, line in lines:
            time.sleep(wait)
            show(line)
        time.sleep(0.05)  # teardown
        run_dir.mkdir(parents=True)
        rounds = [{"seconds": 0.1, "global_accuracy": a} for a in accuracy]
        (run_dir / "results.json").write_text(json.dumps({"rounds": rounds}))
        return "finished:completed"
    return run_experiment


def test_phases_add_up_to_the_wall_time(tmp_path, monkeypatch):
    monkeypatch.setattr(startup, "run_experiment", fake_run())
    r = startup.timed_run("quickstart", [], tmp_path / "r", 10)
    p = r["phases"]
    assert list(p) == list(startup.PHASES) and r["accuracy"] == [0.4, 0.5]
    assert sum(p.values()) == pytest.approx(r["wall"])
    assert p["submit"] == pytest.approx(0.1, abs=0.05)
    assert p["server set-up"] == pytest.approx(0.15, abs=0.05)
    # round 1 ended 0.25 s after the ServerApp's line; 0.1 of it was the round itself
    assert p["ray, actors, handshake"] == pytest.approx(0.15, abs=0.05)
    assert p["rounds"] == pytest.approx(0.2)
    assert p["teardown"] == pytest.approx(0.05, abs=0.05)


def test_a_run_without_its_marks_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(startup, "run_experiment", fake_run(lines=LINES[:2]))
    with pytest.raises(RuntimeError, match="saw \\['started'\\]"):
        startup.timed_run("quickstart", [], tmp_path / "r", 10)


def test_report_and_the_same_numbers_check(tmp_path, monkeypatch, capsys):
    cpus = []
    monkeypatch.setattr(startup, "run_experiment", fake_run(cpus=cpus))
    assert startup.main(["--repeats", "1", "--out", str(tmp_path)]) == 0
    assert cpus == [None, None, None, None, 1, 1]  # alone, side by side, one CPU each
    text = capsys.readouterr().out
    assert "| ray, actors, handshake |" in text and "| two runs one after the other |" in text
    assert "| two side by side, one CPU each | ratio |" in text
    (report,) = tmp_path.glob("startup-*/startup.json")
    res = json.loads(report.read_text())
    assert len(res["runs_alone"]) == 2 and len(res["pairs"]) == 1
    calls = iter([(0.4, 0.5)] * 3 + [(0.4, 0.6)] + [(0.4, 0.5)] * 2)  # the fourth differs

    def differing(*args, **kwargs):
        return fake_run(accuracy=next(calls))(*args, **kwargs)

    monkeypatch.setattr(startup, "run_experiment", differing)
    with pytest.raises(RuntimeError, match="the same seed gave different numbers"):
        startup.main(["--repeats", "1", "--out", str(tmp_path / "b")])
