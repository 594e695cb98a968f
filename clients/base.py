"""The shared NumPyClient: local SGD loop, persistent client state, G/P evaluation.

An algorithm's client subclasses `BaseClient` and overrides only the hooks that differ:
`load_global` (what it takes from the server), `local_train` (its objective), `upload`
(what it sends back) and `predict` (global and personalized logits). Everything else -
batching, seeding, state, counting correct predictions - lives here once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.client import NumPyClient
from flwr.common import Context, RecordDict
from torch import nn

from clients import state_files
from clients.arrays import get_arrays, load_momentum, momentum_arrays, set_arrays
from clients.optim import EagerSGD
from fedapps.evaluation import evaluate_sums
from fedapps.precision import Precision
from fedapps.settings import AlgoSettings
from fedapps.tasks import TASKS, Task
from strategies.phases import local_steps
from strategies.plan import CROSS_EVALUATE, RESUMED_ROUND, RESUMED_STEP, TRAIN, WHOLE_ROUND


class LocalData(Protocol):
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


@dataclass(frozen=True)
class TrainSettings:
    local_epochs: int | float  # a fraction runs as a step budget (batch_indices)
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    seed: int
    lr_milestones: tuple[int, ...] = ()  # rounds after which the learning rate is multiplied
    lr_decay: float = 0.1  # by this factor (seed 004's multi-step schedule)
    precision: str = "fp32"  # fp32 | fp16 | amp | bf16 (fedapps/precision.py)
    # persist: optimizers built with a `keep` name carry their state (SGD momentum) from one
    # participation to the next (client state); reset: a fresh optimizer every round
    optimizer_state: str = "reset"
    # eval.personal: algorithm (the algorithm's own P) | local-previous (P = the model this
    # client trained in its last participation; seed 001's testbed, Table 6)
    personal_eval: str = "algorithm"

    def lr_at(self, server_round: int) -> float:
        return self.lr * self.lr_decay ** sum(server_round > m for m in self.lr_milestones)


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def handshake(partition_id: int, data: LocalData) -> dict[str, Any]:
    """A node's answer to the server's first question (strategies/nodes.py): its partition and
    sizes. num-train is the most a fit may declare as num_examples (the server bounds uploads
    by it): the train split, or the size of the set a per-round transform draws (label
    averaging's redraw). It needs the data only, no model (fedapps/client_app.py)."""
    return {"partition-id": partition_id,
            "num-train": int(getattr(data, "round_train_size", len(data.y_train))),
            "num-test": len(data.y_test)}


class BaseClient(NumPyClient):
    """FedAvg behaviour; subclasses override the hooks."""

    RESTORED = "fedapps.restored-from-disk"  # node-state marker: this node reloaded its state
    LOSS_SCALE = "fedapps.amp-loss-scale"  # node state: amp's GradScaler across rounds
    OPTIMIZER = "optimizer-"  # node state: optimizer-<keep>, a kept optimizer's momentum
    LOCAL_TRAINED = "local-trained"  # node state: the model as its last local training left it

    def __init__(
        self,
        model: nn.Module,
        data: LocalData,
        settings: TrainSettings,
        partition_id: int,
        context: Context | None = None,
        algo: AlgoSettings | None = None,
        device: str = "cpu",
        state_dir: Path | None = None,
        task: Task | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.precision = Precision(settings.precision, self.device)  # first: checks the device
        self.model = model.to(self.device)
        self.data = data
        self.base_data = data  # as built once; a per-round transform redraws from it
        self.settings = settings
        self.partition_id = partition_id
        self.state: RecordDict = context.state if context is not None else RecordDict()
        self.state_dir = state_dir  # where save_state also writes, so a restarted node resumes
        self.algo = algo if algo is not None else AlgoSettings()  # typed algo.* keys
        self.task = task or TASKS["classification"]  # the dataset's: loss and reported sums
        self.generator = torch.Generator()
        self.server_round = 0
        self.clock: state_files.Clock = (0, 0)  # the instruction's (round, step)
        self.resumed_after: state_files.Clock | None = None  # the server's resume point
        self._in_precision = False
        self._kept_optimizers: dict[str, torch.optim.Optimizer] = {}  # this fit's, by name
        self.previous_local: nn.Module | None = None  # eval.personal local-previous: P's model

    # ---- Flower API -------------------------------------------------------------------------
    def get_properties(self, config: dict[str, Any]) -> dict[str, Any]:
        return handshake(self.partition_id, self.base_data)

    def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
        return self.upload()

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """Dispatch on the instruction's task: train (default) or cross-evaluate."""
        self.follow_clock(config)
        task = str(config.get("task", TRAIN))
        if task == CROSS_EVALUATE:
            return self.cross_evaluate(parameters, config)
        if task != TRAIN:
            raise ValueError(f"unknown task {task!r} in a fit instruction")
        self.seed_generator(config, stream=0)
        self.use_round_data()
        self.load_global(parameters)
        self.model.train()
        self._kept_optimizers = {}
        with self.in_precision():
            metrics = self.local_train(config) or {}
        self.save_optimizers()
        if self.settings.personal_eval == "local-previous":
            self.save_state(self.LOCAL_TRAINED, get_arrays(self.model))
        return self.upload(), self.num_train_examples(), {
            "partition-id": self.partition_id, "state-from-disk": int(self.restored_from_disk),
            **metrics}

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]):
        self.follow_clock(config)
        self.seed_generator(config, stream=1)
        self.load_global(parameters)
        self.model.eval()
        self.previous_local = self.local_previous_model()
        predict = self.predict if self.previous_local is None else self.predict_local_previous
        with self.in_precision():
            n, loss_sum, sums = evaluate_sums(self.precision.predict(predict),
                                              self.data.x_test, self.data.y_test, self.task,
                                              device=self.device)
        return loss_sum / max(n, 1), n, {
            "partition-id": self.partition_id,
            "state-from-disk": int(self.restored_from_disk),
            **sums,
        }

    def cross_evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """Score several models sent together (arrays concatenated, `num-models` of them) on
        the local `split` (train by default, as Fed-Star scores its peers): one
        `score-<i>` per model, the task's metric of that model alone. Nothing is trained."""
        num_models = int(config.get("num-models", 1))
        if num_models < 1 or len(parameters) % num_models:
            raise ValueError(f"cross-evaluate: {len(parameters)} arrays do not split into "
                             f"{num_models} models")
        split = str(config.get("split", "train"))
        x, y = ((self.data.x_train, self.data.y_train) if split == "train"
                else (self.data.x_test, self.data.y_test))
        self.seed_generator(config, stream=2)
        size = len(parameters) // num_models
        scores: dict[str, Any] = {}
        n = len(y)
        for i in range(num_models):
            self.load_global(parameters[i * size:(i + 1) * size])
            self.model.eval()
            with self.in_precision():
                n, _, sums = evaluate_sums(self.precision.predict(self.predict), x, y,
                                           self.task, device=self.device)
            scores[f"score-{i}"] = self.task.scores(n, self.task.read(sums))[0]
        return [], n, {"partition-id": self.partition_id, **scores}

    def local_previous_model(self) -> nn.Module | None:
        """eval.personal local-previous: the model this client's last local training left
        (seed 001's testbed scores a client's previous-round local model, Table 6), or None:
        the algorithm's own P, also for a client that has not trained yet (P = G then)."""
        if self.settings.personal_eval != "local-previous":
            return None
        saved = self.load_state(self.LOCAL_TRAINED)
        if saved is None:
            return None
        model = copy.deepcopy(self.model)
        set_arrays(model, saved)
        return model.eval()

    def predict_local_previous(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """G from this round's model, P from the client's previous local model."""
        assert self.previous_local is not None
        return self.predict(x)[0], self.previous_local(x)

    def use_round_data(self) -> None:
        """A transform that draws anew every round (label averaging with redraw) leaves a
        `round_data(data, round)` extra: this round's train set is its draw."""
        round_data = getattr(self.base_data, "round_data", None)
        if round_data is not None:
            self.data = round_data(self.base_data, self.server_round)

    def sgd(self, params: Any, keep: str | None = None) -> torch.optim.Optimizer:
        """SGD with this round's learning rate (params: a list or parameter groups).

        `keep` names an optimizer of the client's local training: with
        train.optimizer-state persist its momentum comes from the client state and goes back
        there after this fit (the thesis creates opt_1/opt_2 once per client; PFLlib keeps
        its optimizers), so it runs on across participations. Without `keep` (or with reset)
        it starts fresh, as evaluation-time fine-tuning always does."""
        s = self.settings
        opt = EagerSGD(params, lr=s.lr_at(self.server_round), momentum=s.momentum,
                       weight_decay=s.weight_decay)
        if keep is None or s.optimizer_state != "persist":
            return opt
        if keep in self._kept_optimizers:
            raise ValueError(f"optimizer {keep!r} built twice in one round: pass it on instead")
        saved = self.load_state(self.OPTIMIZER + keep)
        if saved is not None:
            load_momentum(opt, saved)
        self._kept_optimizers[keep] = opt
        return opt

    def save_optimizers(self) -> None:
        """After local training: the kept optimizers' state into the client state (node
        state, and state-dir on disk), for this client's next participation."""
        for keep, opt in self._kept_optimizers.items():
            arrays = momentum_arrays(opt)
            if arrays:  # momentum 0: SGD keeps no state
                self.save_state(self.OPTIMIZER + keep, arrays)
        self._kept_optimizers = {}

    def seed_generator(self, config: dict[str, Any], stream: int) -> None:
        """Shuffling and any evaluation-time training depend only on (seed, round, client)."""
        server_round = int(config.get("server-round", 0))
        self.server_round = server_round
        step = int(config.get("step", 0))  # steps after the first of a multi-step round
        self.generator.manual_seed(self.settings.seed * 1_000_003 + server_round * 1009
                                   + self.partition_id + 500_009 * stream + 7_919_011 * step)

    # ---- hooks ------------------------------------------------------------------------------
    def load_global(self, parameters: list[np.ndarray]) -> None:
        """Take the server's arrays (default: the whole model)."""
        set_arrays(self.model, parameters)

    def local_train(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """Local objective (default: cross-entropy over all parameters)."""
        loss = self.sgd_epochs(self.model.parameters(), self.task_loss(self.model),
                               self.settings.local_epochs, keep="model")
        return {"train-loss": loss}

    def upload(self) -> list[np.ndarray]:
        """Arrays sent to the server: the model's state entries under `algo.shared-prefix`
        (default '': the whole model)."""
        return get_arrays(self.model, self.algo.upload_prefix)

    def num_train_examples(self) -> int:
        """The client's own samples: a transform's added copies (FedAug) carry no weight."""
        return int(getattr(self.data, "n_orig", len(self.data.y_train)))

    def epoch_examples(self) -> int:
        """The samples one local epoch covers: a transform's `epoch_samples` (FedAug's fair
        compute (a): N_orig) or every training row (FedAug's reading (b): the enlarged set).
        A step budget (phase-shift's fractional E) counts its epochs in these."""
        return int(getattr(self.data, "epoch_samples", None) or len(self.data.y_train))

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the global and of the personalized model (default: the same, so P = G)."""
        logits = self.model(x)
        return logits, logits

    # ---- building blocks for subclasses -----------------------------------------------------
    def task_loss(self, module: Callable[[torch.Tensor], torch.Tensor]) -> LossFn:
        """The dataset task's training loss of a module (cross-entropy, or MSE)."""
        return lambda x, y: self.task.loss(module(x), y)

    def sgd_epochs(
        self,
        params: Iterable[nn.Parameter],
        loss_fn: LossFn,
        epochs: float,
        x: torch.Tensor | None = None,
        y: torch.Tensor | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        steps: int | None = None,
        keep: str | None = None,
    ) -> float:
        """Minibatch SGD over (x, y) (default: the local train split); returns the mean loss.

        Batches are index slices of in-memory tensors, shuffled by the client's seeded
        generator: no DataLoader, no per-sample Python. `steps`, when given, replaces `epochs`:
        that many minibatches, reshuffling each epoch as the epoch loop does (a fractional E).
        `keep` names the optimizer built here (see `sgd`); `optimizer` passes one instead.
        The training precision applies here (in_precision, batch casts, autocast, loss
        scaling), so every algorithm and any caller of this loop trains in it; fp32 is the
        plain loop.
        """
        on_train = x is None or x is self.data.x_train
        x = (self.data.x_train if x is None else x).to(self.device)
        y = (self.data.y_train if y is None else y).to(self.device)
        prec = self.precision
        # transforms may re-augment rows per batch and count an epoch in other samples (FedAug)
        augment = getattr(self.data, "augment_rows", None) if on_train else None
        epoch_samples = getattr(self.data, "epoch_samples", None) if on_train else None
        total, batches = torch.zeros((), device=self.device), 0
        clip = self.clip_grad_norm()
        with self.in_precision():
            params = list(params)
            opt = optimizer or self.sgd(params, keep)
            scaler = prec.grad_scaler(self.state.get(self.LOSS_SCALE))
            for idx in self.batch_indices(len(y), epochs, epoch_samples, steps):
                xb = x[idx] if augment is None else augment(x, idx, self.generator)
                opt.zero_grad(set_to_none=True)
                with prec.autocast():
                    loss = loss_fn(prec.inputs(xb), prec.inputs(y[idx]))
                if scaler is None:
                    loss.backward()
                    if clip is not None:
                        torch.nn.utils.clip_grad_norm_(params, clip)
                    opt.step()
                else:  # amp in float16: scaled loss; steps with inf/NaN gradients skipped
                    scaler.scale(loss).backward()
                    if clip is not None:  # clip the true gradients, not the scaled ones
                        scaler.unscale_(opt)
                        torch.nn.utils.clip_grad_norm_(params, clip)
                    scaler.step(opt)
                    scaler.update()
                prec.after_step()
                total += loss.detach()
                batches += 1
        if scaler is not None:  # the next round starts from the scale found so far
            self.state[self.LOSS_SCALE] = ConfigRecord(scaler.state_dict())
        return float(total) / max(batches, 1)

    def clip_grad_norm(self) -> float | None:
        """Max L2 norm of each step's gradient, or None: the task's (detection: 10, as
        Ultralytics' trainer clips), else none; the partial-training clients clip at 1 (their
        reference)."""
        return self.task.clip_grad_norm

    @contextmanager
    def in_precision(self) -> Iterator[None]:
        """fp16 / bf16: the client's modules (every nn.Module attribute: the model, personal
        models and heads) in the half dtype for the duration, float32 again after, so that
        what is uploaded or kept is float32 holding the half values. Re-entrant (fit and
        evaluate enter it, and sgd_epochs for callers that drive the loop directly); fp32 and
        amp cast nothing."""
        if not self.precision.casts_modules or self._in_precision:
            yield
            return
        self._in_precision = True
        self.precision.cast(self.held_modules())
        try:
            with self.precision.explained():
                yield
        finally:
            self._in_precision = False
            self.precision.restore(self.held_modules())

    def held_modules(self) -> list[nn.Module]:
        """The torch modules this client holds as attributes (what in_precision casts)."""
        return [m for m in vars(self).values() if isinstance(m, nn.Module)]

    def batch_indices(self, n: int, epochs: float, epoch_samples: int | None = None,
                      steps: int | None = None) -> Iterator[torch.Tensor]:
        """Shuffled minibatch indices into n rows, `epochs` passes. With `epoch_samples` an
        epoch is ceil(epoch_samples / B) steps instead, drawn from reshuffled passes over all n
        rows (FedAug's fair compute, seed 002 section 9 item 14 (a)); `steps` gives the number
        of minibatches directly (phase-shift's fractional E). Either budget reshuffles once per
        pass, as the epoch loop does, so a whole number of epochs gives the same batches.
        A fractional `epochs` (FedAvg at Table 4.5's raised E, seed 002) becomes a step
        budget by phase-shift's rule: round(E x ceil(n / B)), n the epoch's samples."""
        b = self.settings.batch_size
        if steps is None and not float(epochs).is_integer():
            steps = local_steps(epochs, int(epoch_samples or n), b)
        if epoch_samples is None and steps is None:
            for _ in range(epochs):
                order = torch.randperm(n, generator=self.generator).to(self.device)
                for start in range(0, n, b):
                    yield order[start:start + b]
            return
        left = int(steps) if steps is not None else epochs * -(-int(epoch_samples) // b)
        while left > 0 and n > 0:
            order = torch.randperm(n, generator=self.generator).to(self.device)
            for start in range(0, n, b):
                if left == 0:
                    return
                yield order[start:start + b]
                left -= 1

    def proximal(self, module: nn.Module, reference: list[torch.Tensor]) -> torch.Tensor:
        """||w - w_ref||^2 over a module's parameters (FedProx, Ditto, FedDyn)."""
        return sum((torch.sum((p - r) ** 2) for p, r in zip(module.parameters(), reference,
                                                            strict=True)),
                   torch.zeros((), device=self.device))

    def snapshot(self, module: nn.Module) -> list[torch.Tensor]:
        """Detached copies of a module's parameters (e.g. the received global model)."""
        return [p.detach().clone() for p in module.parameters()]

    def persistent_copy(self, module: nn.Module, name: str) -> nn.Module:
        """A copy of `module` kept across rounds under `name` (a personal head or model): the
        saved one when this node has it, else the initial one (the seeded model every process
        builds), so a client that never trained still has a defined personal model."""
        kept = copy.deepcopy(module).to(self.device)
        saved = self.load_state(name)
        if saved is not None:
            set_arrays(kept, saved)
        return kept

    def follow_clock(self, config: dict[str, Any]) -> None:
        """The instruction's (round, step), and the checkpoint the server resumed from (sent
        with every instruction after a resume): what state on disk may be read
        (clients/state_files.py)."""
        self.clock = (int(config.get("server-round", 0)), int(config.get("step", 0)))
        resumed = config.get(RESUMED_ROUND)
        self.resumed_after = None if resumed is None else (
            int(resumed), int(config.get(RESUMED_STEP, WHOLE_ROUND)))

    def save_state(self, name: str, arrays: list[np.ndarray]) -> None:
        """Keep arrays across rounds: in Flower's per-node context state and, when the node
        config has a `state-dir`, on disk (atomic, stamped with the instruction's round and
        step, the previous generation kept) so a restarted SuperNode or a resumed run goes
        on from it."""
        self.state[name] = ArrayRecord(numpy_ndarrays=arrays)
        if self.state_dir is not None:
            state_files.save(self.state_dir, name, arrays, self.clock, self.resumed_after)

    def load_state(self, name: str) -> list[np.ndarray] | None:
        """Arrays saved earlier in this run: from memory, else from `state-dir` (never what a
        round the resumed server redoes wrote), else None."""
        record = self.state.get(name)
        if record is not None:
            return record.to_numpy_ndarrays()
        if self.state_dir is None:
            return None
        arrays = state_files.load(self.state_dir, name, self.resumed_after)
        if arrays is None:
            return None
        self.state[name] = ArrayRecord(numpy_ndarrays=arrays)
        self.state[self.RESTORED] = ConfigRecord({"from-disk": 1})
        return arrays

    @property
    def restored_from_disk(self) -> bool:
        """Whether this node (since it started) reloaded its state from `state-dir`: the first
        message to a restarted SuperNode may be any message, so the node state remembers it."""
        return self.RESTORED in self.state
