"""Domain-shift sources (seed 003): image folders where each domain is a natural client, and an
offline proxy built from bundled data.

Image folders (each domain folder = one client, via `data.partitioner: natural`):
- Office-31: `<root>/office31/<domain>/images/<class>/*.jpg` (amazon, dslr, webcam);
- the thesis's own data (one folder per stock-photo source, not published): the layout
  `<root>/commercial-sources/<source>/<class>/*.jpg`.
Images are decoded once with Pillow, resized to 224x224 RGB (seed 003 s.3.1) and cached as
`.npz` (allow_pickle=False) keyed by the file list. There is no official split: the whole pool
is "train", and each client's split comes from `data.test-fraction` (0.2 = the thesis's 80:20).

Offline proxy (`digits-domains`, `fmnist-domains`): the bundled dataset's samples are dealt to
8 domains by a fixed permutation, and each domain applies one fixed transform (plain, inverted,
rotated 90/180/270 degrees, blurred, noisy, low contrast) to its images; the domain is the
natural client id. A proxy for the thesis's 8 sources, not their data: the shift is synthetic
and the classes are the base dataset's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from fedapps.data.datasets import DATASETS, DatasetInfo, Pool, cache_dir, check_available, load_pool
from fedapps.errors import ConfigError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
LAYOUTS = {  # dataset -> (folder under the data root, path from a domain folder to class folders)
    "office31": ("office31", "images"),
    "commercial": ("commercial-sources", ""),
}
WHERE = {
    "office31": "Office-31 (Saenko et al. 2010), e.g. from the Transfer-Learning-Library "
                "or https://faculty.cc.gatech.edu/~judy/domainadapt/",
    "commercial": "the thesis's stock-photo sources (Jain 2023; no public link): place your "
                  "own copy",
}


def layout_text(name: str, root: Path) -> str:
    folder, inner = LAYOUTS[name]
    middle = f"/{inner}" if inner else ""
    return f"{root / folder}/<domain>{middle}/<class>/*.jpg"


def check_image_folders(name: str, root: Path) -> None:
    """One-line ConfigError naming the expected layout and where to get the data."""
    folder = root / LAYOUTS[name][0]
    if not folder.is_dir() or not any(p.is_dir() for p in folder.iterdir()):
        raise ConfigError(f"data.data-root={str(root)!r}: dataset {name} not found (expected "
                          f"{layout_text(name, root)}); get it from {WHERE[name]}")


def image_files(name: str, root: Path) -> tuple[list[str], list[str], list[tuple[Path, int, int]]]:
    """(domains, classes, [(file, class index, domain index)]) in sorted order."""
    check_image_folders(name, root)
    folder, inner = LAYOUTS[name]
    domains = sorted(p.name for p in (root / folder).iterdir() if p.is_dir())
    per_domain = {d: root / folder / d / inner for d in domains}
    classes = sorted({c.name for d in domains if per_domain[d].is_dir()
                      for c in per_domain[d].iterdir() if c.is_dir()})
    files = [(f, ci, di) for di, d in enumerate(domains) for ci, c in enumerate(classes)
             if (per_domain[d] / c).is_dir()
             for f in sorted((per_domain[d] / c).iterdir())
             if f.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise ConfigError(f"dataset {name}: no images under {layout_text(name, root)}")
    return domains, classes, files


def load_image_folders(name: str, root: Path, size: int = 224,
                       num_classes: int | None = None) -> Pool:
    """Every image of every domain as uint8 [N, 3, size, size], its class and its domain id."""
    from PIL import Image

    domains, classes, files = image_files(name, root)
    if num_classes is not None and len(classes) != num_classes:
        raise ConfigError(f"dataset {name}: {len(classes)} class folders under "
                          f"{layout_text(name, root)}, expected {num_classes}")
    listing = json.dumps([[str(f), f.stat().st_size, c, d] for f, c, d in files] + [size])
    digest = hashlib.sha256(listing.encode()).hexdigest()[:16]
    cached = cache_dir() / "image-folders" / f"{name}-{digest}.npz"
    if cached.is_file():
        with np.load(cached, allow_pickle=False) as z:
            x, y, ids = z["x"], z["y"], z["ids"]
    else:
        x = np.empty((len(files), 3, size, size), dtype=np.uint8)
        for i, (f, _, _) in enumerate(files):
            with Image.open(f) as img:
                rgb = img.convert("RGB").resize((size, size), Image.BILINEAR)
            x[i] = np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)
        y = np.array([c for _, c, _ in files], dtype=np.int64)
        ids = np.array([d for _, _, d in files], dtype=np.int64)
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp.npz")
        np.savez(tmp, x=x, y=y, ids=ids)
        tmp.replace(cached)
    return Pool(torch.from_numpy(x), torch.from_numpy(y), len(y), len(classes),
                client_ids=ids)


# ---- the offline proxy ------------------------------------------------------------------------

def _blur(x: np.ndarray) -> np.ndarray:
    """3x3 box blur (edge-padded)."""
    p = np.pad(x.astype(np.float32), ((0, 0), (0, 0), (1, 1), (1, 1)), mode="edge")
    h, w = x.shape[2:]
    out = sum(p[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)) / 9.0
    return np.round(out).astype(np.uint8)


def _noise(x: np.ndarray) -> np.ndarray:
    """Gaussian pixel noise, sigma 40 of 255, from a fixed seed (the same data every time)."""
    rng = np.random.default_rng(1234)
    return np.clip(x + rng.normal(0.0, 40.0, x.shape), 0, 255).astype(np.uint8)


DOMAIN_SHIFTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "plain": lambda x: x,
    "inverted": lambda x: 255 - x,
    "rot90": lambda x: np.rot90(x, 1, axes=(2, 3)),
    "rot180": lambda x: np.rot90(x, 2, axes=(2, 3)),
    "rot270": lambda x: np.rot90(x, 3, axes=(2, 3)),
    "blur": _blur,
    "noise": _noise,
    "low-contrast": lambda x: (64 + x // 2).astype(np.uint8),
}


def domain_shift_pool(base: Pool) -> Pool:
    """The base pool with sample i in domain perm(i) mod 8 (fixed permutation, seed 0, so the
    official train/test order and the class balance per domain are kept in expectation), each
    domain's images transformed by its DOMAIN_SHIFTS entry; client id = domain index."""
    x = base.x.numpy().copy()
    ids = np.random.default_rng(0).permutation(len(x)) % len(DOMAIN_SHIFTS)
    for d, shift in enumerate(DOMAIN_SHIFTS.values()):
        rows = np.flatnonzero(ids == d)
        x[rows] = np.ascontiguousarray(shift(x[rows]))
    return Pool(torch.from_numpy(x), base.y, base.num_train, base.num_classes,
                client_ids=ids.astype(np.int64))


# ---- registration -----------------------------------------------------------------------------

def _folders(name: str) -> DatasetInfo:
    return DatasetInfo(31, (3, 224, 224), has_client_ids=True,
                       loader=lambda root, download: load_image_folders(name, root, 224, 31),
                       check=lambda root: check_image_folders(name, root))


def _proxy(base: str, classes: int, shape: tuple[int, ...]) -> DatasetInfo:
    return DatasetInfo(classes, shape, has_client_ids=True,
                       loader=lambda root, download: domain_shift_pool(
                           load_pool(base, root, download)),
                       check=lambda root: check_available(base, root, False))


DATASETS["office31"] = _folders("office31")
DATASETS["commercial"] = _folders("commercial")
DATASETS["digits-domains"] = _proxy("digits", 10, (1, 8, 8))
DATASETS["fmnist-domains"] = _proxy("fmnist", 10, (1, 28, 28))
