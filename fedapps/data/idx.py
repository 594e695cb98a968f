"""The IDX files of MNIST, Fashion-MNIST and EMNIST read with NumPy alone.

torchvision reads them too, but an edge node (a Raspberry Pi with a CPU-only torch) need not
install torchvision to build its partition: the arrays are the same bytes, so the cache keys and
partitions do not change with the reader (tests/test_idx.py compares the two).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# IDX's third magic byte: the element type (MNIST-family files use only 0x08, unsigned bytes)
_TYPES = {0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"),
          0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: Path) -> np.ndarray:
    """The array in one (unpacked) IDX file; ValueError for a file that is not one or is cut
    short (the caller turns it into the dataset's one-line error)."""
    data = Path(path).read_bytes()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _TYPES:
        raise ValueError(f"{path}: not an IDX file (magic {data[:4].hex()})")
    ndim, dtype = data[3], _TYPES[data[2]]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise ValueError(f"{path}: IDX header cut short")
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", ndim, 4))
    count = int(np.prod(shape))
    if len(data) != header + count * dtype.itemsize:
        raise ValueError(f"{path}: {len(data) - header} data bytes where the header "
                         f"{shape} needs {count * dtype.itemsize}")
    # one copy: writable, native byte order
    return np.frombuffer(data, dtype, count, header).astype(dtype.newbyteorder("=")).reshape(shape)


def read_idx_split(raw: Path, images: str, labels: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [N, 1, H, W], int64 [N]) of one split, as torchvision's MNIST classes give it."""
    x, y = read_idx(raw / images), read_idx(raw / labels)
    if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(f"{raw}: {images} {x.shape} and {labels} {y.shape} do not match")
    return x[:, None, :, :].astype(np.uint8, copy=False), y.astype(np.int64)
