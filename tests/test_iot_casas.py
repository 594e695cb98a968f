"""CASAS (issue 15 item 1): the loader on a small fixture written in the raw CASAS layout (five
homes' event files, Cairo space-separated with spaced activity names, the others tab-separated):
tokens, segments, padding/truncation, label table, split, client ids, cache, missing-data error,
download from a file:// archive."""

import math
import zipfile

import numpy as np
import pytest
from sklearn.model_selection import train_test_split

from fedapps.data.datasets import DATASETS, check_available, load_pool
from fedapps.data.iot import casas
from fedapps.errors import ConfigError

T0 = "2009-06-10 00:00:0"


def ev(sensor, value, note="", sep="\t"):
    """One event line (the timestamp is never used)."""
    return sep.join([f"{T0}1.000001", sensor, value] + ([note] if note else []))


def alternating(n):
    return [ev("M01", "ON" if i % 2 == 0 else "OFF") for i in range(n)]


FIXTURE = {
    "cairo": [  # spaces everywhere, activity names with spaces, a timestamp without fraction
        "2009-06-10 00:00:00.024668 M001 ON",
        "2009-06-10 00:00:01.5 T001 21.50",
        "2009-06-10 00:00:02 M001 OFF R1 wake begin",
        "2009-06-10 00:00:03.1 L001 ON",  # light sensor: dropped
        "2009-06-10 00:00:04.2 M002 ON",
        "2009-06-10 00:00:05.3 M002 OFF R1 wake end",
        "2009-06-10 00:00:06.4 T001 21.5",
        "2009-06-10 00:00:07.5 M001 ON Breakfast begin",
        "2009-06-10 00:00:08.6 T001 22",
        "2009-06-10 00:00:09.7 M001 OFF Breakfast end",
        "2009-06-10 00:00:10.8 M001 ON Lunch begin",  # adjacent Eat: a second sample
        "2009-06-10 00:00:11.9 M001 OFF Lunch end",
        "",
    ],
    "twor.2009": [
        ev("M01", "ON"),
        ev("AD1-A", "0.05", "Meal_Preparation begin"),  # analog sensor: dropped with its note
        ev("M01", "OFF"),
        ev("D01", "OPEN", "Meal_Preparation begin"),
        ev("M02", "ON"),
        ev("D01", "CLOSE", "Meal_Preparation end"),
        ev("M02", "OFF", "Study begin"),
        ev("M02", "ON", "Study end"),
    ],
    "twor.2010": [  # a 2002-event sleep: only its last 2000 events are kept
        ev("D01", "OPEN", "R1_Sleep begin"), ev("D01", "CLOSE"), ev("M02", "ON"),
        *alternating(1998), ev("M01", "ON", "R1_Sleep end"),
        ev("M02", "OFF", "R2_Eating begin"), ev("M02", "ON", "R2_Eating end"),
    ],
    "twor.summer.2009": [  # interleaved: R2_sleep overrides R1_shower; R1's end closes it
        ev("M01", "ON", "R1_shower begin"),
        ev("M02", "ON", "R2_sleep begin"),
        ev("M02", "OFF", "R1_shower end"),
        ev("M01", "OFF"),
        ev("M01", "ON", "Bed_toilet_transition begin"),
        ev("M01", "OFF", "Bed_toilet_transition end"),
    ],
    "milan": [
        ev("T001", "19.0"),
        ev("M003", "ON", "Master_Bathroom begin"),
        ev("T001", "19"),
        ev("M003", "OFF", "Master_Bathroom end"),
        ev("D002", "OPEN", "Kitchen_Activity begin"),
        ev("D002", "CLOSE", "Kitchen_Activity end"),
        ev("M003", "ON", "Eve_Meds begin"),
        ev("M003", "OFF", "Eve_Meds end"),
        ev("E001", "START"),  # not M/D/T: dropped
    ],
}

VOCAB = [  # every (home, sensor, value) of the fixture, sorted; token id = 1 + position
    "cairo\tM001\tOFF", "cairo\tM001\tON", "cairo\tM002\tOFF", "cairo\tM002\tON",
    "cairo\tT001\t21.5", "cairo\tT001\t22.0",
    "milan\tD002\tCLOSE", "milan\tD002\tOPEN", "milan\tM003\tOFF", "milan\tM003\tON",
    "milan\tT001\t19.0",
    "twor.2009\tD01\tCLOSE", "twor.2009\tD01\tOPEN", "twor.2009\tM01\tOFF", "twor.2009\tM01\tON",
    "twor.2009\tM02\tOFF", "twor.2009\tM02\tON",
    "twor.2010\tD01\tCLOSE", "twor.2010\tD01\tOPEN", "twor.2010\tM01\tOFF", "twor.2010\tM01\tON",
    "twor.2010\tM02\tOFF", "twor.2010\tM02\tON",
    "twor.summer.2009\tM01\tOFF", "twor.summer.2009\tM01\tON", "twor.summer.2009\tM02\tOFF",
    "twor.summer.2009\tM02\tON",
]


def tok(home, sensor, value):
    return 1 + VOCAB.index(f"{home}\t{sensor}\t{value}")


def expected_samples():
    """(home index, class name, tokens) per sample in file order, worked out by hand."""
    c = lambda s, v: tok("cairo", s, v)  # noqa: E731
    k9 = lambda s, v: tok("twor.2009", s, v)  # noqa: E731
    k10 = lambda s, v: tok("twor.2010", s, v)  # noqa: E731
    ks = lambda s, v: tok("twor.summer.2009", s, v)  # noqa: E731
    m = lambda s, v: tok("milan", s, v)  # noqa: E731
    sleep = [k10("M02", "ON")] + [k10("M01", "ON" if i % 2 == 0 else "OFF")
                                  for i in range(1998)] + [k10("M01", "ON")]
    return [
        (0, "other", [c("M001", "ON"), c("T001", "21.5")]),
        (0, "other", [c("M001", "OFF"), c("M002", "ON"), c("M002", "OFF")]),  # R1 wake
        (0, "other", [c("T001", "21.5")]),
        (0, "eat", [c("M001", "ON"), c("T001", "22.0"), c("M001", "OFF")]),  # Breakfast
        (0, "eat", [c("M001", "ON"), c("M001", "OFF")]),  # Lunch
        (1, "other", [k9("M01", "ON"), k9("M01", "OFF")]),
        (1, "cook", [k9("D01", "OPEN"), k9("M02", "ON"), k9("D01", "CLOSE")]),
        (1, "other", [k9("M02", "OFF"), k9("M02", "ON")]),  # Study
        (2, "sleep", sleep),
        (2, "eat", [k10("M02", "OFF"), k10("M02", "ON")]),
        (3, "bathing", [ks("M01", "ON")]),
        (3, "sleep", [ks("M02", "ON"), ks("M02", "OFF")]),
        (3, "other", [ks("M01", "OFF")]),
        (3, "other", [ks("M01", "ON"), ks("M01", "OFF")]),  # Bed_toilet_transition
        (4, "other", [m("T001", "19.0")]),
        (4, "bathing", [m("M003", "ON"), m("T001", "19.0"), m("M003", "OFF")]),
        (4, "cook", [m("D002", "OPEN"), m("D002", "CLOSE")]),
        (4, "take_medicine", [m("M003", "ON"), m("M003", "OFF")]),
    ]


def write_fixture(root, fixture=FIXTURE):
    for home, rel in casas.HOMES.items():
        path = root / "casas" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(fixture[home]) + "\n")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))


def unsplit(a, n):
    """Pooled file order from the loader's train-then-test order (the reference's split)."""
    order = np.concatenate(train_test_split(np.arange(n), test_size=0.2, random_state=42))
    out = np.empty_like(a)
    out[order] = a
    return out


def test_tokens_segments_labels_split_and_client_ids(tmp_path, cache):
    write_fixture(tmp_path)
    pool = load_pool("casas", tmp_path)
    want = expected_samples()
    n = len(want)
    assert pool.x.shape == (n, 2000) and str(pool.x.dtype) == "torch.int64"
    assert pool.num_classes == 12 and pool.normalization == "none"
    assert pool.num_train == n - math.ceil(0.2 * n) == 14
    arrays, _ = casas.casas_arrays(tmp_path)
    assert arrays["vocab"].tolist() == VOCAB
    x = unsplit(pool.x.numpy(), n)
    y = unsplit(pool.y.numpy(), n)
    homes = unsplit(pool.client_ids, n)
    for i, (home, label, tokens) in enumerate(want):
        assert homes[i] == home, i
        assert casas.CLASSES[y[i]] == label, i
        row = np.zeros(2000, dtype=np.int64)
        row[2000 - len(tokens):] = tokens  # left-padded with 0, last 2000 events kept
        assert np.array_equal(x[i], row), i
    assert tok("twor.2010", "D01", "OPEN") not in x[8]  # the first 2 of 2002 events cut


def test_registration_and_class_table():
    info = DATASETS["casas"]
    assert (info.num_classes, info.shape, info.vocab_size, info.normalization) == \
        (12, (2000,), 2000, "none")
    assert info.has_client_ids and info.downloadable
    for home, table in casas.ACTIVITIES.items():  # every category a class; "" is Other
        assert set(table) <= set(casas.CLASSES) and "" in table["other"], home
    assert len(set(casas.CLASSES) - {"other"}) == 11


def test_second_load_comes_from_the_cache(tmp_path, cache, monkeypatch):
    write_fixture(tmp_path)
    calls = []
    real = casas.read_events
    monkeypatch.setattr(casas, "read_events", lambda path: calls.append(path) or real(path))
    first = casas.load(tmp_path, False)
    assert len(calls) == 5
    second = casas.load(tmp_path, False)
    assert len(calls) == 5  # no raw file read again
    assert np.array_equal(first.x.numpy(), second.x.numpy())
    assert np.array_equal(first.client_ids, second.client_ids)
    milan = tmp_path / "casas" / "milan" / "data"
    milan.write_text(milan.read_text() + ev("M003", "ON") + "\n")  # a changed copy: rebuilt
    third = casas.load(tmp_path, False)
    assert len(calls) == 10 and len(third) == len(first) + 1


def test_missing_data_is_one_line(tmp_path, cache):
    for call in (lambda: check_available("casas", tmp_path, False),
                 lambda: casas.load(tmp_path, False)):
        with pytest.raises(ConfigError) as err:
            call()
        text = str(err.value)
        assert "\n" not in text and "dataset casas not found" in text
        assert "twor.summer.2009/annotated" in text and "casas.wsu.edu/datasets" in text


def test_unknown_activity_is_one_line(tmp_path, cache):
    fixture = dict(FIXTURE, milan=FIXTURE["milan"] + [ev("M003", "ON", "Yoga begin")])
    write_fixture(tmp_path, fixture)
    with pytest.raises(ConfigError, match=r"milan/data has activities the label table does "
                                          r"not know: Yoga$"):
        casas.load(tmp_path, False)


def test_download_fetches_every_home_archive(tmp_path, cache, monkeypatch):
    write_fixture(tmp_path / "direct")
    server = tmp_path / "server"
    server.mkdir()
    for home, rel in casas.HOMES.items():  # one archive per home, unpacking to <home>/<file>
        with zipfile.ZipFile(server / f"{home}.zip", "w") as z:
            z.write(tmp_path / "direct" / "casas" / rel, rel)
    monkeypatch.setattr(casas, "BASE_URL", server.as_uri() + "/")
    check_available("casas", tmp_path / "fetched", True)  # download=true: no missing error
    fetched = load_pool("casas", tmp_path / "fetched", download=True)
    direct = load_pool("casas", tmp_path / "direct")
    assert np.array_equal(fetched.x.numpy(), direct.x.numpy())
    assert np.array_equal(fetched.y.numpy(), direct.y.numpy())
    (server / "milan.zip").unlink()
    with pytest.raises(ConfigError, match=r"^dataset casas: cannot download .*milan\.zip"):
        load_pool("casas", tmp_path / "empty", download=True)


@pytest.mark.parametrize("milan, message", [
    ([ev("M003", "ON", " ".join(["word"] * 13))], r"cannot read .*milan/data .*at most 16 fields"),
    ([ev("M003", "ON"), ev("M003", "OFF", " ".join(["word"] * 13))], r"cannot read .*at most 16"),
    ([ev("E001", "START")], r"milan/data has no motion, door or temperature events$"),
])
def test_unreadable_home_file_is_one_line(tmp_path, cache, milan, message):
    write_fixture(tmp_path, dict(FIXTURE, milan=milan))
    with pytest.raises(ConfigError, match=message) as err:
        casas.load(tmp_path, False)
    assert "\n" not in str(err.value)
