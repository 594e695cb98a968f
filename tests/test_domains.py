"""Domain-shift sources (seed 003 item 8): the image-folder loader on generated fixtures in the
Office-31 and the thesis's one-folder-per-source layouts, the one-line error for missing data,
and the offline proxy (fixed transform per domain, each domain one natural client)."""

import numpy as np
import pytest
import torch
from PIL import Image

from fedapps.data.datasets import Pool
from fedapps.data.domains import DOMAIN_SHIFTS, domain_shift_pool, load_image_folders
from fedapps.errors import ConfigError

COLORS = {("amazon", "bike"): (250, 0, 0), ("amazon", "mug"): (0, 250, 0),
          ("webcam", "bike"): (0, 0, 250), ("webcam", "mug"): (250, 250, 0)}


def make_fixture(root, inner):
    """2 domains x 2 classes x 2 solid-color JPEGs (of different sizes) under `inner`."""
    for (domain, cls), color in COLORS.items():
        folder = root / domain / inner / cls if inner else root / domain / cls
        folder.mkdir(parents=True)
        for i, size in enumerate([(20, 12), (9, 15)]):
            Image.new("RGB", size, color).save(folder / f"{i}.jpg", quality=95)


@pytest.mark.parametrize("name, folder, inner", [("office31", "office31", "images"),
                                                 ("commercial", "commercial-sources", "")])
def test_image_folders_give_labels_domains_and_pixels(tmp_path, monkeypatch, name, folder,
                                                      inner):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    make_fixture(tmp_path / folder, inner)
    pool = load_image_folders(name, tmp_path, size=8)
    assert pool.x.shape == (8, 3, 8, 8) and pool.x.dtype == torch.uint8
    assert pool.num_classes == 2 and pool.num_train == 8
    assert pool.y.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]  # bike, mug (sorted) per domain
    assert pool.client_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]  # amazon, webcam
    for i, key in enumerate([("amazon", "bike"), ("amazon", "mug"), ("webcam", "bike"),
                             ("webcam", "mug")]):
        for row in (2 * i, 2 * i + 1):
            mean = pool.x[row].float().mean(dim=(1, 2)).numpy()
            assert np.allclose(mean, COLORS[key], atol=4), (key, mean)
    again = load_image_folders(name, tmp_path, size=8)  # from the .npz cache
    assert torch.equal(again.x, pool.x) and len(list((tmp_path / "cache").rglob("*.npz"))) == 1
    with pytest.raises(ConfigError, match="2 class folders .* expected 31"):
        load_image_folders(name, tmp_path, size=8, num_classes=31)


def test_missing_image_folders_are_one_line_naming_the_layout(tmp_path):
    from fedapps.data.datasets import check_available

    with pytest.raises(ConfigError) as err:
        check_available("office31", tmp_path, False)
    text = str(err.value)
    assert "\n" not in text
    assert f"{tmp_path}/office31/<domain>/images/<class>/*.jpg" in text and "Office-31" in text
    with pytest.raises(ConfigError, match="commercial-sources/<domain>/<class>/"):
        check_available("commercial", tmp_path, False)


def test_proxy_applies_one_fixed_transform_per_domain():
    x = torch.from_numpy(np.random.default_rng(5).integers(0, 256, (80, 1, 6, 6), np.uint8))
    y = torch.arange(80) % 10
    base = Pool(x, y, 60, 10)
    pool = domain_shift_pool(base)
    ids = pool.client_ids
    assert np.bincount(ids).tolist() == [10] * 8 and torch.equal(pool.y, y)
    assert pool.num_train == 60
    names = list(DOMAIN_SHIFTS)
    orig, new = x.numpy(), pool.x.numpy()
    for d, name in enumerate(names):
        rows = ids == d
        expected = {"plain": orig[rows], "inverted": 255 - orig[rows],
                    "rot90": np.rot90(orig[rows], 1, axes=(2, 3)),
                    "rot180": orig[rows][:, :, ::-1, ::-1],
                    "low-contrast": 64 + orig[rows] // 2}.get(name)
        if expected is not None:
            assert np.array_equal(new[rows], expected), name
    blur_row = np.flatnonzero(ids == names.index("blur"))[0]
    p = np.pad(orig[blur_row, 0].astype(float), 1, mode="edge")
    assert new[blur_row, 0, 2, 3] == round(p[2:5, 3:6].mean())  # 3x3 mean around (2, 3)
    assert np.array_equal(domain_shift_pool(base).x.numpy(), new)  # fixed, not random


def test_proxy_domains_are_the_natural_clients():
    from fedapps.config import load_config
    from fedapps.data import DATASETS, federated_data
    from fedapps.validation import validate

    cfg = load_config("quickstart", ["dataset=digits-domains", "data.partitioner=natural",
                                     "federation.num-clients=8", "data.test-fraction=0.2"])
    validate(cfg)
    fd = federated_data(cfg)
    ids = domain_shift_pool(Pool(torch.zeros(1797, 1, 8, 8, dtype=torch.uint8),
                                 torch.zeros(1797, dtype=torch.int64), 1500, 10)).client_ids
    for pid in range(8):
        rows = np.concatenate([fd.train_idx[pid], fd.test_idx[pid]])
        assert set(ids[rows]) == {pid}
        assert len(fd.test_idx[pid]) == pytest.approx(0.2 * len(rows), abs=6)
    assert DATASETS["digits-domains"].has_client_ids
