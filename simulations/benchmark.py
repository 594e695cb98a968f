"""Overhead benchmark: the same client work as a Flower simulation and as a plain PyTorch loop.

    FEDAPPS_DATA_ROOT=../shared/data python -m simulations.benchmark            # full
    python -m simulations.benchmark --quick                                      # tiny (CI)
    FEDAPPS_DATA_ROOT=../shared/data python -m simulations.benchmark --scaling-only \
        --rounds 3 --scaling 100,1000,5000                                       # large federations

(a) `fedapps run` of the experiment (real SuperLink, Ray, one CPU per client) and (b) the same
clients, data, sampling, local training and evaluation in one process, without Flower, side by
side in one invocation. Reports the steady-state per-round time of each (median over rounds
after the first), their ratio, start-up time, bytes per round, peak RSS, and per-round time as
the federation grows at a fixed number of participants, with evaluation time separate.
Writes a JSON and a markdown report; numbers are measurements, nothing is asserted.
`--quick` runs (a) with the settings of its one scaling row (10 IID clients), so that one Flower
run gives both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clients.arrays import get_arrays
from fedapps.config import clients_per_round, load_config
from fedapps.data import federated_data
from fedapps.registry import ALGORITHMS, algo_settings
from fedapps.runtime import train_settings
from fedapps.validation import validate
from strategies.aggregation import weighted_average
from strategies.base import BaseStrategy


def steady(values: list[float]) -> float:
    """Median of the rounds after the first (the first pays for start-up)."""
    return statistics.median(values[1:] if len(values) > 1 else values)


def plain_loop(experiment: str, sets: list[str], threads: int) -> dict[str, Any]:
    """The experiment's client work in one process: same sampling, training, evaluation."""
    torch.set_num_threads(threads)
    cfg = load_config(experiment, sets)
    validate(cfg)
    spec = ALGORITHMS[cfg.algorithm]
    fd = federated_data(cfg)
    model = spec.model(cfg)
    arrays = get_arrays(model)
    n = int(cfg.federation["num-clients"])
    sampler = BaseStrategy(initial_arrays=arrays, num_rounds=int(cfg.rounds), num_clients=n,
                           clients_per_round=clients_per_round(cfg), seed=int(cfg.seed),
                           eval_fraction=float(cfg.eval.fraction))
    fit_t, eval_t = [], []
    for rnd in range(1, int(cfg.rounds) + 1):
        t0 = time.perf_counter()
        results = []
        for pid in sampler.sample(rnd, range(n)):
            client = spec.client(spec.model(cfg), spec.client_data(cfg, fd, pid, "cpu"),
                                 train_settings(cfg), pid, algo=algo_settings(cfg))
            out, num, _ = client.fit(arrays, {"server-round": rnd})
            results.append((out, num))
        arrays = weighted_average([r[0] for r in results], [r[1] for r in results])
        t1 = time.perf_counter()
        correct = total = 0
        for pid in sampler.eval_sample(rnd, range(n)):
            client = spec.client(spec.model(cfg), spec.client_data(cfg, fd, pid, "cpu"),
                                 train_settings(cfg), pid, algo=algo_settings(cfg))
            _, num, metrics = client.evaluate(arrays, {"server-round": rnd})
            correct += int(metrics["correct-global"])
            total += num
        fit_t.append(t1 - t0)
        eval_t.append(time.perf_counter() - t1)
    return {"fit_seconds": fit_t, "eval_seconds": eval_t,
            "round_seconds": [a + b for a, b in zip(fit_t, eval_t, strict=True)],
            "final_global_accuracy": correct / max(total, 1),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


class TreeMemory:
    """Peak resident memory (RSS and PSS, kB) of a process and all its descendants, sampled
    every `period` seconds in a thread: every process of a simulation (launcher, SuperLink,
    ServerApp, Ray and its actors) together."""

    def __init__(self, pid: int, period: float = 1.0) -> None:
        self.pid, self.period = pid, period
        self.peak_rss = self.peak_pss = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        from fedapps.processes import descendants
        from simulations.deploy_benchmark import memory_kb

        while not self.done.is_set():
            mem = [memory_kb(p) for p in (self.pid, *descendants(self.pid))]
            self.peak_rss = max(self.peak_rss, sum(m[0] for m in mem))
            self.peak_pss = max(self.peak_pss, sum(m[1] for m in mem))
            self.done.wait(self.period)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def flower_run(experiment: str, sets: list[str], out_dir: Path) -> dict[str, Any]:
    """`fedapps run` in a subprocess; per-round times come from its results.json, the memory
    of its whole process tree from a sampler."""
    run = out_dir / f"flower-{len(list(out_dir.glob('flower-*')))}"
    cmd = [sys.executable, "-m", "simulations.cli", "run", experiment,
           *[x for s in sets for x in ("--set", s)],
           "--set", f"output.output-dir={run.parent}", "--set", f"output.run-name={run.name}"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    memory = TreeMemory(proc.pid)
    _, stderr = proc.communicate()
    memory.stop()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"flower run failed: {stderr[-2000:]}")
    doc = json.loads((run / "results.json").read_text())
    rounds = doc["rounds"]
    round_s = [r["seconds"] for r in rounds]
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"round_seconds": round_s, "fit_seconds": [r["fit_seconds"] for r in rounds],
            "eval_seconds": [r["eval_seconds"] for r in rounds],
            "startup_seconds": wall - sum(round_s), "wall_seconds": wall,
            "bytes_down": rounds[-1]["bytes_down"], "bytes_up": rounds[-1]["bytes_up"],
            "bytes_down_eval": rounds[-1]["bytes_down_eval"],
            "final_global_accuracy": doc["summary"]["final_global_accuracy"],
            "largest_child_peak_rss_mb": children,
            "peak_tree_rss_mb": memory.peak_rss // 1024,
            "peak_tree_pss_mb": memory.peak_pss // 1024}


def report(res: dict[str, Any]) -> str:
    lines = [f"Machine: {res['machine']}; experiment `{res['experiment']}` with "
             f"`{' '.join(res['sets'])}`.", ""]
    if "flower" in res:
        lines += overhead_lines(res)
    lines += [
        "| total clients | start-up + teardown | per round (steady) | fit | eval | eval clients "
        "| peak RSS, all processes | peak PSS |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in res["scaling"]:
        lines.append(f"| {row['clients']:,} | {row['startup']:.1f} s | {row['round']:.2f} s | "
                     f"{row['fit']:.2f} s | {row['eval']:.2f} s | {row['eval_clients']} | "
                     f"{row['peak_tree_rss_mb']:,} MB | {row['peak_tree_pss_mb']:,} MB |")
    return "\n".join(lines) + "\n"


def overhead_lines(res: dict[str, Any]) -> list[str]:
    """(a) against (b): the overhead table."""
    a, b1, b2 = res["flower"], res["plain_1thread"], res["plain_all_threads"]
    lines = [
        "| | per round (steady) | fit | eval | start-up | final G |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| (a) Flower simulation | {steady(a['round_seconds']):.2f} s | "
        f"{steady(a['fit_seconds']):.2f} s | {steady(a['eval_seconds']):.2f} s | "
        f"{a['startup_seconds']:.1f} s | {100 * a['final_global_accuracy']:.2f}% |",
    ]
    for name, b in (("(b) plain loop, 1 thread", b1),
                    (f"(b) plain loop, {res['cores']} threads", b2)):
        lines.append(f"| {name} | {steady(b['round_seconds']):.2f} s | "
                     f"{steady(b['fit_seconds']):.2f} s | {steady(b['eval_seconds']):.2f} s |"
                     f" - | {100 * b['final_global_accuracy']:.2f}% |")
    lines += [
        "",
        f"Ratio (a)/(b) per round: {res['ratio_vs_1thread']:.2f} against the 1-thread loop, "
        f"{res['ratio_vs_all_threads']:.2f} against the {res['cores']}-thread loop.",
        f"Bytes per round: {a['bytes_down']:,} down and {a['bytes_up']:,} up for training, "
        f"{a['bytes_down_eval']:,} down for evaluation.",
        f"Peak RSS: plain loop {b2['peak_rss_mb']:.0f} MB; largest Flower child process "
        f"{a['largest_child_peak_rss_mb']:.0f} MB; all of the Flower run's processes "
        f"{a['peak_tree_rss_mb']:,} MB (PSS {a['peak_tree_pss_mb']:,} MB).",
        "",
    ]
    return lines


def eval_share(n: int) -> float:
    """The share of `n` clients evaluated a round: all up to 100, a seeded 100 of larger ones."""
    return 1.0 if n <= 100 else 100 / n


def scaling_sets(n: int) -> list[str]:
    """The settings of the scaling row of `n` clients: 5 trained a round; IID so that every
    federation size can be partitioned (Dirichlet 0.1 with 500 clients cannot give each client
    data.min-size samples)."""
    return [f"federation.num-clients={n}", "federation.clients-per-round=5",
            f"eval.fraction={eval_share(n):g}", "data.partitioner=iid"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", default="fedavg-fmnist")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--scaling", default="20,100,500", help="total clients to try")
    p.add_argument("--quick", action="store_true", help="tiny run on the embedded digits")
    p.add_argument("--scaling-only", action="store_true",
                   help="only the federation sizes of --scaling (no plain loop, no overhead run)")
    p.add_argument("--out", default="outputs/benchmark")
    args = p.parse_args(argv)
    experiment = "quickstart" if args.quick else args.experiment
    rounds = 2 if args.quick else args.rounds
    scaling = [10] if args.quick else [int(n) for n in args.scaling.split(",")]
    sets = [f"rounds={rounds}", "train.local-epochs=1", "eval.eval-every=1"]
    if args.quick:  # (a) is the scaling row's run itself: one Flower run, not two
        sets += scaling_sets(scaling[0])
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=out))
    runs: dict[tuple[str, ...], dict[str, Any]] = {}

    def flower(run_sets: list[str]) -> dict[str, Any]:
        """A Flower run of these settings, once: a repeated setting or run is not run again."""
        key = tuple(dict.fromkeys(run_sets))
        if key not in runs:
            runs[key] = flower_run(experiment, list(key), work)
        return runs[key]

    res: dict[str, Any] = {"experiment": experiment, "sets": sets, "cores": cores,
                           "machine": f"{platform.machine()}, {cores} cores, "
                                      f"torch {torch.__version__}"}
    if not args.scaling_only:
        print("benchmark: (b) plain loop, 1 thread", flush=True)
        res["plain_1thread"] = plain_loop(experiment, sets, 1)
        print(f"benchmark: (b) plain loop, {cores} threads", flush=True)
        res["plain_all_threads"] = plain_loop(experiment, sets, cores)
        print("benchmark: (a) Flower simulation", flush=True)
        res["flower"] = flower(sets)
        fa = steady(res["flower"]["round_seconds"])
        res["ratio_vs_1thread"] = fa / steady(res["plain_1thread"]["round_seconds"])
        res["ratio_vs_all_threads"] = fa / steady(res["plain_all_threads"]["round_seconds"])
    res["scaling"] = []
    for n in scaling:
        print(f"benchmark: scaling, {n} clients", flush=True)
        r = flower([*sets, *scaling_sets(n)])
        res["scaling"].append({"clients": n, "round": steady(r["round_seconds"]),
                               "fit": steady(r["fit_seconds"]),
                               "eval": steady(r["eval_seconds"]),
                               "eval_clients": max(1, int(np.ceil(eval_share(n) * n))),
                               "startup": r["startup_seconds"],
                               "peak_tree_rss_mb": r["peak_tree_rss_mb"],
                               "peak_tree_pss_mb": r["peak_tree_pss_mb"]})
    (out / "benchmark.json").write_text(json.dumps(res, indent=1))
    md = report(res)
    (out / "benchmark.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
