"""Pins the data of existing configs: the table-driven partitioners, the generalized pools and
the `rebalance` transform must give what the first data layer gave (values recorded with the
code before the refactor at commit 97080b4, seed 0, embedded digits).

Index arrays and labels are pinned exactly (they depend only on numpy/flwr-datasets). Float
tensors are compared with the first data layer's formula recomputed here, or with pinned sums
to 1e-5 relative: their last bits depend on torch's thread count and vector width (a reduction
over the whole pool sums in a different order), which differs between processes and machines."""

import hashlib
import json

import numpy as np
import pytest
import torch

from fedapps.config import load_config
from fedapps.data import federated_data
from fedapps.data import rebalance as rb
from fedapps.registry import ALGORITHMS
from fedapps.validation import resolve_config


def digest(arrays) -> str:
    m = hashlib.sha256()
    for a in arrays:
        a = a.numpy() if isinstance(a, torch.Tensor) else a
        m.update(np.ascontiguousarray(a).tobytes())
    return m.hexdigest()[:16]


# name: (experiment, overrides, hash of all train+test index arrays, train sizes,
#        client 3's x_train[0, 0, 3, 3])
PARTITIONS = {
    "dirichlet": ("quickstart", [], "133d594d2fa0f13a",
                  [26, 142, 155, 168, 212, 143, 162, 68, 147, 114], 1.6812108755111694),
    "dirichlet-alpha0.1": ("fedreb-quick", ["data.dirichlet-balance=none"], "c66f692a8e9e3ab4",
                           [87, 123, 361, 24, 147, 86, 287, 24, 174, 30], -0.4783838391304016),
    "dirichlet-alpha0.1-capped": ("fedreb-quick", [], "67b7a39b2e79526f",
                                  [164, 125, 175, 25, 179, 89, 192, 134, 227, 36],
                                  1.8481359481811523),
    "iid": ("quickstart", ["data.partitioner=iid"], "d3ffc9f35f116819",
            [134, 135, 134, 134, 133, 135, 134, 131, 135, 133], 1.8481359481811523),
    "shards": ("quickstart", ["data.partitioner=shards"], "5361898f12271f81",
               [77, 136, 135, 135, 204, 102, 100, 167, 111, 178], 1.6812108755111694),
    "shards-official": ("quickstart", ["data.partitioner=shards", "data.pool=official",
                                       "data.labels-per-client=3"], "2220929ae50196e0",
                        [89, 122, 132, 150, 161, 78, 106, 105, 83, 92], 1.8481359481811523),
}


@pytest.mark.parametrize("name", list(PARTITIONS))
def test_digits_partitions_and_tensors_are_unchanged(name):
    exp, overrides, idx_hash, sizes, x0 = PARTITIONS[name]
    fd = federated_data(load_config(exp, overrides))
    assert digest(fd.train_idx + fd.test_idx) == idx_hash
    assert [len(t) for t in fd.train_idx] == sizes
    c = fd.client(3)
    assert float(c.x_train[0, 0, 3, 3]) == pytest.approx(x0, rel=1e-6)
    # the first data layer's normalization: /255, per-channel mean and std over the whole pool
    x = fd.pool.x.float().div(255.0)
    mean, std = x.mean(dim=(0, 2, 3)), x.std(dim=(0, 2, 3)).clamp_min(1e-6)
    for got, idx in ((c.x_train, fd.train_idx[3]), (c.x_test, fd.test_idx[3])):
        expected = (x[idx] - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


# algorithm: (client, (sum, sum of |.|) of x_reb, hash of json(y_reb), |D_r|, n_eff, target,
#             sum of the client's x_train), recorded at 97080b4
REBALANCED = {
    "fedreb": (0, (-374.1466205045581, 5165.095771946013), "66812fb1d1b5a36b", 90, 49, 15,
               -112.41923505812883),
    "fedreg": (1, (-428.58220364898443, 7818.531272895634), "a884ec4023d446d9", 135, 50, 27,
               -58.22048404067755),
}


@pytest.mark.parametrize("algorithm", list(REBALANCED))
def test_rebalanced_set_is_unchanged(algorithm):
    pid, x_sums, y_hash, size, n_eff, target, local = REBALANCED[algorithm]
    cfg = resolve_config("fedreb-quick", [f"algorithm={algorithm}", "data.dirichlet-balance=none"],
                         check_data=False)
    fd = federated_data(cfg)
    d = ALGORITHMS[algorithm].client_data(cfg, fd, pid, "cpu")
    assert (len(d.y_reb), d.n_eff, d.target) == (size, n_eff, target)
    assert hashlib.sha256(json.dumps(d.y_reb.tolist()).encode()).hexdigest()[:16] == y_hash
    x_reb = d.x_reb.double()
    assert (float(x_reb.sum()), float(x_reb.abs().sum())) == pytest.approx(x_sums, rel=1e-5)
    assert float(d.x_train.double().sum()) == pytest.approx(local, rel=1e-5)
    # the standalone builder and the transform agree
    a = cfg.algo
    built = rb.build(fd, pid, "digits", a.scope, a.threshold, a.augmentation, int(cfg.seed))
    assert torch.equal(built.x, d.x_reb) and torch.equal(built.y, d.y_reb)
