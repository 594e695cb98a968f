"""Peer pre-aggregation math (strategies/peer.py) against hand-computed values: Fed-Star's
weights 1 - acc normalized over the peers (seed 003 eqs. 3.8-3.9), the all-100% and exclude-self
cases, RingFed's ring mixing, and the server's data-size aggregation (eq. 3.6)."""

import numpy as np
import pytest

from fedapps.errors import ConfigError
from fedapps.settings import build_settings
from strategies.aggregation import weighted_average
from strategies.fedstar import FedStarSettings
from strategies.peer import final_weights, pre_aggregate, ring_rows, star_row
from strategies.ringfed import RingFedSettings

PEERS = [0, 1, 2]
# row k: client k's train accuracy of the models of clients 0, 1, 2
SCORES = {0: [0.99, 0.60, 0.80],  # the spec's worked example: M = (0.01, 0.40, 0.20)
          1: [0.50, 1.00, 0.75],  # M = (0.5, 0, 0.25)
          2: [0.90, 0.90, 0.90]}  # M = (0.1, 0.1, 0.1)
MODELS = {0: [np.array([1.0]), np.array([[10.0]])], 1: [np.array([2.0]), np.array([[20.0]])],
          2: [np.array([4.0]), np.array([[40.0]])]}


def rows(exclude_self=False, scores=SCORES):
    return {k: star_row(PEERS, scores[k], k, exclude_self) for k in PEERS}


def test_star_weights_are_one_minus_accuracy_normalized_over_all_models():
    r = rows()
    assert list(r[0].values()) == pytest.approx([1 / 61, 40 / 61, 20 / 61])  # (.016,.656,.328)
    assert list(r[1].values()) == pytest.approx([2 / 3, 0.0, 1 / 3])
    assert list(r[2].values()) == pytest.approx([1 / 3, 1 / 3, 1 / 3])


def test_pre_aggregates_come_from_the_snapshot_of_all_trained_models():
    new = pre_aggregate(MODELS, rows())
    assert new[0][0][0] == pytest.approx((1 * 1 + 40 * 2 + 20 * 4) / 61)  # 161/61
    assert new[0][1][0, 0] == pytest.approx(1610 / 61)
    # client 1 mixes client 0's TRAINED model (1.0), not its pre-aggregate (161/61 -> 2.43)
    assert new[1][0][0] == pytest.approx(2 / 3 * 1 + 1 / 3 * 4)  # 2.0
    assert new[2][0][0] == pytest.approx(7 / 3)
    assert MODELS[0][0][0] == 1.0  # the snapshot itself is untouched


def test_exclude_self_drops_the_own_model():
    r = rows(exclude_self=True)
    assert list(r[0].values()) == pytest.approx([0.0, 2 / 3, 1 / 3])
    assert list(r[1].values()) == pytest.approx([2 / 3, 0.0, 1 / 3])
    assert list(r[2].values()) == pytest.approx([0.5, 0.5, 0.0])
    assert pre_aggregate(MODELS, r)[0][0][0] == pytest.approx(2 / 3 * 2 + 1 / 3 * 4)  # 8/3
    assert star_row([5], [0.3], 5, exclude_self=True) == {5: 1.0}  # alone: keeps its model


def test_all_scores_100_percent_give_uniform_weights_without_dividing_by_zero():
    perfect = {k: [1.0, 1.0, 1.0] for k in PEERS}
    with np.errstate(all="raise"):
        r = rows(scores=perfect)
        assert list(r[1].values()) == pytest.approx([1 / 3] * 3)
        assert pre_aggregate(MODELS, r)[1][0][0] == pytest.approx(7 / 3)
        assert list(rows(True, perfect)[1].values()) == pytest.approx([0.5, 0.0, 0.5])
    with pytest.raises(ValueError, match="2 scores for 3 peer"):
        star_row(PEERS, [0.5, 0.5], 0)


def test_a_client_without_scores_keeps_its_trained_model():
    new = pre_aggregate(MODELS, {0: rows()[0]})
    assert new[1][0][0] == 2.0 and new[2][1][0, 0] == 40.0


def test_ring_mixes_each_model_with_its_predecessor():
    order = [2, 0, 1]  # ring 2 -> 0 -> 1 -> 2
    r = ring_rows(order, 0.8)
    assert r[0] == pytest.approx({0: 0.2, 2: 0.8}) and r[2] == pytest.approx({2: 0.2, 1: 0.8})
    new = pre_aggregate(MODELS, r)
    assert new[0][0][0] == pytest.approx(0.2 * 1 + 0.8 * 4)  # 3.4
    assert new[1][0][0] == pytest.approx(0.2 * 2 + 0.8 * 1)  # 1.2
    assert new[2][0][0] == pytest.approx(0.2 * 4 + 0.8 * 2)  # 2.4
    rotated = pre_aggregate(MODELS, ring_rows(order, 1.0))  # gamma 1: one place on
    assert [rotated[k][0][0] for k in PEERS] == [4.0, 1.0, 2.0]
    assert ring_rows([7], 0.8) == {7: {7: 1.0}}
    with pytest.raises(ValueError, match="gamma"):
        ring_rows(order, 1.5)


def test_server_aggregates_the_pre_aggregates_by_data_size():
    sizes = {0: 10, 1: 30, 2: 60}
    w = final_weights(sizes)
    assert w == pytest.approx({0: 0.1, 1: 0.3, 2: 0.6})  # |D_k| / |D|, summing to 1 (not 1/K)
    out = weighted_average([MODELS[k] for k in w], list(w.values()))
    assert out[0][0] == pytest.approx(0.1 * 1 + 0.3 * 2 + 0.6 * 4)  # 3.1
    assert final_weights(sizes, "uniform") == pytest.approx({0: 1 / 3, 1: 1 / 3, 2: 1 / 3})


def test_settings_defaults_and_rules():
    star = build_settings(FedStarSettings, {})
    assert (star.periods, star.exclude_self, star.final_weights) == (2, False, "data-size")
    assert build_settings(RingFedSettings, {}).gamma == 0.8
    with pytest.raises(ConfigError, match=r"^algo.gamma=1.5: must be in \[0, 1\]$"):
        build_settings(RingFedSettings, {"gamma": 1.5})
    with pytest.raises(ConfigError, match=r"^algo.periods=0: must be an integer >= 1$"):
        build_settings(FedStarSettings, {"periods": 0})
    with pytest.raises(ConfigError, match="allowed: data-size, uniform"):
        build_settings(RingFedSettings, {"final-weights": "median"})
