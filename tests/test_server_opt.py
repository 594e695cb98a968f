"""Server optimizers (strategies/server_opt.py): hand-computed steps, equality with Flower's
FedAdam/FedYogi/FedAdagrad/FedAvgM on identical client results, checkpoint round trip,
validation."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common import (
    Code,
    FitRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.strategy import FedAdagrad, FedAdam, FedAvgM, FedYogi

from fedapps import checkpoint
from strategies.aggregation import weighted_average
from strategies.server_opt import (
    DEFAULT_LR,
    ServerOptimizer,
    from_settings,
    validate_server_settings,
)

# ---- (a) hand-computed two-step examples on a 2-element array ----------------------------------
# x0 = [1, -2]; round 1 change Delta1 = [0.4, -0.2] (aggregate = x0 + Delta1);
# round 2 change Delta2 = [0.1, 0.4] from the round-1 result x1.
X0 = np.array([1.0, -2.0])
D1 = np.array([0.4, -0.2])
D2 = np.array([0.1, 0.4])


def two_steps(opt: ServerOptimizer) -> tuple[np.ndarray, np.ndarray]:
    (x1,) = opt.step([X0], [X0 + D1], server_round=1)
    (x2,) = opt.step([x1], [x1 + D2], server_round=2)
    return x1, x2


def test_adam_hand_computed():
    # lr 0.1, b1 0.5, b2 0.75, tau 0.1; eta_r = 0.1 sqrt(1 - 0.75^(r+1)) / (1 - 0.5^(r+1))
    # round 1: m1 = 0.5 D1 = [0.2, -0.1]; v1 = 0.25 D1^2 = [0.04, 0.01], sqrt = [0.2, 0.1]
    #   eta_1 = 0.1 sqrt(0.4375) / 0.75 = 0.1 * 0.6614378277661477 / 0.75 = 0.08819171036881969
    #   x1 = x0 + eta_1 [0.2/0.3, -0.1/0.2] = [1.0587944735792132, -2.04409585518441]
    # round 2: m2 = 0.5 m1 + 0.5 D2 = [0.15, 0.15]
    #   v2 = 0.75 v1 + 0.25 D2^2 = [0.03 + 0.0025, 0.0075 + 0.04] = [0.0325, 0.0475]
    #   sqrt(v2) = [0.18027756377319948, 0.21794494717703367]
    #   eta_2 = 0.1 sqrt(1 - 0.421875) / 0.875 = 0.1 * 0.7603453162872774 / 0.875
    #         = 0.08689660757568886
    #   x2 = x1 + eta_2 [0.15 / 0.28027756..., 0.15 / 0.31794494...]
    #      = [1.1053001266214268, -2.0030997920228977]
    opt = ServerOptimizer("adam", lr=0.1, beta1=0.5, beta2=0.75, tau=0.1)
    x1, x2 = two_steps(opt)
    np.testing.assert_allclose(x1, [1.0587944735792132, -2.04409585518441], rtol=0, atol=1e-12)
    np.testing.assert_allclose(x2, [1.1053001266214268, -2.0030997920228977], rtol=0, atol=1e-12)
    np.testing.assert_allclose(opt.v[0], [0.0325, 0.0475], atol=1e-15)


def test_yogi_hand_computed():
    # lr 0.1, b1 0.5, b2 0.75, tau 0.1 (no bias correction)
    # round 1: m1 = [0.2, -0.1]; v1 = 0 - 0.25 D1^2 sign(0 - D1^2) = [0.04, 0.01]
    #   x1 = x0 + 0.1 [0.2/0.3, -0.1/0.2] = [1.0666666666666667, -2.05]
    # round 2: m2 = [0.15, 0.15]; D2^2 = [0.01, 0.16]; sign(v1 - D2^2) = sign([0.03, -0.15])
    #   = [1, -1]; v2 = v1 - 0.25 D2^2 [1, -1] = [0.04 - 0.0025, 0.01 + 0.04] = [0.0375, 0.05]
    #   (adam would give 0.0475 in the second entry: yogi grows v additively)
    #   sqrt(v2) = [0.19364916731037085, 0.22360679774997896]
    #   x2 = x1 + 0.1 [0.15 / 0.29364916..., 0.15 / 0.32360679...]
    #      = [1.1177480306541416, -2.003647450843758]
    opt = ServerOptimizer("yogi", lr=0.1, beta1=0.5, beta2=0.75, tau=0.1)
    x1, x2 = two_steps(opt)
    np.testing.assert_allclose(x1, [1.0666666666666667, -2.05], rtol=0, atol=1e-12)
    np.testing.assert_allclose(x2, [1.1177480306541416, -2.003647450843758], rtol=0, atol=1e-12)
    np.testing.assert_allclose(opt.v[0], [0.0375, 0.05], atol=1e-15)


def test_adagrad_hand_computed():
    # lr 0.1, tau 0.1; beta1 is ignored (Flower's FedAdagrad: m = Delta)
    # round 1: v1 = D1^2 = [0.16, 0.04], sqrt = [0.4, 0.2]
    #   x1 = x0 + 0.1 [0.4/0.5, -0.2/0.3] = [1.08, -2.066666666666667]
    # round 2: v2 = v1 + D2^2 = [0.17, 0.2], sqrt = [0.41231056256176607, 0.4472135954999579]
    #   x2 = x1 + 0.1 [0.1 / 0.51231056..., 0.4 / 0.54721359...]
    #      = [1.0995194101601105, -1.993569067614044]
    opt = ServerOptimizer("adagrad", lr=0.1, beta1=0.5, tau=0.1)
    x1, x2 = two_steps(opt)
    np.testing.assert_allclose(x1, [1.08, -2.066666666666667], rtol=0, atol=1e-12)
    np.testing.assert_allclose(x2, [1.0995194101601105, -1.993569067614044], rtol=0, atol=1e-12)


def test_sgd_momentum_hand_computed():
    # lr 0.5, momentum 0.9; pseudo-gradient g = x - aggregate = -Delta
    # round 1: g1 = [-0.4, 0.2], buffer b1 = g1; x1 = x0 - 0.5 b1 = [1.2, -2.1]
    # round 2: g2 = [-0.1, -0.4]; b2 = 0.9 b1 + g2 = [-0.36 - 0.1, 0.18 - 0.4] = [-0.46, -0.22]
    #   x2 = x1 - 0.5 b2 = [1.2 + 0.23, -2.1 + 0.11] = [1.43, -1.99]
    opt = ServerOptimizer("sgd", lr=0.5, momentum=0.9)
    x1, x2 = two_steps(opt)
    np.testing.assert_allclose(x1, [1.2, -2.1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(x2, [1.43, -1.99], rtol=0, atol=1e-12)
    # Flower's FedAvgM resets the buffer in round 1: b = g, whatever came before
    (x3,) = opt.step([x2], [x2 + D1], server_round=1)
    np.testing.assert_allclose(x3, x2 + 0.5 * D1, rtol=0, atol=1e-12)


def test_sgd_without_momentum_is_a_server_learning_rate():
    # x1 = x0 - 0.5 (x0 - a) = x0 + 0.5 D1 = [1.2, -2.1]; no buffer kept
    opt = ServerOptimizer("sgd", lr=0.5)
    x1, _ = two_steps(opt)
    np.testing.assert_allclose(x1, [1.2, -2.1], rtol=0, atol=1e-12)
    assert opt.m is None


def test_round_defaults_to_step_count():
    for name in ("adam", "sgd"):
        by_round = ServerOptimizer(name, lr=0.1, momentum=0.5)
        by_count = ServerOptimizer(name, lr=0.1, momentum=0.5)
        for r in (1, 2, 3):
            a = X0 + r * D1
            np.testing.assert_array_equal(by_round.step([X0], [a], server_round=r)[0],
                                          by_count.step([X0], [a])[0])


def test_only_floating_arrays_are_stepped_and_dtypes_kept():
    current = [np.array([1.0, -2.0], np.float32), np.array([0.5], np.float16),
               np.array(7, np.int64)]
    aggregated = [np.array([1.4, -2.2], np.float32), np.array([0.25], np.float16),
                  np.array(9, np.int64)]
    for name in ("sgd", "adam", "yogi", "adagrad"):
        opt = ServerOptimizer(name, lr=0.5, momentum=0.9)
        for r in (1, 2):
            out = opt.step(current, aggregated, server_round=r)
            assert [o.dtype for o in out] == [np.float32, np.float16, np.int64]
            assert out[2] is aggregated[2]  # the aggregate as is
            assert not np.array_equal(out[0], aggregated[0])  # stepped
        assert not opt.m[2].any()  # no state builds up for the integer array
        if opt.v is not None:
            assert not opt.v[2].any()


def test_mismatched_arrays_raise():
    opt = ServerOptimizer("adam")
    with pytest.raises(ValueError, match="shape"):
        opt.step([np.zeros(2)], [np.zeros(3)], server_round=1)
    with pytest.raises(ValueError, match="arrays"):
        opt.step([np.zeros(2)], [np.zeros(2), np.zeros(1)], server_round=1)
    opt.step([np.zeros(2)], [np.ones(2)], server_round=1)
    with pytest.raises(ValueError, match="does not match"):
        opt.step([np.zeros(3)], [np.ones(3)], server_round=2)


# ---- (b) identical client results through Flower's strategies and ours ------------------------
NUM_EXAMPLES = [10, 25, 40]


def initial_arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=5).astype(np.float32),
            np.array(5, dtype=np.int64)]  # int64 like BatchNorm's num_batches_tracked


def client_results(rng: np.random.Generator, start: list[np.ndarray]) -> list[list[np.ndarray]]:
    """What each of the 3 clients uploads after training from `start`."""
    out = []
    for _ in NUM_EXAMPLES:
        out.append([(a + rng.normal(scale=0.3, size=a.shape)).astype(np.float32)
                    for a in start[:2]] + [np.array(start[2] + rng.integers(1, 20), np.int64)])
    return out


def fit_results(uploads: list[list[np.ndarray]]) -> list[tuple[None, FitRes]]:
    return [(None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, {}))
            for arrays, n in zip(uploads, NUM_EXAMPLES, strict=True)]


FLOWER_CASES = {
    "adam": (lambda p: FedAdam(initial_parameters=p, eta=0.05, beta_1=0.9, beta_2=0.99,
                               tau=1e-3),
             dict(name="adam", lr=0.05, beta1=0.9, beta2=0.99, tau=1e-3)),
    "adam-flower-defaults": (lambda p: FedAdam(initial_parameters=p),
                             dict(name="adam", lr=0.1, beta1=0.9, beta2=0.99, tau=1e-9)),
    "yogi": (lambda p: FedYogi(initial_parameters=p, eta=0.05, beta_1=0.8, beta_2=0.9, tau=1e-3),
             dict(name="yogi", lr=0.05, beta1=0.8, beta2=0.9, tau=1e-3)),
    "adagrad": (lambda p: FedAdagrad(initial_parameters=p, eta=0.05, tau=1e-3),
                dict(name="adagrad", lr=0.05, tau=1e-3)),
    "avgm": (lambda p: FedAvgM(initial_parameters=p, server_learning_rate=0.7,
                               server_momentum=0.9),
             dict(name="sgd", lr=0.7, momentum=0.9)),
    "avgm-lr-only": (lambda p: FedAvgM(initial_parameters=p, server_learning_rate=1.5),
                     dict(name="sgd", lr=1.5)),
    "avgm-plain": (lambda p: FedAvgM(initial_parameters=p), dict(name="sgd")),
}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("case", sorted(FLOWER_CASES))
def test_matches_flower_over_three_rounds(case):
    make_flower, settings = FLOWER_CASES[case]
    init = initial_arrays()
    flower = make_flower(ndarrays_to_parameters(init))
    ours = ServerOptimizer(**settings)
    rng = np.random.default_rng(1)
    current = init
    for server_round in (1, 2, 3):
        uploads = client_results(rng, current)
        flower_params, _ = flower.aggregate_fit(server_round, fit_results(uploads), [])
        theirs = parameters_to_ndarrays(flower_params)
        aggregate = weighted_average(uploads, NUM_EXAMPLES)
        new = ours.step(current, aggregate, server_round)
        for mine, their in zip(new[:2], theirs[:2], strict=True):
            assert mine.dtype == np.float32
            np.testing.assert_allclose(mine, their, rtol=0, atol=1e-6)
        if settings["name"] != "sgd" or "lr" in settings:
            # the step moved the float arrays away from the plain average
            assert np.abs(new[0] - aggregate[0]).max() > 1e-3
        # integer array: ours is the aggregate (int64, unstepped) ...
        assert new[2].dtype == np.int64 and new[2] == aggregate[2]
        # ... Flower's is float64 (FedAvgM: its float average, stepped when lr != 1 or
        # momentum > 0; FedAdam/FedYogi/FedAdagrad: zeroed by the in-place FedAvg
        # aggregation, whose client shares are cast to int, then stepped)
        if case == "avgm-plain":
            assert theirs[2].dtype == np.float64
            assert theirs[2] == np.average([u[2] for u in uploads], weights=NUM_EXAMPLES)
        else:
            assert np.issubdtype(theirs[2].dtype, np.floating)
            if settings["name"] != "sgd" and server_round == 1:
                # every client counted up from 5, Flower's aggregate of them was 0
                assert float(theirs[2]) < 5 < int(new[2])
        current = new


@pytest.mark.filterwarnings("ignore")
def test_flower_steps_integer_arrays_like_floats():
    """FedAvgM (plain float average): its integer array is exactly our float rule applied to
    the int array's average, which we instead pass through."""
    init = initial_arrays()
    flower = FedAvgM(initial_parameters=ndarrays_to_parameters(init), server_learning_rate=0.7,
                     server_momentum=0.9)
    ours_as_float = ServerOptimizer("sgd", lr=0.7, momentum=0.9)
    rng = np.random.default_rng(2)
    current_int = np.array(float(init[2]))
    for server_round in (1, 2, 3):
        uploads = client_results(rng, init)
        theirs = parameters_to_ndarrays(flower.aggregate_fit(server_round, fit_results(uploads),
                                                             [])[0])
        avg = np.average([float(u[2]) for u in uploads], weights=NUM_EXAMPLES)
        (current_int,) = ours_as_float.step([current_int], [np.array(avg)], server_round)
        np.testing.assert_allclose(theirs[2], current_int, rtol=0, atol=1e-9)


# ---- (c) state round trip ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sgd", "adam", "yogi", "adagrad"])
def test_state_round_trip_gives_the_same_next_step(name, tmp_path):
    rng = np.random.default_rng(3)
    arrays = initial_arrays()
    opt = ServerOptimizer(name, lr=0.3, momentum=0.9)
    current = arrays
    for r in (1, 2):
        current = opt.step(current, weighted_average(client_results(rng, current), NUM_EXAMPLES),
                           r)
    state = opt.state_arrays()
    # plain np.savez / np.load(allow_pickle=False)
    np.savez(tmp_path / "s.npz", **{f"{k}.{i}": a for k, v in state.items()
                                    for i, a in enumerate(v)})
    with np.load(tmp_path / "s.npz", allow_pickle=False) as z:
        loaded = {k: [z[f"{k}.{i}"] for i in range(len(v))] for k, v in state.items()}
    # and through the project's checkpoint file, beside a strategy's own state
    checkpoint.save(tmp_path, checkpoint.Snapshot(2, current, {**state, "h": [np.ones(2)]}))
    from_checkpoint = checkpoint.load(tmp_path).state
    assert from_checkpoint["h"][0].tolist() == [1.0, 1.0]

    aggregate = weighted_average(client_results(rng, current), NUM_EXAMPLES)
    expected = opt.step(current, aggregate)  # round 3 by the step count
    for restored_state in (loaded, from_checkpoint):
        restored = ServerOptimizer(name, lr=0.3, momentum=0.9)
        restored.load_state_arrays(restored_state)
        assert restored.steps == 2
        got = restored.step(current, aggregate)
        for e, g in zip(expected, got, strict=True):
            assert e.dtype == g.dtype and e.tobytes() == g.tobytes()


def test_state_before_any_step_and_for_none():
    opt = ServerOptimizer("adam")
    assert set(opt.state_arrays()) == {"server_opt_step"}
    assert opt.state_arrays()["server_opt_step"][0].shape == ()
    opt.load_state_arrays({"h": [np.zeros(1)]})  # nothing of ours: fresh start
    assert opt.steps == 0 and opt.m is None
    assert ServerOptimizer("none").state_arrays() == {}


# ---- (d) none ---------------------------------------------------------------------------------
def test_none_returns_the_aggregate_bit_identically():
    rng = np.random.default_rng(4)
    current = initial_arrays()
    aggregate = weighted_average(client_results(rng, current), NUM_EXAMPLES)
    for opt in (ServerOptimizer("none"), from_settings({}), ServerOptimizer("sgd")):
        out = opt.step(current, aggregate, server_round=1)
        assert all(o is a for o, a in zip(out, aggregate, strict=True))
        assert opt.is_identity


# ---- (e) settings -----------------------------------------------------------------------------
def test_from_settings_and_default_learning_rates():
    opt = from_settings({"optimizer": "yogi", "beta1": 0.5})
    assert (opt.name, opt.lr, opt.beta1, opt.beta2, opt.tau) == ("yogi", 0.01, 0.5, 0.99, 1e-3)
    assert from_settings({"optimizer": "adam", "lr": 0.02}).lr == 0.02
    assert {n: ServerOptimizer(n).lr for n in DEFAULT_LR} == DEFAULT_LR


@pytest.mark.parametrize("settings,key", [
    ({"optimizer": "adamw"}, "optimizer"),
    ({"optimizer": "sgd", "lr": 0}, "lr"),
    ({"lr": -0.1}, "lr"),
    ({"lr": "fast"}, "lr"),
    ({"beta1": 1.0}, "beta1"),
    ({"beta1": -0.1}, "beta1"),
    ({"beta2": 1.5}, "beta2"),
    ({"tau": 0}, "tau"),
    ({"tau": -1e-3}, "tau"),
    ({"momentum": 1.0}, "momentum"),
    ({"momentum": -0.5}, "momentum"),
    ({"momentum": True}, "momentum"),
    ({"tau": float("nan")}, "tau"),
    ({"learning-rate": 0.1}, "learning-rate"),
])
def test_bad_settings_raise_naming_the_key(settings, key):
    for check in (validate_server_settings, from_settings):
        with pytest.raises(ValueError, match=rf"^server\.{key}\b") as err:
            check(settings)
        assert "\n" not in str(err.value)
    if key != "learning-rate":
        name = settings.get("optimizer", "adam")
        kwargs = {k: v for k, v in settings.items() if k != "optimizer"}
        with pytest.raises(ValueError, match=rf"^server\.{key}\b"):
            ServerOptimizer(name, **kwargs)


def test_defaults_yaml_server_block_is_valid():
    from omegaconf import OmegaConf

    from fedapps.config import CONF_DIR

    block = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "defaults.yaml").server)
    validate_server_settings(block)
    assert from_settings(block).is_identity


# ---- torch-adam: the FedAIoT reference's FedOPT ------------------------------------------------

def test_torch_adam_is_torch_optim_adam_on_the_pseudo_gradient() -> None:
    """Three rounds against torch.optim.Adam stepping `grad = old - average` (the FedAIoT
    reference's aggregators/base.py), with torch's defaults (betas 0.9/0.999, eps 1e-8)."""
    import torch

    rng = np.random.default_rng(3)
    x0 = [rng.normal(size=(3, 2)), rng.normal(size=4)]
    params = [torch.nn.Parameter(torch.tensor(a, dtype=torch.float64)) for a in x0]
    reference = torch.optim.Adam(params, lr=0.01)
    ours = ServerOptimizer("torch-adam", lr=0.01)
    assert (ours.beta2, ours.tau) == (0.999, 1e-8)
    x = [a.copy() for a in x0]
    for r in range(1, 4):
        aggregate = [a + rng.normal(scale=0.1, size=a.shape) for a in x]
        for p, a in zip(params, aggregate, strict=True):
            p.grad = p.detach() - torch.tensor(a)
        reference.step()
        x = ours.step(x, aggregate, server_round=r + 5)  # its own step count, not the round
        for p, a in zip(params, x, strict=True):
            np.testing.assert_allclose(a, p.detach().numpy(), rtol=1e-12, atol=1e-14)
    # Flower's adam differs (bias correction at server_round + 1, eps outside the correction)
    flower = ServerOptimizer("adam", lr=0.01, beta2=0.999, tau=1e-8)
    (f1,) = flower.step([x0[1]], [x0[1] + 0.1], server_round=1)
    (t1,) = ServerOptimizer("torch-adam", lr=0.01).step([x0[1]], [x0[1] + 0.1])
    assert not np.allclose(f1, t1)
    np.testing.assert_allclose(t1, x0[1] + 0.01, rtol=0, atol=1e-9)  # Adam's first step: lr


def test_step_buffers_false_leaves_non_parameters_at_the_aggregate() -> None:
    opt = from_settings({"optimizer": "torch-adam", "lr": 0.5, "step-buffers": False},
                        parameter_mask=[True, False])
    x = [np.zeros(2), np.zeros(2)]
    agg = [np.array([1.0, -1.0]), np.array([3.0, 4.0])]
    new = opt.step(x, agg)
    np.testing.assert_allclose(new[0], [0.5, -0.5], atol=1e-7)  # stepped: lr * sign(Delta)
    np.testing.assert_array_equal(new[1], agg[1])  # a buffer: the average itself
    with pytest.raises(ValueError, match="parameter mask of 2 arrays for 3"):
        opt.step(x + [np.zeros(1)], agg + [np.zeros(1)])
    with pytest.raises(ValueError, match="server.step-buffers=1: must be true or false"):
        validate_server_settings({"step-buffers": 1})
