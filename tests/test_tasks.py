"""Tasks and the shared evaluation loop, by value: hand counts, today's strategy reduction,
batch-size invariance, and R^2 pooled from client sums against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import Code, EvaluateRes, Status
from sklearn.metrics import r2_score
from torch.nn import functional as F

from fedapps.evaluation import (
    EVAL_BATCH,
    evaluate_sums,
    reduce_evaluations,
    summarize_central,
)
from fedapps.tasks import TASKS, Classification, Regression, get_task
from strategies.fedavg import FedAvg

CLS, REG = TASKS["classification"], TASKS["regression"]
OK = Status(Code.OK, "")


def test_registry_and_attributes():
    assert isinstance(CLS, Classification) and isinstance(REG, Regression)
    assert get_task("regression") is REG
    assert (CLS.metric, REG.metric) == ("accuracy", "r2")
    assert CLS.higher_is_better and REG.higher_is_better
    assert CLS.sum_names == ("correct-global", "correct-personal")
    assert REG.sum_names == ("sum-y", "sum-y2", "sse-global", "sse-personal")
    with pytest.raises(ValueError, match="unknown task 'segmentation'"):
        get_task("segmentation")


# ---- classification ---------------------------------------------------------------------------
def test_classification_sums_are_hand_counts():
    target = torch.tensor([0, 1, 2, 1])
    out_g = torch.tensor([[5.0, 0, 0], [0, 5, 0], [5, 0, 0], [0, 0, 5]])  # right: 0, 1
    out_p = torch.tensor([[5.0, 0, 0], [0, 5, 0], [0, 0, 5], [0, 5, 0]])  # all right
    sums = CLS.batch_sums(out_g, out_p, target)
    # correct counts, then both 3 x 3 confusion matrices (true x predicted), flattened
    assert sums.dtype == torch.long and sums[:2].tolist() == [2, 4]
    assert sums[2:11].tolist() == [1, 0, 0, 0, 1, 1, 1, 0, 0]
    assert sums[11:].tolist() == [1, 0, 0, 0, 2, 0, 0, 0, 1]
    metrics = CLS.to_metrics(sums.tolist())
    assert (metrics["correct-global"], metrics["correct-personal"]) == (2, 4)
    assert type(metrics["correct-global"]) is int
    assert np.frombuffer(metrics["confusion-global"], "<i8").tolist() == sums[2:11].tolist()
    assert CLS.loss(out_g, target).item() == pytest.approx(F.cross_entropy(out_g, target).item())


def eval_res(n, correct_g, correct_p, loss, pid, **extra):
    metrics = {"correct-global": correct_g, "correct-personal": correct_p, **extra}
    if pid is not None:
        metrics["partition-id"] = pid
    return EvaluateRes(OK, loss, n, metrics)


def as_tuples(res):
    return [(r.metrics.get("partition-id"), r.num_examples, r.loss, r.metrics) for r in res]


def test_reduction_is_the_micro_average_and_todays_dict():
    res = [eval_res(10, 5, 9, 1.0, 2), eval_res(30, 27, 30, 2.0, 0, **{"state-from-disk": 1}),
           eval_res(0, 0, 0, 0.5, 1), eval_res(7, 3, 6, 0.7, 4, **{"state-from-disk": 0}),
           eval_res(13, 12, 11, 0.3, 3), eval_res(5, 1, 2, 4.0, 9),  # pid out of range
           eval_res(6, 6, 6, 0.1, None)]  # no partition id: pooled, not placed
    m = reduce_evaluations(CLS, as_tuples(res), num_clients=6)
    assert m["global_accuracy"] == 54 / 71  # sum(correct) / sum(n), not a mean of ratios
    assert m["personal_accuracy"] == 64 / 71
    assert m["loss"] == pytest.approx((10 + 60 + 0 + 4.9 + 3.9 + 20 + 0.6) / 71)
    assert m["client_global_accuracy"] == [0.9, None, 0.5, 12 / 13, 3 / 7, None]
    # the strategy pools only answers it can place (ids 0..5), in partition order, and says
    # which it left out
    strategy = FedAvg(initial_arrays=[np.zeros(2, dtype=np.float32)], num_rounds=1,
                      num_clients=6, clients_per_round=2, seed=0).evaluation_metrics(res)
    placed = sorted((r for r in as_tuples(res) if r[0] in range(6)), key=lambda r: r[0])
    expected = reduce_evaluations(CLS, placed, num_clients=6)
    assert {k: v for k, v in strategy.items() if k in expected} == expected
    assert list(strategy)[:len(expected)] == list(expected)  # same key order in results files
    assert strategy["eval_population"] == [0, 1, 2, 3, 4]
    assert strategy["eval_rejected"] == 2


def test_task_reduce_pools_all_clients():
    out = CLS.reduce([(10, {"correct-global": 5, "correct-personal": 9}),
                      (30, {"correct-global": 27, "correct-personal": 30}),
                      (0, {"correct-global": 0, "correct-personal": 0})])
    assert out["global_accuracy"] == 32 / 40 and out["personal_accuracy"] == 39 / 40
    assert out["client_global_accuracy"] == [0.5, 0.9, None]
    assert out["global_client_p50"] == pytest.approx(0.7)
    assert CLS.reduce([])["global_accuracy"] is None
    with pytest.raises(ValueError, match="correct-personal"):
        CLS.reduce([(3, {"correct-global": 1})])


def models(seed=0, classes=3, features=5):
    torch.manual_seed(seed)
    g, p = torch.nn.Linear(features, classes), torch.nn.Linear(features, classes)
    return g, p


def test_loop_is_batch_size_invariant_and_matches_full_batch():
    torch.manual_seed(1)
    x, y = torch.randn(101, 5), torch.randint(0, 3, (101,))
    g, p = models()
    runs = {b: evaluate_sums(lambda xb: (g(xb), p(xb)), x, y, CLS, batch_size=b)
            for b in (1, 3, EVAL_BATCH)}
    with torch.no_grad():
        lg, lp = g(x), p(x)
        direct = {"correct-global": int((lg.argmax(1) == y).sum()),
                  "correct-personal": int((lp.argmax(1) == y).sum())}
        direct_loss = float(F.cross_entropy(lg, y, reduction="sum"))
    assert EVAL_BATCH == 64
    for n, loss_sum, sums in runs.values():
        assert n == 101 and {k: sums[k] for k in direct} == direct
        assert loss_sum == pytest.approx(direct_loss, rel=1e-6)
        # the confusion counts do not depend on the batch size either
        assert sums["confusion-global"] == runs[1][2]["confusion-global"]
    assert 0 < direct["correct-global"] < 101


def test_loop_reproduces_the_clients_loop_of_today():
    """The loop of clients/base.py BaseClient.evaluate, inlined: same loss bits, same counts."""
    torch.manual_seed(2)
    x, y = torch.randn(150, 5), torch.randint(0, 3, (150,))
    g, p = models(3)
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros(2, dtype=torch.long)
    with torch.no_grad():
        for start in range(0, len(y), 64):
            xb, yb = x[start:start + 64], y[start:start + 64]
            logits_g, logits_p = g(xb), p(xb)
            loss_sum += F.cross_entropy(logits_g, yb, reduction="sum").double()
            correct += torch.stack([(logits_g.argmax(1) == yb).sum(),
                                    (logits_p.argmax(1) == yb).sum()])
    n, got_loss, sums = evaluate_sums(lambda xb: (g(xb), p(xb)), x, y, CLS, device="cpu")
    assert (n, got_loss) == (150, float(loss_sum))
    assert {k: sums[k] for k in CLS.sum_names} == dict(zip(CLS.sum_names, correct.tolist(),
                                                           strict=True))


def test_summarize_central_matches_the_servers_numbers():
    torch.manual_seed(4)
    x, y = torch.randn(70, 5), torch.randint(0, 3, (70,))
    g, _ = models(5)
    n, loss_sum, sums = evaluate_sums(lambda xb: (g(xb), g(xb)), x, y, CLS)
    out = summarize_central(CLS, n, loss_sum, sums)
    with torch.no_grad():
        logits = g(x)
    assert out["official_test_accuracy"] == int((logits.argmax(1) == y).sum()) / 70
    assert out["official_test_loss"] == pytest.approx(float(F.cross_entropy(logits, y)))
    assert set(out) == {"official_test_accuracy", "official_test_loss",
                        "official_test_macro_f1", "official_test_weighted_f1"}


# ---- regression -------------------------------------------------------------------------------
def test_mse_loss_by_hand_and_shapes():
    target = torch.tensor([1.0, -2.0, 0.5])
    out = torch.tensor([2.0, -2.0, -0.5])
    assert REG.loss(out, target).item() == pytest.approx((1 + 0 + 1) / 3)
    assert REG.loss(out[:, None], target, reduction="sum").item() == pytest.approx(2.0)
    sums = REG.batch_sums(out[:, None], target[:, None], target)
    assert sums.dtype == torch.float64
    assert sums.tolist() == pytest.approx([-0.5, 1 + 4 + 0.25, 2.0, 0.0])
    with pytest.raises(ValueError, match="must be"):
        REG.loss(torch.zeros(3, 2), target)  # would broadcast to [3, 3] silently
    with pytest.raises(ValueError, match="must be"):
        REG.loss(torch.zeros(4), target)


def regression_clients(shift=0.0, scale=1.0):
    """Three clients' targets and two predictors' outputs (float64), mapped by one affine map."""
    rng = np.random.default_rng(0)
    clients = []
    for n, mean in ((40, 3.0), (25, -1.0), (61, 0.5)):
        y = rng.normal(mean, 2.0, n)
        pred_g = y + rng.normal(0, 1.0, n)
        pred_p = 0.8 * y + rng.normal(0.3, 0.6, n)
        clients.append(tuple(shift + scale * torch.from_numpy(a) for a in (y, pred_g, pred_p)))
    return clients


def pooled_r2(clients, batch_size=EVAL_BATCH):
    per_client = []
    for y, pg, pp in clients:
        x = torch.arange(len(y))  # the "input" is the row index into the fixed predictions
        n, _, sums = evaluate_sums(lambda idx, pg=pg, pp=pp: (pg[idx], pp[idx][:, None]),
                                   x, y, REG, batch_size=batch_size)
        per_client.append((n, sums))
    return REG.reduce(per_client)


def test_r2_pooled_from_client_sums_equals_sklearn():
    clients = regression_clients()
    out = pooled_r2(clients)
    y, pg, pp = (torch.cat([c[i] for c in clients]).numpy() for i in range(3))
    assert out["global_r2"] == pytest.approx(r2_score(y, pg), abs=1e-12)
    assert out["personal_r2"] == pytest.approx(r2_score(y, pp), abs=1e-12)
    for (yc, gc, pc), g, p in zip(clients, out["client_global_r2"], out["client_personal_r2"],
                                  strict=True):
        assert g == pytest.approx(r2_score(yc.numpy(), gc.numpy()), abs=1e-12)
        assert p == pytest.approx(r2_score(yc.numpy(), pc.numpy()), abs=1e-12)
    assert pooled_r2(clients, batch_size=1)["global_r2"] == pytest.approx(out["global_r2"],
                                                                          abs=1e-12)


def test_r2_is_unchanged_by_standardizing_targets_and_predictions():
    raw = regression_clients(shift=50.0, scale=10.0)
    y_all = torch.cat([c[0] for c in raw])
    mu, sd = float(y_all.mean()), float(y_all.std())
    standardized = [tuple((a - mu) / sd for a in c) for c in raw]
    a, b = pooled_r2(raw), pooled_r2(standardized)
    assert a["global_r2"] == pytest.approx(b["global_r2"], abs=1e-12)
    assert a["personal_r2"] == pytest.approx(b["personal_r2"], abs=1e-12)
    assert a["client_global_r2"] == pytest.approx(b["client_global_r2"], abs=1e-12)


def test_constant_target_client_has_no_r2():
    y = torch.full((7,), 0.1, dtype=torch.float64)  # 0.1 is inexact: rounding, not exact 0
    const = REG.batch_sums(y + 0.2, y - 0.1, y).tolist()
    clients = regression_clients()
    varied = [REG.to_metrics(REG.batch_sums(c[1], c[2], c[0]).tolist()) for c in clients]
    out = REG.reduce([(7, REG.to_metrics(const)), (len(clients[0][0]), varied[0])])
    assert out["client_global_r2"][0] is None and out["client_personal_r2"][0] is None
    assert out["client_global_r2"][1] is not None and out["global_r2"] is not None
    assert REG.reduce([(1, {"sum-y": 2.0, "sum-y2": 4.0, "sse-global": 1.0,
                            "sse-personal": 0.0})])["global_r2"] is None  # one sample


def test_regression_reduce_evaluations_and_central():
    clients = regression_clients()
    results = []
    for pid, (y, pg, pp) in enumerate(clients):
        n, loss_sum, sums = evaluate_sums(lambda idx, pg=pg, pp=pp: (pg[idx], pp[idx]),
                                          torch.arange(len(y)), y, REG)
        assert loss_sum == pytest.approx(sums["sse-global"], rel=1e-12)  # MSE loss = SSE / n
        results.append((pid, n, loss_sum / n, {"partition-id": pid, **sums}))
    m = reduce_evaluations(REG, results, num_clients=4)
    y, pg, _ = (torch.cat([c[i] for c in clients]).numpy() for i in range(3))
    assert m["global_r2"] == pytest.approx(r2_score(y, pg), abs=1e-12)
    assert m["loss"] == pytest.approx(float(np.mean((pg - y) ** 2)), rel=1e-12)
    assert m["client_global_r2"][3] is None and len(m["client_personal_r2"]) == 4
    assert {"global_client_p10", "personal_client_std", "eval_samples"} <= set(m)
    assert "global_accuracy" not in m
    n, loss_sum, sums = evaluate_sums(lambda idx: (torch.from_numpy(pg)[idx],) * 2,
                                      torch.arange(len(y)), torch.from_numpy(y), REG)
    c = summarize_central(REG, n, loss_sum, sums)
    assert c["official_test_r2"] == pytest.approx(r2_score(y, pg), abs=1e-12)
    assert c["official_test_loss"] == pytest.approx(m["loss"], rel=1e-12)
