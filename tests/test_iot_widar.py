"""Widar3.0 BVP (issue 15 item 1) on a fixture in SenseFi's layout (the one the FedAIoT reference
downloads): Widardata/{train,test}/<k>-<gesture>/user<u>-*.csv, 22 rows x 400 values each."""

import zipfile

import numpy as np
import pytest

from fedapps.data.datasets import DATASETS, check_available, load_pool
from fedapps.data.iot import widar
from fedapps.errors import ConfigError

# (SenseFi folder, gesture folder, user, repetition); 1, 4 and 20 are kept (labels 0, 1, 8),
# 2 and 22 are not. Samples per user over all gestures: u1 5, u2 2, u3 3, u4 4, u5 4, u6 2, so
# the ranks are u2, u6 (tie: lower user first), u3, u4, u5 (tie), u1: u2, u6, u3, u4 test and
# u5, u1 train. Counting only the kept gestures (u1 1, u6 1, u2 2, u3 3, u4 4, u5 4) or
# breaking the u4/u5 tie the other way would train u4.
FILES = [
    ("train", "1-Push&Pull", 1, 1), *[("train", "2-Sweep", 1, r) for r in range(1, 5)],
    ("train", "4-Slide", 2, 1), ("test", "20-Draw-8", 2, 1),
    ("train", "1-Push&Pull", 3, 1), ("train", "4-Slide", 3, 1), ("test", "20-Draw-8", 3, 1),
    ("train", "1-Push&Pull", 4, 1), ("train", "1-Push&Pull", 4, 2), ("train", "4-Slide", 4, 1),
    ("train", "20-Draw-8", 4, 1),
    ("train", "1-Push&Pull", 5, 1), ("train", "4-Slide", 5, 1), ("test", "4-Slide", 5, 2),
    ("train", "20-Draw-8", 5, 1),
    ("test", "1-Push&Pull", 6, 1), ("train", "22-Draw-10", 6, 1),
]
LABEL = {"1-Push&Pull": 0, "4-Slide": 1, "20-Draw-8": 8}


def make_fixture(root):
    """The FILES as SenseFi writes them, random values; {(user, label): [values, ...]}."""
    rng = np.random.default_rng(0)
    samples = {}
    for split, gesture, user, rep in FILES:
        folder = root / "widar" / "Widardata" / split / gesture
        folder.mkdir(parents=True, exist_ok=True)
        k = gesture.split("-")[0]
        values = rng.normal(0.0025, 0.0119, size=(22, 400))
        np.savetxt(folder / f"user{user}-{k}-1-1-{rep}-1-1e-07-100-20-100000-L0.csv", values,
                   delimiter=",")
        if gesture in LABEL:
            samples.setdefault((user, LABEL[gesture]), []).append(values)
    return samples


def test_kept_gestures_scaled_bvp_and_the_split_by_user_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    samples = make_fixture(tmp_path)
    pool = load_pool("widar", tmp_path)
    assert pool.x.shape == (15, 22, 20, 20) and str(pool.x.dtype) == "torch.float32"
    assert pool.num_classes == 9 and pool.normalization == "none" and pool.num_train == 5
    users = pool.client_ids.tolist()
    assert sorted(users[:5]) == [1, 5, 5, 5, 5] and sorted(users[5:]) == [2, 2, 3, 3, 3, 4, 4,
                                                                          4, 4, 6]
    pairs = sorted(zip(users, pool.y.tolist(), strict=True))
    assert pairs == sorted((u, label) for (u, label), v in samples.items() for _ in v)
    x = pool.x.numpy()
    for row, (user, label) in enumerate(zip(users, pool.y.tolist(), strict=True)):
        # the row is one of the files of its (user, gesture); value [t, a, b] = file[t, 20a + b]
        candidates = [v for v in samples[(user, label)]
                      if abs((v[0, 0] - 0.0025) / 0.0119 - x[row, 0, 0, 0]) < 1e-4]
        assert len(candidates) == 1, (row, user, label)
        raw = candidates[0]
        for t, a, b in [(0, 0, 0), (5, 3, 7), (21, 19, 19), (10, 0, 19)]:
            assert x[row, t, a, b] == pytest.approx((raw[t, 20 * a + b] - 0.0025) / 0.0119,
                                                    abs=1e-4)


def test_held_out_users_follow_the_reference_ranks():
    # 17 users with user u having 100 - u samples: ascending ranks are u17, u16, ..., u1, so
    # ranks 0-3 are u17..u14 and rank 15 is u2 (the second largest)
    assert widar.held_out_users({u: 100 - u for u in range(1, 18)}) == {17, 16, 15, 14, 2}
    # an 18th user ranks 17, which the reference's train list (ranks 4-14 and 16) leaves out
    assert widar.held_out_users({u: 100 - u for u in range(1, 19)}) == {18, 17, 16, 15, 3, 1}
    # a tie across the boundary: user 3 ranks before user 7, so 3 is held out and 7 trains
    assert widar.held_out_users({7: 5, 3: 5, 9: 1, 4: 2, 8: 3}) == {9, 4, 8, 3}


def test_second_load_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    make_fixture(tmp_path)
    calls = []
    read = widar.read_arrays
    monkeypatch.setattr(widar, "read_arrays", lambda files: calls.append(1) or read(files))
    first = widar.load(tmp_path, False)
    second = widar.load(tmp_path, False)
    assert len(calls) == 1 and np.array_equal(first.x.numpy(), second.x.numpy())
    assert np.array_equal(first.client_ids, second.client_ids)
    (tmp_path / "widar/Widardata/train/2-Sweep/user1-2-1-1-1-1-1e-07-100-20-100000-L0.csv").unlink()
    third = widar.load(tmp_path, False)  # u1 now has 4 samples: ranks u2 u6 u3 u1 | u4 u5
    assert len(calls) == 2 and third.source != first.source
    assert third.num_train == 8 and sorted(set(third.client_ids[:8].tolist())) == [4, 5]


def test_missing_data_and_bad_files_are_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        check_available("widar", tmp_path, False)
    text = str(err.value)
    assert "\n" not in text and "dataset widar not found" in text
    assert f"{tmp_path}/widar/Widardata/{{train,test}}/<k>-<gesture>/user<u>-*.csv" in text
    assert widar.DRIVE_ID in text
    make_fixture(tmp_path)
    folder = tmp_path / "widar" / "Widardata" / "train" / "1-Push&Pull"
    np.savetxt(folder / "user1-1-1-1-1-1-1e-07-100-20-100000-L0.csv", np.zeros((22, 399)),
               delimiter=",")
    with pytest.raises(ConfigError, match=r"holds \(22, 399\) values, expected 22x400"):
        widar.load(tmp_path, False)
    (folder / "user1-1-1-1-1-1-1e-07-100-20-100000-L0.csv").write_text("0,x\n")
    with pytest.raises(ConfigError, match="L0.csv is no csv of numbers") as err:
        widar.load(tmp_path, False)
    assert "\n" not in str(err.value)
    (folder / "sample1.csv").write_text("0\n")
    with pytest.raises(ConfigError, match="sample1.csv does not follow"):
        widar.load(tmp_path, False)
    for f in sorted((tmp_path / "widar").rglob("user[15]-*.csv")):  # only test users are left
        f.unlink()
    (folder / "sample1.csv").unlink()
    with pytest.raises(ConfigError, match="no training user has samples"):
        widar.load(tmp_path, False)


def test_download_unpacks_the_archive_into_the_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "source"
    make_fixture(source)
    archive = tmp_path / "Widardata.zip"
    with zipfile.ZipFile(archive, "w") as z:  # the archive holds Widardata/...
        for f in (source / "widar").rglob("*.csv"):
            z.write(f, f.relative_to(source / "widar"))
    monkeypatch.setattr(widar, "google_drive_url",
                        lambda file_id: archive.as_uri() if file_id == widar.DRIVE_ID else "")
    pool = DATASETS["widar"].loader(tmp_path / "root", True)
    assert len(pool) == 15 and pool.num_train == 5
