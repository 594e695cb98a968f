"""FedAIoT protocol pieces (seed 004 chapter 2) that are not a loader, a model or a partitioner:
the centralized test (B13) and its validation."""

from __future__ import annotations

import pytest

from fedapps.config import load_config
from fedapps.errors import ConfigError
from fedapps.validation import validate


def test_clients_without_a_local_test_split_need_the_official_test() -> None:
    base = ["data.pool=official", "data.test-fraction=0"]
    validate(load_config("quickstart", [*base, "eval.official-test=true"]), check_data=False)
    with pytest.raises(ConfigError, match="data.test-fraction=0: 0 leaves clients no local "
                                          "test split: set eval.official-test=true"):
        validate(load_config("quickstart", base), check_data=False)
    with pytest.raises(ConfigError, match="eval.official-test=True: needs data.pool=official"):
        validate(load_config("quickstart", ["eval.official-test=true"]), check_data=False)
    with pytest.raises(ConfigError, match="eval.official-test=2: must be true, false"):
        validate(load_config("quickstart", ["eval.official-test=2"]), check_data=False)


def test_generated_presets_and_grids_are_what_the_generator_writes() -> None:
    """conf/experiment/fedaiot-*.yaml and conf/grid/fedaiot-table2.*.yaml come from one table
    (simulations/fedaiot_grids.py); an edit of one file alone would split them."""
    from simulations.fedaiot_grids import SETTINGS, files

    written = files()
    assert len(written) == 5 * len(SETTINGS) - 2  # no Table 2.5 for AEP and VisDrone
    for path, text in written.items():
        assert path.read_text() == text, f"{path.name}: rerun python -m simulations.fedaiot_grids"


def test_fedaiot_presets_follow_section_2_3() -> None:
    """A few cells of the thesis's settings, as the runs resolve them."""
    cfg = load_config("fedaiot-ut-har", [])
    assert (cfg.federation["num-clients"], cfg.federation["clients-per-round"], cfg.rounds) == \
        (20, 2, 1200)
    assert (cfg.train.lr, cfg.train["batch-size"], cfg.data.partitioner, cfg.data.alpha) == \
        (0.01, 32, "fedaiot-dirichlet", 0.1)
    aep = load_config("fedaiot-aep", [])
    assert (aep.data.partitioner, aep.model.name, aep.rounds) == ("fedaiot-quantiles", "aep-mlp",
                                                                  3000)
    vis = load_config("fedaiot-visdrone", [])  # Table 2.1: 30 clients; B5: Table 2.4's rounds
    assert (vis.dataset, vis.model.name, vis.data.partitioner, vis.data.fedaiot["cluster-features"],
            vis.federation["num-clients"], vis.rounds, vis.train.lr, vis.train["batch-size"]) == \
        ("visdrone", "yolov8n", "fedaiot-clusters", "vgg19", 30, 600, 0.1, 12)
    epic = load_config("fedaiot-epic-sounds", [])
    assert (epic.federation["num-clients"], epic.federation["clients-per-round"],
            epic.centralized["batch-size"]) == (210, 21, 512)


@pytest.mark.integration
def test_fedaiot_pipeline_in_a_real_simulation_reports_the_official_r2(tmp_path) -> None:
    """Issue 15's regression path end to end on the bundled diabetes data: the output-quantile
    Dirichlet partition, FedOPT (torch-adam), clients without a local test split, the server's
    R^2 on the official test split every 2 rounds and at the end, equal to scikit-learn's on
    the final global model."""
    import json
    import subprocess
    import sys

    import numpy as np
    import torch
    from sklearn.metrics import r2_score

    from clients.arrays import set_arrays
    from fedapps import checkpoint
    from fedapps.data import federated_data
    from fedapps.registry import make_model
    from fedapps.validation import resolve_config

    sets = ["rounds=3", "eval.eval-every=2", "server.optimizer=torch-adam", "server.lr=0.01"]
    cmd = [sys.executable, "-m", "fedapps.cli", "run", "fedaiot-diabetes",
           *[a for s in sets for a in ("--set", s)],
           "--set", f"output.output-dir={tmp_path}", "--set", "output.run-name=r"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "r" / "results.json").read_text())
    rounds = doc["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert [r.get("official_test_r2") is not None for r in rounds] == [False, True, True]
    assert all(r["global_r2"] is None and r["bytes_down_eval"] == 0 for r in rounds)
    assert doc["summary"]["final_official_test_r2"] == rounds[-1]["official_test_r2"]
    sizes = doc["partition"]["train_sizes"]
    assert len(sizes) == 10 and min(sizes) >= 20 and sum(sizes) == 350  # the official train
    assert set(doc["partition"]["test_sizes"]) == {0}

    cfg = resolve_config("fedaiot-diabetes", sets, check_data=False)
    fd = federated_data(cfg)
    model = make_model(cfg)
    snap = checkpoint.load(tmp_path / "r")
    assert int(snap.state["server_opt_step"][0]) == 3  # the server optimizer stepped each round
    set_arrays(model, snap.global_arrays)
    model.eval()
    x, y = fd.official_test()
    with torch.no_grad():
        pred = model(x)[:, 0].double().numpy()
    expected = r2_score(y.double().numpy(), pred)
    assert rounds[-1]["official_test_r2"] == pytest.approx(expected, abs=1e-6)
    assert np.isfinite(expected)
