"""The centralized baseline (seed 004 Table 2.3, "Centralized"): the experiment's model trained
on pooled data in one process, no Flower, through the federation's own client training loop.

What it trains on (`centralized.train-data`):
- `clients` (default): the union of every client's local train split after partitioning, the
  very samples the federation trains on, so the gap to FedAvg is the federation's alone;
- `official`: the dataset's official train split.
data.transforms are per-client emulation (label noise, oversampling) and are not applied: the
baseline, and the confusion matrix Q estimated from it, use the clean labels.

What it is scored on, every epoch, with the federation's evaluation loop and task metric:
- `global_<metric>`: the union of the clients' local test splits (the population of the
  federation's G), when held out, i.e. with `train-data: clients`;
- `official_test_<metric>`: the official test split, when held out, i.e. with
  `train-data: official` or `data.pool: official` (the FedAIoT setting, B13); with the default
  `data.pool: merged` the clients' data contains it, so it is not scored.

Q (spec 2.2.5): Q_ij = #(true i predicted j) / #(true i) of the final model on the official
test split when it is held out, else on the clients' local test splits; a class absent from
that split gets the identity row (no evidence of confusion: the label-noise transform then
redraws uniformly). Written as `confusion.csv` (Q) and `confusion-counts.csv` (the counts).

Training: one `BaseClient.fit` per epoch (local-epochs 1) on the pooled data, so the batching,
seeding, loss and any training option of the client loop (e.g. precision) apply unchanged; one
SGD optimizer for the whole run, so momentum carries across epochs as in any centralized run.
After every epoch results.json and checkpoint.npz (model, momentum buffers, epoch) are written;
`fedapps resume <run dir>` continues a stopped run (or runs a completed one further with
`--set centralized.epochs=N`) to the same numbers as an uninterrupted run: an epoch's shuffle
depends only on (seed, epoch).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from clients.arrays import get_arrays, load_momentum, momentum_arrays, set_arrays
from clients.base import BaseClient, TrainSettings
from fedapps import checkpoint, rundir
from fedapps.config import parse_overrides, squash_overrides, to_container
from fedapps.data import ClientData, FederatedData, federated_data
from fedapps.errors import ConfigError
from fedapps.evaluation import EVAL_BATCH, evaluate_sums, summarize_central
from fedapps.metrics import PERCENT_METRICS
from fedapps.registry import ALGORITHMS
from fedapps.results import ResultsWriter
from fedapps.runtime import dataset_task, seed_everything, select_device
from fedapps.server_app import OFFICIAL_TEST_BATCH
from fedapps.tasks import Task, pooled_confusion
from fedapps.validation import resolve_config

CONFUSION_FILE = "confusion.csv"
COUNTS_FILE = "confusion-counts.csv"
CLIENTS_TEST = "clients-test"  # the union of the clients' local test splits
OFFICIAL_TEST = "official-test"
# what a resume may change: how far it goes and what it reports
RESUMABLE = ("centralized.epochs", "output.plots", "wandb.*")
MOMENTUM = "momentum"  # checkpoint state: the optimizer's momentum buffers, by parameter


@dataclass(frozen=True)
class CentralSplits:
    """The pooled train data and the held-out splits it is scored on (normalized tensors)."""

    train: tuple[torch.Tensor, torch.Tensor]
    held_out: dict[str, tuple[torch.Tensor, torch.Tensor]]  # CLIENTS_TEST / OFFICIAL_TEST
    confusion_split: str  # which held-out split Q comes from
    notes: tuple[str, ...] = ()  # why a split is not scored

    def to(self, device: str) -> CentralSplits:
        """Every tensor on `device`, moved once (sgd_epochs and evaluate_sums then copy
        nothing)."""
        def move(pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            return pair[0].to(device), pair[1].to(device)
        return CentralSplits(move(self.train), {k: move(v) for k, v in self.held_out.items()},
                             self.confusion_split, self.notes)


def _rows(fd: FederatedData, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return fd.normalize(fd.pool.x[idx]), fd.norm.targets(fd.pool.y[idx])


def central_splits(cfg: DictConfig, fd: FederatedData) -> CentralSplits:
    """Train on the clients' pooled train splits or the official train split; score on
    whatever of the clients' test splits and the official test split is held out."""
    pool = fd.pool
    official_test = np.arange(pool.num_train, len(pool))
    from_clients = str(cfg.centralized["train-data"]) == "clients"
    train_idx = np.concatenate(fd.train_idx) if from_clients else np.arange(pool.num_train)
    held_out, notes = {}, []
    if from_clients:
        held_out[CLIENTS_TEST] = _rows(fd, np.concatenate(fd.test_idx))
    if len(official_test) and (not from_clients or str(cfg.data.pool) == "official"):
        held_out[OFFICIAL_TEST] = _rows(fd, official_test)
    elif len(official_test):
        notes.append("official test split not scored: data.pool=merged puts it in the "
                     "clients' data (set data.pool=official, or centralized.train-data="
                     "official)")
    if not held_out:
        raise ConfigError(f"centralized.train-data=official: dataset {cfg.dataset} has no "
                          "official test split to score on; use centralized.train-data=clients")
    confusion = OFFICIAL_TEST if OFFICIAL_TEST in held_out else CLIENTS_TEST
    return CentralSplits(_rows(fd, train_idx), held_out, confusion, tuple(notes))


def central_train_settings(cfg: DictConfig) -> TrainSettings:
    """The client loop's settings for one epoch per fit: centralized.lr / batch-size (null:
    train.*), train.momentum and weight decay, no schedule."""
    c, t = cfg.centralized, cfg.train
    return TrainSettings(1, int(c["batch-size"] or t["batch-size"]), float(c.lr or t.lr),
                         float(t.momentum), float(t["weight-decay"]), int(cfg.seed),
                         precision=str(t.precision))


class CentralizedTrainer(BaseClient):
    """The federation's client on the pooled data, keeping one optimizer for the whole run."""

    optimizer: torch.optim.Optimizer | None = None

    def sgd(self, params: Any, keep: str | None = None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            self.optimizer = super().sgd(params)
        return self.optimizer

    def momentum_buffers(self) -> list[np.ndarray]:
        """SGD's momentum buffers (clients.arrays.momentum_arrays); [] when there are none."""
        return momentum_arrays(self.optimizer) if self.optimizer is not None else []

    def restore(self, arrays: list[np.ndarray], momentum: list[np.ndarray]) -> None:
        set_arrays(self.model, arrays)
        opt = self.sgd(list(self.model.parameters()))
        with self.in_precision():  # buffers in the dtype each parameter trains in (fp16...)
            load_momentum(opt, momentum)


def evaluate(trainer: CentralizedTrainer, splits: CentralSplits, task: Task
             ) -> tuple[dict[str, Any], np.ndarray | None]:
    """One epoch's scores on every held-out split (the federation's loop and metrics) and
    the confusion counts of the split Q comes from (None for regression)."""
    trainer.model.eval()
    m = task.metric
    record: dict[str, Any] = {}
    counts = None
    for name, (x, y) in splits.held_out.items():
        batch = EVAL_BATCH if name == CLIENTS_TEST else OFFICIAL_TEST_BATCH
        with trainer.in_precision():  # as the clients evaluate: in the training precision
            n, loss_sum, sums = evaluate_sums(trainer.precision.predict(trainer.predict), x, y,
                                              task, batch, trainer.device)
        if name == CLIENTS_TEST:  # as the federation's G (P = G: nothing is personal)
            g, _ = task.scores(n, task.read(sums))
            extras = task.pooled_extras([sums])
            record.update({f"global_{m}": g, f"personal_{m}": g, "loss": loss_sum / max(n, 1),
                           "eval_samples": n,
                           **{k: v for k, v in extras.items() if k.startswith("global_")}})
        else:
            record.update(summarize_central(task, n, loss_sum, sums))
        if name == splits.confusion_split and "confusion-global" in sums:
            counts = pooled_confusion([sums["confusion-global"]])
    record.setdefault(f"global_{m}", None)
    record.setdefault(f"personal_{m}", None)
    return record, counts


def confusion_q(counts: np.ndarray) -> np.ndarray:
    """Q_ij = counts_ij / row total; a class with no samples gets the identity row."""
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    q = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    empty = totals[:, 0] == 0
    q[empty, np.flatnonzero(empty)] = 1.0
    return q


def write_confusion(run_dir: Path, counts: np.ndarray) -> Path:
    """confusion.csv (Q, rows summing to 1) and confusion-counts.csv, plain numbers."""
    for name, array, fmt in ((CONFUSION_FILE, confusion_q(counts), "%.10g"),
                             (COUNTS_FILE, counts, "%d")):
        tmp = run_dir / f".{name}.tmp"
        np.savetxt(tmp, array, fmt=fmt, delimiter=",")
        tmp.replace(run_dir / name)
    return run_dir / CONFUSION_FILE


def _show(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.2f}%" if metric in PERCENT_METRICS else f"{value:.4f}"


def default_run_name(cfg: DictConfig) -> str:
    return f"{cfg.experiment}-centralized-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_centralized(cfg: DictConfig, run_dir: Path, mode: str = rundir.NEW,
                    invocation: dict[str, str] | None = None,
                    progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Train and score for centralized.epochs epochs into `run_dir`; the results summary.

    `mode` is a rundir mode: NEW, OVERWRITE or RESUME (continue from checkpoint.npz)."""
    epochs = int(cfg.centralized.epochs)
    with rundir.claim(run_dir, mode) as run_id:
        saved = checkpoint.load(run_dir) if mode == rundir.RESUME else None
        if mode == rundir.RESUME and saved is None:
            raise ConfigError(f"{run_dir}: no {checkpoint.FILE} to resume from")
        if saved is not None and saved.round >= epochs:
            raise ConfigError(f"centralized.epochs={epochs}: the run has done {saved.round} "
                              f"epochs; --set centralized.epochs=N with N > {saved.round} "
                              "runs it further")
        seed_everything(int(cfg.seed))
        fd = federated_data(cfg)
        splits = central_splits(cfg, fd)
        task = dataset_task(cfg)
        device = select_device(cfg)
        splits = splits.to(device)
        y = splits.train[1]
        trainer = CentralizedTrainer(ALGORITHMS[cfg.algorithm].model(cfg),
                                     ClientData(*splits.train, *splits.held_out[
                                         splits.confusion_split]),
                                     central_train_settings(cfg), partition_id=0, device=device,
                                     task=task)
        if saved is not None:
            trainer.restore(saved.global_arrays, saved.state.get(MOMENTUM, []))
        settings = trainer.settings
        facts = {"train_data": str(cfg.centralized["train-data"]), "train_samples": len(y),
                 "held_out": {k: len(v[1]) for k, v in splits.held_out.items()},
                 "confusion_split": splits.confusion_split if task.metric == "accuracy"
                 else None, "epochs": epochs, "lr": settings.lr,
                 "batch_size": settings.batch_size, "notes": list(splits.notes)}
        writer = ResultsWriter(run_dir, to_container(cfg), fd.summary(), epochs,
                               invocation={"command": "centralized", **(invocation or {})},
                               resume_after=saved.round if saved else None,
                               metric=task.metric, run_id=run_id, extra={"centralized": facts},
                               title=f"centralized {cfg.model.name} on {cfg.dataset} "
                                     f"({run_dir.name})", xlabel="epoch",
                               plot_labels={"global": "clients' local test splits",
                                            "personal": None})
        for note in splits.notes:
            progress(f"fedapps: note: {note}")
        if list(cfg.data.get("transforms") or []):
            progress(f"fedapps: note: data.transforms {list(cfg.data.transforms)} are "
                     "per-client emulation, not applied to the centralized baseline")
        start = saved.round if saved else 0
        counts = None
        for epoch in range(start + 1, epochs + 1):
            t0 = time.time()
            _, _, fit_metrics = trainer.fit(trainer.get_parameters({}),
                                            {"server-round": epoch})
            t1 = time.time()
            record, counts = evaluate(trainer, splits, task)
            t2 = time.time()
            record = {"round": epoch, "epoch": epoch, **record,
                      "train_loss": float(fit_metrics["train-loss"]), "lr": settings.lr,
                      "train_samples": len(y), "seconds": t2 - t0, "fit_seconds": t1 - t0,
                      "eval_seconds": t2 - t1, "bytes_down": 0, "bytes_up": 0,
                      "fit_clients": [], "failures": 0}
            if epoch == epochs and counts is not None:  # Q before the run says completed
                write_confusion(run_dir, counts)
            writer.on_round(record)  # results first: a crash in between repeats the epoch
            momentum = trainer.momentum_buffers()
            checkpoint.save(run_dir, checkpoint.Snapshot(
                epoch, get_arrays(trainer.model), {MOMENTUM: momentum} if momentum else {}),
                run_id)
            m = task.metric
            eta = (t2 - t0) * (epochs - epoch)
            progress(f"[fedapps] epoch {epoch}/{epochs}  G {_show(m, record[f'global_{m}'])}  "
                     f"official {_show(m, record.get(f'official_test_{m}'))}  train loss "
                     f"{record['train_loss']:.4f}  {t2 - t0:.1f}s  ETA {eta:.0f}s")
        return writer.summary()


def invocation_of(experiment: str, overrides: Sequence[str]) -> dict[str, str]:
    return {"experiment": experiment,
            "overrides": shlex.join(squash_overrides(parse_overrides(list(overrides))))}


def report(summary: dict[str, Any], run_dir: Path, progress: Callable[[str], None] = print
           ) -> None:
    """The closing lines: best and final scores, where the files are."""
    m = summary.get("metric", "accuracy")
    parts = [f"{label} {_show(m, summary.get(f'{kind}_{key}_{m}'))}"
             for key, name in (("global", "G"), ("official_test", "official"))
             for kind, label in (("best", f"best {name}"), ("final", f"final {name}"))]
    progress(f"fedapps: done in {summary['wall_seconds']:.0f}s. {', '.join(parts)}")
    q = run_dir / CONFUSION_FILE
    progress(f"fedapps: results in {run_dir} (results.json, metrics.csv, config.yaml, {m}.png"
             f"{', ' + CONFUSION_FILE + ' (Q)' if q.is_file() else ''})")


def centralized_command(experiment: str, overrides: list[str], run_name: str | None = None,
                        overwrite: bool = False, num_threads: int | None = None) -> int:
    """`fedapps centralized EXPERIMENT`: validate, train, write; 0 when completed.
    `num_threads` sets torch's CPU threads (default: torch's own, all cores)."""
    if num_threads:
        torch.set_num_threads(num_threads)
    from fedapps.preflight import check_device, check_output_dir
    from fedapps.runtime import run_dir as run_dir_of

    sets = [*overrides, *([f"output.run-name={run_name}"] if run_name else [])]
    cfg = resolve_config(experiment, sets)
    if not cfg.output["run-name"]:
        cfg.output["run-name"] = default_run_name(cfg)
    out = run_dir_of(cfg)
    check_output_dir(out.parent)
    check_device(str(cfg.device))
    sets = [*sets, f"output.run-name={out.name}", f"output.output-dir={out.parent}"]
    print(f"fedapps: {cfg.experiment} centralized ({cfg.model.name} on {cfg.dataset}, "
          f"{cfg.centralized.epochs} epochs) -> {out}", flush=True)
    summary = run_centralized(cfg, out, rundir.OVERWRITE if overwrite else rundir.NEW,
                              invocation_of(experiment, sets), _flushed)
    report(summary, out, _flushed)
    return 0


def resume_centralized(run: Path, invocation: dict[str, str], overrides: list[str]) -> int:
    """`fedapps resume <run dir>` of a centralized run: only RESUMABLE keys may change."""
    base = [*shlex.split(invocation["overrides"]), f"output.output-dir={run.parent}",
            f"output.run-name={run.name}"]
    cfg = resolve_config(invocation["experiment"], [*base, *overrides])
    rundir.check_resume_changes(to_container(resolve_config(invocation["experiment"], base)),
                                to_container(cfg), RESUMABLE)
    print(f"fedapps: resuming {run} (centralized, {cfg.centralized.epochs} epochs)", flush=True)
    summary = run_centralized(cfg, run, rundir.RESUME,
                              invocation_of(invocation["experiment"], [*base, *overrides]),
                              _flushed)
    report(summary, run, _flushed)
    return 0


def _flushed(line: str) -> None:
    print(line, flush=True)
