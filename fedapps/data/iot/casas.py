"""CASAS smart homes (seed 004 s.2, following Liciotti et al. 2019): recognise the activity
of daily living from the sequence of sensor activations recorded while it went on.

Raw layout under the data root: the WSU CASAS archives unpacked into `casas/`, the files the
FedAIoT reference reads (datasets/casas/download.py):
    casas/cairo/data  casas/twor.2009/data  casas/twor.2010/data
    casas/twor.summer.2009/annotated  casas/milan/data
one event per line, `date time sensor value [annotation]`, whitespace-separated (Cairo's activity
names contain spaces), the annotation being `<activity> begin` or `<activity> end`. The thesis's
"Kyoto2, Kyoto3, Kyoto4" are the three two-resident Kyoto homes the reference reads (twor.*;
deep-casas names them kyoto7, kyoto8, kyoto11): its label tables fit only those files.

Preprocessing (reference datasets/casas/download.py, from Liciotti's deep-casas data.py):
1. keep motion (M*), door (D*) and temperature (T*) events, in file order; annotations on other
   sensors' lines are dropped with their line, as the reference does;
2. each event's activity: the last `begin` seen, up to and including its line's `end`; '' outside;
3. each event becomes a token: one per distinct (home, sensor, value), temperatures rounded to
   0.1 as the reference's lookup; ids 1..V in sorted order, 0 is padding;
4. one sample per run of consecutive events with the same raw activity (two adjacent activities
   that map to the same category stay two samples): its last 2000 tokens, left-padded with 0;
5. raw activity -> 12 classes: the thesis's 11 activity categories plus Other (spec B4);
6. all homes pooled, 80/20 by scikit-learn's `train_test_split(test_size=0.2, random_state=42)`,
   the reference's split (loaders/casas.py); the home is each sample's natural client id.
"""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedapps.data.datasets import DATASETS, DatasetInfo, Pool
from fedapps.data.iot.common import cached_arrays, download_zip, files_identity, missing, require
from fedapps.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

NAME = "casas"
FOLDER = "casas"
MAX_FIELDS = 16  # date, time, sensor, value and up to 12 annotation words
CHUNK_LINES = 500_000  # lines parsed at a time (bounds the parser's memory)
MAX_LEN = 2000  # events per sample (thesis: "the previous 2000 sensor activations")
VOCAB_SIZE = 2000  # embedding rows incl. padding 0: the reference BiLSTMModel's Embedding(2000, 64)
TEST_SIZE, SPLIT_SEED = 0.2, 42  # reference loaders/casas.py
# home -> its event file under <root>/casas, in the reference's order (the pooled sample order
# its split permutes; the home's index is its natural client id)
HOMES = {
    "cairo": "cairo/data",
    "twor.2009": "twor.2009/data",
    "twor.2010": "twor.2010/data",
    "twor.summer.2009": "twor.summer.2009/annotated",
    "milan": "milan/data",
}
BASE_URL = "http://casas.wsu.edu/datasets/"  # <home>.zip unpacks to <home>/...
LAYOUT = f"{FOLDER}/{{{', '.join(HOMES.values())}}}"
WHERE = (f"WSU CASAS {BASE_URL} ({', '.join(f'{h}.zip' for h in HOMES)}), unpacked into "
         f"<data-root>/{FOLDER}, or set data.download=true")

CLASSES = ("bathing", "bed_to_toilet", "cook", "eat", "enter_home", "leave_home", "other",
           "personal_hygiene", "relax", "sleep", "take_medicine", "work")
# home -> category -> raw activity names ('' = no activity): the reference's mappingActivities
ACTIVITIES: dict[str, dict[str, tuple[str, ...]]] = {
    "cairo": {
        "other": ("", "R1 wake", "R2 wake", "Night wandering"),
        "work": ("R1 work in office", "Laundry"),
        "take_medicine": ("R2 take medicine",),
        "sleep": ("R1 sleep", "R2 sleep"),
        "leave_home": ("Leave home",),
        "eat": ("Breakfast", "Dinner", "Lunch"),
        "bed_to_toilet": ("Bed to toilet",),
    },
    "twor.2009": {
        "bed_to_toilet": ("R1_Bed_to_Toilet", "R2_Bed_to_Toilet"),
        "cook": ("Meal_Preparation",),
        "personal_hygiene": ("R1_Personal_Hygiene", "R2_Personal_Hygiene"),
        "relax": ("Watch_TV",),
        "sleep": ("R1_Sleep", "R2_Sleep"),
        "work": ("Clean", "R1_Work", "R2_Work"),
        "other": ("", "Study", "Wash_Bathtub"),
    },
    "twor.2010": {
        "other": ("", "R1_Wandering_in_room", "R2_Wandering_in_room"),
        "work": ("R1_Work", "R2_Work", "R1_Housekeeping"),
        "sleep": ("R1_Sleeping_Not_in_Bed", "R2_Sleeping_Not_in_Bed", "R1_Sleep", "R2_Sleep"),
        "relax": ("R1_Watch_TV", "R2_Watch_TV"),
        "personal_hygiene": ("R1_Personal_Hygiene", "R2_Personal_Hygiene"),
        "leave_home": ("R1_Leave_Home", "R2_Leave_Home"),
        "enter_home": ("R1_Enter_Home", "R2_Enter_Home"),
        "eat": ("R1_Eating", "R2_Eating"),
        "cook": ("R1_Meal_Preparation", "R2_Meal_Preparation"),
        "bed_to_toilet": ("R1_Bed_Toilet_Transition", "R2_Bed_Toilet_Transition"),
        "bathing": ("R1_Bathing", "R2_Bathing"),
    },
    "twor.summer.2009": {
        "bathing": ("R1_shower", "R2_shower"),
        # the reference's table sends this one to Other, not Bed_to_toilet
        "other": ("", "Bed_toilet_transition", "Grooming", "R1_wakeup", "R2_wakeup"),
        "cook": ("Cooking",),
        "sleep": ("R1_sleep", "R2_sleep"),
        "work": ("Cleaning", "R1_work", "R2_work"),
    },
    "milan": {
        "other": ("", "Master_Bedroom_Activity", "Meditate"),
        "work": ("Chores", "Desk_Activity"),
        "take_medicine": ("Morning_Meds", "Eve_Meds"),
        "sleep": ("Sleep",),
        "relax": ("Read", "Watch_TV"),
        "leave_home": ("Leave_Home",),
        "eat": ("Dining_Rm_Activity",),
        "cook": ("Kitchen_Activity",),
        "bed_to_toilet": ("Bed_to_Toilet",),
        "bathing": ("Master_Bathroom", "Guest_Bathroom"),
    },
}


def check(root: Path) -> None:
    """The one-line missing-data error unless every home's event file is there."""
    require(NAME, root, [f"{FOLDER}/{rel}" for rel in HOMES.values()], LAYOUT, WHERE)


def download(root: Path) -> None:
    """Fetch and unpack the archive of every home whose event file is missing."""
    for home, rel in HOMES.items():
        if (root / FOLDER / rel).is_file():
            continue
        url = f"{BASE_URL}{home}.zip"
        try:
            download_zip(url, root / FOLDER)
        except ConfigError as err:  # download_zip's one line, with where else to get it
            raise ConfigError(f"dataset {NAME}: cannot download {url}: {str(err)[:300]}; "
                              f"get it from {WHERE}") from None
    if not all((root / FOLDER / rel).is_file() for rel in HOMES.values()):
        raise missing(NAME, root, LAYOUT, WHERE)


def _parse(path: Path) -> pd.DataFrame:
    """Sensor (column 2), value (3) and annotation (4, '' when none) of every M/D/T line, read
    by pandas' C whitespace parser in chunks (a chunk's unused columns are dropped at once)."""
    import pandas as pd  # lazy: keeps pandas out of a ClientApp's imports
    kept = []
    try:
        with warnings.catch_warnings():  # a line of too many fields: an error, never truncated
            warnings.simplefilter("error", pd.errors.ParserWarning)
            for chunk in pd.read_csv(path, sep=r"\s+", header=None, names=range(MAX_FIELDS),
                                     index_col=False, dtype=object, quoting=csv.QUOTE_NONE,
                                     keep_default_na=False, na_values=[""],
                                     encoding_errors="replace", chunksize=CHUNK_LINES):
                chunk = chunk[chunk[3].notna() & chunk[2].str.startswith(("M", "D", "T"), na=False)]
                noted = chunk[4].notna()
                note = pd.Series("", index=chunk.index, dtype=object)
                note[noted] = chunk.loc[noted, 4].str.cat(
                    [chunk.loc[noted, c] for c in range(5, MAX_FIELDS)], sep=" ", na_rep=""
                ).str.strip()
                kept.append(pd.DataFrame({"sensor": chunk[2], "value": chunk[3], "note": note}))
    except (pd.errors.ParserError, pd.errors.ParserWarning, pd.errors.EmptyDataError) as err:
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"dataset {NAME}: cannot read {path} ({type(err).__name__}: "
                          f"{reason}; at most {MAX_FIELDS} fields a line)") from None
    if not kept or not sum(len(k) for k in kept):
        raise ConfigError(f"dataset {NAME}: {path} has no motion, door or temperature events")
    return pd.concat(kept, ignore_index=True)


def read_events(path: Path) -> tuple[pd.Series, pd.Series]:
    """(token key `sensor<TAB>value`, raw activity) of every M/D/T event of one home's file."""
    import pandas as pd  # lazy: keeps pandas out of a ClientApp's imports
    events = _parse(path)
    note = events["note"][events["note"] != ""]
    # substring tests, as the reference's `'begin' in des` / `'end' in des`
    begin = note.index[note.str.contains("begin", regex=False)]
    end = note.index[note.str.contains("end", regex=False)]
    name = note.str.replace("begin", "", regex=False).str.strip()
    state = pd.Series(None, index=events.index, dtype=object)  # the activity after each event
    state[begin] = name[begin]
    state[end] = ""
    activity = state.ffill().fillna("").shift(1, fill_value="")  # the one running before it
    activity[begin] = name[begin]
    return events["sensor"] + "\t" + events["value"], activity


def canonical(key: str) -> str:
    """A temperature reading rounded to 0.1 (the reference's `round(float(value), 1)` lookup,
    so 21.50 and 21.5 are one token); other readings as written."""
    sensor, value = key.split("\t")
    if sensor.startswith("T"):
        try:
            return f"{sensor}\t{round(float(value), 1)}"
        except ValueError:
            pass
    return key


def segment(tokens: np.ndarray, activity: np.ndarray, max_len: int = MAX_LEN
            ) -> tuple[np.ndarray, np.ndarray]:
    """One sample per run of consecutive events with the same activity: its last `max_len`
    tokens, left-padded with 0 (Keras pad_sequences' 'pre' defaults, as the reference). Returns
    (int16 [runs, max_len], the activity index of each run)."""
    n = len(tokens)
    starts_run = np.ones(n, dtype=bool)
    starts_run[1:] = activity[1:] != activity[:-1]
    starts = np.flatnonzero(starts_run)
    run = np.cumsum(starts_run) - 1
    last = np.append(starts[1:], n) - 1
    from_end = last[run] - np.arange(n)
    keep = from_end < max_len
    x = np.zeros((len(starts), max_len), dtype=np.int16)
    x[run[keep], max_len - 1 - from_end[keep]] = tokens[keep]
    return x, activity[starts]


def build(root: Path) -> dict[str, np.ndarray]:
    """Read every home, tokenize, segment, label and split (train first, then test)."""
    import pandas as pd  # lazy: keeps pandas out of a ClientApp's imports
    from sklearn.model_selection import train_test_split

    homes = []
    for home, rel in HOMES.items():
        keys, activity = read_events(root / FOLDER / rel)
        key_codes, key_names = pd.factorize(keys)
        act_codes, act_names = pd.factorize(activity)
        homes.append((home, key_codes, [f"{home}\t{canonical(k)}" for k in key_names],
                      act_codes, list(act_names)))
    vocab = sorted({k for _, _, names, _, _ in homes for k in names})
    if len(vocab) + 1 > VOCAB_SIZE:
        raise ConfigError(f"dataset {NAME}: {len(vocab)} distinct sensor readings, more than "
                          f"the model's {VOCAB_SIZE - 1}-token vocabulary; not the CASAS files?")
    token_of = {k: i + 1 for i, k in enumerate(vocab)}
    xs, ys, ids = [], [], []
    for h, (home, key_codes, names, act_codes, act_names) in enumerate(homes):
        tokens = np.array([token_of[k] for k in names], dtype=np.int16)[key_codes]
        x, run_acts = segment(tokens, act_codes)
        category = {raw: c for c, raws in ACTIVITIES[home].items() for raw in raws}
        unknown = sorted(set(act_names) - category.keys())
        if unknown:
            raise ConfigError(f"dataset {NAME}: {root / FOLDER / HOMES[home]} has activities "
                              f"the label table does not know: {', '.join(unknown[:5])}")
        label_of = np.array([CLASSES.index(category[a]) for a in act_names], dtype=np.int64)
        xs.append(x)
        ys.append(label_of[run_acts])
        ids.append(np.full(len(x), h, dtype=np.int64))
    x, y, home_ids = np.concatenate(xs), np.concatenate(ys), np.concatenate(ids)
    train, test = train_test_split(np.arange(len(y)), test_size=TEST_SIZE,
                                   random_state=SPLIT_SEED)
    order = np.concatenate([train, test])
    return {"x": x[order], "y": y[order], "homes": home_ids[order],
            "num_train": np.array(len(train)), "vocab": np.array(vocab)}


def casas_arrays(root: Path, download_missing: bool = False
                 ) -> tuple[dict[str, np.ndarray], str]:
    """The preprocessed arrays with the token vocabulary (from the cache once built), and the
    identity of the raw files and parameters they were built from."""
    if download_missing:
        download(root)
    check(root)
    files = [root / FOLDER / rel for rel in HOMES.values()]
    identity = files_identity(files, {"max_len": MAX_LEN, "vocab_size": VOCAB_SIZE,
                                      "test_size": TEST_SIZE, "seed": SPLIT_SEED, "version": 1})
    return cached_arrays(NAME, identity, lambda: build(root)), identity


def load(root: Path, download_missing: bool) -> Pool:
    """The CASAS pool: int64 token ids [N, 2000], 12 classes, the home as client id."""
    a, identity = casas_arrays(root, download_missing)
    return Pool(torch.from_numpy(a["x"].astype(np.int64)), torch.from_numpy(a["y"]),
                int(a["num_train"]), len(CLASSES), normalization="none",
                client_ids=a["homes"], source=f"{NAME}-{identity}")


DATASETS[NAME] = DatasetInfo(len(CLASSES), (MAX_LEN,), normalization="none",
                             has_client_ids=True, loader=load, check=check,
                             vocab_size=VOCAB_SIZE, downloadable=True)
