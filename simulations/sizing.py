"""Device sizing table (issue 18, item 3): `fedapps sizing`.

    fedapps sizing [--only convnet,preresnet18] [--batches 10] [--threads 1] [--json F] [--md F]

For every model the project ships, one client's local training on this machine: seconds per
batch at its preset's batch size, the round of a client holding 1,000 samples at the preset's
local epochs, and the process's memory (what a device must hold: Python, PyTorch, the model, a
1,000-sample partition and training). A user reads off which device can run which experiment.

Each row runs in a fresh subprocess (glibc's malloc set as a node's ClientApp sets it,
fedapps/allocator.py, so the peak is what a node needs) on inputs of the dataset's shape drawn
at random: time and memory do not depend on pixel values, and so every row runs offline, also
for the datasets (CIFAR, the IoT sets) that are not on this machine. The width models are
measured at every capacity the partial-training methods hand out. The training step is the
client's own loop (`BaseClient.sgd_epochs`), so the preset's optimizer, precision and clipping
apply.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedapps.errors import ConfigError
from fedapps.processes import status_kb

CLIENT_SAMPLES = 1000  # the partition a row's round and memory are given for
DETECTION_BOXES = 54  # boxes per image of a detection row (VisDrone-DET train: ~54 on average)


@dataclass(frozen=True)
class Row:
    """One measured model: a preset that ships it, and the capacity of width models."""

    experiment: str
    overrides: tuple[str, ...] = ()
    beta: float | None = None  # partial-training sub-model at this capacity
    samples: int = CLIENT_SAMPLES  # the client's partition (VisDrone: its share, 640 px images)

    @property
    def key(self) -> str:
        return self.experiment + ("" if self.beta is None else f"@{self.beta:g}")


WIDTHS = (1.0, 0.5, 0.25, 0.125, 0.0625)  # clients/partial.py PartialSettings.levels
NO_WEIGHTS = ("model.pretrained=false",)  # sizing needs no ImageNet weights file
ROWS: tuple[Row, ...] = (
    Row("quickstart"),  # digits-cnn
    Row("regression-quick"),  # the seeds' DNN (mlp), here on the diabetes features
    Row("fedavg-fmnist"),  # the FedDyn ConvNet of seeds 000/001
    Row("thesis-mnist"), Row("thesis-fmnist"), Row("thesis-cifar10"),  # seed 002's CNNs
    *(Row("fedrolex-fmnist", beta=b) for b in WIDTHS),  # width CNN
    *(Row("fedrolex-cifar10", beta=b) for b in WIDTHS),  # pre-activation ResNet18
    Row("seed3-cifar10", NO_WEIGHTS), Row("seed3-office31", NO_WEIGHTS),  # seed 003's VGG-19
    Row("fedaiot-wisdm-w"), Row("fedaiot-ut-har"), Row("fedaiot-widar"),  # seed 004 IoT
    Row("fedaiot-casas"), Row("fedaiot-aep"), Row("fedaiot-epic-sounds"),
    # YOLOv8n: 6,471 images / 30 clients; no VGG-19 clusters (the partition is not built)
    Row("fedaiot-visdrone", ("data.fedaiot.cluster-features=raw",), samples=216),
)


def _status_mb(field: str) -> float:
    kb = status_kb(field)
    if kb is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return kb / 1024


def random_inputs(cfg, n: int, seed: int):
    """`n` samples of the dataset's shape and label range (token ids for token models)."""
    import torch

    from fedapps.data import DATASETS

    info = DATASETS[cfg.dataset]
    g = torch.Generator().manual_seed(seed)
    if info.vocab_size:
        x = torch.randint(info.vocab_size, (n, *info.shape), generator=g).float()
    else:
        x = torch.randn((n, *info.shape), generator=g)
    if info.task == "regression":
        return x, torch.randn(n, generator=g)
    if info.task == "detection":  # pixels in [0, 1], DETECTION_BOXES boxes per image
        shape = (n, DETECTION_BOXES)
        y = torch.stack([torch.randint(info.num_classes, shape, generator=g).float(),
                         0.2 + 0.6 * torch.rand(shape, generator=g),
                         0.2 + 0.6 * torch.rand(shape, generator=g),
                         0.01 + 0.1 * torch.rand(shape, generator=g),
                         0.01 + 0.1 * torch.rand(shape, generator=g)], dim=2)
        return x.uniform_(0, 1, generator=g), y
    return x, torch.randint(info.num_classes, (n,), generator=g)


def build(cfg, beta: float | None):
    from fedapps.registry import ALGORITHMS

    algorithm = ALGORITHMS[cfg.algorithm]
    if beta is None:
        return algorithm.model(cfg)
    return algorithm.client_kwargs(cfg)["model_factory"](beta)


def measure(row: Row, batches: int, threads: int) -> dict[str, Any]:
    """The child: one row, in this (fresh) process."""
    import torch

    from clients.base import BaseClient
    from fedapps.allocator import keep_freed_memory
    from fedapps.data import DATASETS, ClientData
    from fedapps.runtime import dataset_task, train_settings
    from fedapps.validation import resolve_config

    torch.set_num_threads(threads)
    keep_freed_memory()  # as a node's client_fn does
    cfg = resolve_config(row.experiment, [*row.overrides, "device=cpu"], check_data=False)
    settings = train_settings(cfg)
    model = build(cfg, row.beta)
    x, y = random_inputs(cfg, row.samples, int(cfg.seed))  # batches past it reshuffle
    data = ClientData(x, y, x[:0], y[:0])
    client = BaseClient(model, data, settings, 0, device="cpu", task=dataset_task(cfg))
    client.seed_generator({"server-round": 1}, stream=0)
    loss_fn = client.task_loss(client.model)
    params = list(client.model.parameters())
    lifetime_peak = _status_mb("VmHWM")  # imports and config included
    Path("/proc/self/clear_refs").write_text("5")  # peak from here on (simulations.memory)
    baseline = _status_mb("VmRSS")  # Python, PyTorch, the app, the model and the partition
    with client.in_precision():
        client.sgd_epochs(params, loss_fn, 0, steps=1)  # warm-up: kernels, allocator pools
        start = time.perf_counter()
        client.sgd_epochs(params, loss_fn, 0, steps=batches)
        seconds = (time.perf_counter() - start) / batches
    info = DATASETS[cfg.dataset]
    sample_bytes = x[0].numel() * x.element_size() + y[0].numel() * y.element_size()
    epochs = settings.local_epochs
    return {
        "key": row.key, "experiment": row.experiment, "beta": row.beta,
        "model": str(cfg.model.name) if row.beta is None
        else f"{cfg.algo.get('model', 'width-cnn')}",
        "dataset": str(cfg.dataset), "input": list(info.shape),
        "parameters": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
        "weights_mb": round(sum(p.numel() * p.element_size() for p in params) / 2**20, 3),
        "batch_size": settings.batch_size, "local_epochs": epochs,
        "precision": settings.precision, "threads": threads, "batches": batches,
        "seconds_per_batch": round(seconds, 5),
        "samples": row.samples,
        "round_seconds": round(epochs * math.ceil(row.samples / settings.batch_size)
                               * seconds, 3),
        "data_mb": round(row.samples * sample_bytes / 2**20, 3),
        "baseline_rss_mb": round(baseline, 1),
        "peak_rss_mb": round(_status_mb("VmHWM"), 1),  # while training
        "lifetime_peak_rss_mb": round(max(lifetime_peak, _status_mb("VmHWM")), 1),
    }


def measure_in_subprocess(row: Row, batches: int, threads: int) -> dict[str, Any]:
    from simulations.memory import _child_env

    cmd = [sys.executable, "-m", "simulations.sizing", "--child", row.key,
           "--batches", str(batches), "--threads", str(threads)]
    # glibc's malloc as a node's ClientApp sets it (the child calls keep_freed_memory; no
    # live-memory settings): the peak is what a device must have
    done = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(live_malloc=False),
                          check=False)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise ConfigError(f"fedapps sizing: {row.key} failed: {lines[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@functools.cache
def row_names(row: Row) -> frozenset[str]:
    """The names `--only` matches for a row: its preset, model, dataset and width model."""
    from fedapps.config import load_config

    cfg = load_config(row.experiment, list(row.overrides))
    return frozenset({row.experiment, str(cfg.model.name), str(cfg.dataset),
                      str(cfg.get("algo", {}).get("model", ""))} - {""})


def select(only: str | None) -> list[Row]:
    """Rows whose experiment, model or dataset is named in `only` (comma-separated)."""
    if not only:
        return list(ROWS)
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    chosen = [row for row in ROWS if row_names(row) & wanted]
    if missing := sorted(wanted - set().union(*(row_names(r) for r in chosen))):
        presets = ", ".join(sorted({r.experiment for r in ROWS}))
        raise ConfigError(f"--only {','.join(missing)}: no sized model, preset or dataset of "
                          f"that name; presets: {presets}")
    return chosen


def sizing_table(rows: list[Row], batches: int, threads: int,
                 progress=print) -> dict[str, Any]:
    if batches < 1 or threads < 1:
        raise ConfigError(f"--batches {batches} / --threads {threads}: both must be >= 1")
    measured = []
    for i, row in enumerate(rows, 1):
        progress(f"fedapps sizing: {i}/{len(rows)} {row.key}")
        measured.append(measure_in_subprocess(row, batches, threads))
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "client_samples": CLIENT_SAMPLES, "batches": batches, "threads": threads,
            "parent_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                        / 1024, 1),
            "rows": measured}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Machine: {report['machine']}; {report['threads']} thread(s); "
        f"{report['batches']} timed batches after one warm-up; a client of "
        f"{report['client_samples']:,} samples; random inputs of the dataset's shape.",
        "",
        "| preset | model | width | input | parameters | batch | s / batch | round (E) "
        "| data MB | RSS before training MB | peak RSS in training MB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["rows"]:
        width = "-" if r["beta"] is None else f"{r['beta']:g}"
        params = f"{r['parameters']:,}"
        if r["trainable"] != r["parameters"]:
            params += f" ({r['trainable']:,} trained)"
        other = r.get("samples", report["client_samples"]) != report["client_samples"]
        preset = r["experiment"] + (f" ({r['samples']:,} samples)" if other else "")
        lines.append(
            f"| {preset} | {r['model']} | {width} | {'x'.join(map(str, r['input']))} "
            f"| {params} | {r['batch_size']} | {r['seconds_per_batch']:.4f} | "
            f"{r['round_seconds']:.1f} s ({r['local_epochs']}) | {r['data_mb']:.1f} | "
            f"{r['baseline_rss_mb']:.0f} | {r['peak_rss_mb']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """The child (`--child KEY`): one row, one JSON line on stdout."""
    p = argparse.ArgumentParser(description="one row of fedapps sizing")
    p.add_argument("--child", required=True)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    row = next((r for r in ROWS if r.key == args.child), None)
    if row is None:
        print(f"error: no sizing row {args.child}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(measure(row, args.batches, args.threads)))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
