"""How far a relay's final model leans to the clients that trained it last (seed 003).

Fed-Cyclic's global model is the last client's after its local epoch, so under label skew it
scores best on the clients at the end of the round's relay. For each run directory this
prints the final round's global model on each client's own test split (results.json
`client_global_accuracy`), averaged over the last `--last` clients of that round's relay order
and over the other participants. For a run of another algorithm (FedAvg on the same
partition) it uses the relay order its seed would have drawn (`--order`, fixed by default), so
the same clients can be compared. Used in docs/RESULTS.md:

    python -m simulations.relay_lean outputs/seed3-fmnist-a0.1-order/*-s0 --last 2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from strategies.fedcyclic import relay_order


def lean(run_dir: Path, last: int, order: str | None = None) -> tuple[float, float]:
    """(mean % on the last `last` relay clients, mean % on the other participants) of the
    final round's global model; `order` overrides the run's own algo.order. Participants
    without a score that round (not evaluated) are left out of both."""
    missing = [f for f in ("config.yaml", "results.json") if not (run_dir / f).is_file()]
    if missing:
        raise SystemExit(f"{run_dir}: not a run directory (no {', '.join(missing)})")
    cfg = OmegaConf.load(run_dir / "config.yaml")
    if int(cfg.algo.get("chains", 1)) != 1:
        raise SystemExit(f"{run_dir}: algo.chains={cfg.algo.chains}: several relays end on "
                         "several clients; only one chain is split here")
    final = json.loads((run_dir / "results.json").read_text())["rounds"][-1]
    key = next((k for k in final if k.startswith("client_global_")), None)
    if key is None:
        raise SystemExit(f"{run_dir}: the last round has no per-client scores")
    scores = final[key]
    participants = [int(p) for p in final["fit_clients"]]
    if len(participants) <= last:
        raise SystemExit(f"{run_dir}: {len(participants)} participants, --last {last} leaves "
                         "no other clients")
    reshuffle = (order or cfg.algo.get("order", "fixed")) == "reshuffle"
    ranked = relay_order(int(cfg.seed), int(final["round"]),
                         int(cfg.federation["num-clients"]), reshuffle, participants)

    def mean(pids: list[int]) -> float:
        scored = [scores[p] for p in pids if scores[p] is not None]
        if not scored:
            raise SystemExit(f"{run_dir}: none of partitions {pids} was evaluated that round")
        return 100 * float(np.mean(scored))

    return mean(ranked[-last:]), mean(ranked[:-last])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run directories (results.json inside)")
    p.add_argument("--last", type=int, default=2, help="how many relay clients count as last")
    p.add_argument("--order", choices=("fixed", "reshuffle"), default=None,
                   help="relay order to split by (default: the run's own, fixed if it has "
                        "none)")
    args = p.parse_args(argv)
    for run in args.runs:
        end, rest = lean(run, args.last, args.order)
        print(f"{run.name}: last {args.last} {end:.1f} %, other clients {rest:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
