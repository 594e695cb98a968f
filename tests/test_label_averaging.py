"""Label averaging (seed 003 Algorithm 3): hand-computed counts on a tiny synthetic partition,
seeding, per-round redraws through the base client, and validation."""

import numpy as np
import pytest
import torch

from clients.fedavg import FedAvgClient
from fedapps.config import ConfigError, load_config
from fedapps.data import (
    FederatedData,
    Normalizer,
    Pool,
    apply_transforms,
    federated_data,
    make_federated,
)
from fedapps.data import label_averaging as la
from fedapps.runtime import make_model, train_settings
from fedapps.validation import validate

# train counts per client and class; gvec = [9, 7, 7] / 3 = [3, 2.33, 2.33] -> targets [3, 2, 2]
COUNTS = [[6, 1, 0], [2, 4, 3], [1, 2, 4]]
AFTER = [[6, 2, 0], [3, 4, 3], [3, 2, 4]]  # below-target classes raised; absent stays absent


def synthetic() -> FederatedData:
    """Three clients, three classes; sample i is an image filled with value i (traceable)."""
    labels, train, test = [], [], []
    for counts in COUNTS:
        idx = []
        for c, n in enumerate(counts):
            idx += list(range(len(labels), len(labels) + n))
            labels += [c] * n
        train.append(np.asarray(idx, dtype=np.int64))
        test.append(np.asarray([len(labels)], dtype=np.int64))
        labels.append(0)
    n = len(labels)
    x = torch.arange(n, dtype=torch.uint8).reshape(n, 1, 1, 1).expand(n, 1, 2, 2).contiguous()
    pool = Pool(x, torch.tensor(labels), n, 3)
    return FederatedData(pool, Normalizer.fit(pool), train, test, {"synthetic": 1})


def cfg_of(*sets):
    return load_config("quickstart", ["data.transforms=[label-averaging]", *sets])


def test_targets_are_the_rounded_mean_count_per_class_over_clients():
    assert la.class_targets(np.asarray(COUNTS)).tolist() == [3, 2, 2]
    assert la.class_targets(np.asarray([[1, 0], [2, 5]])).tolist() == [2, 3]  # 1.5, 2.5 half up


def test_draw_once_raises_each_present_class_to_its_target_with_own_copies():
    fd = synthetic()
    cfg = cfg_of("data.label-averaging.redraw=false")
    for pid, after in enumerate(AFTER):
        plain, out = fd.client(pid), apply_transforms(cfg, fd, pid)
        assert np.bincount(out.y_train.numpy(), minlength=3).tolist() == after
        assert out.n_oversampled == sum(after) - sum(COUNTS[pid])
        assert out.label_averaging_targets.tolist() == [3, 2, 2]
        n = len(plain.y_train)
        assert torch.equal(out.x_train[:n], plain.x_train)  # originals first, unchanged
        for x, y in zip(out.x_train[n:], out.y_train[n:], strict=True):  # copies of own class
            same = (plain.x_train == x).flatten(1).all(1) & (plain.y_train == y)
            assert same.any()
        assert out.x_test is plain.x_test and out.y_test is plain.y_test


def test_redraw_draws_per_round_seeded_by_seed_round_and_client():
    cfg = load_config("quickstart", ["data.transforms=[label-averaging]"])  # redraw: true
    fd = federated_data(cfg)
    base = apply_transforms(cfg, fd, 0)
    assert len(base.y_train) == len(fd.client(0).y_train)  # the build itself adds nothing
    targets = la.class_targets(fd.counts("train"))
    r1, r2 = base.round_data(base, 1), base.round_data(base, 2)
    own = fd.counts("train")[0]
    want = [max(n, t) if n else 0 for n, t in zip(own, targets, strict=True)]
    for r in (r1, r2):
        assert np.bincount(r.y_train.numpy(), minlength=10).tolist() == want
    assert r1.n_oversampled > 0 and not torch.equal(r1.x_train, r2.x_train)  # new copies
    again = apply_transforms(cfg, make_federated(fd.pool, fd.key), 0)  # as a new process
    assert torch.equal(again.round_data(again, 1).x_train, r1.x_train)
    # the base client trains on this round's draw and reports its size
    client = FedAvgClient(make_model(cfg), base, train_settings(cfg), 0)
    # ... and declares that size at its handshake, so the server's bound on num_examples
    # admits it (it declared the un-oversampled split before: every update was rejected)
    assert client.get_properties({})["num-train"] == len(r1.y_train) > len(base.y_train)
    _, n, _ = client.fit(client.get_parameters({}), {"server-round": 2})
    assert n == len(r2.y_train) and torch.equal(client.data.x_train, r2.x_train)
    _, n1, _ = client.fit(client.get_parameters({}), {"server-round": 1})
    assert n1 == n and torch.equal(client.data.x_train, r1.x_train)  # from the base, not r2


def test_label_averaging_needs_classes():
    with pytest.raises(ConfigError, match="label-averaging does not fit dataset diabetes"):
        validate(load_config("regression-quick", ["data.transforms=[label-averaging]"]),
                 check_data=False)
    with pytest.raises(ConfigError, match="data.label-averaging.redraw=1: must be true or"):
        validate(cfg_of("data.label-averaging.redraw=1"), check_data=False)
