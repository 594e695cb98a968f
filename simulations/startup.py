"""Where a short run's time goes, and what running two at once saves.

    python -m simulations.startup                      # quickstart, 2 rounds, 2 repeats
    python -m simulations.startup --repeats 3 --set algorithm=fedprox

Runs `fedapps run` of the experiment in this process's launcher (fedapps/launcher.py) and
stamps the lines its SuperLink streams, which splits the wall time into: SuperLink start and
submission (until "Successfully started run"), the simulation process and the ServerApp's
set-up (until the ServerApp's first [fedapps] line), Ray, the actors and the nodes' handshake
(until round 1 ends, less round 1's own seconds), the rounds (results.json), and the teardown
(the rest: the SuperLink's final status, stopping the processes). Then it runs two copies of
the run one after the other, side by side, and side by side on one CPU each (`fedapps run
--cpus 1`: one Ray actor per run, as the test suite's paired runs), and reports the ratios.
The same seed gives the same numbers every way (checked). Machines here are noisy: every
figure is from one invocation, and the pairs alternate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fedapps.launcher import run_experiment

PHASES = ("submit", "server set-up", "ray, actors, handshake", "rounds", "teardown")


def timed_run(experiment: str, sets: list[str], run_dir: Path,
              num_supernodes: int, cpus: int | None = None) -> dict[str, Any]:
    """One `fedapps run` with its phases (seconds) and its per-round accuracies."""
    marks: dict[str, float] = {}

    def stamp(line: str) -> bool:
        now = time.perf_counter()
        if "Successfully started run" in line:
            marks.setdefault("started", now)
        elif "[fedapps]" in line and "round " not in line:
            marks.setdefault("server", now)
        elif "[fedapps] round 1/" in line:
            marks.setdefault("round1", now)
        return False

    t0 = time.perf_counter()
    status = run_experiment(experiment, sets, num_supernodes, run_dir, show=stamp,
                            total_cpus=cpus)
    wall = time.perf_counter() - t0
    if status != "finished:completed" or len(marks) < 3:
        raise RuntimeError(f"{run_dir}: run status {status}, saw {sorted(marks)}")
    doc = json.loads((run_dir / "results.json").read_text())
    seconds = [r["seconds"] for r in doc["rounds"]]
    rounds = sum(seconds)
    phases = {"submit": marks["started"] - t0,
              "server set-up": marks["server"] - marks["started"],
              "ray, actors, handshake": marks["round1"] - marks["server"] - seconds[0],
              "rounds": rounds}
    phases["teardown"] = wall - sum(phases.values())
    return {"wall": wall, "phases": phases,
            "accuracy": [r["global_accuracy"] for r in doc["rounds"]]}


def side_by_side(experiment: str, sets: list[str], root: Path, num_supernodes: int,
                 cpus: int | None = None) -> tuple[float, list[list[float]]]:
    """Two copies of the run at once (own SuperLink and Ray each, on `cpus` CPUs each, default
    all); wall seconds, accuracies."""
    out: dict[int, dict[str, Any]] = {}

    def one(i: int) -> None:
        out[i] = timed_run(experiment, sets, root / f"pair-{i}", num_supernodes, cpus)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(out) != 2:
        raise RuntimeError("a run side by side failed (its error is above)")
    return time.perf_counter() - t0, [out[0]["accuracy"], out[1]["accuracy"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulations.startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="quickstart")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--clients", type=int, default=10, help="simulated SuperNodes")
    p.add_argument("--repeats", type=int, default=2, help="pairs of (two alone, two at once)")
    p.add_argument("--out", default="outputs/startup")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats: at least 1")
    sets = [f"rounds={args.rounds}", f"federation.num-clients={args.clients}", *args.sets]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="startup-", dir=out))
    alone: list[dict[str, Any]] = []
    pairs: list[tuple[float, float, float]] = []
    for rep in range(args.repeats):
        print(f"startup: repeat {rep + 1}/{args.repeats}: two runs one after the other",
              flush=True)
        runs = [timed_run(args.experiment, sets, root / f"alone-{rep}-{i}", args.clients)
                for i in (0, 1)]
        alone += runs
        print(f"startup: repeat {rep + 1}/{args.repeats}: two runs side by side", flush=True)
        both, accuracies = side_by_side(args.experiment, sets, root / f"both-{rep}",
                                        args.clients)
        print(f"startup: repeat {rep + 1}/{args.repeats}: two runs side by side, one CPU each",
              flush=True)
        capped, capped_accuracies = side_by_side(args.experiment, sets,
                                                 root / f"one-cpu-{rep}", args.clients, cpus=1)
        seen = (runs[1]["accuracy"], *accuracies, *capped_accuracies)
        if any(a != runs[0]["accuracy"] for a in seen):
            raise RuntimeError(f"the same seed gave different numbers: {runs[0]['accuracy']}, "
                               f"{seen}")
        pairs.append((runs[0]["wall"] + runs[1]["wall"], both, capped))
    res = {"machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "load_average": os.getloadavg(), "experiment": args.experiment, "sets": sets,
           "runs_alone": alone, "pairs": pairs}
    (root / "startup.json").write_text(json.dumps(res, indent=1))
    lines = [f"Machine: {res['machine']}, load average at the end "
             f"{res['load_average'][0]:.1f}; `{args.experiment}` with `{' '.join(sets)}`; "
             f"{len(alone)} runs alone.", "",
             "| phase | median seconds | share of the wall time |", "| --- | --- | --- |"]
    wall = statistics.median(r["wall"] for r in alone)
    for phase in PHASES:
        sec = statistics.median(r["phases"][phase] for r in alone)
        lines.append(f"| {phase} | {sec:.1f} | {sec / wall:.0%} |")
    lines += [f"| whole run | {wall:.1f} | 100% |", "",
              "| two runs one after the other | two side by side | ratio | two side by side, "
              "one CPU each | ratio |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {a:.1f} s | {b:.1f} s | {a / b:.2f} | {c:.1f} s | {a / c:.2f} |"
              for a, b, c in pairs]
    text = "\n".join(lines) + "\n"
    (root / "startup.md").write_text(text)
    print(text + f"\n(written to {root})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
