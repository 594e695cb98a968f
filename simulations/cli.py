"""The `fedapps` console script: fedapps.cli's commands plus `reproduce` (grids of runs),
`partition` (look at a partition's skew before spending compute on it) and `memory` (peak
training memory per precision, simulations/memory.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from fedapps import cli as app_cli
from fedapps import rundir
from fedapps.config import load_config
from fedapps.errors import ConfigError


def _reproduce(args: argparse.Namespace) -> int:
    from fedapps.launcher import gpus_per_client, run_experiment
    from fedapps.processes import descendants, terminate
    from simulations.reproduce import PLOT_KINDS, parse_plots, parse_seeds, reproduce

    jobs = args.jobs
    # concurrent runs split the CPUs (each SuperLink's Ray would otherwise claim all of them)
    cpus = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None

    def runner(experiment: str, sets: list[str], n_clients: int, run_dir: Path) -> str:
        device = str(load_config(experiment, sets).device)
        prefix = f"[{run_dir.name}] " if jobs > 1 else ""
        # an unfinished run continues from its checkpoint with its run id (or, with
        # --restart-unfinished or when it cannot, starts again clean with a new one); a
        # completed run is never replaced
        done = None if args.restart_unfinished else app_cli.resume_point(run_dir, experiment, sets)
        mode = rundir.REDO_UNFINISHED
        if done is not None:
            print(f"{prefix}fedapps: {run_dir.name}: continuing the unfinished run after round "
                  f"{done}", flush=True)
            sets, mode = [*sets, "output.resume=true"], rundir.RESUME_UNFINISHED
        return run_experiment(experiment, sets, n_clients, run_dir,
                              gpus_per_client=gpus_per_client(device), total_cpus=cpus,
                              prefix=prefix, mode=mode, ray_address=args.ray_address)

    seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    out = reproduce(args.grid, seeds, args.overrides, Path(args.output_dir).resolve(),
                    runner, table_only=args.table_only,
                    only=[c for c in args.cells.split(",") if c] if args.cells else (),
                    jobs=jobs, on_interrupt=lambda: terminate(descendants(os.getpid())),
                    paired_against=args.paired_against,
                    keep_root=Path(args.keep).resolve() if args.keep else None,
                    plots=parse_plots(args.plots) if args.plots is not None else PLOT_KINDS)
    print(f"fedapps: table and plots in {out}")
    return 0


def partition_report(experiment: str, overrides: list[str]) -> dict[str, Any]:
    """The partition of a validated config, built (or read from the cache) without training:
    the parameters it ran with (a target EMD's solved ones), sizes, class counts and EMDs. For
    regression data the "classes" are the equal-frequency target bins (data.fedaiot.bins) of
    the partitioned samples, the pseudo-classes fedaiot-quantiles deals out; for detection data
    they are the clients' ground-truth boxes per class."""
    from fedapps.data import federated_data
    from fedapps.data.fedaiot_partition import quantile_bins
    from fedapps.data.partition import class_counts, client_emd, emd

    cfg = app_cli._resolve(experiment, overrides)
    fd = federated_data(cfg)
    grouping = "classes"
    parts = [np.concatenate([a, b]) for a, b in zip(fd.train_idx, fd.test_idx, strict=True)]
    if fd.pool.task == "detection":
        boxes = fd.pool.y[..., 0].long().numpy()  # class per box row, -1 = padding
        counts = np.stack([np.bincount(boxes[p][boxes[p] >= 0], minlength=fd.pool.num_classes)
                           for p in parts])
        grouping = "box classes"
    elif fd.pool.labels() is None:
        bins = int(cfg.data.fedaiot.bins)
        n = len(fd.pool) if fd.key["pool"] == "merged" else fd.pool.num_train
        counts = class_counts(parts, quantile_bins(fd.pool.y[:n].numpy(), bins), bins)
        grouping = "target bins"
    else:
        counts = fd.counts("all")
    return {
        "experiment": experiment, "dataset": str(cfg.dataset),
        **fd.ran_with(), "seed": int(cfg.seed),
        "num_clients": fd.num_clients, "num_classes": int(counts.shape[1]), "grouping": grouping,
        "sizes": [len(p) for p in parts],  # samples (images); counts may be boxes
        "train_sizes": [len(t) for t in fd.train_idx], "test_sizes": [len(t) for t in fd.test_idx],
        "class_counts": counts.tolist(),
        "client_emd": [round(float(v), 6) for v in client_emd(counts)],
        "emd": float(emd(counts)),
    }


def report_lines(report: dict[str, Any]) -> list[str]:
    """The printed table: one line per client, then `EMD <value>` last (three decimals)."""
    from fedapps.data import params_text

    params = params_text(report["params"])
    lines = [f"fedapps: {report['experiment']}: {report['partitioner']} ({params}) on "
             f"{report['dataset']}, {report['num_clients']} clients, {report['num_classes']} "
             f"{report.get('grouping', 'classes')}, seed {report['seed']}",
             f"{'client':>6} {'size':>6} {'train':>6} {'test':>5} {'emd':>6}  class counts"]
    for k, row in enumerate(report["class_counts"]):
        lines.append(f"{k:>6} {report['sizes'][k]:>6} {report['train_sizes'][k]:>6} "
                     f"{report['test_sizes'][k]:>5} {report['client_emd'][k]:>6.3f}  "
                     + " ".join(str(c) for c in row))
    lines.append(f"EMD {report['emd']:.3f}")
    return lines


def _partition(args: argparse.Namespace) -> int:
    report = partition_report(args.experiment, args.overrides)
    outputs = []
    try:
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
            outputs.append(args.json)
        if args.png:
            from fedapps.plots import plot_label_heatmap

            plot_label_heatmap(report["class_counts"], report["emd"], Path(args.png))
            outputs.append(args.png)
    except OSError as err:
        raise ConfigError(f"{err.filename}: {err.strerror}") from None
    lines = report_lines(report)
    print("\n".join(lines[:-1]))
    if outputs:
        print(f"fedapps: wrote {', '.join(outputs)}")
    print(lines[-1])
    return 0


def _centralized(args: argparse.Namespace) -> int:
    from fedapps.centralized import centralized_command

    return centralized_command(args.experiment, args.overrides, args.run_name, args.overwrite,
                               args.num_threads)


def _write_outputs(files: dict[str | None, str]) -> None:
    """Write each requested file (a None path was not asked for); a bad path is one line."""
    for path, text in files.items():
        if not path:
            continue
        try:
            Path(path).write_text(text)
        except OSError as err:
            raise ConfigError(f"{err.filename}: {err.strerror}") from None
        print(f"fedapps: wrote {path}")


def _memory(args: argparse.Namespace) -> int:
    from simulations.memory import memory_table, table_lines

    precisions = [p for p in args.precisions.split(",") if p]
    report = memory_table(args.experiment, args.overrides, precisions, args.batches,
                          args.threads)
    print("\n".join(table_lines(report)))
    _write_outputs({args.json: json.dumps(report, indent=1) + "\n"})
    return 0


def _sizing(args: argparse.Namespace) -> int:
    from simulations.sizing import markdown, select, sizing_table

    report = sizing_table(select(args.only), args.batches, args.threads)
    md = markdown(report)
    print(md, end="")
    _write_outputs({args.json: json.dumps(report, indent=1) + "\n", args.md: md})
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of runs, at least 1")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    """fedapps.cli's commands plus `reproduce` and `partition`: the whole `fedapps` script."""
    parser, sub = app_cli.build_parser()
    parser.description = ("Federated learning experiments on Flower: run, validate, resume, "
                          "deploy-local, node, list, reproduce, partition, centralized, "
                          "memory and sizing. Every command has its own --help.")
    r = sub.add_parser("reproduce", help="run a grid over seeds; table and plots vs the paper")
    r.add_argument("grid", help="a file in conf/grid (or an experiment preset)")
    r.add_argument("--seeds", default=None, metavar="N|LIST",
                   help="N: seeds 0..N-1; or the seeds themselves, e.g. 1,3 or 1-3 (seed 2 "
                        "alone: 2-2) (default: the grid's)")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every run of the grid (a key that a cell "
                        "sets itself keeps the cell's value, with a warning)")
    r.add_argument("--cells", default=None, metavar="LABEL[,LABEL]",
                   help="run only these cells (the table still shows every finished run)")
    r.add_argument("--table-only", action="store_true",
                   help="only tabulate and plot the finished runs on disk; start none")
    r.add_argument("--jobs", type=_positive, default=1, metavar="N",
                   help="runs at a time, each its own SuperLink, sharing the CPUs (and the GPU); "
                        "default 1")
    r.add_argument("--output-dir", default="outputs", help="runs go to <output-dir>/<grid>/")
    r.add_argument("--paired-against", default=None, metavar="LABEL",
                   help="also write paired.md: every cell's per-seed differences from this "
                        "cell, with paired t-test and exact sign-flip p-values")
    r.add_argument("--keep", default=None, metavar="DIR",
                   help="copy the finished runs (these seeds and cells) to DIR/<grid>/ as "
                        "config.yaml, metrics.csv and results.json.gz, never replacing a run "
                        "kept there; --table-only --output-dir DIR tabulates and plots them")
    r.add_argument("--plots", default=None, metavar="KIND[,KIND]|none",
                   help="the PNGs to write: curves (curves.png), transfer "
                        "(curves_by_transfer.png), best (best_by_<axis>.png), clients "
                        "(client_accuracy.png), labels (label_distribution.png); default all")
    r.add_argument("--ray-address", default=None, metavar="HOST:PORT", help=app_cli.RAY_HELP)
    r.add_argument("--restart-unfinished", action="store_true",
                   help="start an interrupted run again from scratch (new run id) instead of "
                        "continuing it from its checkpoint")
    p = sub.add_parser("partition", help="build an experiment's partition without training; "
                       "print sizes, class counts and EMDs")
    p.add_argument("experiment", help="preset in conf/experiment")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="e.g. --set data.partitioner=limit-label --set data.target-emd=1.4")
    p.add_argument("--json", default=None, metavar="FILE", help="write the same numbers as JSON")
    p.add_argument("--png", default=None, metavar="FILE",
                   help="clients x classes heatmap of the counts, with the EMD")
    c = sub.add_parser("centralized", help="the centralized baseline: the experiment's model "
                       "trained on the pooled data in one process (no Flower); writes results, "
                       "a plot and the confusion matrix Q (confusion.csv)")
    c.add_argument("experiment", help="preset in conf/experiment")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="e.g. --set centralized.epochs=50 --set centralized.train-data=official")
    c.add_argument("--run-name", default=None, metavar="NAME",
                   help="run directory under output.output-dir (default "
                        "<experiment>-centralized-s<seed>-<time>)")
    c.add_argument("--overwrite", action="store_true", help=app_cli.OVERWRITE_HELP)
    c.add_argument("--num-threads", type=_positive, default=None, metavar="N",
                   help="torch CPU threads (default: torch's own, all cores; on a shared "
                        "machine 1 avoids oversubscription)")
    m = sub.add_parser("memory", help="peak training memory and time per batch in each "
                       "train.precision (seed 004 Table 2.6), each in a fresh process")
    m.add_argument("experiment", help="preset in conf/experiment")
    m.add_argument("--precisions", default="fp32,fp16,amp,bf16", metavar="P[,P]",
                   help="precisions to measure (default: fp32,fp16,amp,bf16)")
    m.add_argument("--batches", type=_positive, default=20, metavar="N",
                   help="measured batches of train.batch-size, after one warm-up batch")
    m.add_argument("--threads", type=_positive, default=1, metavar="N",
                   help="torch CPU threads of each measurement (default 1)")
    m.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="e.g. --set device=cuda --set train.batch-size=64")
    m.add_argument("--json", default=None, metavar="FILE", help="write the numbers as JSON")
    z = sub.add_parser("sizing", help="device sizing: time per batch and round, and peak memory "
                       "of one client's training, for every model the project ships")
    z.add_argument("--only", default=None, metavar="NAME[,NAME]",
                   help="rows whose preset, model or dataset has one of these names")
    z.add_argument("--batches", type=_positive, default=10, metavar="N",
                   help="timed batches per row, after one warm-up batch (default 10)")
    z.add_argument("--threads", type=_positive, default=1, metavar="N",
                   help="torch CPU threads (default 1: one core of an edge device)")
    z.add_argument("--json", default=None, metavar="FILE", help="write the numbers as JSON")
    z.add_argument("--md", default=None, metavar="FILE", help="write the markdown table")
    return parser


def main(argv: list[str] | None = None) -> int:
    return app_cli.main(argv, build_parser(), {"reproduce": _reproduce, "partition": _partition,
                                               "centralized": _centralized,
                                               "memory": _memory, "sizing": _sizing})


if __name__ == "__main__":
    sys.exit(main())
