"""A small VisDrone2019-DET fixture in the release's exact layout: JPEG images with
coloured boxes on a plain background and their annotation files (left,top,width,height,
score,category,truncation,occlusion)."""

from pathlib import Path

import numpy as np
from PIL import Image

# split -> [(width, height, [(left, top, w, h, category), ...])]
IMAGES = {
    "VisDrone2019-DET-train": [
        (96, 64, [(10, 8, 20, 16, 4), (50, 30, 30, 20, 1)]),
        (64, 64, [(0, 0, 16, 16, 9), (40, 40, 30, 30, 4), (20, 20, 0, 10, 3)]),
        (64, 96, [(8, 60, 24, 20, 0)]),
        (80, 80, [(30, 30, 20, 20, 11), (5, 5, 10, 12, 4)]),
        (72, 48, [(10, 10, 20, 20, 1)]),
        (64, 64, []),
    ],
    "VisDrone2019-DET-test-dev": [
        (96, 64, [(12, 10, 20, 16, 4)]),
        (64, 64, [(40, 38, 20, 20, 1), (4, 4, 12, 12, 9)]),
    ],
}


def write_fixture(root: Path, seed: int = 0) -> Path:
    """The fixture under root/visdrone; returns that folder."""
    rng = np.random.default_rng(seed)
    palette = {c: rng.integers(0, 256, 3) for c in range(12)}
    for split, images in IMAGES.items():
        folder = root / "visdrone" / split
        (folder / "images").mkdir(parents=True)
        (folder / "annotations").mkdir(parents=True)
        for i, (w, h, boxes) in enumerate(images):
            pixels = np.full((h, w, 3), 40, dtype=np.uint8)
            lines = []
            for left, top, bw, bh, cat in boxes:
                pixels[top:top + bh, left:left + bw] = palette[cat]
                lines.append(f"{left},{top},{bw},{bh},1,{cat},0,0")
            name = f"{split[-5:]}_{i:07d}"
            Image.fromarray(pixels).save(folder / "images" / f"{name}.jpg", quality=95)
            (folder / "annotations" / f"{name}.txt").write_text("\n".join(lines) + "\n")
    return root / "visdrone"
