"""Fed-Star and RingFed end to end: real Flower simulations (own SuperLink, Ray) on the digits,
few clients, one local epoch, two rounds of two periods each."""

import pytest
from background import simulations

from tests.test_simulation import run

pytestmark = pytest.mark.integration

SMALL = ("rounds=2", "federation.num-clients=4", "federation.clients-per-round=3",
         "train.local-epochs=1")
RUNS = {"fedstar": ("quickstart", *SMALL, "algorithm=fedstar"),
        "ringfed": ("quickstart", *SMALL, "algorithm=ringfed")}
sims = simulations(RUNS, {
    "test_fed_star_simulation_scores_peers_and_records_one_entry_per_round": ["fedstar"],
    "test_ring_fed_simulation_runs_p_steps_per_round": ["ringfed"]}, run)


def test_fed_star_simulation_scores_peers_and_records_one_entry_per_round(sims):
    _, proc, doc = sims["fedstar"]
    assert [r["round"] for r in doc["rounds"]] == [1, 2]
    for r in doc["rounds"]:
        assert r["steps"] == 4 and len(r["fit_clients"]) == 3 and r["failures"] == 0
        assert r["fit_instructions"] == 2 * 2 * 3 and r["rejected_updates"] == 0
        # per period: one model to each of 3 clients to train, all 3 models to each to score
        assert r["bytes_down_xeval"] == 3 * r["bytes_down"] > 0
    assert "round 1/2 step 2/4 done" in proc.stdout + proc.stderr
    assert doc["summary"]["final_global_accuracy"] > 0.15  # chance is 0.1


def test_ring_fed_simulation_runs_p_steps_per_round(sims):
    _, proc, doc = sims["ringfed"]
    assert [r["round"] for r in doc["rounds"]] == [1, 2]
    for r in doc["rounds"]:
        assert r["steps"] == 2 and len(r["fit_clients"]) == 3 and r["failures"] == 0
        assert r["bytes_down_xeval"] == 0 and r["fit_instructions"] == 2 * 3
    assert "round 2/2 step 1/2 done" in proc.stdout + proc.stderr
    assert doc["summary"]["final_global_accuracy"] > 0.15
