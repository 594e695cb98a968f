"""WISDM-W / WISDM-P loader on a small fixture written in the release's raw layout.

Expected windows are computed here independently (timestamp dictionaries, not a pandas merge)
from the rows the fixture wrote, so a wrong join, class map, window rule, split or statistic
shows up as a value mismatch."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedapps.data import check_available
from fedapps.data.datasets import load_pool
from fedapps.data.iot import wisdm
from fedapps.errors import ConfigError

# subject -> activity runs (code, matched rows); 1602 is one of wisdm.TEST_SUBJECTS
RUNS = {
    1600: [("A", 500), ("H", 400), ("I", 420), ("M", 450), ("S", 399)],
    1601: [("B", 400), ("L", 610)],
    1602: [("A", 400), ("K", 500)],
    1603: [("C", 400)],  # a train subject after the test subject: still in the train split
}
STEP_NS = 50_000_000  # 20 Hz


def sensor_rows(subject: int, device: str) -> tuple[dict, dict]:
    """{timestamp: (code, xyz)} for the accelerometer and the gyroscope of one subject: every
    run's rows at shared timestamps, plus accelerometer-only (+1 ns) and gyroscope-only (+2 ns)
    timestamps that the join must drop. Test-subject values are offset by 5, so statistics
    that included them would differ."""
    rng = np.random.default_rng([subject, len(device)])
    shift = 5.0 if subject in wisdm.TEST_SUBJECTS else 0.0
    acc, gyr = {}, {}
    t = 10**12 * subject
    for code, n in RUNS[subject]:
        for k in range(n):
            acc[t] = (code, np.round(rng.normal([0, 9, 1], [2, 3, 1]) + shift, 4))
            gyr[t] = (code, np.round(rng.normal([0, 0, 0], [1, 2, 0.5]) + shift, 4))
            if k % 97 == 5:
                acc[t + 1] = (code, np.round(rng.normal(size=3) + 50, 4))
                gyr[t + 2] = (code, np.round(rng.normal(size=3) - 50, 4))
            t += STEP_NS
    return acc, gyr


def write_subject(root: Path, subject: int, device: str) -> tuple[dict, dict]:
    acc, gyr = sensor_rows(subject, device)
    for sensor, rows in (("accel", acc), ("gyro", gyr)):
        folder = root / wisdm.FOLDER / "raw" / device / sensor
        folder.mkdir(parents=True, exist_ok=True)
        lines = [f"{subject},{c},{t},{v[0]:.4f},{v[1]:.4f},{v[2]:.4f};"
                 for t, (c, v) in rows.items()]
        if sensor == "accel":  # out of time order, plus a row with a missing field (dropped)
            lines = lines[::-1] + [f"{subject},A,{min(gyr)},,1.0,2.0;"]
        (folder / f"data_{subject}_{sensor}_{device}.txt").write_text("\n".join(lines) + "\n")
    return acc, gyr


def write_fixture(root: Path, device: str = "watch") -> dict[int, tuple[dict, dict]]:
    return {s: write_subject(root, s, device) for s in RUNS}


def expected(rows: dict[int, tuple[dict, dict]]):
    """Windows (unnormalized), labels, subjects, and the train rows' mean and std."""
    runs, train_rows = [], []
    for subject in sorted(rows, key=lambda s: (s in wisdm.TEST_SUBJECTS, s)):
        acc, gyr = rows[subject]
        joined = [(acc[t][0], np.concatenate([acc[t][1], gyr[t][1]]))
                  for t in sorted(set(acc) & set(gyr))]
        kept = [(c, v) for c, v in joined if c not in "MOP"]
        if subject not in wisdm.TEST_SUBJECTS:
            train_rows += [v for _, v in kept]
        for code in sorted({c for c, _ in kept}):
            series = np.array([v for c, v in kept if c == code])
            runs.append((subject, code, series))
    stats = np.array(train_rows, dtype=np.float32).astype(np.float64)
    mean, std = stats.mean(axis=0), stats.std(axis=0, ddof=1)
    windows, labels, subjects = [], [], []
    for subject, code, series in runs:
        start = 200
        while start + 200 <= len(series):
            windows.append(series[start:start + 200])
            labels.append(wisdm.CODE_TO_CLASS[code])
            subjects.append(subject)
            start += 100
    return np.array(windows), np.array(labels), np.array(subjects), mean, std


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))


def test_windows_labels_split_and_statistics(tmp_path):
    rows = write_fixture(tmp_path / "data")
    pool = load_pool("wisdm-w", tmp_path / "data")
    windows, labels, subjects, mean, std = expected(rows)
    # by hand: 1600 A 2 (starts 200, 300), H 1, I 1 (eating runs apart), M dropped, S 399 rows: 0;
    # 1601 B 1, L 3; 1603 C 1; test subject 1602 last: A 1, K 2
    assert pool.y.tolist() == [0, 0, 7, 7, 1, 7, 7, 7, 2, 0, 8, 8] == labels.tolist()
    assert pool.client_ids.tolist() == [1600] * 4 + [1601] * 4 + [1603] + [1602] * 3
    assert subjects.tolist() == pool.client_ids.tolist()
    assert pool.num_train == 9 and pool.num_classes == 12 and pool.normalization == "none"
    assert tuple(pool.x.shape) == (12, 200, 6) and pool.x.dtype == torch.float32
    x = pool.x.numpy().astype(np.float64)
    np.testing.assert_allclose(x, (windows.astype(np.float32) - mean) / std, atol=2e-5)
    np.testing.assert_allclose(x * std + mean, windows, atol=1e-3)  # the rows written
    # first window: accelerometer then gyroscope of 1600's rows 200..399 of walking
    acc, gyr = rows[1600]
    t200 = sorted(set(acc) & set(gyr))[200]
    np.testing.assert_allclose(x[0, 0] * std + mean,
                               np.concatenate([acc[t200][1], gyr[t200][1]]), atol=1e-4)


def test_phone_is_its_own_dataset(tmp_path):
    root = tmp_path / "data"
    rows = {s: write_subject(root, s, "phone") for s in (1600, 1602)}
    with pytest.raises(ConfigError):  # the watch folder is empty
        load_pool("wisdm-w", root)
    pool = load_pool("wisdm-p", root)
    windows, labels, _, mean, std = expected(rows)
    assert pool.client_ids.tolist() == [1600] * 4 + [1602] * 3 and pool.num_train == 4
    np.testing.assert_allclose(pool.x.numpy(), (windows.astype(np.float32) - mean) / std,
                               atol=2e-5)


def test_second_load_reads_the_cache(tmp_path, monkeypatch):
    write_fixture(tmp_path / "data")
    first = load_pool("wisdm-w", tmp_path / "data")
    reads = []
    real = wisdm.read_sensor
    monkeypatch.setattr(wisdm, "read_sensor", lambda p: reads.append(p) or real(p))
    second = load_pool("wisdm-w", tmp_path / "data")
    assert reads == [] and bool((second.x == first.x).all())
    assert second.source == first.source
    (tmp_path / "data" / wisdm.FOLDER / "raw" / "watch" / "gyro" /
     "data_1601_gyro_watch.txt").write_text("1601,B,1,0.0,0.0,0.0;\n")
    third = load_pool("wisdm-w", tmp_path / "data")  # changed raw file: read again
    assert len(reads) == 8 and third.source != first.source and 1601 not in third.client_ids


def test_missing_data_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        check_available("wisdm-p", tmp_path, False)
    text = str(err.value)
    assert "\n" not in text and "dataset wisdm-p not found" in text
    assert "wisdm-dataset/raw/phone/{accel,gyro}/data_<subject>_{accel,gyro}_phone.txt" in text
    assert "UCI 507" in text and wisdm.URL in text
    check_available("wisdm-p", tmp_path, True)  # the loader downloads: no error before it
    write_subject(tmp_path, 1600, "phone")
    (tmp_path / wisdm.FOLDER / "raw" / "phone" / "gyro" / "data_1600_gyro_phone.txt").unlink()
    with pytest.raises(ConfigError, match="data_1600_accel_phone.txt has no gyroscope partner"):
        load_pool("wisdm-p", tmp_path)
    gyro = tmp_path / wisdm.FOLDER / "raw" / "phone" / "gyro" / "data_1600_gyro_phone.txt"
    gyro.write_text("1600,A,1,0.5,abc,0.1;\n")
    with pytest.raises(ConfigError) as err:
        load_pool("wisdm-p", tmp_path)
    assert "\n" not in str(err.value) and f"cannot read {gyro}" in str(err.value)


def test_download_unpacks_the_nested_release_zip(tmp_path, monkeypatch):
    src = tmp_path / "src"
    rows = write_fixture(src)
    inner = tmp_path / "wisdm-dataset.zip"
    with zipfile.ZipFile(inner, "w") as z:
        for f in sorted((src / wisdm.FOLDER).rglob("*.txt")):
            z.write(f, f.relative_to(src).as_posix())
    outer = tmp_path / "wisdm+smartphone+and+smartwatch+activity+and+biometrics+dataset.zip"
    with zipfile.ZipFile(outer, "w") as z:
        z.write(inner, inner.name)
    monkeypatch.setattr(wisdm, "URL", outer.as_uri())
    root = tmp_path / "root"
    pool = load_pool("wisdm-w", root, download=True)
    assert (root / wisdm.FOLDER / "raw" / "watch" / "accel" / "data_1600_accel_watch.txt").is_file()
    assert pool.y.tolist() == expected(rows)[1].tolist()
    monkeypatch.setattr(wisdm, "URL", (tmp_path / "absent.zip").as_uri())
    with pytest.raises(ConfigError, match="fetching .*absent.zip .*failed"):
        load_pool("wisdm-w", tmp_path / "empty", download=True)
