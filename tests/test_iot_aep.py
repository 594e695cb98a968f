"""AEP (seed 004, UCI Appliances Energy Prediction) on a generated energydata_complete.csv in the
UCI layout: every feature step, the split and the target against an independent computation
(pandas, numpy and scikit-learn in the reference's way, written here), the pool and its
normalization, the cache, the download path and the one-line errors."""

import csv

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.decomposition import PCA
from sklearn.model_selection import train_test_split

from fedapps.data.datasets import Normalizer, check_available, load_pool
from fedapps.data.iot import aep
from fedapps.errors import ConfigError

N_ROWS = 240  # 192 train, 48 test


def write_csv(path, n=N_ROWS, seed=0, rh_group=5):
    """The UCI header and quoting ("date" strings quoted, numbers bare), dates 13h10m apart
    so that day and month vary (Jan 11 to May), and a correlation structure like the real
    house's: t1..t9 (but t6, t8) follow one indoor temperature, t6 and T_out the outdoor
    one, rh_1..rh_{rh_group} one humidity, rv2 = rv1. rh_group=5 leaves exactly 18 features."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    dates = pd.Timestamp("2016-01-11 17:00:00") + pd.to_timedelta(t * 790, unit="min")
    indoor = 20 + 2 * np.sin(t / 9) + rng.normal(0, 0.3, n)
    outdoor = 6 + 5 * np.sin(t / 30) + rng.normal(0, 1, n)
    humidity = 40 + 5 * np.cos(t / 7) + rng.normal(0, 1, n)
    cols = {"date": dates.strftime("%Y-%m-%d %H:%M:%S"),
            "Appliances": rng.integers(1, 60, n) * 10,
            "lights": rng.choice([0, 0, 0, 10, 20, 30], n)}
    for i in range(1, 10):
        room = {6: outdoor, 8: rng.normal(21, 1.5, n)}.get(i, indoor)
        cols[f"T{i}"] = np.round(room + rng.normal(i / 10, 0.2, n), 3)
        rh = humidity + rng.normal(0, 1, n) if i <= rh_group else rng.normal(40, 4, n)
        cols[f"RH_{i}"] = np.round(rh, 4)
    cols["T_out"] = np.round(outdoor + rng.normal(0, 0.5, n), 2)
    cols["Press_mm_hg"] = np.round(755 + rng.normal(0, 6, n), 1)
    cols["RH_out"] = np.round(80 + rng.normal(0, 12, n), 1)
    cols["Windspeed"] = np.round(rng.gamma(2, 2, n), 2)
    cols["Visibility"] = np.round(rng.uniform(1, 66, n), 1)
    # dew point follows T_out on the train rows only: correlated (> 0.85) on the train split,
    # not on all rows, so that the correlation filter's fit on the train split is visible
    dew = np.round(rng.normal(3, 4, n), 2)
    train = aep.split_indices(n)[0]
    dew[train] = np.round(outdoor[train] - 3 + rng.normal(0, 0.5, len(train)), 2)
    cols["Tdewpoint"] = dew
    cols["rv1"] = np.round(rng.uniform(0, 50, n), 6)
    cols["rv2"] = cols["rv1"]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(cols).to_csv(path, index=False, quoting=csv.QUOTE_NONNUMERIC)
    return path


def expected(path):
    """The reference pipeline's train and test inputs, names and targets, recomputed column by
    column with pandas, numpy percentiles, scikit-learn's split and PCA and the pairwise
    correlation loop (independent of the loader's vectorized code)."""
    df = pd.read_csv(path)
    assert df.columns.tolist() == list(aep.COLUMNS)
    df["date"] = pd.to_datetime(df["date"])
    df.columns = [c.lower() for c in df.columns]
    x, y = df.drop(columns="appliances"), df["appliances"]
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=42)
    xtr, xte = xtr.copy(), xte.copy()
    for part in (xtr, xte):
        for c in ("t9", "rv1", "rv2", "windspeed"):
            part[c] = np.log1p(part[c])
        part["visibility"] = np.where(part["visibility"] > 40, 1, 0)
    bounds = {c: (np.percentile(xtr[c], 10), np.percentile(xtr[c], 90)) for c in xtr.columns}
    for part in (xtr, xte):
        for c, (lo, hi) in bounds.items():
            part[c] = np.where(part[c] > hi, hi, np.where(part[c] < lo, lo, part[c]))
        part["avg_house_temp"] = part[[f"t{i}" for i in range(1, 10)]].mean(axis=1)
        part["avg_humidity_percentage"] = part[[f"rh_{i}" for i in range(1, 10)]].mean(axis=1)
        dates = pd.to_datetime(part.pop("date"))
        part["day"], part["month"] = dates.dt.day, dates.dt.month
    pca = PCA(n_components=3, svd_solver="full").fit(xtr)
    parts = [pd.concat([p, pd.DataFrame(pca.transform(p), index=p.index,
                                        columns=["pca_1", "pca_2", "pca_3"])], axis=1)
             for p in (xtr, xte)]
    corr = parts[0].corr()
    dropped = {corr.columns[i] for i in range(len(corr)) for j in range(i)
               if abs(corr.iloc[i, j]) > 0.85}
    names = [c for c in parts[0].columns if c not in dropped]
    return ([p[names].to_numpy(dtype=np.float64) for p in parts], names,
            np.log(np.concatenate([ytr, yte])), bounds)


@pytest.fixture
def fixture_root(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    write_csv(tmp_path / "data" / "aep" / "energydata_complete.csv")
    return tmp_path / "data"


def test_split_is_sklearns_80_20_with_seed_42():
    rows = np.arange(N_ROWS)
    want_train, want_test = train_test_split(rows, test_size=0.2, random_state=42)
    train, test = aep.split_indices(N_ROWS)
    assert train.tolist() == want_train.tolist() and test.tolist() == want_test.tolist()
    assert [len(p) for p in aep.split_indices(19735)] == [15788, 3947]  # the thesis's counts


def test_every_feature_step_matches_an_independent_computation(fixture_root):
    path = fixture_root / "aep" / "energydata_complete.csv"
    (want_train, want_test), names, y, bounds = expected(path)
    got = aep.preprocess(path)
    assert got["names"].tolist() == names
    assert names == ["lights", "t1", "rh_1", "t6", "rh_6", "rh_7", "t8", "rh_8", "rh_9",
                     "press_mm_hg", "rh_out", "windspeed", "visibility", "rv1", "day", "month",
                     "pca_2", "pca_3"]  # 16 of 34 dropped: rv2 (= rv1), tdewpoint (train only)
    assert int(got["num_train"]) == 192 and got["x"].shape == (240, 18)
    np.testing.assert_allclose(got["x"][:192], want_train, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(got["x"][192:], want_test, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(got["y"], y, rtol=1e-6)  # ln(Appliances), train rows first
    # each step leaves its mark: binary visibility, clipped at train percentiles, dates too
    col = {n: got["x"][:, i] for i, n in enumerate(names)}
    assert set(np.unique(col["visibility"])) == {0.0, 1.0}
    assert col["windspeed"].max() == pytest.approx(bounds["windspeed"][1], rel=1e-6)
    assert col["lights"].min() == bounds["lights"][0] and col["lights"].max() == 30
    low, high = (pd.Timestamp(b) for b in bounds["date"])  # the raw dates: Jan 11 to May 21
    month_day = col["month"] * 100 + col["day"]
    assert month_day.min() == low.month * 100 + low.day > 111  # dates clipped before day/month
    assert month_day.max() == high.month * 100 + high.day < 521


def test_pool_is_regression_with_train_statistics(fixture_root):
    pool = load_pool("aep", fixture_root)
    assert pool.x.shape == (240, 18) and pool.x.dtype == torch.float32
    assert pool.task == "regression" and pool.num_classes is None and pool.num_train == 192
    _, _, y, _ = expected(fixture_root / "aep" / "energydata_complete.csv")
    norm = Normalizer.fit(pool)  # the one standardization of inputs and targets
    assert norm.target_mean.item() == pytest.approx(y[:192].mean(), rel=1e-5)
    assert norm.target_std.item() == pytest.approx(y[:192].std(ddof=1), rel=1e-5)
    scaled = norm.inputs(pool.x[:192]).numpy()
    np.testing.assert_allclose(scaled.mean(axis=0), 0, atol=1e-5)


def test_second_load_comes_from_the_cache(fixture_root, monkeypatch):
    first = load_pool("aep", fixture_root)
    calls = []
    monkeypatch.setattr(aep, "read_csv", lambda path: calls.append(path))
    second = load_pool("aep", fixture_root)
    assert calls == [] and torch.equal(first.x, second.x) and torch.equal(first.y, second.y)
    assert first.source == second.source and first.source.startswith("aep-")


def test_missing_data_is_one_line(tmp_path):
    for call in (lambda: load_pool("aep", tmp_path), lambda: check_available("aep", tmp_path,
                                                                              False)):
        with pytest.raises(ConfigError) as err:
            call()
        text = str(err.value)
        assert "\n" not in text and "dataset aep not found" in text
        assert f"{tmp_path}/aep/energydata_complete.csv" in text
        assert "archive.ics.uci.edu/ml/machine-learning-databases/00374" in text
    check_available("aep", tmp_path, True)  # with download the loader fetches it


def test_download_fetches_the_csv(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    source = write_csv(tmp_path / "site" / "energydata_complete.csv")
    monkeypatch.setattr(aep, "URL", source.as_uri())
    pool = load_pool("aep", tmp_path / "data", download=True)
    fetched = tmp_path / "data" / "aep" / "energydata_complete.csv"
    assert fetched.read_bytes() == source.read_bytes() and pool.x.shape == (240, 18)
    assert not list(fetched.parent.glob("*.part"))
    monkeypatch.setattr(aep, "URL", (tmp_path / "gone.csv").as_uri())
    with pytest.raises(ConfigError, match="cannot download .*gone.csv") as err:
        load_pool("aep", tmp_path / "elsewhere", download=True)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("change, message", [
    (lambda p: p.write_text(p.read_text().replace('"Visibility"', '"Vis"')), "UCI header"),
    (lambda p: p.write_text(p.read_text().replace('"2016-01-12 06:10:00"', '"12/01/2016"')),
     "YYYY-MM-DD HH:MM:SS"),
    (lambda p: write_csv(p, rh_group=7), "kept 14 columns"),
    (lambda p: p.write_text(p.read_text().replace('",240,', '",0,')), "energy <= 0"),
])
def test_bad_files_are_one_line_errors(fixture_root, change, message):
    path = fixture_root / "aep" / "energydata_complete.csv"
    change(path)
    with pytest.raises(ConfigError, match=message) as err:
        load_pool("aep", fixture_root)
    assert "\n" not in str(err.value)


def test_correlation_filter_compares_with_dropped_columns_too():
    """b follows a (r 0.89) and c follows b (r 0.91) but not a (r 0.82): the reference drops
    b and also c, because c is compared with every earlier column, b included."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=5000)
    b = a + rng.normal(0, 0.5, 5000)
    c = b + rng.normal(0, 0.5, 5000)
    table = np.column_stack([a, b, c, rng.normal(size=5000)])
    assert aep.correlated_columns(table).tolist() == [False, True, True, False]
