"""What an idle deployment costs: the CPU of a SuperLink and N warm SuperNodes with no run.

A deployed node asks for work all the time, and its SuperLink answers: on one machine these
asks compete with training (docs/PERFORMANCE.md, "Held pulls"). This starts `deploy-local`'s
processes (the SuperLink with its state in memory, N SuperNodes with a warm ClientApp each)
without submitting a run, waits `--settle` seconds for the ClientApps' start-up (imports), then
counts the CPU seconds each kind of process uses over `--window` seconds, for each mode in turn:

- flower: Flower's pulls (the SuperNode every 3 s, the warm ClientApp up to once a second);
- quick: `--pull-interval 0.5` (fedapps/quick_supernode.py);
- held: the same beside a SuperLink that holds empty pulls (`--link-hold 5`).

    python -m simulations.idle_cpu --nodes 20 --modes flower,quick,held
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from fedapps.deploy import IN_MEMORY_LINK_STATE, SuperNode, node_config
from fedapps.launcher import LocalSuperLink
from simulations.deploy_benchmark import CpuSampler

MODES = {"flower": (None, None), "quick": (0.5, None), "held": (0.5, 5.0)}


def idle_cores(nodes: int, pull_interval: float | None, link_hold: float | None,
               settle: float, window: float) -> dict[str, float]:
    """Cores used per kind of process over `window` seconds of an idle federation."""
    workdir = Path(tempfile.mkdtemp(prefix="fedapps-idle-"))
    held = {} if link_hold is None else {"hold": link_hold}  # (code before it has no hold)
    with LocalSuperLink(workdir, simulation=False, database=IN_MEMORY_LINK_STATE,
                        **held) as link:
        started = [SuperNode(link, i, node_config(i, nodes, None, None),
                             pull_interval=pull_interval).start() for i in range(nodes)]
        try:
            time.sleep(settle)
            sampler = CpuSampler()  # counts only what is used from here on
            sampler.start()
            begun = time.monotonic()
            time.sleep(window)
            totals = sampler.totals()
            seconds = time.monotonic() - begun
        finally:
            for node in started:
                node.stop()
    return {kind: round(used / seconds, 3) for kind, used in totals.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=20)
    p.add_argument("--modes", default="flower,quick,held", help=", ".join(MODES))
    p.add_argument("--settle", type=float, default=100.0,
                   help="seconds for the ClientApps to start before counting (default 100)")
    p.add_argument("--window", type=float, default=30.0, help="seconds counted (default 30)")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"--modes {','.join(unknown)}: choose from {', '.join(MODES)}")
    print("| mode | cores: SuperLink | SuperNodes | ClientApps | all |")
    print("| --- | --- | --- | --- | --- |")
    for mode in modes:
        cores = idle_cores(args.nodes, *MODES[mode], args.settle, args.window)
        parts = [cores.get(k, 0.0) for k in ("superlink", "supernode", "clientapp")]
        print(f"| {mode} | {' | '.join(f'{c:.3f}' for c in parts)} | "
              f"{sum(cores.values()):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
