"""A simulation on an existing two-node Ray cluster (head + second node on loopback)."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from background import beside

from fedapps.launcher import free_port, run_experiment

pytestmark = pytest.mark.integration

SETS = ["rounds=2", "federation.num-clients=3", "federation.fraction-fit=1.0"]


def g_and_loss(run_dir: Path) -> list[tuple[float, float]]:
    rounds = json.loads((run_dir / "results.json").read_text())["rounds"]
    return [(r["global_accuracy"], r["loss"]) for r in rounds]


def processes():
    """pid -> (parent pid, command line) of every live process."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            found[int(proc.name)] = (ppid, (proc / "cmdline").read_bytes().replace(b"\0", b" "))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_simulation_on_a_two_node_ray_cluster_gives_the_single_machine_numbers(tmp_path):
    """The reference is measured here, on this machine (its own Ray, started beside the
    cluster: tests/background.py): the digits differ between CPU kinds and torch versions
    (docs/ARCHITECTURE.md), so no pinned numbers."""
    single = tmp_path / "single"
    port = free_port()
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}  # two nodes on one host
    common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    raylets = set()
    stop = threading.Event()

    def watch():  # which raylet (node) each simulated client's actor runs under
        while not stop.wait(0.5):
            procs = processes()
            for ppid, cmd in procs.values():
                if b"ClientAppActor" in cmd and temp.encode() in procs.get(ppid, (0, b""))[1]:
                    raylets.add(ppid)

    watcher = threading.Thread(target=watch, daemon=True)
    with beside(lambda: run_experiment("quickstart", SETS, 3, single, show=lambda line: False,
                                       total_cpus=1)) as reference:  # one actor: a core free
        # Ray's own temp dir, short (Unix socket paths) and private: `ray start` records the
        # cluster there, so no other Ray user on this machine ever connects to it by accident
        temp = tempfile.mkdtemp(prefix="fr", dir="/tmp")  # one temp dir per node, below it
        try:
            subprocess.run(["ray", "start", "--head", "--port", str(port), "--temp-dir",
                            f"{temp}/h", "--include-dashboard", "false", *common], env=env,
                           check=True, capture_output=True, timeout=300)
            subprocess.run(["ray", "start", "--address", f"127.0.0.1:{port}", "--temp-dir",
                            f"{temp}/w", *common], env=env, check=True, capture_output=True,
                           timeout=300)
            watcher.start()
            out = tmp_path / "run"
            status = run_experiment("quickstart", SETS, 3, out, show=lambda line: False,
                                    ray_address=f"127.0.0.1:{port}")
            stop.set()
            assert status == "finished:completed"
            assert reference() == "finished:completed"
            single_machine = g_and_loss(single)
            assert len(single_machine) == 2 and single_machine[1][0] > 0.5  # chance is 0.1
            assert g_and_loss(out) == pytest.approx(single_machine, abs=1e-9)
            assert len(raylets) == 2  # clients ran on both nodes
        finally:
            stop.set()
            # stop this cluster's processes only (never `ray stop`: it stops every Ray here)
            mine = [pid for pid, (_, cmd) in processes().items()
                    if temp.encode() in cmd and pid != os.getpid()]
            for pid in mine:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(temp, ignore_errors=True)
