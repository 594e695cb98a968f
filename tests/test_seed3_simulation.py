"""Seed 003 end to end in real Flower simulations on digits: Fed-Cyclic + label averaging
(the thesis's method), relay chains, and the local-model baseline."""

import pytest
from background import simulations
from omegaconf import OmegaConf

from tests.test_simulation import run

pytestmark = pytest.mark.integration

CYCLIC = ("rounds=2", "algorithm=fedcyclic", "federation.clients-per-round=4",
          "train.local-epochs=1")
RUNS = {"la": ("quickstart", *CYCLIC, "data.transforms=[label-averaging]", "algo.chains=2"),
        "local": ("quickstart", "rounds=2", "algorithm=local", "train.local-epochs=1")}
sims = simulations(RUNS, {"test_fed_cyclic_with_label_averaging_and_chains": ["la"],
                          "test_local_models_train_alone": ["local"]}, run)


def test_fed_cyclic_with_label_averaging_and_chains(sims):
    """Two chains of two hops: two Flower rounds per round, one record and one evaluation per
    round (the relay itself, chains=1, is checked in process in tests/test_steps.py)."""
    root, proc, la = sims["la"]
    assert [r["round"] for r in la["rounds"]] == [1, 2]
    for r in la["rounds"]:
        assert r["steps"] == 2 and len(r["fit_clients"]) == 4 and r["failures"] == 0
        assert r["fit_instructions"] == 4 and r["global_accuracy"] is not None
    assert "round 1/2 step 1/2 done" in proc.stdout + proc.stderr
    cfg = OmegaConf.load(root / "la" / "config.yaml")
    assert list(cfg.data.transforms) == ["label-averaging"] and cfg.algo.chains == 2
    assert la["summary"]["final_global_accuracy"] > 0.15


def test_local_models_train_alone(sims):
    _, _, doc = sims["local"]
    first, last = doc["rounds"]
    for r in doc["rounds"]:
        assert len(r["fit_clients"]) == 10 and r["failures"] == 0  # every client, every round
        assert r["bytes_down"] == 0 and r["bytes_up"] == 0
    assert first["global_accuracy"] == last["global_accuracy"]  # the global model never trains
    assert last["personal_accuracy"] > last["global_accuracy"] + 0.2
    assert last["personal_accuracy"] >= first["personal_accuracy"]  # the local models go on
