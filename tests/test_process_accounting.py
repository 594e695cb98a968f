"""What the deployment benchmark reads from /proc: command lines, process kinds and CPU time
(simulations/deploy_benchmark.py's table of CPU seconds by kind, docs/PERFORMANCE.md)."""

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
