"""EPIC-SOUNDS (seed 004 s.2.1): audio events of EPIC-KITCHENS-100 as log-mel spectrograms.

Raw layout under the data root (`<root>/epic-sounds/`):
- `EPIC_Sounds_train.csv`, `EPIC_Sounds_validation.csv` (epic-sounds-annotations; columns
  annotation_id, participant_id, video_id, ..., start_sample, stop_sample, ..., class_id);
- `EPIC-KITCHENS-100_audio.hdf5`: one 1-D float dataset per video_id, mono, 24 kHz (the
  auditory-slow-fast `wav_to_hdf5.py` layout the reference loader reads).

Preprocessing (thesis s.2.2.2 where it speaks, the reference `loaders/pack_audio.py` where it is
silent): a clip of at most 1.999 s per segment, STFT with a 10 ms Hann window and 5 ms step
(n_fft 2048), magnitude, 128 HTK mel bins (librosa `filters.mel(htk=True, norm=None)`), natural
log of (mel + 1e-6), edge-padded (and cut) to 400 frames -> float [1, 400, 128] (frames, bins).
The validation file is the test split, with 5 clips per segment as the reference's test mode
(8,035 x 5 = 40,175 = Table 2.1). 44 classes; the participant (P01 -> 1) is the natural client id.

~100k segments x 400 x 128 do not fit in memory: features are written block by block into a
float16 `.npy` in the cache and mapped back, so a process reads only the samples it indexes
(the log-mel of audio in [-1, 1] lies in [-13.9, 8], which float16 rounds by at most 2^-8).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedapps.data.datasets import DATASETS, DatasetInfo, Pool, cache_dir, file_mapping
from fedapps.data.iot.common import (
    cached_arrays,
    exclusive,
    files_identity,
    require,
    write_memmap,
)
from fedapps.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

NAME = "epic-sounds"
FOLDER = "epic-sounds"
TRAIN_CSV, TEST_CSV = "EPIC_Sounds_train.csv", "EPIC_Sounds_validation.csv"
AUDIO = "EPIC-KITCHENS-100_audio.hdf5"
NUM_CLASSES = 44
SAMPLE_RATE = 24000
N_FFT = 2048  # reference pack_audio._log_specgram
WIN = round(10 * SAMPLE_RATE / 1000)  # 10 ms Hann window = 240 samples (thesis)
HOP = round(5 * SAMPLE_RATE / 1000)  # 5 ms step = 120 samples (thesis)
N_MELS = 128
FRAMES = 400
EPS = 1e-6  # reference: log(mel + 1e-6)
# reference clip_secs 1.999: a segment of at least CLIP samples is cropped to CLIP - 1 samples
# (its samples[start:start + CLIP - 1]), i.e. exactly 1 + (CLIP - 1) // HOP = 400 frames
CLIP = round(SAMPLE_RATE * 1.999)
TEST_CLIPS = 5  # reference test mode: 5 clips evenly spread over each test segment
TRAIN_SEED = 0  # the one random crop per train segment (reference: random, then preloaded)
BLOCK = 32  # segments per STFT batch: 32 x 1025 x 400 complex64 = 105 MB
LAYOUT = f"{FOLDER}/{{{TRAIN_CSV},{TEST_CSV},{AUDIO}}}"
WHERE = ("the annotations at https://github.com/epic-kitchens/epic-sounds-annotations and the "
         "EPIC-KITCHENS-100 videos via https://github.com/epic-kitchens/"
         "epic-kitchens-download-scripts, their audio extracted to 24 kHz mono and packed into "
         f"{AUDIO} (auditory-slow-fast audio_extraction/wav_to_hdf5.py); no direct download")
PARAMS = {"version": 1, "n_fft": N_FFT, "win": WIN, "hop": HOP, "mels": N_MELS, "frames": FRAMES,
          "eps": EPS, "clip": CLIP, "test_clips": TEST_CLIPS, "seed": TRAIN_SEED,
          "dtype": "float16"}  # version: bump when the feature code changes


def hz_to_mel(f: np.ndarray | float) -> np.ndarray:
    """HTK mel scale (librosa `htk=True`, the reference's choice)."""
    return 2595.0 * np.log10(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


def mel_to_hz(m: np.ndarray | float) -> np.ndarray:
    return 700.0 * (10.0 ** (np.asarray(m, dtype=np.float64) / 2595.0) - 1.0)


def mel_edges(sample_rate: int = SAMPLE_RATE, n_mels: int = N_MELS) -> np.ndarray:
    """n_mels + 2 frequencies (Hz) evenly spaced in mel from 0 to Nyquist: filter i rises from
    edge i to its centre edge i + 1 and falls to edge i + 2."""
    return mel_to_hz(np.linspace(0.0, float(hz_to_mel(sample_rate / 2)), n_mels + 2))


def mel_filterbank(sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT,
                   n_mels: int = N_MELS) -> torch.Tensor:
    """Triangular filters [n_mels, n_fft // 2 + 1], peak 1, no area normalization (librosa
    `filters.mel(sr, n_fft, n_mels, htk=True, norm=None)`, as the reference calls it)."""
    freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_edges(sample_rate, n_mels)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising, falling = (freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)
    return torch.from_numpy(np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32))


_MEL: torch.Tensor | None = None


def log_mel(audio: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Log-mel spectrograms [B, FRAMES, N_MELS] of B clips ([B, L] float32, L >= CLIP - 1,
    zero after each clip's length). As librosa's centred STFT with constant padding: a clip of
    n samples has 1 + n // HOP frames (zeros after n are exactly its padding); the last one is
    repeated up to FRAMES (reference: np.pad 'edge') and frames beyond FRAMES are cut."""
    global _MEL
    if _MEL is None:
        _MEL = mel_filterbank()
    padded = torch.nn.functional.pad(audio, (N_FFT // 2, N_FFT // 2))
    spec = torch.stft(padded, N_FFT, HOP, WIN, torch.hann_window(WIN, periodic=True),
                      center=False, return_complex=True)
    mel = torch.log(torch.matmul(_MEL, spec.abs()) + EPS).transpose(1, 2)  # [B, T, mels]
    frames = (1 + lengths // HOP).clamp(max=FRAMES)
    index = torch.minimum(torch.arange(FRAMES)[None, :], frames[:, None] - 1)
    return torch.gather(mel, 1, index[:, :, None].expand(-1, -1, N_MELS))


def read_tables(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The train and test (validation) annotation tables."""
    import pandas as pd  # lazy: keeps pandas out of a ClientApp's imports
    cols = ["participant_id", "video_id", "start_sample", "stop_sample", "class_id"]
    out = []
    for name in (TRAIN_CSV, TEST_CSV):
        table = pd.read_csv(root / FOLDER / name)
        absent = [c for c in cols if c not in table.columns]
        if absent:
            raise ConfigError(f"dataset {NAME}: {root / FOLDER / name} lacks column(s) "
                              f"{', '.join(absent)}")
        out.append(table[cols])
    return out[0], out[1]


def clip_windows(table: pd.DataFrame, test: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(annotation row, first sample, sample count) of every clip. A segment shorter than CLIP
    is taken whole; a longer one gives CLIP - 1 samples from an offset in [0, n - CLIP]:
    5 evenly spaced offsets for the test split (rows repeated 5 times), one seeded random offset
    for train (reference `get_start_end_idx`: a new draw per access, but it preloads the first).
    The start_sample/stop_sample columns are the annotation's 24 kHz samples; the reference
    recomputes them from the timestamps, which differs by 1 in 3 of the 8,035 test rows."""
    start = table["start_sample"].to_numpy(np.int64)
    count = table["stop_sample"].to_numpy(np.int64) - start
    delta = np.maximum(count - CLIP, 0).astype(np.float64)
    rows = np.arange(len(table))
    if test:
        rows = np.repeat(rows, TEST_CLIPS)
        offset = np.floor(np.linspace(0.0, delta, TEST_CLIPS, axis=1).ravel())
    else:
        offset = np.floor(np.random.default_rng(TRAIN_SEED).uniform(0.0, delta))
    long = count[rows] >= CLIP
    first = np.where(long, start[rows] + offset.astype(np.int64), start[rows])
    return rows, first, np.where(long, CLIP - 1, np.maximum(count[rows], 0))


def _video_audio(h5, video: str) -> object:
    if video not in h5:
        raise ConfigError(f"dataset {NAME}: no audio for video {video!r} in {AUDIO}")
    data = h5[video]
    if data.ndim != 1 or data.dtype.kind != "f":
        raise ConfigError(f"dataset {NAME}: {AUDIO}[{video!r}] is {data.dtype} of shape "
                          f"{data.shape}, expected 1-D float audio")
    return data


def write_features(audio_path: Path, videos: np.ndarray, first: np.ndarray,
                   count: np.ndarray, out: np.ndarray) -> None:
    """Fill out[i] = log-mel of videos[i] samples [first[i], first[i] + count[i]), video by
    video and BLOCK clips at a time, reading only the span those clips cover."""
    import h5py

    ramp = np.arange(CLIP - 1)
    with h5py.File(audio_path, "r") as h5:
        for video in np.unique(videos):
            data = _video_audio(h5, str(video))
            mine = np.flatnonzero(videos == video)
            mine = mine[np.argsort(first[mine], kind="stable")]
            for block in np.array_split(mine, math.ceil(len(mine) / BLOCK)):
                lo = int(first[block].min())
                hi = min(int((first[block] + count[block]).max()), len(data))
                span = np.asarray(data[lo:hi], dtype=np.float32) if hi > lo else np.zeros(0)
                index = first[block, None] - lo + ramp[None, :]
                keep = (ramp[None, :] < count[block, None]) & (index < len(span))
                clips = np.zeros(keep.shape, dtype=np.float32)
                clips[keep] = span[index[keep]]
                lengths = torch.from_numpy(keep.sum(axis=1))
                feats = log_mel(torch.from_numpy(clips), lengths)
                out[block, 0] = feats.numpy().astype(np.float16)


def _h5py_required() -> None:
    try:
        import h5py  # noqa: F401
    except ImportError:
        raise ConfigError(f"dataset {NAME} reads {AUDIO} with h5py: pip install h5py "
                          "(or the fedapps 'iot' extra)") from None


def check(root: Path) -> None:
    """One-line error when the annotations or the audio file are missing."""
    require(NAME, root, [f"{FOLDER}/{f}" for f in (TRAIN_CSV, TEST_CSV, AUDIO)], LAYOUT, WHERE)


def _build_x(root: Path, path: Path, train: pd.DataFrame, test: pd.DataFrame) -> None:
    """Write the features of all clips (train, then test) to `path` atomically."""
    parts = [(train, clip_windows(train, False)), (test, clip_windows(test, True))]
    videos = np.concatenate([t["video_id"].to_numpy(str)[w[0]] for t, w in parts])
    first = np.concatenate([w[1] for _, w in parts])
    count = np.concatenate([w[2] for _, w in parts])
    write_memmap(path, np.float16, (len(first), 1, FRAMES, N_MELS),
                 lambda out: write_features(root / FOLDER / AUDIO, videos, first, count, out))


def _targets(train: pd.DataFrame, test: pd.DataFrame) -> dict[str, np.ndarray]:
    """Labels and participant numbers (P01 -> 1) per clip, train then test."""
    rows = [clip_windows(train, False)[0], clip_windows(test, True)[0]]
    y, ids = [], []
    for table, r in zip((train, test), rows, strict=True):
        labels = table["class_id"].to_numpy(np.int64)[r]
        if labels.min(initial=0) < 0 or labels.max(initial=0) >= NUM_CLASSES:
            raise ConfigError(f"dataset {NAME}: class_id outside 0..{NUM_CLASSES - 1}")
        y.append(labels)
        ids.append(table["participant_id"].str.lstrip("P").astype(np.int64).to_numpy()[r])
    return {"y": np.concatenate(y), "client_ids": np.concatenate(ids),
            "num_train": np.array(len(rows[0]))}


def identity(root: Path) -> str:
    """Keys the caches: the raw files' names, sizes and mtimes and the preprocessing constants."""
    folder = root / FOLDER
    return files_identity([folder / TRAIN_CSV, folder / TEST_CSV, folder / AUDIO], PARAMS)


def features_path(ident: str) -> Path:
    return cache_dir() / "iot" / f"{NAME}-{ident}-x.npy"


def load(root: Path, download: bool) -> Pool:
    """The EPIC-SOUNDS pool (train clips, then 5 clips per test segment), its inputs mapped
    from the cache; data.download is the missing-data error (no direct download exists)."""
    check(root)
    ident = identity(root)
    x_path = features_path(ident)
    tables = None
    if not x_path.is_file():
        with exclusive(x_path):
            if not x_path.is_file():
                _h5py_required()
                tables = read_tables(root)
                _build_x(root, x_path, *tables)
    meta = cached_arrays(NAME, ident, lambda: _targets(*(tables or read_tables(root))))
    x = np.load(x_path, mmap_mode="c")  # copy-on-write: writable for torch, never written back
    if len(x) != len(meta["y"]):
        raise ConfigError(f"dataset {NAME}: cached {x_path} holds {len(x)} clips, expected "
                          f"{len(meta['y'])}; delete it to rebuild")
    return Pool(torch.from_numpy(x), torch.from_numpy(meta["y"]), int(meta["num_train"]),
                NUM_CLASSES, normalization="none", client_ids=meta["client_ids"],
                source=ident, cache_id=f"{NAME}-{ident}", mapping=file_mapping(x))


DATASETS[NAME] = DatasetInfo(NUM_CLASSES, (1, FRAMES, N_MELS), normalization="none",
                             has_client_ids=True, loader=load, check=check)
