"""Seed 002's presets and figure grids carry the thesis's settings (Table 4.2, Table 4.5,
Table 6.1), checked on the resolved configs; no run is started."""

import pytest
import torch

from fedapps.config import load_config
from simulations.reproduce import load_grid


@pytest.mark.parametrize("dataset, model", [("mnist", "thesis-mnist-cnn"),
                                            ("fmnist", "thesis-fmnist-cnn"),
                                            ("cifar10", "thesis-cifar10-cnn")])
def test_presets_hold_table_4_2(dataset, model):
    cfg = load_config(f"thesis-{dataset}")
    assert (cfg.dataset, cfg.model.name) == (dataset, model)
    assert cfg.federation["num-clients"] == 20 and cfg.federation["fraction-fit"] == 1.0
    assert (cfg.train.lr, cfg.train.momentum, cfg.train["batch-size"]) == (0.001, 0.9, 16)
    assert cfg.data.partitioner == "limit-label" and cfg.data["target-emd"] == 1.4


def settings(grid, label):
    cell = next(c for c in grid.cells() if c.get("variant") == label)
    return load_config(grid.experiment, grid.cell_sets(cell))


@pytest.mark.parametrize("name", ["thesis-fig6.1-mnist", "thesis-fig6.1-fmnist",
                                  "thesis-fig6.1-cifar10"])
def test_fig_6_1_gives_every_method_the_same_epochs_and_transfers(name):
    grid = load_grid(name)
    assert grid.seeds == [0, 1, 2, 3]
    two_p = settings(grid, "2p-fedaug-0.8")
    k = two_p.federation["num-clients"]
    # Table 6.1: 2P E 9 (12 x 3/4, epoch mode) x 12 rounds; the others E 12 x 9 rounds = 108
    assert two_p.algo.mode == "epoch" and two_p.algo.phases == 2
    assert two_p.train["local-epochs"] * 3 / 4 * two_p.rounds == 108
    assert two_p.data.transforms == ["fedaug"] and two_p.data.fedaug["target-emd"] == 0.8
    for other in ("fednova", "fedprox", "fedavg"):
        cfg = settings(grid, other)
        assert cfg.train["local-epochs"] * cfg.rounds == 108
        # transfers: K down + K up per FedAvg round = K down + K/2 up per 2P round
        assert cfg.rounds * 2 * k == two_p.rounds * (k + k // 2)
    assert settings(grid, "fedprox").algo["mu-mode"] == "auto"
    # the ablation cell 2p is 2P-FedAug-0.8 with FedAug taken out, and nothing else changed
    fedaug = ["data.transforms=[fedaug]", "data.fedaug.target-emd=0.8"]
    assert grid.variants["2p"] == [o for o in grid.variants["2p-fedaug-0.8"] if o not in fedaug]
    assert settings(grid, "2p").data.transforms == []


@pytest.mark.parametrize("name", ["thesis-fig6.1-mnist", "thesis-fig6.1-fmnist",
                                  "thesis-fig6.1-cifar10"])
def test_fig_6_1_paired_md_sets_every_method_beside_fedavg(name):
    """The thesis's Fig. 6.1 claims are each method against FedAvg, so paired.md must hold
    every one of those pairs, seed by seed (FedNova and FedProx were once missing)."""
    grid = load_grid(name)
    against_fedavg = {a for a, b in grid.paired if b == "fedavg"}
    assert against_fedavg == set(grid.axes["variant"]) - {"fedavg"}


def fltk_fednova_sends(old, grads, lr, momentum, tau_eff):
    """FLTK's FedNova (the thesis's testbed; fltk/strategy/FedNova.py, JMGaljaard/fltk-testbed
    ca89875), its arithmetic on one tensor: `step` as SGD with momentum accumulating
    cum_grad and the momentum-weighted step count a_i, then `pre_communicate` as written,
    `p -= cum_grad` ("get back to old_init") and `p += cum_grad * tau_eff / a_i`."""
    p, buf, cum, counter, a = old.clone(), None, torch.zeros_like(old), 0.0, 0.0
    for g in grads:
        buf = g.clone() if buf is None else buf * momentum + g
        cum += lr * buf
        p -= lr * buf
        counter = counter * momentum + 1
        a += counter
    return p - cum + cum * (tau_eff / a), cum, a


@pytest.mark.parametrize("name", ["thesis-fig6.1-mnist", "thesis-fig6.1-fmnist",
                                  "thesis-fig6.1-cifar10"])
def test_fig_6_1_fednova_fltk_cell_is_fedavg_with_fltks_step_scale(name):
    """The fednova-fltk cell: FedAvg whose aggregate step is scaled by what FLTK's FedNova
    multiplies each client's update by, 2 - tau_eff / a_i (its sign slip)."""
    grid = load_grid(name)
    assert grid.variants["fednova-fltk"] == ["algorithm=fedavg", "server.optimizer=sgd",
                                             "server.lr=1.995", "server.step-buffers=false",
                                             *grid.variants["fedavg"][1:]]
    cfg, fedavg = settings(grid, "fednova-fltk"), settings(grid, "fedavg")
    assert (cfg.algorithm, cfg.server.optimizer, cfg.rounds) == ("fedavg", "sgd", fedavg.rounds)
    assert cfg.server["step-buffers"] is False  # FLTK rescales parameters, not BN statistics
    # the closed form on a short run of steps: the client sends old - (2 - s) x its update
    torch.manual_seed(0)
    old, grads = torch.randn(5), torch.randn(7, 5)
    sent, cum, a = fltk_fednova_sends(old, grads, 0.001, 0.9, tau_eff=0.3)
    assert a == pytest.approx(sum(10 * (1 - 0.9 ** k) for k in range(1, 8)))
    assert torch.allclose(sent, old - (2 - 0.3 / a) * cum, atol=1e-7)
    # the preset's clients: about N / K samples each (n / N taken as 1 / K), E epochs of
    # ceil(n / B) steps, momentum 0.9; tau_eff = int(E n / 16) x n / N (FLTK hard-codes
    # B = 16), a_i = the sum of its momentum counter over the steps
    e, b, k = cfg.train["local-epochs"], cfg.train["batch-size"], cfg.federation["num-clients"]
    for n in (2838, 3000, 3150):  # the spread of seed 0's MNIST clients around 60,000 / 20
        steps = e * -(-n // b)
        a = sum(1 - 0.9 ** j for j in range(1, steps + 1)) / (1 - 0.9)
        s = int(e * n / 16) * (1 / k) / a
        assert cfg.server.lr == pytest.approx(2 - s, abs=3e-4)
    # fedprox-fltk: FLTK's FedProx default mu, fixed (its adaptive rule is never reached)
    prox = settings(grid, "fedprox-fltk")
    assert (prox.algorithm, prox.algo["mu-mode"], prox.algo.mu) == ("fedprox", "fixed", 0.01)
    assert prox.train["local-epochs"] * prox.rounds == 108


@pytest.mark.parametrize("name, base, total", [("thesis-fig4.9-mnist", 8, 120),
                                               ("thesis-fig4.10-fmnist", 16, 128),
                                               ("thesis-fig4.9-cifar10", 8, 120),
                                               ("thesis-fig4.10-cifar10", 16, 128)])
def test_fig_4_fedavg_raises_e_per_table_4_5(name, base, total):
    grid = load_grid(name)
    for variant in grid.axes["variant"]:
        cfg = settings(grid, variant)
        assert cfg.federation["num-clients"] == 40
        e = cfg.train["local-epochs"]
        if variant.startswith("phase-shift"):
            assert (e, cfg.rounds) == (base, total // base)
        else:  # Table 4.5's E = base x 2n/(n+1), rounded; about the same total epochs
            assert any(abs(e - base * 2 * n / (n + 1)) <= 0.5 for n in (1, 2, 4, 5, 10, 20))
            assert abs(e * cfg.rounds - total) <= e / 2


def test_fig_5_runs_fedaug_only_below_the_emd():
    grid = load_grid("thesis-fig5.3-mnist")
    cells = {(c["data.target-emd"], c["variant"]) for c in grid.cells()}
    assert len(cells) == 13 and (0.8, "fedaug-0.4") in cells and (0.8, "fedaug-0.8") not in cells
    cfg = load_config(grid.experiment, grid.cell_sets({"data.target-emd": 1.4,
                                                       "variant": "fedaug-0.8"}))
    assert (cfg.train["local-epochs"], cfg.rounds, cfg.data["target-emd"]) == (4, 8, 1.4)


@pytest.mark.parametrize("name", ["thesis-fig3.4-fmnist", "thesis-fig3.4-fmnist-reduced",
                                  "thesis-fig3.5-cifar10"])
def test_fig_3_4_draws_ll_q_per_sample_and_the_others_by_expected_counts(name):
    grid = load_grid(name)
    draws = {(c["data.partitioner"], c["data.target-emd"]):
             load_config(grid.experiment, grid.cell_sets(c)).data.draw for c in grid.cells()}
    assert len(draws) == 4 * len(grid.axes["data.target-emd"])
    assert {k for k, d in draws.items() if d == "per-sample"} == \
        {("limit-label-q", e) for e in grid.axes["data.target-emd"]}


def test_fig_3_4_paired_md_tests_the_drop_at_1_2_and_each_sampler_against_ll():
    """paired.md puts the thesis's claims seed by seed: every sampler's step into EMD 1.2 and
    out of it, then each other sampler against limit-label at every EMD."""
    grid = load_grid("thesis-fig3.4-fmnist")
    emds = [str(e) for e in grid.axes["data.target-emd"]]
    assert emds == ["0.8", "1.0", "1.2", "1.4", "1.6"]

    def cell(sampler: str, emd: str) -> str:
        return f"data.partitioner={sampler},data.target-emd={emd}"

    samplers = grid.axes["data.partitioner"]
    steps = [(cell(s, b), cell(s, a)) for s in samplers for a, b in (("1.0", "1.2"),
                                                                    ("1.2", "1.4"))]
    against_ll = [(cell(s, e), cell("limit-label", e))
                  for s in ("dirichlet", "limit-label-q", "emd") for e in emds]
    assert [tuple(p) for p in grid.paired] == steps + against_ll


@pytest.mark.parametrize("name", ["thesis-fig4.9-mnist", "thesis-fig4.9-fmnist",
                                  "thesis-fig4.10-mnist", "thesis-fig4.10-fmnist",
                                  "thesis-fig4.9-cifar10", "thesis-fig4.10-cifar10"])
def test_fig_4_paired_md_covers_every_phase_count_claims_first(name):
    """paired.md compares each phase count's two lines with FedAvg and with each other, the
    thesis's 4-phase claim cells on top."""
    grid = load_grid(name)
    counts = [v.removeprefix("phase-shift-") for v in grid.axes["variant"]
              if v.startswith("phase-shift-")]
    assert sorted(map(int, counts)) == [2, 4, 5, 10, 20]
    pairs = [tuple(p) for p in grid.paired]
    assert pairs[:3] == [("phase-shift-4", "fedavg-n1"), ("fedavg-n4", "fedavg-n1"),
                         ("phase-shift-4", "fedavg-n4")]
    assert set(pairs) == {pair for n in counts for pair in [
        (f"phase-shift-{n}", "fedavg-n1"), (f"fedavg-n{n}", "fedavg-n1"),
        (f"phase-shift-{n}", f"fedavg-n{n}")]}
    assert len(pairs) == len(set(pairs))


@pytest.mark.parametrize("name, fmnist", [("thesis-fig3.5-cifar10", "thesis-fig3.4-fmnist"),
                                          ("thesis-fig4.9-cifar10", "thesis-fig4.9-fmnist"),
                                          ("thesis-fig4.10-cifar10", "thesis-fig4.10-fmnist")])
def test_cifar10_grids_run_the_fmnist_cells_on_the_cifar10_preset(name, fmnist):
    grid, base = load_grid(name), load_grid(fmnist)
    assert [grid.cell_sets(c) for c in grid.cells()] == [base.cell_sets(c) for c in base.cells()]
    assert (grid.seeds, grid.paired) == (base.seeds, base.paired) and "CIFAR-10" in grid.source
    for cell in grid.cells():
        cfg = load_config(grid.experiment, grid.cell_sets(cell))
        assert (cfg.dataset, cfg.model.name) == ("cifar10", "thesis-cifar10-cnn")
