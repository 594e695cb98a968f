"""The centralized baseline (`fedapps centralized`): pooled data, the client loop, the
results contract, Q, same numbers for the same seed and after a resume, the real CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.arrays import set_arrays
from fedapps import checkpoint, rundir
from fedapps.centralized import (
    CLIENTS_TEST,
    OFFICIAL_TEST,
    central_splits,
    confusion_q,
    run_centralized,
)
from fedapps.data import federated_data
from fedapps.errors import ConfigError
from fedapps.registry import make_model
from fedapps.validation import resolve_config

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["centralized.epochs=2", "data.pool=official"]


def config(tmp_path, *sets, experiment="quickstart"):
    return resolve_config(experiment, [*QUICK, f"output.output-dir={tmp_path}", *sets],
                          check_data=False)


@pytest.fixture(autouse=True)
def one_thread():
    """As a simulated client trains (1 thread): on a loaded 2-core machine torch's 2 threads
    made an epoch of digits 20-60x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(tmp_path, name, *sets, mode=rundir.NEW, progress=lambda line: None,
        experiment="quickstart"):
    cfg = config(tmp_path, f"output.run-name={name}", *sets, experiment=experiment)
    summary = run_centralized(cfg, tmp_path / name, mode, progress=progress)
    return cfg, summary, json.loads((tmp_path / name / "results.json").read_text())


def test_pooled_data_is_the_union_of_the_clients_train_splits(tmp_path):
    cfg = config(tmp_path, "data.pool=merged")
    fd = federated_data(cfg)
    s = central_splits(cfg, fd)
    x = torch.cat([fd.client(p).x_train for p in range(fd.num_clients)])
    y = torch.cat([fd.client(p).y_train for p in range(fd.num_clients)])
    assert torch.equal(s.train[0], x) and torch.equal(s.train[1], y)
    assert list(s.held_out) == [CLIENTS_TEST]  # merged pool: the official test split is in it
    assert torch.equal(s.held_out[CLIENTS_TEST][1],
                       torch.cat([fd.client(p).y_test for p in range(fd.num_clients)]))
    assert s.confusion_split == CLIENTS_TEST and "data.pool=merged" in s.notes[0]
    cfg = config(tmp_path)  # data.pool=official: both held out, Q on the official test split
    s = central_splits(cfg, federated_data(cfg))
    assert list(s.held_out) == [CLIENTS_TEST, OFFICIAL_TEST] and s.confusion_split == OFFICIAL_TEST
    assert len(s.held_out[OFFICIAL_TEST][1]) == 297 and len(s.train[1]) + len(
        s.held_out[CLIENTS_TEST][1]) == 1500
    cfg = config(tmp_path, "data.pool=merged", "centralized.train-data=official")
    s = central_splits(cfg, federated_data(cfg))
    assert len(s.train[1]) == 1500 and list(s.held_out) == [OFFICIAL_TEST]


def test_one_epoch_is_plain_sgd_over_the_client_loop_batches(tmp_path):
    """Epoch 1 = an independent loop: SGD (lr, momentum) over the pooled data in the batches
    the client's generator gives for (seed, round 1, partition 0)."""
    cfg, _, _ = run(tmp_path, "a", "centralized.epochs=1", "centralized.lr=0.03",
                    "centralized.batch-size=32")
    s = central_splits(cfg, federated_data(cfg))
    x, y = s.train
    model = make_model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    gen = torch.Generator()
    gen.manual_seed(0 * 1_000_003 + 1 * 1009 + 0)
    order = torch.randperm(len(y), generator=gen)
    model.train()
    for start in range(0, len(y), 32):
        idx = order[start:start + 32]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    saved = checkpoint.load(tmp_path / "a")
    for mine, theirs in zip(model.state_dict().values(), saved.global_arrays, strict=True):
        np.testing.assert_allclose(mine.detach().numpy(), theirs, rtol=0, atol=1e-6)


def test_results_contract_q_and_same_seed_same_numbers(tmp_path):
    cfg, summary, doc = run(tmp_path, "a")
    _, _, again = run(tmp_path, "b")
    assert [r["official_test_accuracy"] for r in doc["rounds"]] == \
        [r["official_test_accuracy"] for r in again["rounds"]]
    assert [r["train_loss"] for r in doc["rounds"]] == [r["train_loss"] for r in again["rounds"]]
    assert (tmp_path / "a" / "confusion.csv").read_bytes() == \
        (tmp_path / "b" / "confusion.csv").read_bytes()
    _, _, other = run(tmp_path, "c", "seed=1")
    assert other["rounds"][-1]["train_loss"] != doc["rounds"][-1]["train_loss"]
    rounds = doc["rounds"]
    assert [r["round"] for r in rounds] == [1, 2] and summary["status"] == "completed"
    for key in ("global_accuracy", "personal_accuracy", "bytes_down", "bytes_up", "seconds",
                "fit_clients", "failures", "official_test_accuracy", "train_loss", "loss"):
        assert all(key in r for r in rounds), key
    assert summary["final_official_test_accuracy"] == rounds[-1]["official_test_accuracy"]
    assert summary["best_global_accuracy"] == max(r["global_accuracy"] for r in rounds)
    assert doc["invocation"]["command"] == "centralized"
    assert doc["centralized"]["confusion_split"] == OFFICIAL_TEST
    assert {"config.yaml", "metrics.csv", "accuracy.png", "confusion-counts.csv"} <= \
        {p.name for p in (tmp_path / "a").iterdir()}
    # Q by value: the final model's predictions on the official test split, counted here
    counts = np.loadtxt(tmp_path / "a" / "confusion-counts.csv", delimiter=",")
    q = np.loadtxt(tmp_path / "a" / "confusion.csv", delimiter=",")
    fd = federated_data(cfg)
    x, y = fd.official_test()
    model = make_model(cfg)
    set_arrays(model, checkpoint.load(tmp_path / "a").global_arrays)
    model.eval()
    with torch.no_grad():
        pred = model(x).argmax(1).numpy()
    mine = np.zeros((10, 10))
    np.add.at(mine, (y.numpy(), pred), 1)
    assert np.array_equal(counts, mine)
    np.testing.assert_allclose(q, mine / mine.sum(1, keepdims=True), atol=1e-9)
    assert np.trace(mine) / len(y) == pytest.approx(rounds[-1]["official_test_accuracy"])


def test_confusion_q_rows_sum_to_one_with_an_absent_class():
    q = confusion_q(np.array([[3, 1, 0], [0, 0, 0], [0, 2, 2]]))
    np.testing.assert_allclose(q, [[0.75, 0.25, 0], [0, 1, 0], [0, 0.5, 0.5]])


def test_resume_after_a_crash_gives_the_numbers_of_an_uninterrupted_run(tmp_path):
    _, _, whole = run(tmp_path, "whole", "centralized.epochs=3")

    def crash(line):
        if line.startswith("[fedapps] epoch 2/"):
            raise RuntimeError("killed")  # after epoch 2's results and checkpoint

    with pytest.raises(RuntimeError):
        run(tmp_path, "cut", "centralized.epochs=3", progress=crash)
    assert rundir.run_status(tmp_path / "cut") == "running"
    assert not (tmp_path / "cut" / "confusion.csv").exists()
    with pytest.raises(ConfigError, match="resume"):  # a new run may not replace it
        run(tmp_path, "cut", "centralized.epochs=3")
    _, summary, resumed = run(tmp_path, "cut", "centralized.epochs=3", mode=rundir.RESUME)
    assert summary["status"] == "completed"
    assert [r["train_loss"] for r in resumed["rounds"]] == \
        [r["train_loss"] for r in whole["rounds"]]
    assert [r["official_test_accuracy"] for r in resumed["rounds"]] == \
        [r["official_test_accuracy"] for r in whole["rounds"]]
    assert (tmp_path / "cut" / "confusion.csv").read_bytes() == \
        (tmp_path / "whole" / "confusion.csv").read_bytes()


def test_regression_scores_r2_and_writes_no_q(tmp_path):
    _, summary, doc = run(tmp_path, "r", experiment="regression-quick")
    assert summary["metric"] == "r2" and doc["rounds"][-1]["official_test_r2"] is not None
    assert doc["rounds"][-1]["global_r2"] is not None
    assert not (tmp_path / "r" / "confusion.csv").exists()


@pytest.mark.parametrize("sets, key", [
    (["centralized.epochs=0"], "centralized.epochs"),
    (["centralized.lr=-1"], "centralized.lr"),
    (["centralized.batch-size=0"], "centralized.batch-size"),
    (["centralized.train-data=all"], "centralized.train-data"),
])
def test_settings_are_checked(tmp_path, sets, key):
    with pytest.raises(ConfigError, match=key):
        config(tmp_path, *sets)


def test_cli_end_to_end_then_its_q_feeds_label_noise(tmp_path):
    """The real command in a fresh interpreter; its confusion.csv passes the label-noise
    transform's checks."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "simulations.cli", "centralized", "quickstart", "--set",
           "centralized.epochs=1", "--set", "data.pool=official", "--set",
           f"output.output-dir={tmp_path}", "--run-name", "cli", "--num-threads", "1"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "[fedapps] epoch 1/1  G " in out.stdout and "confusion.csv (Q)" in out.stdout
    q = tmp_path / "cli" / "confusion.csv"
    np.testing.assert_allclose(np.loadtxt(q, delimiter=",").sum(axis=1), 1, atol=1e-9)
    resolve_config("quickstart", ["data.transforms=[label-noise]", "data.label-noise.ratio=0.1",
                                  f"data.label-noise.matrix={q}"], check_data=False)


def test_cli_bad_value_is_one_line_and_exit_code_2(capsys):
    from simulations.cli import main

    assert main(["centralized", "quickstart", "--set", "centralized.epochs=0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "centralized.epochs=0" in err


def test_half_precision_trains_in_half_and_resumes_to_the_same_numbers(tmp_path):
    """train.precision reaches the centralized baseline (the Table 2.6 memory is centralized
    training): fp16 numbers differ from fp32's, and a resume after a crash repeats them
    (momentum buffers kept through the checkpoint)."""
    _, _, fp32 = run(tmp_path, "fp32", "centralized.epochs=3")
    _, _, whole = run(tmp_path, "whole", "centralized.epochs=3", "train.precision=fp16")
    assert [r["train_loss"] for r in whole["rounds"]] != [r["train_loss"] for r in fp32["rounds"]]

    def crash(line):
        if line.startswith("[fedapps] epoch 2/"):
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        run(tmp_path, "cut", "centralized.epochs=3", "train.precision=fp16", progress=crash)
    _, _, resumed = run(tmp_path, "cut", "centralized.epochs=3", "train.precision=fp16",
                        mode=rundir.RESUME)
    assert [r["train_loss"] for r in resumed["rounds"]] == \
        [r["train_loss"] for r in whole["rounds"]]
    assert [r["official_test_accuracy"] for r in resumed["rounds"]] == \
        [r["official_test_accuracy"] for r in whole["rounds"]]
