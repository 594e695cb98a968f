"""Run directories (fedapps/rundir.py): one process per directory, a run id that keys client
state, what a new run does with an old one, and what a resume may change. All in process or
with a tiny subprocess; tests/test_resume.py holds the real runs."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.common import Context, RecordDict

from fedapps import checkpoint, rundir
from fedapps.cli import main
from fedapps.errors import ConfigError


def fake_run(run_dir: Path, status: str = "completed", rounds: int = 2) -> Path:
    """A run directory as a run with `rounds` rounds left it: results, config, checkpoint,
    run id, a plot, node state, and its simulated clients' state beside it."""
    run_dir.mkdir(parents=True)
    doc = {"rounds": [{"round": r} for r in range(1, rounds + 1)],
           "summary": {"status": status},
           "invocation": {"experiment": "quickstart", "overrides": f"rounds={rounds}"}}
    (run_dir / "results.json").write_text(json.dumps(doc))
    (run_dir / "config.yaml").write_text("rounds: 2\n")
    (run_dir / "accuracy.png").write_bytes(b"png")
    (run_dir / "run-id").write_text("oldrun\n")
    (run_dir / "node-state" / "node-0").mkdir(parents=True)
    checkpoint.save(run_dir, checkpoint.Snapshot(rounds, [np.zeros(3)]))
    state = rundir.client_state_root(run_dir) / run_dir.name / "oldrun" / "partition-0"
    state.mkdir(parents=True)
    (state / "h.npz").write_bytes(b"x")
    return run_dir


def files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".lock"}


def one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("fedapps: config error: "), err
    assert all(n in err for n in needles), err
    return err


# ---- run identity and client state --------------------------------------------------------

def test_a_fresh_run_never_reads_client_state_of_another_run_id(tmp_path):
    """The ClientApp keys state on disk by the run id: a new id (a rerun under the same name)
    starts from nothing, the same id (a resume, a restarted node) finds its state."""
    from fedapps.client_app import client_fn

    def client(run_id, flower_run_id=1):
        run_config = {"experiment": "quickstart", "overrides": "algorithm=ditto",
                      "output-dir": str(tmp_path), "run-name": "r"}
        if run_id:
            run_config["run-id"] = run_id
        node = {"partition-id": 3, "num-partitions": 10, "state-dir": str(tmp_path / "state")}
        context = Context(run_id=flower_run_id, node_id=1, node_config=node, state=RecordDict(),
                          run_config=run_config)  # a fresh process: empty node state
        return client_fn(context).numpy_client.client()

    first = client("aaa")
    first.save_state("personal", [np.arange(3.0)])
    assert first.state_dir == tmp_path / "state" / "r" / "aaa" / "partition-3"
    rerun = client("bbb")
    assert rerun.load_state("personal") is None and not rerun.restored_from_disk
    resumed = client("aaa")
    np.testing.assert_array_equal(resumed.load_state("personal")[0], np.arange(3.0))
    assert resumed.restored_from_disk
    # plain `flwr run` (no run id in the run config): Flower's own run id keys the state
    assert client(None, flower_run_id=7).state_dir.parent.name == "flwr-7"
    with pytest.raises(ConfigError, match="run-id='../x': only letters"):
        client("../x")


def test_server_writes_only_while_the_directory_is_its_runs(tmp_path):
    """A ServerApp whose launcher died must not write over the run that claimed the
    directory after it: results and checkpoints check the run id first."""
    from fedapps.results import ResultsWriter

    with rundir.claim(tmp_path / "r") as run_id:
        cfg = {"output": {"plots": False}, "algorithm": "fedavg", "dataset": "digits",
               "wandb": {"enabled": False}}
        writer = ResultsWriter(tmp_path / "r", cfg, {"emd": 0.5, "min_client_samples": 1}, 2,
                               run_id=run_id)
        (tmp_path / "r" / "run-id").write_text("newer\n")  # another run claimed it since
        with pytest.raises(RuntimeError, match="now belongs to run newer, not to this run"):
            writer.stop("x")
        with pytest.raises(RuntimeError, match="now belongs to run newer"):
            checkpoint.save(tmp_path / "r", checkpoint.Snapshot(1, [np.zeros(1)]), run_id)
    assert json.loads((tmp_path / "r" / "results.json").read_text())["summary"]["status"] \
        == "running"


# ---- claiming a directory -------------------------------------------------------------------

def test_a_second_claim_fails_at_once_in_one_line(tmp_path, capsys):
    out = tmp_path / "r"
    with rundir.claim(out) as run_id:
        assert rundir.read_run_id(out) == run_id and len(run_id) == 16
        busy = f"in use by another fedapps process \\(pid {os.getpid()}\\)"
        with pytest.raises(rundir.RunDirBusy, match=busy), rundir.claim(out, rundir.OVERWRITE):
            pass
        # the real CLI path: one line, exit 2, nothing started, nothing written
        before = files(out)
        assert main(["run", "quickstart", "--set", f"output.output-dir={tmp_path}",
                     "--set", "output.run-name=r", "--overwrite"]) == 2
        one_line_error(capsys, str(out), "in use by another fedapps process")
        assert files(out) == before


def test_a_killed_claimer_leaves_no_stale_lock(tmp_path):
    """The lock is the OS's (flock): a SIGKILLed process releases it."""
    code = ("import os, signal, sys; from pathlib import Path; from fedapps import rundir\n"
            "with rundir.claim(Path(sys.argv[1])):\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r")], timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert proc.returncode == -signal.SIGKILL
    with rundir.claim(tmp_path / "r", rundir.OVERWRITE):  # claimable at once
        pass


def test_a_completed_or_unfinished_run_is_refused_without_overwrite(tmp_path, capsys):
    done = fake_run(tmp_path / "done")
    before = files(done)
    assert main(["run", "quickstart", "--set", f"output.output-dir={tmp_path}",
                 "--set", "output.run-name=done"]) == 2
    one_line_error(capsys, "holds a completed run; add --overwrite to replace it")
    assert files(done) == before
    fake_run(tmp_path / "half", status="running")
    unfinished = "holds an unfinished run; `fedapps resume .*half` continues it"
    with pytest.raises(rundir.RunDirTaken, match=unfinished), rundir.claim(tmp_path / "half"):
        pass
    # a run that stopped before its first checkpoint has nothing to keep: replaced
    (tmp_path / "half" / "checkpoint.npz").unlink()
    with rundir.claim(tmp_path / "half") as run_id:
        assert run_id != "oldrun" and not (tmp_path / "half" / "results.json").exists()


def test_overwrite_removes_the_old_run_and_its_client_state_only(tmp_path):
    old = fake_run(tmp_path / "r")
    (old / "notes.txt").write_text("mine")
    with rundir.claim(old, rundir.OVERWRITE) as run_id:
        assert run_id != "oldrun" and rundir.read_run_id(old) == run_id
        assert sorted(p.name for p in old.iterdir()) == [".lock", "notes.txt", "run-id"]
        assert not (rundir.client_state_root(old) / "r").exists()
    # a folder that is no run's (no run id, no results): its files stay
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "photo.png").write_bytes(b"png")
    with rundir.claim(tmp_path / "mine", rundir.OVERWRITE):
        assert (tmp_path / "mine" / "photo.png").is_file()


def test_a_grid_reruns_an_unfinished_run_clean_and_keeps_a_completed_one(tmp_path):
    """`fedapps reproduce` claims with REDO_UNFINISHED: an interrupted cell starts again with
    a new run id and none of the old run's state; a cell completed meanwhile is kept."""
    half = fake_run(tmp_path / "half", status="running")
    with rundir.claim(half, rundir.REDO_UNFINISHED) as run_id:
        assert run_id != "oldrun" and not (half / "checkpoint.npz").exists()
        assert not (rundir.client_state_root(half) / "half").exists()
    done = fake_run(tmp_path / "done")
    before = files(done)
    with pytest.raises(rundir.RunCompleted), rundir.claim(done, rundir.REDO_UNFINISHED):
        pass
    assert files(done) == before


def test_a_grid_continues_an_unfinished_run_of_its_own_settings_only(tmp_path):
    """`fedapps reproduce` continues an interrupted cell (RESUME_UNFINISHED keeps its run id,
    checkpoint and clients' state) when resume_point finds the same experiment with only
    RESUMABLE keys changed and rounds left; anything else is started again clean."""
    from fedapps.cli import resume_point

    half = fake_run(tmp_path / "g" / "half", status="running", rounds=2)
    here = [f"output.output-dir={half.parent}", f"output.run-name={half.name}"]
    assert resume_point(half, "quickstart", ["rounds=4", *here]) == 2
    assert resume_point(half, "quickstart", ["rounds=4", "wandb.enabled=true", *here]) == 2
    # another setting, experiment or too few rounds: start again
    assert resume_point(half, "quickstart", ["rounds=4", "train.lr=0.5", *here]) is None
    assert resume_point(half, "fedreb-quick", ["rounds=4", *here]) is None
    assert resume_point(half, "quickstart", ["rounds=2", *here]) is None
    # a grid folder moved elsewhere still continues (the run's place is where it is now)
    moved = tmp_path / "elsewhere" / "half"
    moved.parent.mkdir()
    half.rename(moved)
    there = [f"output.output-dir={moved.parent}", f"output.run-name={moved.name}"]
    assert resume_point(moved, "quickstart", ["rounds=4", *there]) == 2
    with rundir.claim(moved, rundir.RESUME_UNFINISHED) as run_id:
        assert run_id == "oldrun" and (moved / "checkpoint.npz").is_file()
    # nothing to continue: completed, no checkpoint, a damaged checkpoint, no run id
    done = fake_run(tmp_path / "done")
    assert resume_point(done, "quickstart", ["rounds=4"]) is None
    with pytest.raises(rundir.RunCompleted), rundir.claim(done, rundir.RESUME_UNFINISHED):
        pass
    (moved / "checkpoint.npz").write_bytes(b"PK\x03\x04 cut short")
    assert resume_point(moved, "quickstart", ["rounds=4", *there]) is None
    (moved / "checkpoint.npz").unlink()
    assert resume_point(moved, "quickstart", ["rounds=4", *there]) is None
    assert resume_point(tmp_path / "nothing", "quickstart", ["rounds=4"]) is None


def test_a_grid_skips_a_run_another_process_holds(tmp_path):
    from simulations.reproduce import Grid, run_grid

    ran = []

    def runner(experiment, sets, n_clients, run_dir):  # claims as run_experiment does
        with rundir.claim(run_dir, rundir.REDO_UNFINISHED):
            ran.append(run_dir.name)
            return "finished:completed"

    grid, lines = Grid("g", "quickstart", [0, 1], {"algorithm": ["fedavg"]}), []
    with rundir.claim(tmp_path / "g" / "fedavg-s0"):
        run_grid(grid, [], tmp_path, runner, log=lines.append)
    assert ran == ["fedavg-s1"]
    assert any(line.startswith("[1/2] fedavg seed 0: skipped, ") and "in use by another" in line
               for line in lines), lines


# ---- resume ---------------------------------------------------------------------------------

def test_resume_may_change_only_rounds_output_plots_timeout_and_wandb():
    before = {"rounds": 2, "model": {"name": "digits-cnn"}, "output": {"plots": True},
              "wandb": {"enabled": False}, "federation": {"round-timeout": None}}
    rundir.check_resume_changes(before, {
        **before, "rounds": 5, "output": {"plots": False}, "wandb": {"enabled": True},
        "federation": {"round-timeout": 60}})
    with pytest.raises(ConfigError, match=r"resume: model.name='mlp' would change the "
                                          r"experiment; a resume may change only rounds, "):
        rundir.check_resume_changes(before, {**before, "model": {"name": "mlp"}})


def test_resume_refuses_experiment_changes_and_a_finished_run_before_writing(tmp_path, capsys):
    run = fake_run(tmp_path / "done")
    before = files(run)
    assert main(["resume", str(run), "--set", "model.name=mlp"]) == 2
    one_line_error(capsys, "model.name='mlp' would change the experiment")
    assert main(["resume", str(run), "--set", "output.run-name=other"]) == 2
    one_line_error(capsys, "output.run-name='other'")
    assert main(["resume", str(run)]) == 2  # completed, rounds not raised
    one_line_error(capsys, "rounds=2 but the run (completed) has done 2 rounds",
                   "--set rounds=N` with N > 2")
    assert files(run) == before  # config.yaml, results.json (status) untouched
