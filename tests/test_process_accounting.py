"""What the deployment benchmark reads from /proc: command lines, process kinds and CPU time
(simulations/deploy_benchmark.py's table of CPU seconds by kind, docs/PERFORMANCE.md)."""

import os
import subprocess
import sys
import time

from fedapps.processes import command_line, cpu_seconds, running, start_time
from simulations.deploy_benchmark import CpuSampler, process_kind

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}: pass\n"


def test_cpu_is_counted_by_kind_from_the_samplers_start(tmp_path):
    # a script whose path names it a SuperNode, burning 1.0 s of CPU; a sleeping one beside it
    busy = tmp_path / "flower-supernode"
    busy.write_text(BURN.format(1.0) + "time.sleep(30)\n")
    # a process already running when the sampler starts counts from then on: it burned 0.5 s
    # before and sleeps after
    earlier = subprocess.Popen([sys.executable, "-c", BURN.format(0.5) + "time.sleep(30)"])
    while cpu_seconds(earlier.pid) < 0.5:
        time.sleep(0.05)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    sampler = CpuSampler(period=0.1)
    proc = subprocess.Popen([sys.executable, str(busy)])
    sampler.start()
    try:
        assert process_kind(proc.pid) == "supernode" and process_kind(idle.pid) == "other"
        assert str(busy) in command_line(proc.pid) and running(proc.pid)
        assert start_time(proc.pid) is not None
        deadline = time.time() + 20
        while cpu_seconds(proc.pid) < 1.0 and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)  # one more sample after the burn
        totals = sampler.totals()
    finally:
        for p in (proc, idle, earlier):
            p.kill()
            p.wait()
    # the burn plus the interpreter's start (about 0.05 s); the others slept all along
    assert 1.0 <= totals["supernode"] < 1.5
    assert totals.get("other", 0.0) < 0.3
    assert command_line(proc.pid) == "" and cpu_seconds(proc.pid) == 0.0 and not running(proc.pid)


def test_a_process_that_shows_its_kind_late_is_counted_as_that_kind(tmp_path):
    """A process read before its command line names it (here: it execs into a SuperNode after
    0.5 s) is asked again, and its CPU counts for the kind it shows (a Ray worker of a
    simulation was once counted as "other")."""
    busy = tmp_path / "flower-supernode"
    busy.write_text(BURN.format(0.5) + "time.sleep(30)\n")
    late = (BURN.format(0.3) + "import os, sys\n"  # (the path is not on its command line)
            "os.execv(sys.executable, [sys.executable, os.environ['LATE_KIND']])\n")
    sampler = CpuSampler(period=0.1)
    proc = subprocess.Popen([sys.executable, "-c", late],
                            env={**os.environ, "LATE_KIND": str(busy)})
    sampler.start()
    try:
        deadline = time.time() + 20
        while cpu_seconds(proc.pid) < 0.8 and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)
        totals = sampler.totals()
    finally:
        proc.kill()
        proc.wait()
    assert totals.get("supernode", 0.0) >= 0.8 and "other" not in totals, totals


def test_cpu_a_steady_round_runs_from_the_first_rounds_end_to_the_last():
    """Each end is read from the first sample after it; the sum is spread over the rounds
    between (here rounds 2 and 3); a kind that used nothing in between is left out."""
    from simulations.deploy_benchmark import RoundEnds

    sampler = CpuSampler()
    sampler.history = [(0.0, {"superlink": 1.0, "clientapp": 5.0}),
                       (1.0, {"superlink": 2.0, "clientapp": 9.0, "other": 0.5}),
                       (2.0, {"superlink": 2.5, "clientapp": 12.0, "other": 0.5}),
                       (3.0, {"superlink": 4.0, "clientapp": 17.0, "other": 0.5})]
    lines = []
    rounds = RoundEnds(lambda line: lines.append(line) or True)
    for line in ("INFO : [fedapps] round 1/3  G 39.58%", "INFO : [fedapps] fedavg-fmnist: x",
                 "INFO : [fedapps] round 3/3  G 40.66%"):
        assert rounds(line)
    assert len(lines) == 3 and sorted(rounds.ends) == [1, 3]
    rounds.ends = {1: 0.5, 3: 2.5}
    assert sampler.per_round(rounds.ends) == {"clientapp": 4.0, "superlink": 1.0}
    assert sampler.per_round({1: 0.5}) == {}


def test_memory_of_clientapps_is_measured_only_where_they_have_processes(tmp_path):
    """A one-process node's ClientApp has no process of its own: the benchmark reports its
    peaks as None (the tree's peak is the node's), not as a 0 that reads as measured; a
    ClientApp process beside its node is found below it and measured."""
    import threading
    from types import SimpleNamespace

    from simulations.deploy_benchmark import TreeSampler

    holds = "import time\nx = bytearray(64 << 20)\nx[::4096] = b'1' * len(x[::4096])\n" \
            "time.sleep(30)\n"
    app = tmp_path / "fedapps.warm_clientapp"  # the path carries a ClientApp's marker
    app.write_text(holds)
    node = tmp_path / "one_process_node"
    node.write_text(f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, "
                    f"{str(app)!r}])\ntime.sleep(30)\n")
    found = {}
    for name, script in (("one process", "import time; time.sleep(30)"), ("beside", None)):
        cmd = [sys.executable, "-c", script] if script else [sys.executable, str(node)]
        proc = subprocess.Popen(cmd)
        sampler = TreeSampler(period=0.1)
        thread = threading.Thread(target=sampler, args=([SimpleNamespace(process=proc)],))
        thread.start()
        try:
            if script:
                time.sleep(1.0)  # ten samples of the lone node
            deadline = time.time() + 20
            while not script and sampler.peak_app_rss < 64 << 10 and time.time() < deadline:
                time.sleep(0.1)
        finally:
            sampler.stop.set()
            thread.join()
            subprocess.run(["pkill", "-f", str(app)], check=False)
            proc.kill()
            proc.wait()
        found[name] = sampler.clientapp_memory()
        assert sampler.peak_tree_rss > 0
    assert found["one process"] == {"clientapp_processes": 0, "peak_clientapp_rss_mb": None,
                                    "peak_clientapp_pss_mb": None}
    beside = found["beside"]
    assert beside["clientapp_processes"] == 1
    assert 64 <= beside["peak_clientapp_rss_mb"] < 200  # its 64 MB, touched, and Python's own
    assert 0 < beside["peak_clientapp_pss_mb"] <= beside["peak_clientapp_rss_mb"]
