"""EPIC-SOUNDS: the log-mel front end checked by value (filterbank, pure tones, frame counts,
an independent numpy STFT) and the loader on a fixture written in the exact raw layout (the
two annotation CSVs and an HDF5 file of 1-D 24 kHz audio per video, written with h5py)."""

from __future__ import annotations

import fcntl
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedapps.data.datasets import DATASETS, Normalizer, load_pool
from fedapps.data.iot import epic_sounds as es
from fedapps.errors import ConfigError

h5py = pytest.importorskip("h5py")

SR = 24000
NYQUIST_MEL = 2595 * np.log10(1 + 12000 / 700)  # HTK mel of 12 kHz


def reference_filterbank() -> np.ndarray:
    """HTK triangles written out filter by filter, bin by bin (librosa htk=True, norm=None)."""
    edges = [700 * (10 ** (m / 2595) - 1) for m in np.linspace(0, NYQUIST_MEL, 130)]
    fb = np.zeros((128, 1025))
    for i in range(128):
        lo, mid, hi = edges[i], edges[i + 1], edges[i + 2]
        for k in range(1025):
            f = k * SR / 2048
            if lo < f <= mid:
                fb[i, k] = (f - lo) / (mid - lo)
            elif mid < f < hi:
                fb[i, k] = (hi - f) / (hi - mid)
    return fb


FB = reference_filterbank()


def reference_log_mel(clip: np.ndarray) -> np.ndarray:
    """librosa-style centred STFT by hand: zero padding of n_fft/2, a periodic 240-sample Hann
    window centred in 2048 points, numpy's rfft, magnitude, mel, log(+1e-6); 1 + n // 120
    frames, the last repeated to 400 (or the first 400 kept)."""
    y = np.pad(clip.astype(np.float64), 1024)
    window = np.zeros(2048)
    window[904:1144] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(240) / 240)
    n_frames = min(1 + len(clip) // 120, 400)
    frames = np.stack([y[t * 120: t * 120 + 2048] * window for t in range(n_frames)])
    out = np.log(np.abs(np.fft.rfft(frames, axis=1)) @ FB.T + 1e-6)
    return np.concatenate([out, np.repeat(out[-1:], 400 - n_frames, axis=0)])[:400]


def test_filterbank_matches_htk_triangles_and_sums_to_one() -> None:
    fb = es.mel_filterbank().numpy()
    assert fb.shape == (128, 1025)
    np.testing.assert_allclose(fb, FB, atol=1e-6)
    assert abs(es.hz_to_mel(1000.0) - 1000.0) < 0.02  # HTK: 1000 Hz is ~1000 mel
    edges = es.mel_edges()
    assert edges[0] == 0 and abs(edges[-1] - 12000) < 1e-6
    assert abs(edges[1] - 15.905) < 1e-3  # 700 (10^(3266.34 / 129 / 2595) - 1) by hand
    # neighbouring triangles cross linearly: between the first and last centre they sum to 1
    freqs = np.arange(1025) * SR / 2048
    inside = (freqs >= edges[1]) & (freqs <= edges[-2])
    np.testing.assert_allclose(fb[:, inside].sum(axis=0), 1.0, atol=1e-5)
    assert fb.max() <= 1.0


@pytest.mark.parametrize("centre", [40, 100, 125])
def test_pure_tone_peaks_in_the_nearest_mel_bin(centre: int) -> None:
    edges = es.mel_edges()
    f = edges[centre + 1] + 0.3 * (edges[centre + 2] - edges[centre + 1])  # off-centre
    assert np.argmin(np.abs(edges[1:-1] - f)) == centre
    tone = np.sin(2 * np.pi * f * np.arange(47975) / SR).astype(np.float32)
    mel = es.log_mel(torch.from_numpy(tone)[None], torch.tensor([47975]))[0]
    assert int(mel[10:390].mean(dim=0).argmax()) == centre


@pytest.mark.parametrize("n", [0, 1319, 47975, 60000])
def test_frame_count_and_edge_padding_against_numpy_stft(n: int) -> None:
    rng = np.random.default_rng(n)
    clip = (0.3 * rng.standard_normal(n)).astype(np.float32)
    buffer = np.zeros(max(n, 47975), dtype=np.float32)
    buffer[:n] = clip
    mel = es.log_mel(torch.from_numpy(buffer)[None], torch.tensor([n]))[0].numpy()
    assert mel.shape == (400, 128)
    frames = min(1 + n // 120, 400)  # 0 -> 1, 1319 -> 11, 60000 -> 501 cut to 400
    if frames < 400:
        assert (mel[frames:] == mel[frames - 1]).all()
        assert not (mel[frames - 1] == mel[frames - 2]).all() or n == 0
    np.testing.assert_allclose(mel, reference_log_mel(buffer[:n]), atol=2e-3)


def test_matches_librosa_called_as_the_reference_calls_it() -> None:
    """Only where librosa is installed (not a dependency): pack_audio._log_specgram's calls."""
    # A librosa that does not import whole (a stray folder of numba caches reads as a namespace
    # package, as CI once had) is no librosa: skip rather than fail on a missing attribute.
    filters = pytest.importorskip("librosa.filters")
    librosa = pytest.importorskip("librosa")
    fb = filters.mel(sr=SR, n_fft=2048, n_mels=128, htk=True, norm=None)
    np.testing.assert_array_equal(es.mel_filterbank().numpy(), fb)
    clip = (0.3 * np.random.default_rng(1).standard_normal(4801)).astype(np.float32)
    spec = librosa.stft(clip, n_fft=2048, window="hann", hop_length=120, win_length=240,
                        pad_mode="constant")
    want = np.log(fb @ np.abs(spec) + 1e-6).T
    want = np.pad(want, ((0, 400 - len(want)), (0, 0)), "edge")
    buffer = torch.zeros(1, 47975)
    buffer[0, :4801] = torch.from_numpy(clip)
    got = es.log_mel(buffer, torch.tensor([4801]))[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


# ---- the loader on a fixture in the raw layout ------------------------------------------------

VIDEO_SECONDS = {"P01_01": 10, "P02_03": 10, "P03_07": 8, "P01_11": 10, "P04_02": 6}
TRAIN = [  # participant, video, start_sample, stop_sample, class_id
    ("P01", "P01_01", 24000, 36000, 5),  # 0.5 s: taken whole
    ("P01", "P01_01", 48000, 120000, 43),  # 3 s: one seeded random 47,975-sample crop
    ("P02", "P02_03", 1000, 48976, 0),  # exactly CLIP = 47,976 samples: crop from its start
    ("P02", "P02_03", 230000, 250000, 12),  # runs past the audio's end (240,000): truncated
    ("P03", "P03_07", 0, 1200, 7),  # 11 frames, then the 11th repeated
]
TEST = [
    ("P01", "P01_11", 12000, 132000, 34),  # 5 s: 5 crops at offsets 0, 18006, ..., 72024
    ("P01", "P01_11", 130000, 140000, 4),  # short: 5 identical clips
    ("P04", "P04_02", 0, 24000, 43),
]


def audio_of(video: str) -> np.ndarray:
    rng = np.random.default_rng(sum(map(ord, video)))
    t = np.arange(VIDEO_SECONDS[video] * SR) / SR
    tone = 0.5 * np.sin(2 * np.pi * rng.uniform(200, 8000) * t)
    return (tone + 0.1 * rng.standard_normal(len(t))).astype(np.float32)


def timestamp(sample: int) -> str:
    ms = sample * 1000 // SR
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"


def write_csv(path: Path, rows: list[tuple]) -> None:
    counter: dict[str, int] = {}
    records = []
    for participant, video, start, stop, label in rows:
        k = counter[video] = counter.get(video, -1) + 1
        records.append({"annotation_id": f"{video}_{k}", "participant_id": participant,
                        "video_id": video, "start_timestamp": timestamp(start),
                        "stop_timestamp": timestamp(stop), "start_sample": start,
                        "stop_sample": stop, "description": "clang / clatter",
                        "class": f"class {label}", "class_id": label})
    pd.DataFrame(records).to_csv(path, index=False)


def write_fixture(root: Path) -> Path:
    folder = root / "epic-sounds"
    folder.mkdir(parents=True)
    write_csv(folder / "EPIC_Sounds_train.csv", TRAIN)
    write_csv(folder / "EPIC_Sounds_validation.csv", TEST)
    with h5py.File(folder / "EPIC-KITCHENS-100_audio.hdf5", "w") as f:
        for video in VIDEO_SECONDS:
            f.create_dataset(video, data=audio_of(video))
    return root


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh fixture and an empty cache."""
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    return write_fixture(tmp_path / "data")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    """(data root, cache folder, pool) built once for the tests that only read them."""
    base = tmp_path_factory.mktemp("epic")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDAPPS_CACHE", str(base / "cache"))
        root = write_fixture(base / "data")
        yield root, base / "cache", load_pool("epic-sounds", root)


def expected_windows() -> list[tuple[str, int, int]]:
    """(video, first sample, count) of every clip, worked out by hand from the rows above."""
    deltas = [0.0, 72000 - 47976, 0.0, 0.0, 0.0]
    crop = 48000 + int(np.floor(np.random.default_rng(0).uniform(0.0, deltas)[1]))
    train = [("P01_01", 24000, 12000), ("P01_01", crop, 47975), ("P02_03", 1000, 47975),
             ("P02_03", 230000, 20000), ("P03_07", 0, 1200)]  # 20000: cut to 10000 on reading
    test = ([("P01_11", 12000 + off, 47975) for off in (0, 18006, 36012, 54018, 72024)]
            + [("P01_11", 130000, 10000)] * 5 + [("P04_02", 0, 24000)] * 5)
    return train + test


def test_clip_windows_by_hand(root: Path) -> None:
    train, test = es.read_tables(root)
    got = []
    for table, is_test in ((train, False), (test, True)):
        rows, first, count = es.clip_windows(table, is_test)
        got += list(zip(table["video_id"].to_numpy()[rows], first.tolist(), count.tolist(),
                        strict=True))
    assert got == expected_windows()


def test_pool_contents_split_labels_and_client_ids(built) -> None:
    pool = built[2]
    assert len(pool) == 5 + 3 * 5 and pool.num_train == 5 and pool.num_classes == 44
    assert pool.x.shape == (20, 1, 400, 128) and pool.x.dtype == torch.float16
    assert pool.normalization == "none" and DATASETS["epic-sounds"].has_client_ids
    assert pool.y.tolist() == [5, 43, 0, 12, 7] + [34] * 5 + [4] * 5 + [43] * 5
    assert pool.client_ids.tolist() == [1, 1, 2, 2, 3] + [1] * 10 + [4] * 5
    want: dict[tuple[str, int, int], np.ndarray] = {}
    for i, (video, first, count) in enumerate(expected_windows()):
        key = (video, first, count)
        if key not in want:
            want[key] = reference_log_mel(audio_of(video)[first:first + count])
        got = pool.x[i, 0].float().numpy()
        # float16 storage: |x| < 16 rounds by at most 2^-8
        np.testing.assert_allclose(got, want[key], atol=2 ** -8 + 2e-3, err_msg=f"clip {i}")
    assert pool.x[:5].float().min() >= np.log(1e-6) - 1e-3 and pool.x.float().max() < 8
    # a crop never leaves its segment: the last test crop ends 1 sample before stop (reference)
    assert 48000 <= expected_windows()[1][1] <= 120000 - 47976


def test_float16_cache_loses_less_than_its_rounding_bound(built) -> None:
    pool = built[2]
    clip = torch.from_numpy(audio_of("P01_01")[24000:36000].copy())
    buffer = torch.zeros(1, 47975)
    buffer[0, :12000] = clip
    exact = es.log_mel(buffer, torch.tensor([12000]))[0]
    err = (pool.x[0, 0].float() - exact).abs().max().item()
    assert 0 < err <= 2 ** -8
    # training sees float32 inputs (no normalization, as the reference)
    inputs = Normalizer.for_pool(pool).inputs(pool.x[:2])
    assert inputs.dtype == torch.float32 and torch.equal(inputs, pool.x[:2].float())
    assert Normalizer("none").inputs(torch.arange(3)).dtype == torch.int64  # token ids kept


def test_blocks_give_the_same_features(built, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    root, _, pool = built
    monkeypatch.setattr(es, "BLOCK", 2)  # 2 clips per STFT batch and audio read
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache-blocks"))
    assert torch.equal(es.load(root, False).x, pool.x)


def test_cache_is_a_memory_mapped_npy_and_skips_the_raw_files(
        built, monkeypatch: pytest.MonkeyPatch) -> None:
    root, cache, first = built
    monkeypatch.setenv("FEDAPPS_CACHE", str(cache))
    files = list((cache / "iot").glob("epic-sounds-*-x.npy"))
    assert len(files) == 1 and first.cache_id and first.cache_id in files[0].name
    mapped = np.load(files[0], mmap_mode="r")
    assert mapped.dtype == np.float16 and mapped.shape == (20, 1, 400, 128)

    def boom(*args: object) -> None:
        raise AssertionError("raw files read again")

    monkeypatch.setattr(es, "read_tables", boom)
    monkeypatch.setattr(es, "write_features", boom)
    again = es.load(root, False)
    assert torch.equal(again.x, first.x) and torch.equal(again.y, first.y)
    np.testing.assert_array_equal(again.client_ids, first.client_ids)


def test_a_second_process_waits_for_the_build_instead_of_repeating_it(
        built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, cache, pool = built
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    x_path = es.features_path(es.identity(root))
    x_path.parent.mkdir(parents=True)
    monkeypatch.setattr(es, "_build_x", lambda *a: pytest.fail("built a second time"))
    pools: list = []
    with open(x_path.with_suffix(".lock"), "w") as held:  # another process is building
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=lambda: pools.append(es.load(root, False)))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not pools  # blocked on the lock
        np.save(x_path, pool.x.numpy())  # ... which finishes its file
        fcntl.flock(held, fcntl.LOCK_UN)
    waiter.join(30)
    assert len(pools) == 1 and torch.equal(pools[0].x, pool.x)  # mapped the finished file


def test_missing_data_is_one_line_naming_the_layout(tmp_path: Path) -> None:
    for download in (False, True):
        with pytest.raises(ConfigError) as err:
            es.load(tmp_path, download)
        text = str(err.value)
        assert "\n" not in text and "dataset epic-sounds not found" in text
        for part in ("epic-sounds/{EPIC_Sounds_train.csv,EPIC_Sounds_validation.csv,"
                     "EPIC-KITCHENS-100_audio.hdf5}", "epic-kitchens-download-scripts",
                     "no direct download"):
            assert part in text
    with pytest.raises(ConfigError, match="not found"):
        DATASETS["epic-sounds"].check(tmp_path)


def test_bad_audio_file_and_missing_h5py_are_one_line_errors(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with h5py.File(root / "epic-sounds" / "EPIC-KITCHENS-100_audio.hdf5", "a") as f:
        del f["P01_01"]  # the first video read
    with pytest.raises(ConfigError, match=r"^dataset epic-sounds: no audio for video 'P01_01'"):
        es.load(root, False)
    monkeypatch.setitem(sys.modules, "h5py", None)  # as if h5py were not installed
    with pytest.raises(ConfigError, match="pip install h5py"):
        es.load(root, False)
