"""The test process itself: children started from a thread survive the environment changing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading


def test_children_start_from_a_thread_while_the_main_thread_changes_the_environment():
    """The race behind one CI failure (tests/conftest.py): with vfork, 18-23 of these 40
    starts failed with OSError EFAULT (three tries, 2-core machine); with fork none does."""
    failures: list[OSError] = []
    started = 0

    def spawn() -> None:
        nonlocal started
        for _ in range(40):
            try:
                subprocess.run([sys.executable, "-S", "-c", "pass"], check=True)
            except OSError as err:
                failures.append(err)
            started += 1

    spawner = threading.Thread(target=spawn)
    spawner.start()
    keys = [f"FEDAPPS_HARNESS_{i}" for i in range(300)]
    try:
        while spawner.is_alive():
            for i, key in enumerate(keys):  # grows environ, so setenv reallocates (and frees)
                os.environ[key] = "x" * (i % 40)
            for key in keys:
                del os.environ[key]
    finally:
        spawner.join()
        for key in keys:
            os.environ.pop(key, None)
    assert started == 40 and not failures, f"{len(failures)} of 40 failed: {failures[:3]}"
