"""VisDrone2019-DET (AISKYEYE, Tianjin University): drone images with object boxes, seed 004's
object-detection row (mAP-50, YOLOv8n, partitioned by clusters of input features).

Layout: the public release archives unpacked under `<root>/visdrone/`:
`VisDrone2019-DET-train/{images,annotations}` (6,471 images, the thesis's train count) and
`VisDrone2019-DET-test-dev/{images,annotations}` (1,610, its test count), as the reference's
download.py arranges them. Each `annotations/<image>.txt` line is
`left,top,width,height,score,category,truncation,occlusion` in pixels.

Classes (B4): the thesis says 12 object categories and the reference trains on the raw
category numbers 0-11 as class ids (0 "ignored regions" and 11 "others" included); so do we.
Images are letterboxed to a square of `side` pixels (aspect kept, the rest grey 114, centred:
Ultralytics' validation letterbox) and stored uint8 in a memory-mapped cache; pixels are
scaled to [0, 1] (normalization `unit`). The reference trains at 640 (its imgsz), `visdrone`;
`visdrone-320` is the same data at 320 for CPU-sized runs. Targets: [N, M, 5] float32 rows
(class, cx, cy, w, h) as fractions of the side, padded with class -1 to the most boxes of any
image. Boxes of zero width or height after clipping to the image are dropped.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedapps.data.datasets import DATASETS, DatasetInfo, Pool, cache_dir, file_mapping
from fedapps.data.iot.common import (
    cached_arrays,
    download_zip,
    exclusive,
    files_identity,
    google_drive_url,
    require,
    write_memmap,
)
from fedapps.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

NAME = "visdrone"
FOLDER = "visdrone"
SPLITS = ("VisDrone2019-DET-train", "VisDrone2019-DET-test-dev")
NUM_CLASSES = 12
PAD_VALUE = 114
LAYOUT = (f"{FOLDER}/{{VisDrone2019-DET-train,VisDrone2019-DET-test-dev}}/"
          "{images/*.jpg,annotations/*.txt}")
# the reference's datasets/visdrone/download.py fetches these Google Drive files
DRIVE_IDS = {"VisDrone2019-DET-train": "1i8iZ-zYBgWwzX9355HIYrWM1uKeqWW0S",
             "VisDrone2019-DET-test-dev": "1nTC4cqNqT_IJ7EIH28i9YTVGNFq5WgqL"}
WHERE = ("the VisDrone2019-DET train and test-dev archives (github.com/VisDrone/VisDrone-Dataset, "
         "CC BY-NC-SA 3.0), unpacked as they come; data.download=true fetches them")


def check(root: Path) -> None:
    require(NAME, root, [f"{FOLDER}/{s}/{d}" for s in SPLITS for d in ("images", "annotations")],
            LAYOUT, WHERE)


def _download(root: Path) -> None:
    """Fetch and unpack each split that is missing (data.download=true). The folder holding
    `images/` and `annotations/` is moved to the layout wherever the archive put it (the
    train archive has a top folder; the reference unpacks test-dev as if it had none)."""
    for split, file_id in DRIVE_IDS.items():
        dest = root / FOLDER / split
        if (dest / "images").is_dir() and (dest / "annotations").is_dir():
            continue
        staging = root / FOLDER / f".{split}.download"
        shutil.rmtree(staging, ignore_errors=True)
        download_zip(google_drive_url(file_id), staging, f"{split}.zip")
        (staging / f"{split}.zip").unlink()
        found = [p.parent for p in staging.rglob("images") if (p.parent / "annotations").is_dir()]
        if len(found) != 1:
            raise ConfigError(f"dataset {NAME}: the {split} archive holds {len(found)} folders "
                              "with images/ and annotations/, expected one")
        shutil.rmtree(dest, ignore_errors=True)
        shutil.move(str(found[0]), dest)
        shutil.rmtree(staging, ignore_errors=True)  # gone already when it was the folder


def image_files(root: Path) -> list[tuple[Path, Path]]:
    """(image, annotation) pairs, train then test-dev, each split in name order; an image
    without its annotation file is a one-line error."""
    pairs = []
    for split in SPLITS:
        folder = root / FOLDER / split
        images = sorted((folder / "images").glob("*.jpg"))
        if not images:
            raise ConfigError(f"dataset {NAME}: no .jpg images in {folder / 'images'}")
        for image in images:
            note = folder / "annotations" / f"{image.stem}.txt"
            if not note.is_file():
                raise ConfigError(f"dataset {NAME}: {image} has no annotation file {note}")
            pairs.append((image, note))
    return pairs


def read_boxes(path: Path) -> np.ndarray:
    """[n, 5] float64 rows (category, left, top, width, height) of one annotation file."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = [f for f in line.strip().split(",") if f != ""]
        if not fields:
            continue
        try:
            left, top, width, height, _, category = (int(f) for f in fields[:6])
        except ValueError:
            raise ConfigError(f"dataset {NAME}: {path}:{number}: expected integers "
                              "left,top,width,height,score,category,...") from None
        if not 0 <= category < NUM_CLASSES:
            raise ConfigError(f"dataset {NAME}: {path}:{number}: category {category} outside "
                              f"0..{NUM_CLASSES - 1}")
        rows.append((category, left, top, width, height))
    return np.array(rows, dtype=np.float64).reshape(-1, 5)


def letterbox(image: Image.Image, side: int) -> np.ndarray:
    """uint8 [3, side, side]: the image scaled to fit, centred on grey (`placement`)."""
    from PIL import Image  # lazy, as every image library here: not in a ClientApp's imports

    _, nw, nh, left, top = placement(image.size, side)
    canvas = np.full((side, side, 3), PAD_VALUE, dtype=np.uint8)
    canvas[top:top + nh, left:left + nw] = np.asarray(
        image.convert("RGB").resize((nw, nh), Image.BILINEAR))
    return canvas.transpose(2, 0, 1)


def target_rows(boxes: np.ndarray, size: tuple[int, int], scale: float, left: int, top: int,
                side: int) -> np.ndarray:
    """[n, 5] (class, cx, cy, w, h) as fractions of the letterboxed side; boxes clipped to
    the image first, empty ones dropped."""
    w, h = size
    x1 = np.clip(boxes[:, 1], 0, w)
    y1 = np.clip(boxes[:, 2], 0, h)
    x2 = np.clip(boxes[:, 1] + boxes[:, 3], 0, w)
    y2 = np.clip(boxes[:, 2] + boxes[:, 4], 0, h)
    keep = (x2 > x1) & (y2 > y1)
    x1, y1, x2, y2 = x1[keep], y1[keep], x2[keep], y2[keep]
    cx = ((x1 + x2) / 2 * scale + left) / side
    cy = ((y1 + y2) / 2 * scale + top) / side
    return np.stack([boxes[keep, 0], cx, cy, (x2 - x1) * scale / side,
                     (y2 - y1) * scale / side], axis=1)


def placement(size: tuple[int, int], side: int) -> tuple[float, int, int, int, int]:
    """(scale, width, height, left pad, top pad) of an image of `size` letterboxed to `side`."""
    w, h = size
    scale = side / max(w, h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    return scale, nw, nh, (side - nw) // 2, (side - nh) // 2


def _build_images(pairs: list[tuple[Path, Path]], side: int, path: Path) -> None:
    """Write every letterboxed image to `path` (a .npy memory map, atomically)."""

    from PIL import Image

    def fill(out: np.ndarray) -> None:
        for i, (image_path, _) in enumerate(pairs):
            with Image.open(image_path) as image:
                out[i] = letterbox(image, side)

    write_memmap(path, np.uint8, (len(pairs), 3, side, side), fill)


def _targets(pairs: list[tuple[Path, Path]], side: int) -> dict[str, np.ndarray]:
    """The padded box targets (image sizes come from the file headers, no decoding)."""
    from PIL import Image

    targets = []
    for image_path, note in pairs:
        with Image.open(image_path) as image:
            scale, _, _, left, top = placement(image.size, side)
            targets.append(target_rows(read_boxes(note), image.size, scale, left, top, side))
    most = max(1, max(len(t) for t in targets))
    y = np.full((len(targets), most, 5), -1.0, dtype=np.float32)
    for i, t in enumerate(targets):
        y[i, :len(t)] = t
    return {"y": y}


def loader(side: int) -> Callable[[Path, bool], Pool]:
    """The pool loader at one letterbox side."""

    def load(root: Path, download: bool) -> Pool:
        """VisDrone train then test-dev; images mapped from the cache, built once (under a
        lock, so processes starting together wait for one builder); downloaded first when
        allowed and missing."""
        if download:
            with exclusive(root / FOLDER / "download"):
                _download(root)
        check(root)
        pairs = image_files(root)
        num_train = sum(1 for image, _ in pairs if image.parent.parent.name == SPLITS[0])
        ident = files_identity([p for pair in pairs for p in pair],
                               {"side": side, "pad": PAD_VALUE, "classes": "raw 0-11"})
        x_path = cache_dir() / "iot" / f"{NAME}-{ident}-x.npy"
        with exclusive(x_path):
            if not x_path.is_file():
                _build_images(pairs, side, x_path)
            meta = cached_arrays(NAME, ident, lambda: _targets(pairs, side))
        x = np.load(x_path, mmap_mode="c")  # copy-on-write: writable for torch, never written
        if len(x) != len(meta["y"]):
            raise ConfigError(f"dataset {NAME}: cached {x_path} holds {len(x)} images, expected "
                              f"{len(meta['y'])}; delete it to rebuild")
        return Pool(torch.from_numpy(x), torch.from_numpy(meta["y"]), num_train, NUM_CLASSES,
                    task="detection", normalization="unit", source=ident,
                    cache_id=f"{NAME}-{side}-{ident}", mapping=file_mapping(x))

    return load


for _name, _side in (("visdrone", 640), ("visdrone-320", 320)):
    DATASETS[_name] = DatasetInfo(NUM_CLASSES, (3, _side, _side), task="detection",
                                  normalization="unit", loader=loader(_side), check=check,
                                  downloadable=True)
