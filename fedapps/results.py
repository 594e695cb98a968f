"""The results contract: outputs/<run-name>/{config.yaml, results.json, metrics.csv, *.png}.

Files are rewritten atomically after every round, so a crash loses at most the round in flight.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from fedapps.plots import plot_metric
from fedapps.rundir import check_owner
from fedapps.tracking import WandbTracker


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def summarize(rounds: list[dict[str, Any]], metric: str = "accuracy",
              allow_partial: bool = False) -> dict[str, Any]:
    """Best and final G/P over the evaluated rounds (best G and best P may differ in round),
    in the task's metric (accuracy, r2): best_global_<metric> and so on. Rounds whose
    evaluated population differs from the contract (`eval_complete` false: a node down or an
    answer rejected) count only with `allow_partial` (eval.allow-partial): G over other
    clients is another quantity, and a hung node raised it from 42.60% to 56.56%."""
    evaluated = [r for r in rounds if r.get(f"global_{metric}") is not None
                 and (allow_partial or r.get("eval_complete", True))]

    def best(key: str) -> float | None:
        vals = [r[key] for r in evaluated if r.get(key) is not None]
        return max(vals) if vals else None

    last = evaluated[-1] if evaluated else {}
    official = [r[f"official_test_{metric}"] for r in rounds
                if r.get(f"official_test_{metric}") is not None]
    clients = [m for r in rounds for m in r.get("client_fit_metrics", {}).values() if "params" in m]
    cost = {  # seed 004 Table 3.6: per participating client and round
        "mean_client_params": sum(m["params"] for m in clients) / len(clients),
        "mean_client_flops": sum(m.get("flops", 0) for m in clients) / len(clients),
        "mean_client_bytes_down": sum(r["bytes_down"] for r in rounds)
        / max(sum(len(r["fit_clients"]) for r in rounds), 1),
    } if clients else {}
    extra = {f"best_official_test_{metric}": max(official),
             f"final_official_test_{metric}": official[-1]} if official else {}
    return {
        **extra,
        **cost,
        f"best_global_{metric}": best(f"global_{metric}"),
        f"best_personal_{metric}": best(f"personal_{metric}"),
        f"final_global_{metric}": last.get(f"global_{metric}"),
        f"final_personal_{metric}": last.get(f"personal_{metric}"),
        "final_round": last.get("round"),  # the round final G/P come from
        "partial_rounds": [r["round"] for r in rounds if r.get("eval_complete") is False],
        "rounds_completed": len(rounds),
        "total_bytes_down": sum(r["bytes_down"] for r in rounds),
        "total_bytes_up": sum(r["bytes_up"] for r in rounds),
        "total_failures": sum(r["failures"] for r in rounds),
    }


def environment() -> dict[str, str | int]:
    """What a run's digits depend on besides its config and seed: library versions and the CPU.
    torch picks kernels by the CPU's vector instructions (AVX-512 or AVX2; `cpu_capability`),
    which sum floats in different orders, so one seed repeats bit for bit only on the same kind
    of CPU with the same libraries. Of the machine running the ServerApp (in a simulation the
    clients' too; deployed clients record nothing here). GPUs are counted without initializing
    CUDA in this process (a process that forks must not have)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import numpy
    import torch

    try:
        flwr = version("flwr")
    except PackageNotFoundError:
        flwr = "not installed"
    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip()
                 for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {"python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "flwr": flwr, "cpu": cpu,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cuda": torch.version.cuda or "none", "gpus": torch.cuda.device_count()}


def mark_failed(run_dir: Path, reason: str) -> bool:
    """Record that the run ended without completing: a results.json still saying `running`
    (the ServerApp died, so its writer never got to say why) becomes `failed: <reason>`.
    A status the run wrote itself (`completed`, `stopped: ...`) is kept. True if changed."""
    path = run_dir / "results.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False  # nothing written yet, or not ours to repair
    if doc.get("summary", {}).get("status") != "running":
        return False
    doc["summary"]["status"] = f"failed: {' '.join(reason.split())}"
    atomic_write(path, json.dumps(doc, indent=1))
    return True


class ResultsWriter:
    """Receives one record per round from the strategy and keeps the run directory current."""

    def __init__(self, run_dir: Path, cfg: dict[str, Any], partition: dict[str, Any],
                 num_rounds: int, invocation: dict[str, str] | None = None,
                 resume_after: int | None = None, metric: str = "accuracy",
                 run_id: str | None = None, extra: dict[str, Any] | None = None,
                 title: str | None = None, xlabel: str = "round",
                 plot_labels: dict[str, str | None] | None = None) -> None:
        self.run_dir = run_dir
        self.run_id = run_id  # with it, write only while the directory belongs to this run
        self.metric = metric  # the dataset task's: accuracy or r2
        self.cfg = cfg
        self.partition = partition
        self.num_rounds = num_rounds
        self.invocation = invocation or {}
        self.extra = extra or {}  # further top-level sections (the centralized baseline's)
        self.title = title or f"{cfg['algorithm']} on {cfg['dataset']} ({run_dir.name})"
        self.xlabel = xlabel
        self.plot_labels = plot_labels  # series names of the plot (plots.SERIES)
        self.rounds: list[dict[str, Any]] = []
        self.started = time.time()
        # every environment the run has run in, oldest first (a resume elsewhere adds one)
        self.environments = [environment()]
        if resume_after is not None:  # keep the rounds the checkpoint covers, and their time
            old = json.loads((run_dir / "results.json").read_text())
            self.rounds = [r for r in old["rounds"] if r["round"] <= resume_after]
            self.started -= float(old["summary"].get("wall_seconds") or 0.0)
            before = old.get("environments", [])
            self.environments = before + [e for e in self.environments if e not in before[-1:]]
        self.status = "running"
        run_dir.mkdir(parents=True, exist_ok=True)
        check_owner(run_dir, run_id)
        atomic_write(run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(cfg)))
        self.tracker = WandbTracker(cfg, run_dir, run_dir.name)
        self._write()

    def summary(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            **summarize(self.rounds, self.metric,
                        bool(self.cfg.get("eval", {}).get("allow-partial", False))),
            "wall_seconds": time.time() - self.started,
            "emd": self.partition["emd"],
            "min_client_samples": self.partition["min_client_samples"],
            "status": self.status,
        }

    def _write(self) -> None:
        check_owner(self.run_dir, self.run_id)
        doc = {"rounds": self.rounds, "summary": self.summary(), "partition": self.partition,
               "invocation": self.invocation, "environments": self.environments, **self.extra}
        atomic_write(self.run_dir / "results.json", json.dumps(doc, indent=1))
        if self.rounds:
            columns = [k for k, v in self.rounds[0].items() if not isinstance(v, list | dict)]
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(self.rounds)
            atomic_write(self.run_dir / "metrics.csv", buf.getvalue())

    def on_round(self, record: dict[str, Any]) -> None:
        self.rounds.append(record)
        self.tracker.log_round(record)
        if record["round"] >= self.num_rounds:
            self.finish()
        else:
            self._write()

    def stop(self, reason: str) -> None:
        """The run stops early: record why, keep everything written so far."""
        self.status = f"stopped: {reason}"
        self._write()

    def finish(self) -> None:
        self.status = "completed"
        self._write()
        plots = []
        if self.cfg["output"]["plots"]:
            plots.append(plot_metric(self.rounds, self.title,
                                     self.run_dir / f"{self.metric}.png", self.metric,
                                     self.xlabel, self.plot_labels))
        self.tracker.finish(self.summary(), plots)
