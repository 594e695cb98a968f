"""Label noise from a confusion matrix (seed 004 B9): exact count per client, never the true
label, redraw frequencies = Q's off-diagonal row, seeds, validation; the p mode unchanged."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedapps.data import ClientData, apply_transforms, federated_data, make_federated
from fedapps.data import label_noise as ln
from fedapps.errors import ConfigError
from fedapps.validation import resolve_config


def noisy(tmp_path=None, *sets, q=None):
    """Quickstart with label-noise and the given settings; Q (if any) written to a CSV."""
    extra = []
    if q is not None:
        path = tmp_path / "q.csv"
        np.savetxt(path, q, delimiter=",", fmt="%.10g")
        extra = [f"data.label-noise.matrix={path}"]
    cfg = resolve_config("quickstart", ["data.transforms=[label-noise]", *extra, *sets],
                         check_data=False)
    fd = federated_data(cfg)
    return cfg, make_federated(fd.pool, fd.key)  # without this process's memo


def digits_q():
    """A 10-class Q with uneven off-diagonal rows, one row (class 3) without confusion."""
    rng = np.random.default_rng(5)
    q = rng.random((10, 10)) ** 3
    q[np.arange(10), np.arange(10)] = 4.0
    q[3] = 0.0
    q[3, 3] = 1.0
    return q / q.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("ratio", [0.1, 0.3])
@pytest.mark.parametrize("with_matrix", [False, True])
def test_exact_count_per_client_never_the_true_label_test_untouched(tmp_path, ratio,
                                                                      with_matrix):
    cfg, fd = noisy(tmp_path, f"data.label-noise.ratio={ratio}",
                    q=digits_q() if with_matrix else None)
    for pid in range(fd.num_clients):
        clean, out = fd.client(pid), apply_transforms(cfg, fd, pid)
        n = len(clean.y_train)
        changed = (out.y_train != clean.y_train).numpy()
        assert changed.sum() == int(np.floor(ratio * n + 0.5))  # round half up, per client
        assert np.array_equal(out.label_noise_mask.numpy(), changed)  # a flip never keeps y
        assert out.y_test is clean.y_test and out.x_train is clean.x_train
        assert out.y_train.dtype == torch.int64


def test_flip_count_rounds_half_up():
    assert [ln.flip_count(0.1, n) for n in (4, 5, 15, 25, 0)] == [0, 1, 2, 3, 0]
    assert ln.flip_count(0.3, 35) == 11 and ln.flip_count(1.0, 7) == 7


def fake_ctx(k, params, seed=0):
    return SimpleNamespace(fd=SimpleNamespace(pool=SimpleNamespace(num_classes=k)),
                           rng=lambda: np.random.default_rng(seed), params=params)


def test_redraw_frequencies_match_q_off_diagonal_row(tmp_path):
    """A large synthetic client: each class's new labels follow Q[y] without y, renormalized;
    a row with no off-diagonal mass is uniform over the other classes."""
    q = np.array([[0.50, 0.30, 0.15, 0.05],
                  [0.10, 0.80, 0.00, 0.10],
                  [0.00, 0.00, 0.90, 0.10],
                  [0.00, 0.00, 0.00, 1.00]])
    path = tmp_path / "q.csv"
    np.savetxt(path, q, delimiter=",")
    per_class = 60_000
    y = torch.arange(4).repeat_interleave(per_class)
    data = ClientData(torch.zeros(len(y), 1), y, torch.zeros(3, 1), torch.zeros(3))
    params = {"p": 0.1, "ratio": 0.5, "matrix": str(path), "row_max_below": None}
    out = ln.transform(fake_ctx(4, params), data)
    new, mask = out.y_train.numpy(), out.label_noise_mask.numpy()
    assert mask.sum() == len(y) // 2 and (new[mask] != y.numpy()[mask]).all()
    expected = {0: [0, 0.6, 0.3, 0.1], 1: [0.5, 0, 0, 0.5], 2: [0, 0, 0, 1],
                3: [1 / 3, 1 / 3, 1 / 3, 0]}
    for c, row in expected.items():
        drawn = new[mask & (y.numpy() == c)]
        freq = np.bincount(drawn, minlength=4) / len(drawn)
        assert np.abs(freq - row).max() < 0.01, (c, freq)
        assert len(drawn) > 0.45 * per_class  # the selection is uniform over samples


def test_redraw_never_returns_the_true_label_at_zero_weight_edges():
    """Zero-weight classes (first and last column) are never drawn, whatever u is."""
    q = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    y = np.repeat(np.arange(3), 20_000)
    new = ln.redraw(y, q, np.random.default_rng(1))
    assert (new != y).all()
    assert set(new[y == 0]) == {1} and set(new[y == 1]) == {2}
    assert set(new[y == 2]) == {1}  # row 2 holds only itself + class 1 -> always 1


def test_seeds_reproduce_and_differ(tmp_path):
    q = digits_q()
    cfg, fd = noisy(tmp_path, "data.label-noise.ratio=0.3", q=q)
    a = apply_transforms(cfg, fd, 1).y_train
    _, fd2 = noisy(tmp_path, "data.label-noise.ratio=0.3", q=q)  # a new process's view
    assert torch.equal(a, apply_transforms(cfg, fd2, 1).y_train)
    # the generator is the transform's (seed, partition id, position): another seed or client
    # selects other samples and draws other labels from the same clean labels
    y = torch.arange(10).repeat(50)
    data = ClientData(torch.zeros(len(y), 1), y, torch.zeros(3, 1), torch.zeros(3))
    params = {"p": 0.1, "ratio": 0.3, "matrix": None, "row_max_below": None}
    runs = [ln.transform(fake_ctx(10, params, seed), data).y_train for seed in (7, 7, 8)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    assert (runs[0] != y).sum() == (runs[2] != y).sum() == 150


def test_row_max_below_selects_only_confusable_classes(tmp_path):
    """The reference's shortcut: only samples whose class row has max(Q[y]) < threshold;
    classes the central model gets right are never flipped, and a client with too few
    eligible samples has all of them flipped."""
    q = np.eye(10)
    q[0] = [0.9, 0.1, 0, 0, 0, 0, 0, 0, 0, 0]  # only classes 0 and 1 are confusable
    q[1] = [0.2, 0.8, 0, 0, 0, 0, 0, 0, 0, 0]
    cfg, fd = noisy(tmp_path, "data.label-noise.ratio=0.3", "data.label-noise.row-max-below=0.95",
                    q=q)
    for pid in range(fd.num_clients):
        clean = fd.client(pid).y_train.numpy()
        out = apply_transforms(cfg, fd, pid).y_train.numpy()
        changed = out != clean
        eligible = np.isin(clean, [0, 1])
        assert not changed[~eligible].any()
        assert changed.sum() == min(int(np.floor(0.3 * len(clean) + 0.5)), eligible.sum())
        assert ((clean[changed] == 0) & (out[changed] == 1)
                | (clean[changed] == 1) & (out[changed] == 0)).all()


def test_p_mode_is_the_original_code_path():
    """ratio and matrix null: the same draws as the code before them (copied here)."""
    cfg, fd = noisy(None, "data.label-noise.p=0.3")
    for pid in (0, 4):
        y = fd.client(pid).y_train.numpy()
        rng = np.random.default_rng([0, pid, 0])  # (seed, partition id, position)
        flip = rng.random(len(y)) < 0.3
        shift = rng.integers(1, 10, size=len(y))
        old = np.where(flip, (y + shift) % 10, y)
        assert np.array_equal(apply_transforms(cfg, fd, pid).y_train.numpy(), old)


def test_p_mode_with_a_matrix_flips_by_probability_and_redraws_from_q(tmp_path):
    q = digits_q()
    cfg, fd = noisy(tmp_path, "data.label-noise.p=0.5", q=q)
    clean = np.concatenate([fd.client(p).y_train.numpy() for p in range(fd.num_clients)])
    out = np.concatenate([apply_transforms(cfg, fd, p).y_train.numpy()
                          for p in range(fd.num_clients)])
    changed = out != clean
    assert 0.4 < changed.mean() < 0.6
    assert set(out[changed & (clean == 3)]) <= set(range(10)) - {3}


@pytest.mark.parametrize("content, why", [
    (None, "no such file"),
    ("1,0\n0,1\n", "shape 2x2, the dataset has 10 classes"),
    ("\n".join(",".join(["0.2"] * 10) for _ in range(10)) + "\n", "row 0 sums to 2"),
    ("a,b\n", "not a CSV of numbers"),
], ids=["missing", "shape", "row-sum", "not-numbers"])
def test_bad_matrix_is_one_line_error_naming_the_command(tmp_path, content, why):
    path = tmp_path / "q.csv"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as err:
        resolve_config("quickstart", ["data.transforms=[label-noise]",
                                      f"data.label-noise.matrix={path}"])
    msg = str(err.value)
    assert "\n" not in msg and why in msg and "fedapps centralized" in msg
    assert msg.startswith(f"data.label-noise.matrix='{path}'")
    # validation without the data (a grid's cells, before the matrix is made) leaves it out
    resolve_config("quickstart", ["data.transforms=[label-noise]",
                                  f"data.label-noise.matrix={path}"], check_data=False)


def test_settings_are_checked():
    for sets, key in ((["data.label-noise.ratio=1.5"], "data.label-noise.ratio"),
                      (["data.label-noise.row-max-below=0.95"], "needs data.label-noise.matrix"),
                      (["data.label-noise.row-max-below=0"], "data.label-noise.row-max-below")):
        with pytest.raises(ConfigError, match=key):
            resolve_config("quickstart", ["data.transforms=[label-noise]", *sets],
                           check_data=False)
    # a matrix the run does not use (no label-noise listed) is not read
    resolve_config("quickstart", ["data.label-noise.matrix=/nonexistent.csv"], check_data=False)
