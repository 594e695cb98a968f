"""The regression task end to end on the embedded diabetes data: a real simulation whose G is
the R^2 pooled from every client's sums, checked against scikit-learn's r2_score of the final
global model on the union of the clients' local test splits."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.metrics import r2_score

from clients.arrays import set_arrays
from fedapps import checkpoint
from fedapps.data import federated_data
from fedapps.errors import ConfigError
from fedapps.registry import make_model
from fedapps.validation import resolve_config


def test_class_based_settings_are_refused_for_a_regression_dataset():
    for overrides, message in (
            (["algorithm=fedreb"], "needs a classification dataset; diabetes is regression"),
            (["data.partitioner=dirichlet"], "needs class labels"),
            (["model.name=convnet"], "needs [C, H, W] inputs")):
        with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
            resolve_config("regression-quick", overrides, check_data=False)


def test_diabetes_targets_are_standardized_with_the_train_split():
    fd = federated_data(resolve_config("regression-quick", check_data=False))
    y = torch.cat([fd.client(p).y_train for p in range(fd.num_clients)]).double()
    assert fd.pool.task == "regression" and fd.summary()["emd"] is None
    assert abs(float(y.mean())) < 0.15 and 0.85 < float(y.std()) < 1.15


@pytest.mark.integration
def test_regression_run_reports_r2_equal_to_sklearn_on_the_union_of_test_splits(tmp_path):
    cmd = [sys.executable, "-m", "fedapps.cli", "run", "regression-quick", "--set", "rounds=3",
           "--set", f"output.output-dir={tmp_path}", "--set", "output.run-name=r"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "G r2 " in proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "r" / "results.json").read_text())
    last = doc["rounds"][-1]
    assert doc["summary"]["metric"] == "r2" and "global_accuracy" not in last
    assert doc["summary"]["final_global_r2"] == last["global_r2"]
    assert (tmp_path / "r" / "r2.png").is_file()

    cfg = resolve_config("regression-quick", ["rounds=3"], check_data=False)
    fd = federated_data(cfg)
    model = make_model(cfg)
    set_arrays(model, checkpoint.load(tmp_path / "r").global_arrays)
    model.eval()
    with torch.no_grad():
        ys, preds = [], []
        for pid in range(fd.num_clients):
            c = fd.client(pid)
            ys.append(c.y_test.double().numpy())
            preds.append(model(c.x_test)[:, 0].double().numpy())
    expected = r2_score(np.concatenate(ys), np.concatenate(preds))
    assert last["global_r2"] == pytest.approx(expected, abs=1e-6)
    assert last["global_r2"] > 0.3  # a linear model reaches about 0.5 on this data
    per_client = [r2_score(y, p) for y, p in zip(ys, preds, strict=True)]
    assert last["client_global_r2"] == pytest.approx(per_client, abs=1e-6)
