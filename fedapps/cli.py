"""`fedapps` command line: run, validate, resume and list experiments, deploy them on real
SuperLink/SuperNode processes. simulations/cli.py (the `fedapps` console script) adds
`reproduce` and `partition`."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from fedapps import rundir
from fedapps.config import available, to_container
from fedapps.errors import ConfigError
from fedapps.metrics import show_metric
from fedapps.paths import data_root

OVERWRITE_HELP = ("replace a run already in the run directory (without it, a completed or "
                  "resumable run there is an error)")


COLD_HELP = ("Flower's default isolation: a fresh ClientApp process per message (about 3 s of "
             "start-up each) instead of one long-running ClientApp process per node")


PULL_HELP = ("SECONDS (0.05-3): the SuperNode pulls for work this often while idle instead of "
             "Flower's 3 s (its loop patched in this process, flwr 1.41-1.42 only; more pulls "
             "on the SuperLink; fedapps/quick_supernode.py, measured in docs/PERFORMANCE.md)")
LINK_HOLD_HELP = ("SECONDS (2-20): the SuperLink holds a pull that finds nothing (a node's for "
                  "a message, the ServerApp's for a reply, either's for an object) this long, "
                  "answering as soon as it arrives (flwr 1.41-1.42 only; with --pull-interval "
                  "the nodes then pull again at once; fedapps/quick_superlink.py)")


ONE_PROCESS_HELP = ("run the node's long-running ClientApp in a thread of its SuperNode's own "
                    "process, calling the SuperNode's Runtime API directly instead of over "
                    "loopback HTTP: one process per node, 70-120 MB less each and less CPU a "
                    "round (FMNIST preset); a crash of the interpreter ends the SuperNode too "
                    "(flwr 1.41-1.42 only; fedapps/one_process_node.py, measured in "
                    "docs/PERFORMANCE.md)")


CPUS_HELP = ("CPUs the run's Ray may use (default: all of this machine's); one client trains "
             "per CPU, so with 1 the run leaves the other cores to other work (two quick runs "
             "side by side on 2 cores: 42-46 s instead of 47-48 s, docs/PERFORMANCE.md)")


def cpus_arg(text: str) -> int:
    """argparse type of --cpus: a whole number, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of CPUs, at least 1")
    return int(text)


RAY_HELP = ("run the simulated clients on an existing Ray cluster (the head's address, as "
            "`ray start --head` prints it) instead of a Ray started on this machine")


def build_parser() -> tuple[argparse.ArgumentParser, Any]:
    """The parser and its subparsers (simulations/cli.py adds `reproduce` to them)."""
    p = argparse.ArgumentParser(
        prog="fedapps", description="Federated learning experiments on Flower. Every command "
        "has its own --help. (`python -m fedapps.cli` lacks reproduce and partition: use the "
        "`fedapps` console script.)")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("run", "run an experiment as a Flower simulation"),
                       ("validate", "resolve and check an experiment's config, print it")):
        s = sub.add_parser(name, help=text)
        presets = ", ".join(available("experiment"))
        s.add_argument("experiment", help=f"preset in conf/experiment: {presets}")
        s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, e.g. --set rounds=5 --set data.alpha=0.5")
        if name == "run":
            s.add_argument("--verbose", action="store_true", help="show Flower's whole log")
            s.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
            s.add_argument("--ray-address", default=None, metavar="HOST:PORT", help=RAY_HELP)
            s.add_argument("--cpus", type=cpus_arg, default=None, metavar="N", help=CPUS_HELP)
    d = sub.add_parser("deploy-local", help="run an experiment on a real SuperLink + SuperNodes "
                       "(separate processes, loopback gRPC/HTTP)")
    d.add_argument("experiment", help="preset in conf/experiment (see `fedapps list`)")
    d.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, as for `fedapps run`")
    d.add_argument("--state-dir", default=None,
                   help="per-node personal state on disk (default: <run dir>/node-state)")
    d.add_argument("--tls", metavar="DIR", default=None,
                   help="TLS + SuperNode authentication with the certificates and keys of "
                        "deploy/make_certs.py in DIR (made there if DIR is empty)")
    d.add_argument("--verbose", action="store_true", help="show Flower's whole log")
    d.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    d.add_argument("--cold", action="store_true", help=COLD_HELP)
    d.add_argument("--pull-interval", type=float, default=None, metavar="SECONDS",
                   help=PULL_HELP)
    d.add_argument("--link-hold", type=float, default=None, metavar="SECONDS",
                   help=LINK_HOLD_HELP)
    d.add_argument("--one-process", action="store_true", help=ONE_PROCESS_HELP)
    d.add_argument("--compute-slots", type=int, default=None, metavar="N",
                   help="at most N of the local nodes' ClientApps compute at once, the others "
                        "waiting for a slot, as a simulation runs as many clients as it has "
                        "cores (default: this machine's cores; 0: all at once; warm nodes "
                        "only; fedapps/compute_slots.py)")
    n = sub.add_parser("node", help="start one SuperNode for this app (e.g. on a Jetson)")
    n.add_argument("--superlink", required=True, help="SuperLink Fleet address host:port")
    n.add_argument("--partition-id", type=int, required=True,
                   help="this node's client, 0..num-partitions-1 (its data partition)")
    n.add_argument("--num-partitions", type=int, required=True,
                   help="clients in the federation (= the experiment's federation.num-clients)")
    n.add_argument("--data-root", default=None,
                   help="folder holding the dataset on this device (default: data.data-root, "
                        "else $FEDAPPS_DATA_ROOT, else ./data)")
    n.add_argument("--dataset", default=None, help="check that data-root holds this dataset")
    n.add_argument("--state-dir", default=None,
                   help="keep personal client state on disk here (survives a node restart)")
    n.add_argument("--num-threads", type=int, default=None,
                   help="torch CPU threads for training (default 1)")
    n.add_argument("--root-certificates", default=None, help="CA certificate (TLS)")
    n.add_argument("--auth-key", default=None, help="this node's private key (node auth)")
    n.add_argument("--check-only", action="store_true", help="validate and exit")
    n.add_argument("--cold", action="store_true", help=COLD_HELP)
    n.add_argument("--pull-interval", type=float, default=None, metavar="SECONDS",
                   help=PULL_HELP)
    n.add_argument("--one-process", action="store_true", help=ONE_PROCESS_HELP)
    n.add_argument("--runtime-port", type=int, default=9094,
                   help="local port of the SuperNode's Runtime API (default 9094)")
    r = sub.add_parser("resume", help="continue a stopped run from its checkpoint")
    r.add_argument("run_dir", help="outputs/<run-name> of the run to continue")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="only rounds (e.g. --set rounds=50 to run further than first planned), "
                        "output.plots, federation.round-timeout and wandb.* may change")
    r.add_argument("--verbose", action="store_true", help="show Flower's whole log")
    r.add_argument("--ray-address", default=None, metavar="HOST:PORT", help=RAY_HELP)
    r.add_argument("--cpus", type=cpus_arg, default=None, metavar="N", help=CPUS_HELP)
    sub.add_parser("list", help="list experiments, datasets, algorithms and grids")
    return p, sub


def _resolve(experiment: str, overrides: list[str]):
    from fedapps.validation import resolve_config  # torch + Flower: only when a config is checked

    return resolve_config(experiment, overrides)


def _resuming_here(run: Path) -> list[str]:
    """The overrides that resume the run in `run` where it is now (its folder may have moved
    since it started)."""
    return [f"output.output-dir={run.parent}", f"output.run-name={run.name}",
            "output.resume=true"]


def _resume(args: argparse.Namespace) -> int:
    """Continue a run from its checkpoint, with its run id (so its clients find their state).
    Everything is checked before anything is written: only RESUMABLE keys may change, and the
    rounds must go beyond the checkpoint's (a completed run stays as it is otherwise)."""
    import shlex

    from fedapps.checkpoint import load

    run = Path(args.run_dir).resolve()
    try:
        invocation = json.loads((run / "results.json").read_text())["invocation"]
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        raise ConfigError(f"{run}: no results.json with an invocation to resume") from None
    if invocation.get("command") == "centralized":  # `fedapps centralized`: no Flower
        from fedapps.centralized import resume_centralized

        return resume_centralized(run, invocation, args.overrides)
    saved = load(run)
    if saved is None:
        raise ConfigError(f"{run}: no checkpoint.npz (the run stopped before its first round)")
    args.experiment = invocation["experiment"]
    base = [*shlex.split(invocation["overrides"]), *_resuming_here(run)]
    cfg = _resolve(args.experiment, [*base, *args.overrides])
    rundir.check_resume_changes(to_container(_resolve(args.experiment, base)),
                                to_container(cfg))
    done = saved.completed_rounds
    if int(cfg.rounds) <= done:
        raise ConfigError(f"{run}: rounds={cfg.rounds} but the run ({rundir.run_status(run)}) "
                          f"has done {done} rounds; `fedapps resume {run} --set rounds=N` with "
                          f"N > {done} runs it further")
    args.overrides = [*base, *args.overrides]
    return _run(args, mode=rundir.RESUME)


def resume_point(run: Path, experiment: str, overrides: Sequence[str]) -> int | None:
    """The rounds done by an unfinished run in `run` that `experiment` with `overrides` would
    continue as `fedapps resume` does: same experiment, no key outside RESUMABLE changed, a
    run id and a checkpoint short of the rounds. None otherwise (nothing there, a completed
    run, a run of other settings, one stopped before its first checkpoint, a damaged
    checkpoint): `fedapps reproduce` then starts the run again from scratch."""
    import shlex

    from fedapps.checkpoint import load

    if rundir.run_status(run) in (None, "completed") or rundir.read_run_id(run) is None:
        return None
    try:
        invocation = json.loads((run / "results.json").read_text())["invocation"]
        saved = load(run)
        if saved is None or invocation.get("command") or invocation["experiment"] != experiment:
            return None
        here = _resuming_here(run)
        before = _resolve(experiment, [*shlex.split(invocation["overrides"]), *here])
        after = _resolve(experiment, [*overrides, *here])
        rundir.check_resume_changes(to_container(before), to_container(after))
    except (OSError, KeyError, TypeError, ValueError, ConfigError):  # JSONDecodeError: a ValueError
        return None
    return saved.completed_rounds if saved.completed_rounds < int(after.rounds) else None


def _named_run(args: argparse.Namespace):
    """The validated config, its run directory (named now if unnamed) and its client count."""
    from fedapps.preflight import check_run
    from fedapps.runtime import run_dir
    from fedapps.server_app import default_run_name

    cfg = _resolve(args.experiment, args.overrides)
    if not cfg.output["run-name"]:
        cfg.output["run-name"] = default_run_name(cfg)
    check_run(cfg, run_dir(cfg))  # this machine: output folder, device, checkpoint
    return cfg, run_dir(cfg), int(cfg.federation["num-clients"])


def _mode(args: argparse.Namespace) -> str:
    """What a new run does with a run already in its directory (fedapps/rundir.py)."""
    return rundir.OVERWRITE if getattr(args, "overwrite", False) else rundir.NEW


def _run(args: argparse.Namespace, mode: str | None = None) -> int:
    from fedapps.launcher import gpus_per_client, run_experiment

    if args.cpus and args.ray_address:
        raise ConfigError("--cpus caps a Ray started on this machine; a cluster's CPUs "
                          "(--ray-address) are its own")
    cfg, out, n = _named_run(args)
    print(f"fedapps: {cfg.experiment} ({cfg.algorithm} on {cfg.dataset}, {n} clients, "
          f"{cfg.rounds} rounds) -> {out}", flush=True)
    status = run_experiment(cfg.experiment, args.overrides + [f"output.run-name={out.name}",
                                                               f"output.output-dir={out.parent}"],
                            n, out, gpus_per_client=gpus_per_client(str(cfg.device)),
                            show=(lambda line: True) if args.verbose else _show,
                            mode=mode or _mode(args),
                            ray_address=args.ray_address, total_cpus=args.cpus)
    return _report(status, out)


def _report(status: str, out: Path) -> int:
    """Print the summary; 0 only if the SuperLink and the results file both say completed."""
    results = out / "results.json"
    summary = json.loads(results.read_text())["summary"] if results.is_file() else {}
    if status != "finished:completed" or summary.get("status") != "completed":
        recorded = str(summary.get("status", ""))  # why, when the run or the launcher said
        why = (recorded.removeprefix("failed: ") if recorded.startswith(("failed", "stopped"))
               else f"status {status}")
        print(f"fedapps: run failed ({why}); partial results: {out}", file=sys.stderr)
        return 1

    metric = summary.get("metric", "accuracy")

    def show(key: str) -> str:
        return show_metric(summary.get(f"{key}_{metric}"), metric)

    emd = summary.get("emd")
    skew = f", EMD {emd:.3f}" if emd is not None else ""
    official = "" if summary.get(f"best_official_test_{metric}") is None else \
        (f", official test best {show('best_official_test')}"
         f" final {show('final_official_test')}")
    print(f"fedapps: done in {summary['wall_seconds']:.0f}s. best G {show('best_global')}"
          f", best P {show('best_personal')}, final G {show('final_global')}"
          f", final P {show('final_personal')}{official}{skew}")
    print(f"fedapps: results in {out} (results.json, metrics.csv, config.yaml, {metric}.png)")
    return 0


def _check_pull_interval(args: argparse.Namespace) -> None:
    """A bad --pull-interval or --one-process (or a Flower they cannot patch) is a one-line
    error before anything starts."""
    if args.pull_interval is not None:
        from fedapps.quick_supernode import check

        check(args.pull_interval)
    if args.one_process:
        if args.cold:
            raise ConfigError("--one-process runs the node's long-running ClientApp in the "
                              "SuperNode's process: it cannot go with --cold")
        from fedapps.one_process_node import check as check_one_process

        check_one_process()


def _deploy_local(args: argparse.Namespace) -> int:
    from fedapps.deploy import check_tls_folder, run_federation

    _check_pull_interval(args)
    if args.link_hold is not None:
        from fedapps.quick_superlink import check

        check(args.link_hold)
    slots = args.compute_slots
    if slots is None:
        from fedapps.compute_slots import machine_cores

        slots = machine_cores()
    if slots < 0:
        raise ConfigError(f"--compute-slots {slots}: must be 0 (no limit) or more")
    cfg, out, n = _named_run(args)
    if args.tls:
        check_tls_folder(Path(args.tls).resolve(), n)
    state = Path(args.state_dir).resolve() if args.state_dir else out / "node-state"
    print(f"fedapps: {cfg.experiment} on a local SuperLink + {n} SuperNodes -> {out}",
          flush=True)
    status = run_federation(cfg.experiment, args.overrides, n, out, data_root=data_root(cfg),
                            state_root=state,
                            secure=Path(args.tls).resolve() if args.tls else None,
                            warm=not args.cold, pull_interval=args.pull_interval,
                            link_hold=args.link_hold, one_process=args.one_process,
                            compute_slots=slots or None,
                            show=(lambda line: True) if args.verbose else _show,
                            mode=_mode(args))
    return _report(status, out)


def _node(args: argparse.Namespace) -> int:
    """Validate a SuperNode's settings, start the long-running ClientApp process (unless
    --cold or --one-process), then become `flower-supernode` (same PID, which the ClientApp
    process watches; with --one-process, the SuperNode that runs its ClientApp itself)."""
    import os
    import shutil
    import subprocess

    from fedapps.deploy import (
        check_node_settings,
        node_config,
        supernode_command,
        warm_clientapp_command,
    )

    _check_pull_interval(args)
    check_node_settings(args.superlink, args.partition_id, args.num_partitions,
                        args.data_root, args.dataset, tls=args.root_certificates is not None)
    if args.check_only:
        print("fedapps: node settings OK")
        return 0
    extra = {"num-threads": str(args.num_threads)} if args.num_threads else None
    config = node_config(args.partition_id, args.num_partitions,
                         Path(args.data_root).resolve() if args.data_root else None,
                         Path(args.state_dir).resolve() if args.state_dir else None, extra)
    flags = ["--superlink", args.superlink, "--node-config", config]
    flags += (["--root-certificates", args.root_certificates] if args.root_certificates
              else ["--insecure"])
    if args.auth_key:
        flags += ["--auth-supernode-private-key", args.auth_key]
    flags += ["--port", str(args.runtime_port),
              "--isolation", "subprocess" if args.cold else "process"]
    cmd = supernode_command(flags, args.pull_interval, args.one_process)
    exe = cmd[0] if cmd[0] == sys.executable else shutil.which(cmd[0])
    if exe is None:
        raise ConfigError("flower-supernode not found: install this project (pip install -e .)")
    if not args.cold and not args.one_process:
        subprocess.Popen(warm_clientapp_command(args.runtime_port, os.getpid(),
                                                args.pull_interval))
    os.execv(exe, cmd)
    return 0  # not reached


def _show(line: str) -> bool:
    from fedapps.launcher import default_filter

    return default_filter(line)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # so the launcher's cleanup stops the SuperLink it started


def main(argv: list[str] | None = None,
         parser: argparse.ArgumentParser | None = None,
         handlers: dict[str, Callable[[argparse.Namespace], int]] | None = None) -> int:
    args = (parser or build_parser()[0]).parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if handlers and args.command in handlers:
            return handlers[args.command](args)
        if args.command == "resume":
            return _resume(args)
        if args.command == "deploy-local":
            return _deploy_local(args)
        if args.command == "node":
            return _node(args)
        if args.command == "list":
            for kind in ("experiment", "dataset", "algorithm", "grid"):
                print(f"{kind}s: {', '.join(available(kind))}")
            return 0
        if args.command == "validate":
            print(OmegaConf.to_yaml(_resolve(args.experiment, args.overrides)), end="")
            return 0
        return _run(args)
    except ConfigError as err:
        print(f"fedapps: config error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedapps: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
