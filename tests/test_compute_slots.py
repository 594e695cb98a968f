"""Compute slots (fedapps/compute_slots.py): at most N tasks hold one at a time, in one process
or many, and a slot whose holder dies is free again at once."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from fedapps.compute_slots import (
    COUNT_VARIABLE,
    FOLDER_VARIABLE,
    ComputeSlots,
    environment,
    from_environment,
    held_slot,
)


def test_no_more_than_n_tasks_hold_a_slot_at_once(tmp_path):
    slots = ComputeSlots(tmp_path / "slots", 2)
    lock, inside, most, numbers = threading.Lock(), [0], [0], []

    def task() -> None:
        with slots.held() as number:
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                numbers.append(number)
            time.sleep(0.15)
            with lock:
                inside[0] -= 1

    t = time.monotonic()
    threads = [threading.Thread(target=task) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 2  # two at a time, never more, and the slots were used
    assert time.monotonic() - t >= 0.45  # 5 tasks of 0.15 s, 2 at a time: three waves
    assert sorted(set(numbers)) == [0, 1]


def test_a_slot_is_given_back_when_its_task_raises(tmp_path):
    slots = ComputeSlots(tmp_path, 1)
    with pytest.raises(RuntimeError), slots.held():
        raise RuntimeError("the task failed")
    done = []

    def take() -> None:
        with slots.held() as number:
            done.append(number)

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(timeout=2)
    assert done == [0]  # the only slot, free again


HOLDER = """
import sys, time
from pathlib import Path
from fedapps.compute_slots import ComputeSlots
with ComputeSlots(Path(sys.argv[1]), 1).held():
    print("held", flush=True)
    time.sleep(60)
"""


def test_another_processs_slot_is_free_once_that_process_is_killed(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        taken = threading.Event()

        def take() -> None:
            with ComputeSlots(tmp_path, 1).held():
                taken.set()

        waiter = threading.Thread(target=take, daemon=True)
        waiter.start()
        assert not taken.wait(0.3)  # the other process holds the only slot
        holder.kill()  # no cleanup runs in it: the kernel drops its lock
        assert taken.wait(2.0)
    finally:
        holder.kill()
        holder.wait()


def test_the_environment_names_the_slots_of_every_node(tmp_path):
    env = environment(tmp_path / "s", 3)
    assert env == {COUNT_VARIABLE: "3", FOLDER_VARIABLE: str(tmp_path / "s")}
    slots = from_environment(env)
    assert (slots.count, slots.folder) == (3, tmp_path / "s")
    assert from_environment({}) is None and from_environment({COUNT_VARIABLE: "2"}) is None
    with held_slot(None) as nothing:  # no slots: nothing to wait for
        assert nothing is None
    with pytest.raises(ValueError, match="at least 1"):
        environment(tmp_path, 0)
    with pytest.raises(ValueError, match="at least 1"):
        ComputeSlots(tmp_path, 0)
    for bad in ("two", "-1", "0"):  # a hand-set variable: one line that says what is wrong
        with pytest.raises(ValueError, match=f"{COUNT_VARIABLE}=.*|at least 1"):
            from_environment({COUNT_VARIABLE: bad, FOLDER_VARIABLE: str(tmp_path)})
