"""Macro and weighted F1 of G and P (seed 003's tables), pooled exactly on the server from the
clients' confusion counts, checked against scikit-learn on the concatenated predictions."""

import numpy as np
import pytest
import torch
from sklearn.metrics import confusion_matrix, f1_score

from fedapps.evaluation import evaluate_sums, reduce_evaluations, summarize_central
from fedapps.tasks import TASKS, f1_scores, pooled_confusion

C = 5
TASK = TASKS["classification"]


def client(seed, n):
    """Labels over classes 0..3 (class 4 never occurs) and two predictors' logits."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C - 1, (n,), generator=g)
    logits_g = torch.randn(n, C, generator=g)
    logits_p = torch.randn(n, C, generator=g) + 3 * torch.nn.functional.one_hot(y, C)
    return y, logits_g, logits_p


def evaluated(seed, n, batch_size=7):
    y, lg, lp = client(seed, n)
    def predict(xb):
        idx = xb.long()
        return lg[idx], lp[idx]

    x = torch.arange(n).float()
    count, loss, sums = evaluate_sums(predict, x, y, TASK, batch_size=batch_size)
    assert count == n
    return y, lg.argmax(1), lp.argmax(1), (count, loss, sums)


def test_client_confusion_counts_equal_sklearns_confusion_matrix():
    y, pred_g, pred_p, (_, _, sums) = evaluated(0, 50)
    for key, pred in (("confusion-global", pred_g), ("confusion-personal", pred_p)):
        got = np.frombuffer(sums[key], dtype="<i8").reshape(C, C)
        np.testing.assert_array_equal(got, confusion_matrix(y, pred, labels=range(C)))
    assert sums["correct-global"] == int((pred_g == y).sum())


def test_pooled_f1_equals_sklearn_on_the_concatenated_predictions():
    clients = [evaluated(seed, n) for seed, n in ((1, 40), (2, 17), (3, 64))]
    results = [(pid, ev[0], ev[1] / ev[0], ev[2]) for pid, (_, _, _, ev) in enumerate(clients)]
    out = reduce_evaluations(TASK, results, num_clients=3)
    y = torch.cat([c[0] for c in clients]).numpy()
    for who, idx in (("global", 1), ("personal", 2)):
        pred = torch.cat([c[idx] for c in clients]).numpy()
        for avg in ("macro", "weighted"):
            expected = f1_score(y, pred, average=avg, zero_division=0)
            assert out[f"{who}_{avg}_f1"] == pytest.approx(expected, abs=1e-12), (who, avg)
    # a macro F1 is not a micro-average: it differs from the accuracy here
    assert out["global_macro_f1"] != pytest.approx(out["global_accuracy"], abs=1e-3)


def test_hand_computed_f1_and_the_classes_that_count():
    # true x predicted; class 2 is never a label but predicted once; class 3 never occurs
    conf = np.array([[3, 1, 0, 0], [0, 2, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    macro, weighted = f1_scores(conf)
    f1 = [2 * 3 / (4 + 3), 2 * 2 / (3 + 3), 0.0]  # class 3 left out (neither label nor guess)
    assert macro == pytest.approx(sum(f1) / 3)
    assert weighted == pytest.approx((4 * f1[0] + 3 * f1[1]) / 7)
    assert f1_scores(np.zeros((3, 3))) == (None, None)


def test_malformed_confusion_bytes_give_no_f1_instead_of_a_crash():
    good = np.eye(3, dtype="<i8").tobytes()
    assert pooled_confusion([good, good]).tolist() == (2 * np.eye(3)).tolist()
    assert pooled_confusion([good, b"123"]) is None  # not int64 sized
    assert pooled_confusion([good, np.eye(2, dtype="<i8").tobytes()]) is None  # sizes differ
    assert pooled_confusion([good, None]) is None  # a client without counts
    assert pooled_confusion([np.ones(3, dtype="<i8").tobytes()]) is None  # not square


def test_official_test_summary_has_f1_too():
    _, _, _, (n, loss, sums) = evaluated(4, 30)
    out = summarize_central(TASK, n, loss, sums)
    assert 0.0 <= out["official_test_macro_f1"] <= 1.0
    assert "official_test_weighted_f1" in out and "official_test_accuracy" in out
