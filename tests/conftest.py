"""Shared test settings: a private cache, the offline data at ../shared/data, no network."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_configure(config: pytest.Config) -> None:
    # Runs start from background threads (tests/background.py) while tests in the main thread
    # change the environment. With vfork, a child started without `env=` execs from the
    # parent's live `environ`, which a concurrent setenv can free: exec fails with EFAULT
    # ("Bad address"; once in CI). fork gives the child its own copy. Python's own switch:
    # https://docs.python.org/3/library/subprocess.html#disabling-use-of-vfork-or-posix-spawn
    subprocess._USE_VFORK = False
    os.environ.setdefault("FEDAPPS_CACHE", str(Path(config.rootpath) / ".pytest_cache" / "fedapps"))
    os.environ["WANDB_MODE"] = os.environ.get("WANDB_MODE", "offline")
    os.environ["WANDB_SILENT"] = "true"
    if SHARED_DATA.is_dir():
        os.environ.setdefault("FEDAPPS_DATA_ROOT", str(SHARED_DATA))


def has_dataset(folder: str) -> bool:
    return (SHARED_DATA / folder / "raw").is_dir()


needs_fmnist = pytest.mark.skipif(not has_dataset("FashionMNIST"),
                                  reason="FashionMNIST not found under ../shared/data")
needs_mnist = pytest.mark.skipif(not has_dataset("MNIST"),
                                 reason="MNIST not found under ../shared/data")


@pytest.fixture(autouse=True)
def _flowers_reply_pull_restored():
    """A deployed proxy's handshake (strategies/replies.py `hasten`) rewraps Flower's reply
    object pull in its module for the whole process: Flower's own is put back after each test,
    so no test sees another's schedule (a test measuring Flower's own 1 s retry would fail)."""
    import functools
    import sys

    yield
    http_grid = sys.modules.get("flwr.superlink.grid.http_grid")  # not imported: untouched
    if http_grid is not None and isinstance(http_grid.pull_objects, functools.partial):
        http_grid.pull_objects = http_grid.pull_objects.func
