"""Seed 002's skew samplers: closed-form EMDs (eq. 3.6b, 3.8, 3.13) against the EMD measured on
the partitions they produce, the Dirichlet figure (0.86 +- 0.06), Robinhood, the inverse solvers
(Table 4.3), target-EMD cache keys and `fedapps partition`."""

import json

import numpy as np
import pytest

from fedapps.config import ConfigError, load_config
from fedapps.data import make_federated, partition_key, partition_params
from fedapps.data.datasets import load_pool
from fedapps.data.partition import (
    PartitionInput,
    SolveContext,
    class_counts,
    client_emd,
    dirichlet_mean_emd,
    emd,
    label_sets,
    ll_emd,
    ll_solutions,
    llq_emd,
    q_emd,
    resolve_params,
    robinhood,
    run_partitioner,
)
from fedapps.paths import data_root
from fedapps.validation import validate


def balanced(per_class: int, classes: int = 10) -> np.ndarray:
    return np.repeat(np.arange(classes), per_class)


def split(name, labels, clients, params, seed=0):
    data = PartitionInput(len(labels), labels=labels, num_classes=int(labels.max()) + 1)
    parts = run_partitioner(name, data, clients, seed, params)
    joined = np.concatenate(parts)
    assert sorted(joined.tolist()) == list(range(len(labels)))  # every sample, once
    return class_counts(parts, labels, int(labels.max()) + 1)


def test_label_sets_hold_every_label_tk_over_m_times():
    sets = label_sets(20, 10, 2)
    assert sets.sum(axis=1).tolist() == [2] * 20  # |Omega_k| = t (3.4b)
    assert sets.sum(axis=0).tolist() == [4] * 10  # tK/M = 4 (3.4a)
    assert np.flatnonzero(sets[0]).tolist() == [0, 1] and np.flatnonzero(sets[6]).tolist() == [2, 3]
    assert label_sets(5, 10, 2).sum(axis=0).tolist() == [1] * 10  # K < M works when M | tK
    with pytest.raises(ConfigError, match=r"label-limit x num-clients \(3 x 5\) must be a mult"):
        label_sets(5, 10, 3)


# Sizes chosen so every expected count is whole: the measured EMD must equal the closed form.
@pytest.mark.parametrize("t, f, clients, per_class, own, other", [
    (2, 0.875, 20, 160, 36, 1),   # 0.875*160/4 + 0.125*160/20 = 35 + 1; EMD 1.4 (Table 4.3)
    (1, 0.5, 10, 100, 55, 5),     # 50 + 5; EMD 0.9
    (3, 1.0, 10, 120, 40, 0),     # pure ll(3): 120/3 = 40; EMD 1.4
])
def test_limit_label_emd_equals_eq_3_6b(t, f, clients, per_class, own, other):
    counts = split("limit-label", balanced(per_class), clients,
                   {"label_limit": t, "fraction_noniid": f, "every_class": False})
    sets = label_sets(clients, 10, t)
    assert (counts[sets] == own).all() and (counts[~sets] == other).all()
    assert emd(counts) == pytest.approx(ll_emd(t, f, 10), abs=1e-12)
    assert client_emd(counts) == pytest.approx([ll_emd(t, f, 10)] * clients, abs=1e-12)


def test_limit_label_emd_on_uneven_classes_is_close():
    labels = np.random.default_rng(5).integers(0, 10, 4000)  # about 400 per class, uneven
    counts = split("limit-label", labels, 20,
                   {"label_limit": 2, "fraction_noniid": 0.875, "every_class": False})
    assert emd(counts) == pytest.approx(1.4, abs=0.03)


def test_every_class_gives_each_client_each_class():
    counts = split("limit-label", balanced(120), 10,
                   {"label_limit": 3, "fraction_noniid": 1.0, "every_class": True})
    sets = label_sets(10, 10, 3)
    assert (counts[~sets] == 1).all()  # the 7 missing classes: one sample each
    # each class's 7 moved samples come from its 3 holders (40 each): 37, 38, 38 in some order
    for y in range(10):
        assert sorted(counts[sets[:, y], y].tolist()) == [37, 38, 38]
    assert counts.sum() == 1200
    assert 1.2 < emd(counts) < ll_emd(3, 1.0, 10)


def test_q_sampler_emd_equals_eq_3_8():
    # groups k mod 10 of 2 clients: own label 0.5*180/2 = 45, any other 0.5*180/18 = 5
    counts = split("q", balanced(180), 20, {"q": 0.5, "every_class": False})
    own = np.arange(20)[:, None] % 10 == np.arange(10)[None, :]
    assert (counts[own] == 45).all() and (counts[~own] == 5).all()
    assert emd(counts) == pytest.approx(q_emd(0.5, 10), abs=1e-12) == pytest.approx(0.8)
    with pytest.raises(ConfigError, match="multiple of the 10 classes"):
        split("q", balanced(180), 15, {"q": 0.5, "every_class": False})


def test_limit_label_q_emd_equals_eq_3_13_and_q_is_ll_q_1():
    counts = split("limit-label-q", balanced(160), 20,
                   {"label_limit": 2, "q": 0.9, "every_class": False})
    sets = label_sets(20, 10, 2)
    assert (counts[sets] == 36).all() and (counts[~sets] == 1).all()  # 144/4, 16/16
    assert emd(counts) == pytest.approx(llq_emd(2, 0.9, 10), abs=1e-12) == pytest.approx(1.4)
    a = split("q", balanced(180), 20, {"q": 0.7, "every_class": False})
    b = split("limit-label-q", balanced(180), 20, {"label_limit": 1, "q": 0.7,
                                                   "every_class": False})
    assert np.array_equal(a, b)


def test_per_sample_draws_give_the_thesis_probabilities_in_expectation_only():
    """data.draw=per-sample: each sample to client k with probability W[k, y] (eq. 3.10 for
    ll_q), so a client's count of one of its labels is Binomial(160, 0.9 / 4) and of any other
    Binomial(160, 0.1 / 16); expected counts give exactly 36 and 1."""
    params = {"label_limit": 2, "q": 0.9, "every_class": False, "draw": "per-sample"}
    sets = label_sets(20, 10, 2)
    draws = np.stack([split("limit-label-q", balanced(160), 20, params, seed=s)
                      for s in range(200)])
    own, other = draws[:, sets], draws[:, ~sets]  # 40 and 160 cells per draw
    p_own, p_other = 0.9 / 4, 0.1 / 16
    # means over 8,000 and 32,000 binomials: within 5 standard errors of 36 and 1
    assert abs(own.mean() - 36) < 5 * np.sqrt(160 * p_own * (1 - p_own) / own.size)
    assert abs(other.mean() - 1) < 5 * np.sqrt(160 * p_other * (1 - p_other) / other.size)
    # their spread is the binomial's (the draws are not expected counts in disguise)
    assert own.var() == pytest.approx(160 * p_own * (1 - p_own), rel=0.1)
    assert other.var() == pytest.approx(160 * p_other * (1 - p_other), rel=0.1)
    # sizes, and the EMD, equal the closed form only in expectation (200 draws: 1.399 mean,
    # 1.359-1.438; expected counts give 1.4 exactly)
    assert len({int(n) for n in draws[0].sum(axis=1)}) > 1
    emds = [emd(d) for d in draws]
    assert np.mean(emds) == pytest.approx(1.4, abs=0.005) and np.std(emds) > 0.01
    # seeded: the same seed gives the same split, another seed another
    assert np.array_equal(split("limit-label-q", balanced(160), 20, params, seed=3), draws[3])
    assert not np.array_equal(draws[3], draws[4])


def test_per_sample_draws_tell_limit_label_from_limit_label_q_at_equal_emd():
    """Expected counts make ll(2, 0.875) and ll_q(2, 0.9) (both EMD 1.4) the same split; drawn
    per sample, ll_q is the thesis's coin per sample and ll's counts come from other draws."""
    ll = {"label_limit": 2, "fraction_noniid": 0.875, "every_class": False}
    llq = {"label_limit": 2, "q": 0.9, "every_class": False}
    assert np.array_equal(split("limit-label", balanced(160), 20, ll),
                          split("limit-label-q", balanced(160), 20, llq))
    drawn = split("limit-label-q", balanced(160), 20, {**llq, "draw": "per-sample"})
    assert not np.array_equal(drawn, split("limit-label-q", balanced(160), 20, llq))
    # drawn per sample, a small pool over many clients leaves some without data: one line
    tiny = {"label_limit": 1, "q": 1.0, "every_class": False, "draw": "per-sample"}
    with pytest.raises(ConfigError, match=r"^data.partitioner=limit-label-q: \d+ of 40 clients "
                       r"get no samples \(first: client \d+; 40 samples\); use fewer clients"):
        split("limit-label-q", balanced(4), 40, tiny)
    with pytest.raises(ValueError, match="draw='coin': one of expected, per-sample"):
        split("limit-label-q", balanced(160), 20, {**llq, "draw": "coin"})
    with pytest.raises(ConfigError, match=r"data.draw.*allowed: expected, per-sample"):
        validate(load_config("quickstart", ["data.partitioner=limit-label-q",
                                            "data.draw=coin"]))


@pytest.mark.parametrize("target", [0.0, 0.4, 1.0, 1.6, 1.8])
def test_robinhood_reaches_the_target(target):
    d = robinhood(target, 10, np.random.default_rng(1))
    assert d.sum() == pytest.approx(1.0) and (d >= 0).all()
    assert abs(np.abs(d - 0.1).sum() - target) <= 1e-3


def test_emd_sampler_shifts_one_distribution_per_client():
    counts = split("emd", balanced(1000), 10, {"target_emd": 1.2})
    assert counts.sum(axis=1).tolist() == [1000] * 10
    for k in range(10):  # client k holds client 0's distribution shifted by k (+- rounding)
        assert np.abs(counts[k] - np.roll(counts[0], k)).max() <= 1
    # D within tol 1e-3 of 1.2; rounding moves each client's sum by at most 10 / 1000
    assert emd(counts) == pytest.approx(1.2, abs=0.011)


def test_dirichlet_m10_k10_alpha_half_matches_the_thesis():
    labels = balanced(500)
    values = [emd(split("dirichlet", labels, 10, {"alpha": 0.5, "min_size": 1}, seed=s))
              for s in range(20)]
    assert np.mean(values) == pytest.approx(0.86, abs=0.03)  # thesis 0.86 +- 0.059
    assert 0.03 < np.std(values) < 0.09


def test_ll_solutions_give_table_4_3():
    assert ll_solutions(1.4, 10) == [(1, 0.777777777778), (2, 0.875), (3, 1.0)]
    # 0.4 / 0.4 is 1.0000000000000002 in floats: t = 8 is kept (the thesis lost it)
    assert [t for t, _ in ll_solutions(0.4, 10)] == list(range(1, 9))
    assert ll_solutions(1.85, 10) == []


def ctx(clients=20, sizes=None):
    return SolveContext(10, clients, 0, (lambda: sizes) if sizes is not None else None)


def test_closed_form_solvers_and_their_errors():
    ll = {"label_limit": 2, "fraction_noniid": 1.0, "every_class": False}
    assert resolve_params("limit-label", ll, 1.4, ctx())["fraction_noniid"] == 0.875
    llq = {"label_limit": 1, "q": 0.5, "every_class": False}
    assert [resolve_params("limit-label-q", {**llq, "label_limit": t}, 1.4, ctx())["q"]
            for t in (1, 2, 3)] == [0.8, 0.9, 1.0]
    assert resolve_params("q", {"q": 0.5, "every_class": False}, 0.8, ctx())["q"] == 0.5
    with pytest.raises(ConfigError) as err:
        resolve_params("limit-label", {**ll, "label_limit": 4}, 1.4, ctx())
    assert str(err.value) == ("data.target-emd=1.4: data.label-limit=4 cannot reach it (f <= 1); "
                              "reachable with data.label-limit 1 (f=0.778), 2 (f=0.875), "
                              "3 (f=1.000)")
    with pytest.raises(ConfigError) as err:
        resolve_params("q", {"q": 0.5, "every_class": False}, 1.9, ctx())
    assert str(err.value) == "data.target-emd=1.9: q reaches EMD in [0.000, 1.800]"
    with pytest.raises(ConfigError, match="data.partitioner=iid has no EMD solver"):
        resolve_params("iid", {}, 1.0, ctx())


def test_dirichlet_bisection_hits_the_mean_emd():
    sizes = np.full(10, 500)
    base = {"alpha": 0.1, "min_size": 10}
    lo = resolve_params("dirichlet", base, 1.2, ctx(10, sizes))["alpha"]
    hi = resolve_params("dirichlet", base, 0.8, ctx(10, sizes))["alpha"]
    assert lo < hi  # more skew, smaller alpha
    for alpha, target in ((lo, 1.2), (hi, 0.8)):
        assert dirichlet_mean_emd(sizes, 10, alpha, 10, 0) == pytest.approx(target, abs=0.01)
    with pytest.raises(ConfigError, match=r"dirichlet \(alpha in \[0.001, 1000\], mean of 20 "
                                          r"draws\) reaches EMD in \[0.0"):
        resolve_params("dirichlet", base, 0.0001, ctx(10, sizes))


@pytest.mark.parametrize("name, target, explicit", [
    ("limit-label", 1.4, ["data.label-limit=2", "data.fraction-noniid=0.875"]),
    ("limit-label-q", 1.4, ["data.label-limit=2", "data.q=0.9"]),
    ("q", 0.8, ["data.q=0.5"]),
    ("dirichlet", 1.0, None),  # alpha: the solved value, read back
])
def test_target_run_and_explicit_run_share_key_and_partition(name, target, explicit):
    common = [f"data.partitioner={name}", "federation.num-clients=10"]
    solved = load_config("quickstart", [*common, f"data.target-emd={target}",
                                        "data.label-limit=2"])
    key = partition_key(solved)
    if explicit is None:
        explicit = [f"data.alpha={key['params']['alpha']}"]
    plain = load_config("quickstart", [*common, *explicit])
    assert key == partition_key(plain)
    assert key != partition_key(load_config("quickstart", [*common, "data.target-emd=0.6",
                                                           "data.label-limit=2"]))
    pool = load_pool("digits", data_root(solved))
    a, b = make_federated(pool, key, cache=False), make_federated(pool, partition_key(plain),
                                                                  cache=False)
    assert all(np.array_equal(x, y) for x, y in zip(a.train_idx + a.test_idx,
                                                     b.train_idx + b.test_idx, strict=True))
    summary = a.summary()  # results.json's partition: the solved parameters, not the target
    assert summary["partitioner"] == name and summary["params"] == key["params"]
    if name == "limit-label-q":
        assert summary["params"]["q"] == pytest.approx(0.9)  # EMD/2 + t/M = 0.7 + 2/10
    measured = summary["emd"]
    # digits' classes are uneven (174-183 of each): closed forms hold to rounding; Dirichlet
    # is one draw about the mean
    assert measured == pytest.approx(target, abs=0.1 if name == "dirichlet" else 0.03)


@pytest.mark.parametrize("overrides, message", [
    (["data.partitioner=limit-label", "data.target-emd=1.9"],
     "data.target-emd=1.9: limit-label reaches EMD in [0.000, 1.800]"),
    (["data.partitioner=iid", "data.target-emd=0.5"], "data.partitioner=iid has no EMD solver"),
    (["data.partitioner=emd"], "data.target-emd: not set; data.partitioner=emd needs a target"),
    (["data.partitioner=emd", "data.target-emd=1.81"],
     "data.target-emd=1.81: emd reaches [0, 1.800] with 10 classes"),
    (["data.target-emd=-1"], "data.target-emd=-1: must be >= 0"),
    (["data.q=1.5"], "data.q=1.5: must be in [0, 1]"),
])
def test_target_errors_are_one_line_at_validation(overrides, message):
    with pytest.raises(ConfigError) as err:
        validate(load_config("quickstart", overrides), check_data=False)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_partition_params_without_data_skip_the_dirichlet_bisection():
    cfg = load_config("quickstart", ["data.target-emd=1.0"])
    assert partition_params(cfg, with_data=False) == {"alpha": 0.5, "min_size": 10,
                                                      "balance": "none"}


def test_partition_command_prints_and_writes_the_partition(tmp_path, capsys, monkeypatch):
    from fedapps.data import federated_data
    from simulations.cli import main

    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    sets = ["data.partitioner=limit-label", "data.target-emd=1.4", "data.label-limit=2"]
    out, png = tmp_path / "p.json", tmp_path / "p.png"
    args = ["partition", "quickstart", *[a for s in sets for a in ("--set", s)]]
    assert main([*args, "--json", str(out), "--png", str(png)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    counts = federated_data(load_config("quickstart", sets)).counts("all")
    assert lines[-1] == f"EMD {emd(counts):.3f}"
    report = json.loads(out.read_text())
    assert report["class_counts"] == counts.tolist()
    assert report["params"] == {"label_limit": 2, "fraction_noniid": 0.875, "every_class": False,
                                "draw": "expected"}
    assert report["emd"] == pytest.approx(emd(counts), abs=1e-12)
    assert report["client_emd"] == pytest.approx(client_emd(counts).tolist(), abs=1e-6)
    assert report["sizes"] == counts.sum(axis=1).tolist()
    assert [a + b for a, b in zip(report["train_sizes"], report["test_sizes"], strict=True)] \
        == report["sizes"]
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "    3 " in "\n".join(lines)  # client rows

    assert main(["partition", "quickstart", "--set", "data.partitioner=limit-label-q",
                 "--set", "data.target-emd=1.9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("fedapps: config error: data.target-emd=1.9: limit-label-q reaches EMD in "
                   "[0.000, 1.800]")
