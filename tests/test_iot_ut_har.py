"""UT-HAR (issue 15 item 1) on a fixture in SenseFi's layout (the one the FedAIoT reference
downloads): .npy arrays named X_*.csv / y_*.csv, windows [250 packets, 90 amplitudes]."""

import os
import zipfile

import numpy as np
import pytest

from fedapps.data.datasets import DATASETS, check_available, load_pool
from fedapps.data.iot import ut_har
from fedapps.errors import ConfigError

LABELS = {"train": [0, 3, 6], "val": [1, 1], "test": [2, 5]}
RANGES = {"train": (-40.0, 10.0), "val": (500.0, 600.0), "test": (100.0, 300.0)}


def make_fixture(root):
    """Three splits of random windows, each split in its own value range; the arrays."""
    rng = np.random.default_rng(0)
    data, label = root / "ut-har" / "UT_HAR" / "data", root / "ut-har" / "UT_HAR" / "label"
    data.mkdir(parents=True)
    label.mkdir(parents=True)
    arrays = {}
    for split, ys in LABELS.items():
        x = rng.uniform(*RANGES[split], size=(len(ys), 250, 90))
        with open(data / f"X_{split}.csv", "wb") as f:  # .npy content under a .csv name
            np.save(f, x)
        with open(label / f"y_{split}.csv", "wb") as f:
            np.save(f, np.array(ys, dtype=np.float64))
        arrays[split] = x
    return arrays


def test_windows_are_pair_subcarrier_packet_amplitudes_scaled_per_split(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    raw = make_fixture(tmp_path)
    pool = load_pool("ut-har", tmp_path)
    assert pool.x.shape == (5, 3, 30, 250) and str(pool.x.dtype) == "torch.float32"
    assert pool.num_train == 3 and pool.num_classes == 7 and pool.normalization == "none"
    assert pool.y.tolist() == [0, 3, 6, 2, 5]  # train, then test; val is not used
    assert pool.client_ids is None
    x = pool.x.numpy()
    for row, split, n in [(0, "train", 0), (2, "train", 2), (3, "test", 0), (4, "test", 1)]:
        lo, hi = raw[split].min(), raw[split].max()  # each split's own min and max
        for pair, sub, packet in [(0, 0, 0), (1, 4, 17), (2, 29, 249), (2, 5, 100)]:
            want = (raw[split][n, packet, 30 * pair + sub] - lo) / (hi - lo)
            assert x[row, pair, sub, packet] == pytest.approx(want, abs=1e-6)
    assert x[:3].min() == 0 and x[:3].max() == pytest.approx(1, abs=1e-6)
    assert x[3:].min() == 0 and x[3:].max() == pytest.approx(1, abs=1e-6)


def test_second_load_reads_the_cache_and_a_changed_file_is_read_again(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    make_fixture(tmp_path)
    calls = []
    read = ut_har.read_arrays
    monkeypatch.setattr(ut_har, "read_arrays", lambda root: calls.append(root) or read(root))
    first = ut_har.load(tmp_path, False)
    second = ut_har.load(tmp_path, False)
    assert len(calls) == 1 and np.array_equal(first.x.numpy(), second.x.numpy())
    assert first.source == second.source
    with open(tmp_path / "ut-har/UT_HAR/label/y_test.csv", "wb") as f:
        np.save(f, np.array([4.0, 4.0]))
    os.utime(tmp_path / "ut-har/UT_HAR/label/y_test.csv", ns=(10**9, 10**9))  # surely new
    third = ut_har.load(tmp_path, False)
    assert len(calls) == 2 and third.y.tolist() == [0, 3, 6, 4, 4]
    assert third.source != first.source


def test_missing_data_is_one_line_naming_layout_and_source(tmp_path):
    with pytest.raises(ConfigError) as err:
        check_available("ut-har", tmp_path, False)
    text = str(err.value)
    assert "\n" not in text and "dataset ut-har not found" in text
    assert f"{tmp_path}/ut-har/UT_HAR/{{data/X,label/y}}_{{train,test}}.csv" in text
    assert ut_har.DRIVE_ID in text and "WiFi-CSI-Sensing-Benchmark" in text
    check_available("ut-har", tmp_path, True)  # with download the loader fetches first
    for split in ("train", "test"):
        for name in ut_har.split_files(split):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text("1,2,3\n")  # a text csv, not SenseFi's .npy
    with pytest.raises(ConfigError, match=r"X_train.csv is not a NumPy array file") as err:
        ut_har.read_arrays(tmp_path)
    assert "\n" not in str(err.value)
    for split in ("train", "test"):
        for name in ut_har.split_files(split):
            with open(tmp_path / name, "wb") as f:
                np.save(f, np.zeros((2, 250, 30)))
    with pytest.raises(ConfigError, match=r"X_train has shape \(2, 250, 30\)"):
        ut_har.read_arrays(tmp_path)


def test_download_unpacks_the_archive_into_the_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "source"
    make_fixture(source)
    archive = tmp_path / "UT_HAR.zip"
    with zipfile.ZipFile(archive, "w") as z:  # the archive holds UT_HAR/{data,label}/...
        for f in (source / "ut-har").rglob("*.csv"):
            z.write(f, f.relative_to(source / "ut-har"))
    urls = []
    monkeypatch.setattr(ut_har, "google_drive_url",
                        lambda file_id: urls.append(file_id) or archive.as_uri())
    root = tmp_path / "root"
    pool = DATASETS["ut-har"].loader(root, True)
    assert urls == [ut_har.DRIVE_ID] and pool.y.tolist() == [0, 3, 6, 2, 5]
    assert (root / "ut-har" / "UT_HAR.zip").is_file()
    monkeypatch.setattr(ut_har, "google_drive_url", lambda _: (tmp_path / "none.zip").as_uri())
    with pytest.raises(ConfigError, match="data.download: fetching .*none.zip") as err:
        ut_har.load(tmp_path / "empty", True)
    assert "\n" not in str(err.value)
