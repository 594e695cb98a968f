"""Checkpoint and resume: a run stopped after round 2 and resumed ends where an uninterrupted
run ends (FedDyn: the global model and the server state h must both be restored)."""

import json
import subprocess
import sys

import numpy as np
import pytest
from background import beside

from fedapps import checkpoint

pytestmark = pytest.mark.integration


def cli(*args):
    proc = subprocess.run([sys.executable, "-m", "fedapps.cli", *args], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_checkpoint_roundtrip(tmp_path):
    arrays = [np.arange(4, dtype=np.float32), np.ones((2, 2))]
    state = {"h": [np.zeros(3), np.full(2, 7.0)], "x": [np.array([1])]}
    checkpoint.save(tmp_path, checkpoint.Snapshot(5, arrays, state))
    snap = checkpoint.load(tmp_path)
    assert snap.round == 5 and snap.step is None and snap.completed_rounds == 5
    assert all(np.array_equal(a, b) for a, b in zip(snap.global_arrays, arrays, strict=True))
    assert list(snap.state) == ["h", "x"] and np.array_equal(snap.state["h"][1], state["h"][1])
    # inside a multi-step round: the last completed step and the open round's counters
    checkpoint.save(tmp_path, checkpoint.Snapshot(6, arrays, state, step=2, open_round="{}"))
    mid = checkpoint.load(tmp_path)
    assert (mid.round, mid.step, mid.open_round, mid.completed_rounds) == (6, 2, "{}", 5)
    assert checkpoint.load(tmp_path / "missing") is None


@pytest.mark.parametrize("algorithm", ["feddyn"])  # server state h must survive too
def test_resumed_run_equals_uninterrupted_run(tmp_path, algorithm):
    base = ["--set", f"algorithm={algorithm}", "--set", f"output.output-dir={tmp_path}"]
    # two stages of two runs side by side (tests/background.py), on one CPU each: the
    # uninterrupted reference beside the stopped run, then the resume beside a rerun of the
    # reference's name
    one_cpu = ["--cpus", "1"]
    with beside(lambda: cli("run", "quickstart", *base, *one_cpu, "--set", "rounds=4", "--set",
                            "output.run-name=full")) as uninterrupted:
        cli("run", "quickstart", *base, *one_cpu, "--set", "rounds=2", "--set",
            "output.run-name=part")
        uninterrupted()
    full = json.loads((tmp_path / "full" / "results.json").read_text())
    # resuming a completed run without more rounds: one line, exit 2, nothing written
    # (tests/test_rundir.py checks the same for `--set model.name=...` in process)
    kept = {f: (tmp_path / "full" / f).read_bytes() for f in ("results.json", "config.yaml")}
    proc = subprocess.run([sys.executable, "-m", "fedapps.cli", "resume", str(tmp_path / "full")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "has done 4 rounds" in proc.stderr
    assert kept == {f: (tmp_path / "full" / f).read_bytes() for f in kept}
    # the same name again: refused unless --overwrite; then a fresh run id, so the clients do
    # not load the old run's FedDyn corrections (4 rounds of them on disk) and the rerun
    # repeats the first rounds
    rerun = ["run", "quickstart", *base, "--set", "rounds=2", "--set", "output.run-name=full"]
    proc = subprocess.run([sys.executable, "-m", "fedapps.cli", *rerun], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "holds a completed run; add --overwrite" in proc.stderr
    with beside(lambda: cli(*rerun, *one_cpu, "--overwrite")) as overwritten:
        proc = cli("resume", str(tmp_path / "part"), *one_cpu, "--set", "rounds=4")
        overwritten()
    assert "round 3/4" in proc.stdout and "round 1/" not in proc.stdout
    part = json.loads((tmp_path / "part" / "results.json").read_text())
    assert [r["round"] for r in part["rounds"]] == [1, 2, 3, 4]
    for a, b in zip(full["rounds"], part["rounds"], strict=True):
        assert a["global_accuracy"] == b["global_accuracy"]
        assert a["fit_clients"] == b["fit_clients"]
    assert part["summary"]["status"] == "completed"
    assert part["environments"] == full["environments"]  # resumed on the same machine: one
    again = json.loads((tmp_path / "full" / "results.json").read_text())
    assert [r["global_accuracy"] for r in again["rounds"]] == \
        [r["global_accuracy"] for r in full["rounds"][:2]]
    assert all(r["clients_state_from_disk"] == [] for r in again["rounds"])


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedapps.cli", "resume", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no results.json" in proc.stderr


def test_resuming_again_records_each_override_once(tmp_path, monkeypatch):
    """`fedapps resume` of a resumed run: invocation.overrides used to gain another
    `output.run-name=...` and `output.output-dir=...` with every resume. In process: the
    ServerApp's server_fn stands in for the Flower run the CLI would start."""
    import shlex

    from flwr.common import Context, RecordDict

    from clients.arrays import get_arrays
    from fedapps import cli, launcher
    from fedapps.registry import make_model
    from fedapps.server_app import server_fn
    from fedapps.validation import resolve_config

    run = tmp_path / "r"
    run.mkdir()
    model = make_model(resolve_config("quickstart", ["rounds=1"], check_data=False))
    checkpoint.save(run, checkpoint.Snapshot(1, [a.copy() for a in get_arrays(model)]))
    first = f"rounds=1 output.run-name=r output.output-dir={tmp_path}"  # as `fedapps run` left it
    (run / "results.json").write_text(json.dumps({
        "rounds": [], "summary": {"status": "stopped: test"},
        "invocation": {"experiment": "quickstart", "overrides": first}}))

    cpus = []

    def start_server(experiment, overrides, n, out, **kwargs):  # what Flower would run
        cpus.append(kwargs["total_cpus"])
        server_fn(Context(run_id=1, node_id=0, state=RecordDict(), node_config={}, run_config={
            "experiment": experiment, "overrides": shlex.join(overrides),
            "output-dir": str(out.parent), "run-name": out.name}))
        return "finished:completed"

    monkeypatch.setattr(launcher, "run_experiment", start_server)
    recorded = []
    for extra in ([], ["--cpus", "1"]):
        cli.main(["resume", str(run), "--set", "rounds=3", *extra])
        recorded.append(json.loads((run / "results.json").read_text())["invocation"]["overrides"])
    keys = [item.split("=")[0] for item in shlex.split(recorded[1])]
    assert recorded[0] == recorded[1] and len(keys) == len(set(keys))
    assert cpus == [None, 1]  # --cpus caps the Ray of this run only; it is no override
    assert dict(item.split("=", 1) for item in shlex.split(recorded[1])) == {
        "rounds": "3", "output.run-name": "r", "output.output-dir": str(tmp_path),
        "output.resume": "true"}
