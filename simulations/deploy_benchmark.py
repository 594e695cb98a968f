"""Deployment against simulation, side by side in one invocation (docs/PERFORMANCE.md).

Runs the same experiment as a Flower simulation (`fedapps run`), as a real deployment with
Flower's default ClientApp process per message (`deploy-local --cold`), with one long-running
ClientApp process per SuperNode (`deploy-local`), and (mode `deploy_quick`) the same with
SuperNodes that pull every `--pull-interval` seconds while idle (`deploy-local
--pull-interval`), and (mode `deploy_held`) the quick SuperNodes beside a SuperLink that holds
an empty pull until what it asks for arrives (`deploy-local --pull-interval S --link-hold S`),
and (mode `deploy_one`) the held mode with each node's ClientApp a thread of its SuperNode's
process (`... --one-process`; its CPU and memory are the kind `node`). While a deployment
runs, every SuperNode's process tree (SuperNode, Flower's SuperExec and ClientApp processes,
or the warm ClientApp process) is sampled from /proc: peak resident memory
(RSS, and PSS, which splits pages shared between processes) of the tree and of its largest
ClientApp process; and the CPU seconds every process of a run used, by kind (SuperLink,
SuperNodes, ClientApps, Ray workers, ...), in all and a steady round (`cpu_seconds_per_round`,
from the end of round 1 to the end of the last; its table). Each run's steady rounds also say
where each message's time went (results.json `timing`: in the client, or on the way there and
back; fedapps/timing.py; message_timing.png stacks each part's median per mode and phase), and
the warm ClientApps' log lines say what each kind of task did to their resident memory (before
it, pulling its input, running it, the peak; `task_memory`) and what CPU each kind of task
used (median CPU and kernel seconds, minor page faults and the task thread's own CPU;
`task_cpu`). A fresh interpreter also times what each cold message pays before training
(imports + data) and one fit, with the
peak RSS after each stage (and whether the fit imported torch._dynamo), then what importing a
warm ClientApp's Flower runtime adds; `--python` runs that probe under another environment's
interpreter (the lean node install of deploy/README.md). `--progress` prints each run's
progress lines (rounds, the clients a round waits for), which are quiet otherwise.
`--repeat N` runs the modes N times in turn (OUT/repeat-1, ...) and reports each deployed
round's ratio to the simulated round of the same repeat and the ratios' median
(OUT/repeats.json and a table): on a machine whose speed drifts, one pair of runs is one draw.
`--cpus N` with `--compute-slots N` trains N clients at once in every mode (the simulation's
Ray gets N CPUs), leaving the machine's other cores to Flower's own processes: on a 2-core
machine, `--cpus 1 --compute-slots 1` separates what the deployment's messaging costs from
what its processes take from the training when every core trains.

    FEDAPPS_DATA_ROOT=../shared/data python -m simulations.deploy_benchmark --out DIR
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fedapps.compute_slots import machine_cores
from fedapps.deploy import SuperNode, run_federation
from fedapps.launcher import default_filter, run_experiment
from fedapps.processes import child_map, command_line, cpu_seconds, descendants
from fedapps.timing import SPLIT_PARTS

CLIENTAPP_MARKERS = ("flwr-clientapp", "fedapps.warm_clientapp")
STARTUP_PROBE = """
import json, sys, time

def status_mb(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key))
    return int(line.split()[1]) // 1024

peak_mb = lambda: status_mb("VmHWM")
rss_mb = lambda: status_mb("VmRSS")

t0 = time.perf_counter()
import torch
torch_mb = peak_mb()
import fedapps.client_app
t1 = time.perf_counter()
app_mb = peak_mb()
from flwr.common import Context, FitIns, GetParametersIns, RecordDict
from fedapps.validation import resolve_config
from fedapps.data import federated_data
experiment, sets = sys.argv[1], sys.argv[2:]
cfg = resolve_config(experiment, sets)
federated_data(cfg).client(0)
t2 = time.perf_counter()
federated_data(cfg).client(0)
t3 = time.perf_counter()
data_mb = peak_mb()
n = int(cfg.federation["num-clients"])
context = Context(run_id=0, node_id=0, node_config={"partition-id": 0, "num-partitions": n},
                  state=RecordDict(), run_config={"experiment": experiment,
                                                  "overrides": " ".join(sets)})
client = fedapps.client_app.client_fn(context)
params = client.get_parameters(GetParametersIns({})).parameters
t4 = time.perf_counter()
fit = client.fit(FitIns(params, {"server-round": 1}))
t5 = time.perf_counter()
# what a warm ClientApp adds on top: Flower's Runtime API client and its imports
before_runtime = rss_mb()
import flwr.cli.install, flwr.clientapp.utils, flwr.supercore.heartbeat
import flwr.supernode.runtime.run_clientapp
runtime_mb = rss_mb() - before_runtime
print(json.dumps({"torch": torch.__version__, "imports_s": round(t1 - t0, 2),
                  "data_s": round(t2 - t1, 2), "again_s": round(t3 - t2, 4),
                  "fit_s": round(t5 - t4, 2), "fit_examples": fit.num_examples,
                  "torch_rss_mb": torch_mb, "app_rss_mb": app_mb, "peak_rss_mb": data_mb,
                  "fit_peak_rss_mb": peak_mb(),
                  "torch_dynamo_imported": "torch._dynamo" in sys.modules,
                  "warm_runtime_rss_mb": runtime_mb,
                  "warm_runtime_brings": sorted(m for m in ("fastapi", "pydantic", "httpx",
                                                            "grpc") if m in sys.modules)}))
"""


def memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in kB; (0, 0) once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    values = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:]
              if line.split(":")[0] in ("Rss", "Pss")}
    return values.get("Rss", 0), values.get("Pss", 0)


def is_clientapp(pid: int) -> bool:
    return any(m in command_line(pid) for m in CLIENTAPP_MARKERS)


class TreeSampler:
    """Peak memory of every SuperNode's process tree, sampled every `period` seconds."""

    def __init__(self, period: float = 1.0) -> None:
        self.period, self.stop = period, threading.Event()
        self.peak_tree_rss = self.peak_tree_pss = self.peak_app_rss = self.peak_app_pss = 0
        self.clientapp_pids: set[int] = set()

    def __call__(self, nodes: list[SuperNode]) -> None:
        while not self.stop.is_set():
            children = child_map()
            for node in nodes:
                todo = [p.pid for p in (node.process, getattr(node, "worker", None)) if p]
                pids = []
                while todo:
                    pids.append(todo.pop())
                    todo += children.get(pids[-1], [])
                mem = {pid: memory_kb(pid) for pid in pids}
                self.peak_tree_rss = max(self.peak_tree_rss, sum(m[0] for m in mem.values()))
                self.peak_tree_pss = max(self.peak_tree_pss, sum(m[1] for m in mem.values()))
                for pid, (rss, pss) in mem.items():
                    if is_clientapp(pid):
                        self.clientapp_pids.add(pid)
                        self.peak_app_rss = max(self.peak_app_rss, rss)
                        self.peak_app_pss = max(self.peak_app_pss, pss)
            time.sleep(self.period)

    def clientapp_memory(self) -> dict[str, int | None]:
        """The ClientApp processes seen and their peaks, in MB; the peaks None where no
        ClientApp had a process of its own (a one-process node's is its node's process, whose
        peak is the tree's), rather than a 0 that reads as a measured size."""
        seen = bool(self.clientapp_pids)
        return {"clientapp_processes": len(self.clientapp_pids),
                "peak_clientapp_rss_mb": self.peak_app_rss // 1024 if seen else None,
                "peak_clientapp_pss_mb": self.peak_app_pss // 1024 if seen else None}


# Ray's workers name themselves `ray::<task>`; its services are raylet, gcs_server and
# scripts under ray/_private
CPU_KINDS = (("clientapp", CLIENTAPP_MARKERS), ("superexec", ("flower-superexec",)),
             ("node", ("fedapps.one_process_node",)),  # a SuperNode with its ClientApp
             ("supernode", ("flower-supernode", "fedapps.quick_supernode")),
             ("superlink", ("flower-superlink", "fedapps.quick_superlink")),
             ("serverapp", ("flwr-serverapp",)),
             ("ray", ("ray::", "raylet", "gcs_server", "ray/_private", "ray/dashboard")))


def process_kind(pid: int) -> str:
    """Which part of the federation a process is, by its command line ('other' if none)."""
    cmd = command_line(pid)
    return next((kind for kind, marks in CPU_KINDS if any(m in cmd for m in marks)), "other")


class CpuSampler(threading.Thread):
    """CPU seconds used by each kind of process this benchmark started (SuperLink,
    SuperNodes, ClientApps, ...), read from /proc every `period` seconds while it runs. Only
    CPU used after it was created counts (a process already running then, such as the
    launcher's watchdog, starts from its reading at that moment); a process's last reading
    counts, so one that lived less than a period is missed (a lower bound)."""

    def __init__(self, period: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.period, self.stop = period, threading.Event()
        self.before = {pid: cpu_seconds(pid) for pid in descendants(os.getpid())}
        self.last: dict[int, tuple[str, float]] = {}
        self.history: list[tuple[float, dict[str, float]]] = []  # (time.monotonic(), sums)

    def run(self) -> None:
        while not self.stop.is_set():
            for pid in descendants(os.getpid()):
                # a kind once found stays (a Ray worker renames itself); "other" is asked
                # again: a process read while it starts may not show its command line yet (a
                # simulation's Ray worker once counted as "other", 3.45 of 7.2 CPU s a round)
                known = self.last.get(pid, ("other", 0.0))[0]
                kind = known if known != "other" else process_kind(pid)
                used = cpu_seconds(pid) - self.before.get(pid, 0.0)
                if used > 0:
                    self.last[pid] = (kind, used)
            self.history.append((time.monotonic(), self.sums()))
            time.sleep(self.period)

    def sums(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for kind, used in list(self.last.values()):
            out[kind] = out.get(kind, 0.0) + used
        return out

    def totals(self) -> dict[str, float]:
        self.stop.set()
        self.join()
        return {kind: round(used, 1) for kind, used in sorted(self.sums().items())}

    def per_round(self, ends: dict[int, float]) -> dict[str, float]:
        """CPU seconds a steady round, per kind: from the first round's end to the last's
        (`ends`: round -> when its progress line came), over the rounds between, each end
        read from the first sample after it ({} with fewer than two rounds)."""
        if len(ends) < 2 or not self.history:
            return {}
        first, last = min(ends), max(ends)

        def at(t: float) -> dict[str, float]:
            return next((sums for when, sums in self.history if when >= t),
                        self.history[-1][1])

        start, end = at(ends[first]), at(ends[last])
        return {kind: round((end[kind] - start.get(kind, 0.0)) / (last - first), 2)
                for kind in sorted(end) if end[kind] - start.get(kind, 0.0) > 0.005}


ROUND_LINE = re.compile(r"\[fedapps\] round (\d+)/\d+\s")


class RoundEnds:
    """A run's `show` filter that notes when each round's progress line came (time.monotonic()),
    passing every line on to `show`."""

    def __init__(self, show: Callable[[str], bool]) -> None:
        self.show = show
        self.ends: dict[int, float] = {}

    def __call__(self, line: str) -> bool:
        match = ROUND_LINE.search(line)
        if match:
            self.ends[int(match.group(1))] = time.monotonic()
        return self.show(line)


def round_stats(run_dir: Path) -> dict:
    rounds = json.loads((run_dir / "results.json").read_text())["rounds"]
    if not rounds:
        return {"global_accuracy": []}
    steady = rounds[1:] or rounds
    return {
        "round_seconds": [round(r["seconds"], 2) for r in rounds],
        "steady_seconds": statistics.median(r["seconds"] for r in steady),
        "fit_seconds": statistics.median(r["fit_seconds"] for r in steady),
        "eval_seconds": statistics.median(r["eval_seconds"] for r in steady),
        "bytes_per_round": rounds[-1]["bytes_down"] + rounds[-1]["bytes_up"]
        + rounds[-1]["bytes_down_eval"],
        "global_accuracy": [r["global_accuracy"] for r in rounds],
        # each part's median over the steady rounds, per phase (fedapps/timing.py)
        "timing": {phase: {key: statistics.median(r["timing"][phase][key] for r in steady)
                           for key in steady[0]["timing"][phase]
                           if all(key in r["timing"][phase] for r in steady)}
                   for phase in steady[0].get("timing", {})
                   if all(phase in r.get("timing", {}) for r in steady)},
    }


# fedapps/warm_clientapp.py's line for each task it ran: its memory part and its CPU part
TASK_LINE = re.compile(r"\[warm-clientapp\] (\S+) task done .*?; resident (\d+) MB before"
                       r"(?:, (\d+) with its input)?, (\d+) after; peak (\d+) -> (\d+) MB")
TASK_CPU = re.compile(r"\[warm-clientapp\] (\S+) task done [^\n]*?; CPU ([\d.]+) s, kernel "
                      r"([\d.]+) s, (\d+) page faults(?:, ([\d.]+) s in the task's thread)?")


def task_values(log_dir: Path, line: re.Pattern) -> dict[str, list[list[str | None]]]:
    """Per message type (`line`'s first group), the rest of `line`'s groups in every warm
    ClientApp task line of a deployment's node logs (not the SuperLink's)."""
    rows: dict[str, list[list[str | None]]] = {}
    for path in sorted(log_dir.glob("supernode-*.log")):
        for found in line.finditer(path.read_text(errors="replace")):
            kind, *values = found.groups()
            rows.setdefault(kind, []).append(values)
    return dict(sorted(rows.items()))


def task_memory(log_dir: Path) -> dict[str, dict[str, int]]:
    """Per message type, over every warm ClientApp task in a deployment's node logs: how many
    ran, and the largest resident MB before one, added by pulling its input, added by running
    it (reply pushed), after one, by how much one raised its process's peak, and that peak."""
    out = {}
    for kind, found in task_values(log_dir, TASK_LINE).items():
        r = [(int(before), int(pulled or before), int(after), int(peak0), int(peak1))
             for before, pulled, after, peak0, peak1 in found]
        out[kind] = {"tasks": len(r),
                     "before_mb": max(v[0] for v in r),
                     "input_mb": max(v[1] - v[0] for v in r),
                     "task_mb": max(v[2] - v[1] for v in r),
                     "after_mb": max(v[2] for v in r),
                     "peak_rise_mb": max(v[4] - v[3] for v in r),
                     "peak_mb": max(v[4] for v in r)}
    return out


def task_cpu(log_dir: Path) -> dict[str, dict[str, float]]:
    """Per message type, over every warm ClientApp task in a deployment's node logs: how many
    ran and the median CPU seconds, kernel CPU seconds and minor page faults of one, and the
    median CPU seconds of its own thread (None where the lines predate them)."""
    def median(values: list[str | None], convert: type = float) -> float | None:
        return median_of([None if v is None else convert(v) for v in values], 3)

    return {kind: {"tasks": len(found), "cpu_s": median([v[0] for v in found]),
                   "kernel_s": median([v[1] for v in found]),
                   "page_faults": int(median([v[2] for v in found], int)),
                   "thread_s": median([v[3] for v in found])}
            for kind, found in task_values(log_dir, TASK_CPU).items()}


def task_table(report: dict, modes: list[str], field: str, headers: list[str],
               cells: Callable[[dict], list[str]]) -> str:
    """A per-task report `field` (task_memory, task_cpu) of each deployed mode as a Markdown
    table, a row per mode and message type (empty without warm ClientApps)."""
    rows = [f"| {mode} | {kind} | " + " | ".join(cells(m)) + " |"
            for mode in modes for kind, m in report.get(mode, {}).get(field, {}).items()]
    if not rows:
        return ""
    return "\n".join([f"| mode | task | {' | '.join(headers)} |",
                      "| --- " * (len(headers) + 2) + "|", *rows])


def memory_table(report: dict, modes: list[str]) -> str:
    keys = ("tasks", "before_mb", "input_mb", "task_mb", "after_mb", "peak_rise_mb", "peak_mb")
    return task_table(report, modes, "task_memory",
                      ["tasks", "resident before", "+ its input", "+ the task", "after",
                       "raised the peak by", "peak"], lambda m: [str(m[k]) for k in keys])


def task_cpu_table(report: dict, modes: list[str]) -> str:
    return task_table(report, modes, "task_cpu",
                      ["tasks", "CPU s (median)", "of it kernel", "page faults",
                       "the task's thread"],
                      lambda m: [str(m["tasks"]), f"{m['cpu_s']:.2f}", f"{m['kernel_s']:.2f}",
                                 str(m["page_faults"]),
                                 "-" if m.get("thread_s") is None else f"{m['thread_s']:.2f}"])


def cpu_table(report: dict, modes: list[str]) -> str:
    """CPU seconds a steady round by kind of process, per mode, beside its steady round."""
    runs = [m for m in modes if report.get(m, {}).get("cpu_seconds_per_round")]
    kinds = sorted({k for m in runs for k in report[m]["cpu_seconds_per_round"]})
    lines = [f"| mode | steady round | CPU s a round: {' | '.join(kinds)} | all |",
             "| --- " * (len(kinds) + 3) + "|"]
    for m in runs:
        used = report[m]["cpu_seconds_per_round"]
        lines.append(f"| {m} | {report[m].get('steady_seconds', 0):.2f} | "
                     + " | ".join(f"{used.get(k, 0):.2f}" for k in kinds)
                     + f" | {sum(used.values()):.2f} |")
    return "\n".join(lines)


def cell(timing: dict, part: str) -> str:
    """A part's median for a table, '-' where no answer measured it."""
    return f"{timing[f'{part}_median']:.2f}" if f"{part}_median" in timing else "-"


def timing_table(report: dict, modes: list[str]) -> str:
    """Where each mode's steady round went, as a Markdown table: per phase the slowest answer
    and the medians of client seconds and its thread's CPU seconds, delivery and reply, and
    of the delivery's parts where a warm ClientApp stamped them (to node, pull, start;
    fedapps/timing.py)."""
    rows = ["| mode | round (fit, eval) | phase | slowest | client | client CPU | delivery "
            "| reply | to node | pull | start |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode in modes:
        r = report.get(mode, {})
        for phase, t in r.get("timing", {}).items():
            split_cells = " | ".join(cell(t, part) for part in SPLIT_PARTS)
            rows.append(f"| {mode} | {r['steady_seconds']:.2f} ({r['fit_seconds']:.2f}, "
                        f"{r['eval_seconds']:.2f}) | {phase} | {t['round_trip_max']:.2f} | "
                        f"{t['client_median']:.2f} | {cell(t, 'client_cpu')} | "
                        f"{t['delivery_median']:.2f} | "
                        f"{t['reply_median']:.2f} | {split_cells} |")
    return "\n".join(rows)


# The parts of a message's way, in order: the delivery (split where a warm ClientApp stamped
# it), the client, the reply (fedapps/timing.py)
SEGMENTS = (("to_node", "to the node"), ("pull", "ClientApp's pulls"), ("start", "to client_fn"),
            ("delivery", "delivery"), ("client", "client"), ("reply", "reply"))


def message_segments(report: dict, modes: list[str]) -> list[tuple[str, list[tuple[str, float]]]]:
    """(mode: phase, [(part, median seconds), ...]) per mode and phase of the steady rounds:
    a warm ClientApp's to_node, pull and start where stamped, else the whole delivery; then
    client and reply. Each part's own median, so a row's sum is not any one message's time;
    a negative part (two machines' clocks apart) counts as 0."""
    rows = []
    for mode in modes:
        for phase, t in report.get(mode, {}).get("timing", {}).items():
            has_split = all(f"{part}_median" in t for part in SPLIT_PARTS)
            parts = (*SPLIT_PARTS, "client", "reply") if has_split \
                else ("delivery", "client", "reply")
            rows.append((f"{mode}: {phase}", [(part, max(0.0, t[f"{part}_median"]))
                                              for part in parts]))
    return rows


def plot_message_segments(report: dict, modes: list[str], path: Path) -> Path | None:
    """Horizontal bars of message_segments: each part's median, stacked, per mode and phase."""
    rows = message_segments(report, modes)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = dict(SEGMENTS)
    colors = dict(zip(names, plt.get_cmap("tab10").colors, strict=False))
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 2.2))
    drawn: dict[str, object] = {}
    for y, (_, parts) in enumerate(rows):
        left = 0.0
        for part, seconds in parts:
            drawn[part] = ax.barh(y, seconds, left=left, color=colors[part])
            left += seconds
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds: each part's median over a step's messages, stacked (steady rounds)")
    ax.set_title("Where a message's time goes")
    order = [part for part in names if part in drawn]
    ax.legend([drawn[part] for part in order], [names[part] for part in order], fontsize=8,
              loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=min(len(order), 6))
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def startup_probe(experiment: str, sets: list[str], python: str = sys.executable) -> dict:
    """What a fresh interpreter pays before a message's training (imports, then partition 0's
    data), the same data again in that process, one fit of partition 0, and the peak RSS after
    `import torch`, the app's imports, the data and the fit. `python` may be another
    environment's interpreter (an edge install, e.g. a CPU-only torch) with fedapps in it."""
    out = subprocess.run([python, "-c", STARTUP_PROBE, experiment, *sets],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the probe failed under {python}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def save_partial(report: dict, out: Path, part: str) -> None:
    """Write the report so far and say so: a mode takes minutes, and a run stopped later (a time
    limit, a crash) keeps the probe and the modes already done."""
    (out / "deploy_benchmark.json").write_text(json.dumps(report, indent=1))
    done = report[part]
    if part == "startup_probe":
        summary = f"imports {done.get('imports_s')} s, fit {done.get('fit_s')} s"
    else:
        summary = (f"{done['status']}, {done['wall_s']} s, steady round "
                   f"{done.get('steady_seconds', 0.0):.2f} s")
    print(f"[deploy_benchmark] {part}: {summary} -> {out / 'deploy_benchmark.json'}", flush=True)


# What each deployed mode passes run_federation beyond warm, which all but deploy_cold are:
# the quick SuperNodes' pull interval, the SuperLink's hold, a ClientApp thread per node.
DEPLOY_MODES = {"deploy_cold": (), "deploy_warm": (), "deploy_quick": ("pull_interval",),
                "deploy_held": ("pull_interval", "link_hold"),
                "deploy_one": ("pull_interval", "link_hold", "one_process")}


def mode_settings(name: str, pull_interval: float, link_hold: float,
                  accepted: set[str], compute_slots: int = 0) -> dict:
    """run_federation's keyword arguments for deployed mode `name`; `accepted`: the keywords
    this run_federation has (the code before the warm ClientApp has no `warm`: always cold;
    the code before compute slots, none). `compute_slots`: for every warm mode (0: none)."""
    values = {"pull_interval": pull_interval, "link_hold": link_hold, "one_process": True}
    settings = {"warm": name != "deploy_cold", **{k: values[k] for k in DEPLOY_MODES[name]}}
    if compute_slots and settings["warm"] and "compute_slots" in accepted:
        settings["compute_slots"] = compute_slots
    return settings if "warm" in accepted else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="fedavg-fmnist")
    p.add_argument("--set", dest="overrides", action="append", default=None)
    p.add_argument("--out", type=Path, default=Path("outputs/deploy-benchmark"))
    p.add_argument("--modes", default="simulation,deploy_warm,deploy_cold",
                   help=f"which runs, of simulation, {', '.join(DEPLOY_MODES)} (the code "
                        "before the warm ClientApp has only simulation and deploy_cold)")
    p.add_argument("--pull-interval", type=float, default=0.5,
                   help="deploy_quick's, deploy_held's and deploy_one's SuperNode idle pull "
                        "in seconds (default 0.5)")
    p.add_argument("--link-hold", type=float, default=5.0,
                   help="deploy_held's and deploy_one's SuperLink hold of an empty pull in "
                        "seconds (default 5)")
    p.add_argument("--compute-slots", type=int, default=machine_cores(),
                   help="the warm modes' compute slots, as `deploy-local --compute-slots` "
                        "(default: this machine's cores, as deploy-local; 0: all at once)")
    p.add_argument("--cpus", type=int, default=None, metavar="N",
                   help="the simulation's Ray CPUs, as `fedapps run --cpus` (default: all): "
                        "with --compute-slots N, N clients train at once in every mode and "
                        "the other cores are left to Flower's own processes")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the modes this many times in turn (into OUT/repeat-i), and report "
                        "each deployed round's ratio to the same repeat's simulated round and "
                        "the ratios' median (OUT/repeats.json; default 1: once, into OUT)")
    p.add_argument("--probe-only", action="store_true",
                   help="only the fresh-interpreter probe (runs with the fedapps on PYTHONPATH)")
    p.add_argument("--progress", action="store_true",
                   help="print each run's progress lines (rounds, clients waited for), to see "
                        "where a slow mode spends its time")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter of the probe: another environment's (e.g. a CPU-only "
                        "torch edge install, deploy/README.md) to measure its footprint")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat: {args.repeat}, must be at least 1")
    if args.compute_slots < 0:
        p.error(f"--compute-slots: {args.compute_slots}, must be 0 (all at once) or more")
    if args.cpus is not None and args.cpus < 1:
        p.error(f"--cpus: {args.cpus}, must be at least 1")
    modes = args.modes.split(",")
    unknown = [m for m in modes if m != "simulation" and m not in DEPLOY_MODES]
    if unknown:
        p.error(f"--modes: unknown {', '.join(unknown)} (of simulation, "
                f"{', '.join(DEPLOY_MODES)})")
    sets = args.overrides or ["rounds=3", "eval.fraction=0.25"]  # 5 of 20 clients evaluate
    n = int(next((s.split("=")[1] for s in sets if s.startswith("federation.num-clients=")),
                 20))
    args.out.mkdir(parents=True, exist_ok=True)
    show = default_filter if args.progress else lambda line: False
    report: dict = {"experiment": args.experiment, "overrides": sets, "clients": n,
                    "simulation_cpus": args.cpus, "compute_slots": args.compute_slots}
    report["startup_probe"] = startup_probe(args.experiment, sets, args.python)
    if args.probe_only:
        print(json.dumps(report["startup_probe"]))
        return 0
    save_partial(report, args.out, "startup_probe")
    if args.repeat == 1:
        run_modes(args, modes, sets, n, args.out, show, report)
        return print_report(report, modes, args.out)
    reports, ok = [], True
    for i in range(1, args.repeat + 1):  # the modes in turn, again: drift reaches each alike
        out = args.out / f"repeat-{i}"
        out.mkdir(parents=True, exist_ok=True)
        reports.append(run_modes(args, modes, sets, n, out, show, dict(report)))
        summary = repeat_summary(reports, modes)
        (args.out / "repeats.json").write_text(json.dumps(summary, indent=1))
    for i, r in enumerate(reports, 1):
        print(f"== repeat {i} ({args.out / f'repeat-{i}'})")
        ok = print_report(r, modes, args.out / f"repeat-{i}") == 0 and ok
    print(repeat_table(summary, modes))
    accuracies = [r[m]["global_accuracy"] for r in reports for m in modes]
    same = all(a == accuracies[0] for a in accuracies)
    print(f"same accuracies in every repeat: {same}")
    return 0 if ok and same else 1


def run_modes(args: argparse.Namespace, modes: list[str], sets: list[str], n: int, out: Path,
              show: Callable[[str], bool], report: dict) -> dict:
    """Run each of `modes` once into `out`, adding each one's measures to `report` (saved to
    out/deploy_benchmark.json as each ends); returns `report`."""
    if "simulation" in modes:
        cpu = CpuSampler()
        cpu.start()
        t = time.perf_counter()
        rounds = RoundEnds(show)
        status = run_experiment(args.experiment, sets, n, out / "simulation", show=rounds,
                                total_cpus=args.cpus)
        report["simulation"] = {"status": status, "wall_s": round(time.perf_counter() - t, 1),
                                "cpu_seconds": cpu.totals(),
                                "cpu_seconds_per_round": cpu.per_round(rounds.ends),
                                **round_stats(out / "simulation")}
        save_partial(report, out, "simulation")
    for name in [m for m in modes if m in DEPLOY_MODES]:
        sampler, cpu = TreeSampler(), CpuSampler()
        cpu.start()
        t = time.perf_counter()
        mode = mode_settings(name, args.pull_interval, args.link_hold,
                             set(inspect.signature(run_federation).parameters),
                             args.compute_slots)
        rounds = RoundEnds(show)
        status = run_federation(args.experiment, sets, n, out / name, show=rounds,
                                state_root=out / f"{name}-state", during=sampler, **mode)
        sampler.stop.set()
        report[name] = {"status": status, "wall_s": round(time.perf_counter() - t, 1),
                        "cpu_seconds": cpu.totals(),
                        "cpu_seconds_per_round": cpu.per_round(rounds.ends),
                        **sampler.clientapp_memory(),
                        "peak_tree_rss_mb": sampler.peak_tree_rss // 1024,
                        "peak_tree_pss_mb": sampler.peak_tree_pss // 1024,
                        "task_memory": task_memory(out / name / "logs"),
                        "task_cpu": task_cpu(out / name / "logs"),
                        **round_stats(out / name)}
        save_partial(report, out, name)
    return report


def print_report(report: dict, modes: list[str], out: Path) -> int:
    """Print one invocation's (or repeat's) report and tables, draw its plot; 0 if every mode
    reached the same accuracies."""
    print(json.dumps(report, indent=1))
    print(timing_table(report, modes))
    print(cpu_table(report, modes))
    print(memory_table(report, modes))
    print(task_cpu_table(report, modes))
    plot = plot_message_segments(report, modes, out / "message_timing.png")
    if plot is not None:
        print(f"plot: {plot}")
    accuracies = [report[m]["global_accuracy"] for m in modes]
    same = all(a == accuracies[0] for a in accuracies)
    print(f"same accuracies in every run: {same}")
    return 0 if same else 1


def repeat_summary(reports: list[dict], modes: list[str]) -> dict:
    """Each mode's steady round per repeat and, where the repeats ran the simulation, each
    deployed mode's ratio to the simulated round of the same repeat, with the ratios' median:
    what a goal like "within 1.2x of the simulated round" is judged by on a noisy machine."""
    rounds = {m: [r.get(m, {}).get("steady_seconds") for r in reports] for m in modes}
    summary: dict = {"repeats": len(reports), "steady_seconds": rounds}
    if "simulation" in modes:  # a run that did not finish a round has no ratio (None)
        ratios = {m: [round(d / s, 3) if d and s else None
                      for d, s in zip(rounds[m], rounds["simulation"], strict=True)]
                  for m in modes if m != "simulation"}
        summary["ratio_to_simulation"] = ratios
        summary["median_ratio"] = {m: median_of(v, 3) for m, v in ratios.items()}
    return summary


def median_of(values: list[float | None], digits: int) -> float | None:
    """The median of the values that are there, rounded; None if none is."""
    present = [v for v in values if v is not None]
    return round(statistics.median(present), digits) if present else None


def seconds_and_ratio(seconds: float | None, ratio: float | None) -> str:
    """A table cell: a steady round and, where there is one, its ratio to the simulated."""
    cell = "-" if seconds is None else f"{seconds:.2f} s"
    return cell + ("" if ratio is None else f" ({ratio:.2f}x)")


def repeat_table(summary: dict, modes: list[str]) -> str:
    """repeat_summary as a Markdown table: a row per repeat, a steady round (and its ratio to
    the simulated one) per mode, then the median."""
    ratios, rounds = summary.get("ratio_to_simulation", {}), summary["steady_seconds"]
    rows = ["| repeat | " + " | ".join(modes) + " |", "| --- |" + " --- |" * len(modes)]
    for i in range(summary["repeats"]):
        cells = [seconds_and_ratio(rounds[m][i], ratios[m][i] if m in ratios else None)
                 for m in modes]
        rows.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    medians = [seconds_and_ratio(median_of(rounds[m], 2), summary.get("median_ratio", {})
                                 .get(m)) for m in modes]
    rows.append("| median | " + " | ".join(medians) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
