"""Pins the data of existing configs: the table-driven partitioners, the generalized pools and
the `rebalance` transform must give what the first data layer gave (values recorded with the
code before the refactor at commit 97080b4, seed 0, embedded digits).

The index hashes depend only on numpy/flwr-datasets; the float hashes also on torch (and the
rebalanced images on torchvision's augmentation), so a torch upgrade may need them re-recorded
with a check that partitions are unchanged."""

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
#        hash of client 3's normalized x_train + x_test, client 3's x_train[0, 0, 3, 3])
PARTITIONS = {
    "dirichlet": ("quickstart", [], "133d594d2fa0f13a",
                  [26, 142, 155, 168, 212, 143, 162, 68, 147, 114], "c3822fba273994d6",
                  1.6812108755111694),
    "dirichlet-alpha0.1": ("fedreb-quick", [], "c66f692a8e9e3ab4",
                           [87, 123, 361, 24, 147, 86, 287, 24, 174, 30], "984afee57d2c069e",
                           -0.4783838391304016),
    "iid": ("quickstart", ["data.partitioner=iid"], "d3ffc9f35f116819",
            [134, 135, 134, 134, 133, 135, 134, 131, 135, 133], "aff977c648dd4e74",
            1.8481359481811523),
    "shards": ("quickstart", ["data.partitioner=shards"], "5361898f12271f81",
               [77, 136, 135, 135, 204, 102, 100, 167, 111, 178], "aff1b4c6536eadc5",
               1.6812108755111694),
    "shards-official": ("quickstart", ["data.partitioner=shards", "data.pool=official",
                                       "data.labels-per-client=3"], "2220929ae50196e0",
                        [89, 122, 132, 150, 161, 78, 106, 105, 83, 92], "c18781146fab889d",
                        1.8481359481811523),
}


@pytest.mark.parametrize("name", list(PARTITIONS))
def test_digits_partitions_and_tensors_are_unchanged(name):
    exp, overrides, idx_hash, sizes, x_hash, x0 = PARTITIONS[name]
    fd = federated_data(load_config(exp, overrides))
    assert digest(fd.train_idx + fd.test_idx) == idx_hash
    assert [len(t) for t in fd.train_idx] == sizes
    c = fd.client(3)
    assert float(c.x_train[0, 0, 3, 3]) == x0
    assert digest([c.x_train, c.x_test]) == x_hash


# algorithm: (client, hash of x_reb, hash of json(y_reb), |D_r|, n_eff, target,
#             hash of the client's x_train, y_train, x_test, y_test)
REBALANCED = {
    "fedreb": (0, "d95b84d0a1c0a220", "66812fb1d1b5a36b", 90, 49, 15, "9a0f00e8435b61ba"),
    "fedreg": (1, "174d13f896a8ec1e", "a884ec4023d446d9", 135, 50, 27, "05c9a6e086537408"),
}


@pytest.mark.parametrize("algorithm", list(REBALANCED))
def test_rebalanced_set_is_unchanged(algorithm):
    pid, x_hash, y_hash, size, n_eff, target, local = REBALANCED[algorithm]
    cfg = resolve_config("fedreb-quick", [f"algorithm={algorithm}"], check_data=False)
    fd = federated_data(cfg)
    d = ALGORITHMS[algorithm].client_data(cfg, fd, pid, "cpu")
    assert (len(d.y_reb), d.n_eff, d.target) == (size, n_eff, target)
    assert hashlib.sha256(json.dumps(d.y_reb.tolist()).encode()).hexdigest()[:16] == y_hash
    assert digest([d.x_reb]) == x_hash
    assert digest([d.x_train, d.y_train, d.x_test, d.y_test]) == local
    # the standalone builder and the transform agree
    a = cfg.algo
    built = rb.build(fd, pid, "digits", a.scope, a.threshold, a.augmentation, int(cfg.seed))
    assert torch.equal(built.x, d.x_reb) and torch.equal(built.y, d.y_reb)
