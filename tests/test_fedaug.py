"""FedAug (seed 002 chapter 5): Algorithm 4, eqs. 5.4/5.9 and Table 5.1 by value; the `fedaug`
transform (copies last, originals untouched, one-line error for a missing class); on-the-fly
augmentation and the fair-compute step budget in the client's SGD loop."""

import numpy as np
import pytest
import torch

from clients.arrays import get_arrays
from clients.base import TrainSettings
from clients.fedavg import FedAvgClient
from fedapps.config import ConfigError
from fedapps.data import ClientData, apply_transforms, federated_data
from fedapps.data import fedaug as fa
from fedapps.models import build_model
from fedapps.validation import resolve_config

# ll(3, 1.0) on M = 10 classes, by hand: three classes share the client's N = 2100 samples
LL3 = [700, 700, 700, 0, 0, 0, 0, 0, 0, 0]


def test_ll3_at_augmented_emd_0_4_gives_k_7_and_l_n_over_7():
    lv = fa.calculate_level(LL3, 0.4)
    assert lv.k == 7 and lv.level == pytest.approx(2100 / 7) and lv.kept_sum == 2100


@pytest.mark.parametrize("target, ratio", [(0.0, 0.30), (0.4, 0.50), (0.8, 0.70)])
def test_unaltered_ratio_of_ll3_is_table_5_1(target, ratio):
    assert fa.unaltered_ratio(LL3, target) == pytest.approx(ratio, abs=1e-12)


def test_eq_5_4_at_the_original_emd_is_the_common_level_of_the_bottom_classes():
    assert fa.uniform_emd(LL3) == pytest.approx(1.4)
    assert fa.level_eq_5_4(7, 2100, 10, 1.4) == pytest.approx(0.0, abs=1e-9)
    assert fa.common_level(LL3, 7) == 0.0


def test_worked_example_ll2_0_9_is_0_435_not_0_47():
    shares = [0.46, 0.46] + [0.01] * 8  # ll(2, 0.9): EMD 1.44 (digest section 5.3)
    assert fa.uniform_emd(shares) == pytest.approx(1.44)
    assert fa.calculate_level(shares, 0.4).level == pytest.approx(0.1725)
    assert fa.unaltered_ratio(shares, 0.4) == pytest.approx(1 / (1 + 8 * 0.1625))


def test_the_printed_increasing_sort_would_give_a_negative_level():
    # what Algorithm 4 as printed computes at its first step: s = the smallest class
    assert fa.level_eq_5_4(9, 0, 10, 0.4) <= 0


def test_no_augmentation_at_or_below_the_target():
    counts = [110, 100, 90, 100, 100, 100, 100, 100, 100, 100]  # EMD 0.02
    assert fa.target_counts(counts, 0.8) == counts and fa.unaltered_ratio(counts, 0.8) == 1.0


def test_post_augmentation_emd_equals_the_target_on_a_label_array():
    # ll(3, 1.0) with one sample of every other class (seed 002 section 4.4); L = 300 exactly
    counts = [700, 700, 700, 1, 1, 1, 1, 1, 1, 1]
    labels = np.repeat(np.arange(10), counts)
    after = fa.target_counts(counts, 0.4)
    assert after == [700, 700, 700] + [300] * 7
    sources = fa.copy_sources(labels, after, np.random.default_rng(0))
    grown = np.concatenate([labels, labels[sources]])
    assert fa.uniform_emd(np.bincount(grown, minlength=10)) == pytest.approx(0.4, abs=1e-12)


@pytest.mark.parametrize("target", [0.0, 0.4, 0.8])
def test_ceil_of_l_lands_on_the_target_within_one_sample_per_class(target):
    counts = [523, 417, 301, 44, 9, 3, 2, 1, 1, 1]
    after = fa.target_counts(counts, target)
    k = fa.calculate_level(counts, target).k
    emd = fa.uniform_emd(after)
    assert target - 2 * k / sum(after) <= emd <= target + 1e-12
    assert sum(after) - sum(counts) == pytest.approx(
        sum(counts) / fa.unaltered_ratio(counts, target) - sum(counts), abs=k)


def fedaug_config(*overrides):
    return resolve_config("quickstart", ["data.partitioner=iid", "data.transforms=[fedaug]",
                                         *overrides], check_data=False)


def test_transform_appends_copies_and_keeps_the_originals():
    cfg = fedaug_config("data.fedaug.target-emd=0.05")
    fd = federated_data(cfg)
    plain, aug = fd.client(0), apply_transforms(cfg, fd, 0)
    n = len(plain.y_train)
    assert aug.n_orig == n and aug.epoch_samples == n and len(aug.y_train) == n + aug.n_augmented
    assert torch.equal(aug.x_train[:n], plain.x_train) and torch.equal(aug.y_train[:n],
                                                                       plain.y_train)
    counts = np.bincount(plain.y_train.numpy(), minlength=10).tolist()
    assert np.bincount(aug.y_train.numpy(), minlength=10).tolist() == fa.target_counts(counts,
                                                                                       0.05)
    assert aug.x_test is plain.x_test
    again = apply_transforms(cfg, federated_data(cfg), 0)
    assert torch.equal(again.y_train, aug.y_train)  # seeded


def test_a_client_at_or_below_the_target_is_unchanged():
    cfg = fedaug_config("data.fedaug.target-emd=2.0")
    fd = federated_data(cfg)
    aug = apply_transforms(cfg, fd, 0)
    assert aug.x_train is fd.client(0).x_train and aug.n_augmented == 0
    assert getattr(aug, "augment_rows", None) is None


def test_a_missing_class_is_a_one_line_error_naming_the_sampler_option():
    cfg = resolve_config("quickstart", ["data.partitioner=shards", "data.transforms=[fedaug]"],
                         check_data=False)
    fd = federated_data(cfg)
    with pytest.raises(ConfigError) as err:
        for pid in range(fd.num_clients):
            apply_transforms(cfg, fd, pid)
    assert fa.EVERY_CLASS_OPTION in str(err.value) and "\n" not in str(err.value)


def client_with(data, batch=8, epochs=2):
    torch.manual_seed(0)
    model = build_model("digits-cnn", (1, 8, 8), 10, 2)
    return FedAvgClient(model, data, TrainSettings(epochs, batch, 0.05, 0.9, 0.0, 0), 0)


def test_fair_compute_runs_e_times_ceil_n_orig_over_b_steps_from_the_augmented_set():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(50, 1, 8, 8, generator=g), torch.randint(0, 10, (50,), generator=g)
    client = client_with(ClientData(x, y, x, y, {"epoch_samples": 30, "n_orig": 30}))
    batches = list(client.batch_indices(50, 2, 30))
    assert len(batches) == 2 * 4 and [len(b) for b in batches] == [8] * 6 + [2, 8]
    assert len(torch.unique(torch.cat(batches[:7]))) == 50  # whole passes over all rows
    assert client.num_train_examples() == 30
    plain = client_with(ClientData(x, y, x, y))
    assert len(list(plain.batch_indices(50, 2))) == 2 * 7  # reading (b) / no budget


def test_copies_are_re_augmented_per_batch_and_originals_never():
    cfg = fedaug_config("data.fedaug.target-emd=0.05")
    aug = apply_transforms(cfg, federated_data(cfg), 0)
    n = aug.n_orig
    idx = torch.arange(len(aug.y_train))
    gen = torch.Generator().manual_seed(0)
    first = aug.augment_rows(aug.x_train.clone(), idx, gen)
    second = aug.augment_rows(aug.x_train.clone(), idx, gen)
    assert torch.equal(first[:n], aug.x_train[:n])
    assert not torch.equal(first[n:], second[n:])  # a fresh draw every time
    again = aug.augment_rows(aug.x_train.clone(), idx, torch.Generator().manual_seed(0))
    assert torch.equal(first, again)  # seeded by the client's batch generator
    client = client_with(aug, batch=20, epochs=1)
    assert len(list(client.batch_indices(len(aug.y_train), 1, n))) == -(-n // 20)
    _, num_examples, metrics = client.fit(get_arrays(client.model), {"server-round": 1})
    assert num_examples == n and np.isfinite(metrics["train-loss"])  # copies carry no weight


def batches_trained(client, epochs):
    """The minibatches the client's real training loop draws in `epochs` local epochs."""
    seen, loss = [], client.task_loss(client.model)
    client.sgd_epochs(client.model.parameters(), lambda x, y: seen.append(len(y)) or loss(x, y),
                      epochs)
    return len(seen)


def test_reading_b_trains_e_full_epochs_over_the_enlarged_set():
    """compute=epochs (section 9 item 14 (b)): no step budget, so an epoch covers every row,
    originals and copies; the copies still carry no aggregation weight."""
    cfg = fedaug_config("data.fedaug.target-emd=0.05", "data.fedaug.compute=epochs")
    aug = apply_transforms(cfg, federated_data(cfg), 0)
    n, rows = aug.n_orig, len(aug.y_train)
    assert getattr(aug, "epoch_samples", None) is None and rows > n and aug.n_augmented > 0
    steps_reading = apply_transforms(fedaug_config("data.fedaug.target-emd=0.05"),
                                     federated_data(cfg), 0)
    for data, per_epoch in ((aug, rows), (steps_reading, n)):
        client = client_with(data, batch=20, epochs=2)
        assert client.epoch_examples() == per_epoch and client.num_train_examples() == n
        assert batches_trained(client, epochs=2) == 2 * -(-per_epoch // 20)


def transform_types(transform):
    from torchvision.transforms import v2
    found = []
    for step in transform.transforms:
        inner = step.transforms if isinstance(step, v2.RandomApply) else [step]
        found += [type(t).__name__ for t in inner]
    return found


def test_augmenter_holds_section_5_4_transforms_per_dataset():
    digits = fa.augmenter((1, 28, 28), allow_flip=False)
    rgb = fa.augmenter((3, 32, 32), allow_flip=True)
    assert transform_types(digits) == ["RandomAffine", "RandomPerspective", "_Noise"]
    assert transform_types(rgb) == ["RandomHorizontalFlip", "RandomAffine", "RandomPerspective",
                                    "ColorJitter", "RandomGrayscale", "_Noise"]
    affine = next(t for s in digits.transforms if hasattr(s, "transforms")
                  for t in s.transforms)
    assert list(affine.degrees) == [-20.0, 20.0]
    images = torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8)
    out = fa.rebalance.augment_each(images, digits, seed=3)
    assert out.shape == images.shape and out.dtype == torch.uint8  # grey stays one channel
    assert torch.equal(out, fa.rebalance.augment_each(images, digits, seed=3))
    assert not torch.equal(out, images)
