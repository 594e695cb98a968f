"""Peak training memory per precision (seed 004 Table 2.6's analogue): `fedapps memory`.

    fedapps memory quickstart --precisions fp32,fp16,amp,bf16 --batches 20 [--set device=cuda]

Trains the experiment's model centrally (the client training loop, `BaseClient.sgd_epochs`,
so exactly the arithmetic of `train.precision`) for a few batches of the configured batch size
on rows of the experiment's training data, each precision in a fresh subprocess so that one
measurement's allocations, caches and loaded kernels do not count in another's.

What is measured, after one warm-up batch (its one-time costs: kernels paged in, cuBLAS
workspaces) and with the model already in the precision's dtype:
- cuda: torch.cuda.max_memory_allocated over the batches (weights, gradients, optimizer state,
  activations, the batches' data): the GPU memory of the thesis's table;
- cpu: the growth of the process's peak resident set (VmHWM, reset through
  /proc/self/clear_refs) over its resident set before the batches, which already holds the
  model and the data: gradients, optimizer state, activations and the kernels' temporaries.
  The child runs with glibc malloc set so that freed memory leaves the resident set
  (CPU_MALLOC); a measurement in an ordinary process would miss reused freed memory.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fedapps.data import ClientData
from fedapps.errors import ConfigError
from fedapps.precision import PRECISIONS

CPU_MEASURE = "cpu: peak RSS growth over the state after model, data and one warm-up batch"
CUDA_MEASURE = "cuda: torch.cuda.max_memory_allocated (weights, gradients, optimizer, activations)"


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


class PeakMeter:
    """Peak memory of a region: allocated CUDA memory, or the CPU's resident-set growth."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.baseline_kb = 0

    def start(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        self.baseline_kb = _status_kb("VmRSS")

    def peak_mb(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**20
        return (_status_kb("VmHWM") - self.baseline_kb) / 1024

    def baseline_mb(self) -> float:
        return self.baseline_kb / 1024


def _config(experiment: str, overrides: list[str], precision: str):
    """The validated config of one measurement, with this machine's checks (device, bf16)."""
    from fedapps.preflight import check_device
    from fedapps.validation import resolve_config

    cfg = resolve_config(experiment, [*overrides, f"train.precision={precision}"])
    check_device(str(cfg.device), precision)
    return cfg


def train_rows(cfg, rows: int, device: str) -> ClientData:
    """`rows` training rows (the clients' train splits in order, normalized as the clients
    see them; fewer if the data has fewer), on the device so that nothing is copied while
    measuring."""
    from fedapps.data import federated_data

    fd = federated_data(cfg)
    xs, ys, have = [], [], 0
    for pid in range(fd.num_clients):
        data = fd.client(pid)
        xs.append(data.x_train)
        ys.append(data.y_train)
        have += len(data.y_train)
        if have >= rows:
            break
    x, y = torch.cat(xs)[:rows].to(device), torch.cat(ys)[:rows].to(device)
    return ClientData(x, y, x[:0], y[:0])


def measure(experiment: str, overrides: list[str], precision: str, batches: int,
            threads: int = 1) -> dict[str, Any]:
    """One precision's peak training memory and seconds per batch, in this process."""
    from clients.base import BaseClient
    from fedapps.registry import ALGORITHMS
    from fedapps.runtime import dataset_task, seed_everything, select_device, train_settings

    torch.set_num_threads(threads)
    cfg = _config(experiment, overrides, precision)
    device = select_device(cfg)
    seed_everything(int(cfg.seed))
    settings = train_settings(cfg)
    data = train_rows(cfg, settings.batch_size * batches, device)
    model = ALGORITHMS[cfg.algorithm].model(cfg)
    client = BaseClient(model, data, settings, 0, device=device, task=dataset_task(cfg))
    client.seed_generator({"server-round": 1}, stream=0)
    loss_fn = client.task_loss(client.model)
    meter = PeakMeter(device)
    with client.in_precision():
        client.sgd_epochs(client.model.parameters(), loss_fn, 0, steps=1)  # warm-up
        client.model.zero_grad(set_to_none=True)
        meter.start()
        start = time.perf_counter()
        client.sgd_epochs(client.model.parameters(), loss_fn, 0, steps=batches)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        peak = meter.peak_mb()
        weights = sum(p.numel() * p.element_size() for p in client.model.parameters())
    return {"precision": precision, "peak_mb": round(peak, 3),
            "seconds_per_batch": round(seconds / batches, 6),
            "weights_mb": round(weights / 2**20, 3),
            "baseline_rss_mb": None if device.startswith("cuda") else round(meter.baseline_mb(), 1),
            "autocast_dtype": str(client.precision.autocast_dtype or "").replace("torch.", "")
            or None,
            "device": device, "model": str(cfg.model.name), "dataset": str(cfg.dataset),
            "batch_size": settings.batch_size, "batches": batches, "rows": len(data.y_train),
            "threads": threads}


# glibc malloc in the child: every allocation from 64 KiB up mapped on its own and unmapped
# when freed, and the heap trimmed at once, so the resident set follows the live tensors.
# Without this, memory freed by the warm-up batch stays resident, in the baseline, and is
# reused unseen (a bf16 run measured 9 MB where 62 MB are live).
CPU_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def _child_env(live_malloc: bool = True) -> dict[str, str]:
    """This checkout first on the child's path, so the child measures the same code; with
    `live_malloc`, the malloc settings that make its resident set measure live memory."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, **(CPU_MALLOC if live_malloc else {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def measure_in_subprocess(experiment: str, overrides: list[str], precision: str, batches: int,
                          threads: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "simulations.memory", experiment, "--precision", precision,
           "--batches", str(batches), "--threads", str(threads)]
    for o in overrides:
        cmd += ["--set", o]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(), check=False)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise ConfigError(f"fedapps memory: {precision} failed: {lines[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def with_reductions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's memory reduction against fp32's row, in % (Table 2.6's arrows; None
    without an fp32 row)."""
    base = next((r["peak_mb"] for r in rows if r["precision"] == "fp32"), None)
    for r in rows:
        r["reduction_pct"] = (round(100 * (1 - r["peak_mb"] / base), 1)
                              if base and r["precision"] != "fp32" else None)
    return rows


def memory_table(experiment: str, overrides: list[str], precisions: list[str], batches: int,
                 threads: int = 1) -> dict[str, Any]:
    """Every precision measured in its own subprocess; configs checked here first, so a bad
    value is one line before anything is spawned."""
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown or not precisions:
        raise ConfigError(f"--precisions {','.join(precisions)}: allowed: "
                          f"{', '.join(PRECISIONS)}")
    if batches < 1:
        raise ConfigError(f"--batches {batches}: must be >= 1")
    for p in precisions:
        _config(experiment, overrides, p)
    rows = with_reductions([measure_in_subprocess(experiment, overrides, p, batches, threads)
                            for p in precisions])
    first = rows[0]
    return {"experiment": experiment, "overrides": overrides, "device": first["device"],
            "model": first["model"], "dataset": first["dataset"],
            "batch_size": first["batch_size"], "batches": batches, "threads": threads,
            "measure": CUDA_MEASURE if first["device"].startswith("cuda") else CPU_MEASURE,
            "rows": rows}


def table_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"fedapps memory: {report['experiment']} ({report['model']} on {report['dataset']},"
             f" batch {report['batch_size']}, {report['batches']} batches, "
             f"{report['threads']} thread(s))",
             f"measure: {report['measure']}",
             f"{'precision':<9} {'peak MB':>9} {'reduction':>9} {'s/batch':>9}"]
    for r in report["rows"]:
        red = "-" if r["reduction_pct"] is None else f"{r['reduction_pct']:.1f}%"
        lines.append(f"{r['precision']:<9} {r['peak_mb']:>9.2f} {red:>9} "
                     f"{r['seconds_per_batch']:>9.4f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """The child: one precision, one JSON line on stdout."""
    p = argparse.ArgumentParser(description="one precision's measurement (fedapps memory)")
    p.add_argument("experiment")
    p.add_argument("--precision", required=True)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)
    try:
        row = measure(args.experiment, args.overrides, args.precision, args.batches,
                      args.threads)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
