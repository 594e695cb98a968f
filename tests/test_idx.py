"""The NumPy IDX reader (fedapps/data/idx.py): the same arrays as torchvision's MNIST classes,
so edge nodes without torchvision build the same pools, caches and partitions."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_DATA, needs_fmnist, needs_mnist

from fedapps.data import datasets
from fedapps.data.idx import read_idx, read_idx_split
from fedapps.errors import ConfigError


def write_idx(path: Path, array: np.ndarray, type_byte: int = 0x08) -> None:
    """An IDX file written by hand from the format's definition (big-endian header)."""
    header = bytes([0, 0, type_byte, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + array.astype(array.dtype.newbyteorder(">")).tobytes())


def test_reads_hand_written_files_of_every_shape_and_type(tmp_path):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "i", images)
    got = read_idx(tmp_path / "i")
    assert got.shape == (2, 3, 4) and got.dtype == np.uint8 and np.array_equal(got, images)
    assert got.flags.writeable
    ints = np.array([[1, -2], [70000, -300000]], dtype=np.int32)
    write_idx(tmp_path / "j", ints, 0x0C)
    got = read_idx(tmp_path / "j")
    assert got.dtype == np.dtype("int32") and got.dtype.isnative and got.tolist() == ints.tolist()


def test_a_split_comes_as_torchvision_gives_it(tmp_path):
    write_idx(tmp_path / "x", np.full((5, 2, 2), 7, dtype=np.uint8))
    write_idx(tmp_path / "y", np.array([3, 1, 4, 1, 5], dtype=np.uint8))
    x, y = read_idx_split(tmp_path, "x", "y")
    assert x.shape == (5, 1, 2, 2) and x.dtype == np.uint8
    assert y.dtype == np.int64 and y.tolist() == [3, 1, 4, 1, 5]
    write_idx(tmp_path / "y4", np.arange(4, dtype=np.uint8))
    with pytest.raises(ValueError, match="do not match"):
        read_idx_split(tmp_path, "x", "y4")


def test_damaged_files_are_refused(tmp_path):
    write_idx(tmp_path / "ok", np.zeros((4, 2, 2), dtype=np.uint8))
    good = (tmp_path / "ok").read_bytes()
    (tmp_path / "short").write_bytes(good[:-1])
    with pytest.raises(ValueError, match="15 data bytes where the header"):
        read_idx(tmp_path / "short")
    (tmp_path / "magic").write_bytes(b"\x1f\x8b" + good[2:])  # a gzip file, not unpacked
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "magic")


def test_a_damaged_raw_file_is_the_datasets_one_line_error(tmp_path, monkeypatch):
    raw = tmp_path / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    files = datasets.DATASETS["emnist"].raw_files
    for name in files:
        shape = (3, 28, 28) if "images" in name else (3,)
        write_idx(raw / name, np.zeros(shape, dtype=np.uint8))
    (raw / files[2]).write_bytes((raw / files[2]).read_bytes()[:100])
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"dataset emnist: cannot read .*ValueError.*header"):
        datasets._read_torchvision("emnist", tmp_path, False)


@pytest.mark.parametrize("name,folder", [
    pytest.param("mnist", "MNIST", marks=needs_mnist),
    pytest.param("fmnist", "FashionMNIST", marks=needs_fmnist)])
def test_equal_to_torchvision_on_the_real_files(name, folder):
    tvd = pytest.importorskip("torchvision.datasets")
    root = datasets.resolve_root(name, SHARED_DATA)
    x, y = datasets._idx_arrays(name, root)
    cls = {"mnist": tvd.MNIST, "fmnist": tvd.FashionMNIST}[name]
    parts = [cls(root, train=train) for train in (True, False)]
    assert np.array_equal(x, np.concatenate([p.data.numpy()[:, None] for p in parts]))
    assert np.array_equal(y, np.concatenate([p.targets.numpy() for p in parts]))
    assert x.dtype == np.uint8 and y.dtype == np.int64


@needs_fmnist
def test_a_pool_is_built_without_importing_torchvision(tmp_path):
    code = ("import sys; from pathlib import Path; from fedapps.data.datasets import load_pool; "
            f"p = load_pool('fmnist', Path({str(SHARED_DATA)!r})); "
            "print(tuple(p.x.shape), 'torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"FEDAPPS_CACHE": str(tmp_path), "PATH": "/usr/bin"})
    assert out.stdout.split() == ["(70000,", "1,", "28,", "28)", "False"]
