"""The `fedapps` console script: fedapps.cli's commands plus `reproduce` (grids of runs)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fedapps import cli as app_cli
from fedapps.config import load_config


def _reproduce(args: argparse.Namespace) -> int:
    from fedapps.launcher import descendants, gpus_per_client, run_experiment, terminate
    from simulations.reproduce import reproduce

    jobs = args.jobs
    # concurrent runs split the CPUs (each SuperLink's Ray would otherwise claim all of them)
    cpus = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None

    def runner(experiment: str, sets: list[str], n_clients: int, run_dir: Path) -> str:
        device = str(load_config(experiment, sets).device)
        return run_experiment(experiment, sets, n_clients, run_dir,
                              gpus_per_client=gpus_per_client(device), total_cpus=cpus,
                              prefix=f"[{run_dir.name}] " if jobs > 1 else "")

    out = reproduce(args.grid, args.seeds, args.overrides, Path(args.output_dir).resolve(),
                    runner, table_only=args.table_only,
                    only=[c for c in args.cells.split(",") if c] if args.cells else (),
                    jobs=jobs, on_interrupt=lambda: terminate(descendants(os.getpid())))
    print(f"fedapps: table and plots in {out}")
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of runs, at least 1")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser, sub = app_cli.build_parser()
    r = sub.add_parser("reproduce", help="run a grid over seeds; table and plots vs the paper")
    r.add_argument("grid", help="a file in conf/grid (or an experiment preset)")
    r.add_argument("--seeds", type=int, default=None, help="use seeds 0..N-1 (default: the grid's)")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("--cells", default=None, metavar="LABEL[,LABEL]",
                   help="run only these cells (the table still shows every finished run)")
    r.add_argument("--table-only", action="store_true",
                   help="only tabulate and plot the finished runs on disk; start none")
    r.add_argument("--jobs", type=_positive, default=1, metavar="N",
                   help="runs at a time, each its own SuperLink, sharing the CPUs (and the GPU); "
                        "default 1")
    r.add_argument("--output-dir", default="outputs", help="runs go to <output-dir>/<grid>/")
    return app_cli.main(argv, parser, {"reproduce": _reproduce})


if __name__ == "__main__":
    sys.exit(main())
