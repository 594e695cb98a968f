"""Learning tasks: what a dataset's model is trained on and how G and P are scored.

A task owns three things that must agree with each other: the training loss, the sums a client
reports after evaluating its two predictors (the global model -> G, its personalized model -> P)
on its local test split, and the server's reduction of those sums. Clients report sums, never
per-client scores, so the server's G and P are exact pooled values over all test samples:
micro-averaged accuracy for classification, R^2 over the pooled targets for regression.

Only torch and numpy are imported here, so clients, strategies and the server can all use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

Sums = dict[str, int | float]


def client_percentiles(values: Sequence[float], prefix: str) -> dict[str, float]:
    """p10/p50/p90/std of per-client scores: how unevenly the federation is served."""
    if not values:
        return {}
    arr = np.asarray(values)
    p10, p50, p90 = np.percentile(arr, [10, 50, 90])
    return {f"{prefix}_p10": float(p10), f"{prefix}_p50": float(p50),
            f"{prefix}_p90": float(p90), f"{prefix}_std": float(arr.std())}


class Task:
    """A learning task; subclasses fill in the loss, the sums and their reduction."""

    name: str = ""
    metric: str = ""  # G is reported as global_<metric>, P as personal_<metric>
    higher_is_better: bool = True
    sum_names: tuple[str, ...] = ()  # the metric keys a client reports, in batch_sums order
    sum_dtype: torch.dtype = torch.float64  # integer counts stay exact in torch.long
    clip_grad_norm: float | None = None  # max gradient norm of each training step (None: none)

    def loss(self, output: torch.Tensor, target: torch.Tensor,
             reduction: str = "mean") -> torch.Tensor:
        """Training (mean) or evaluation (sum) loss of one batch."""
        raise NotImplementedError

    def batch_sums(self, out_global: torch.Tensor, out_personal: torch.Tensor,
                   target: torch.Tensor) -> torch.Tensor:
        """One batch's sums, a vector of len(sum_names) on the outputs' device: adding these
        over batches on the device needs no host sync until the end."""
        raise NotImplementedError

    def to_metrics(self, values: Sequence[float]) -> Sums:
        """Host values of the summed vector as the client's metric dict (counts as int)."""
        if len(values) != len(self.sum_names):
            raise ValueError(f"{self.name}: {len(values)} sums, expected {len(self.sum_names)}")
        cast = int if not self.sum_dtype.is_floating_point else float
        return {k: cast(v) for k, v in zip(self.sum_names, values, strict=True)}

    def read(self, sums: dict[str, Any]) -> Sums:
        """This task's sums out of a client's metrics (other keys are ignored)."""
        missing = [k for k in self.sum_names if k not in sums]
        if missing:
            raise ValueError(f"{self.name} evaluation: client metrics lack {missing}")
        cast = int if not self.sum_dtype.is_floating_point else float
        return {k: cast(sums[k]) for k in self.sum_names}

    def scores(self, n: int, sums: Sums) -> tuple[float | None, float | None]:
        """(G, P) from one set of sums; None where the score is undefined (no samples)."""
        raise NotImplementedError

    def check_sums(self, n: int, metrics: dict[str, Any]) -> str | None:
        """Why a client's reported sums cannot come from evaluating n samples, or None: the
        server pools them unweighted, so one impossible value would move G for everyone."""
        raise NotImplementedError

    def pooled_extras(self, client_metrics: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Further pooled scores beyond the task's metric (e.g. F1 from confusion counts),
        keyed global_<name> / personal_<name>; none by default."""
        return {}

    def reduce(self, per_client: Sequence[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
        """G and P pooled over all clients (sums added first, then scored once), each client's
        own G and P (input order; None where undefined) and their percentiles."""
        total: dict[str, int | float] = dict.fromkeys(self.sum_names, 0)
        n_total = 0
        per_g: list[float | None] = []
        per_p: list[float | None] = []
        for n, raw in per_client:
            sums = self.read(raw)
            n_total += n
            for k in self.sum_names:
                total[k] += sums[k]
            g, p = self.scores(n, sums)
            per_g.append(g)
            per_p.append(p)
        g, p = self.scores(n_total, total)
        return {
            f"global_{self.metric}": g,
            f"personal_{self.metric}": p,
            **client_percentiles([v for v in per_g if v is not None], "global_client"),
            **client_percentiles([v for v in per_p if v is not None], "personal_client"),
            f"client_global_{self.metric}": per_g,
            f"client_personal_{self.metric}": per_p,
        }


class Classification(Task):
    """Cross-entropy on logits [B, C]; G and P are accuracies, reported as correct counts."""

    name = "classification"
    metric = "accuracy"
    higher_is_better = True
    sum_names = ("correct-global", "correct-personal")  # the keys results and tests know
    sum_dtype = torch.long

    def loss(self, output: torch.Tensor, target: torch.Tensor,
             reduction: str = "mean") -> torch.Tensor:
        return F.cross_entropy(output, target, reduction=reduction)

    CONFUSION = ("confusion-global", "confusion-personal")  # C x C int64 counts, as bytes

    def batch_sums(self, out_global: torch.Tensor, out_personal: torch.Tensor,
                   target: torch.Tensor) -> torch.Tensor:
        """Correct counts of both predictors, then both confusion matrices (true x predicted,
        flattened): the server sums them over clients for exact macro and weighted F1."""
        c = out_global.shape[1]
        pred_g, pred_p = out_global.argmax(1), out_personal.argmax(1)
        return torch.cat([torch.stack([(pred_g == target).sum(), (pred_p == target).sum()]),
                          torch.bincount(target * c + pred_g, minlength=c * c),
                          torch.bincount(target * c + pred_p, minlength=c * c)])

    def to_metrics(self, values: Sequence[float]) -> Sums:
        """The correct counts as ints and, when batches were seen, the two confusion matrices
        as int64 bytes (Flower metrics are scalars; bytes carry an array without pickle)."""
        head, rest = list(values[:2]), np.asarray(values[2:], dtype=np.float64)
        out: dict[str, Any] = super().to_metrics(head)
        if rest.size:
            c = int(round(np.sqrt(rest.size / 2)))
            if 2 * c * c != rest.size:
                raise ValueError(f"classification: {rest.size} confusion counts, not 2 C^2")
            for key, conf in zip(self.CONFUSION, rest.reshape(2, c * c), strict=True):
                out[key] = np.rint(conf).astype("<i8").tobytes()
        return out

    def scores(self, n: int, sums: Sums) -> tuple[float | None, float | None]:
        if not n:
            return None, None
        return int(sums["correct-global"]) / n, int(sums["correct-personal"]) / n

    def check_sums(self, n: int, metrics: dict[str, Any]) -> str | None:
        """Correct counts are ints in 0..n; confusion counts, where sent, are C x C
        non-negative counts that add up to n with the correct count on the diagonal."""
        for key in self.sum_names:
            v = metrics.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= n:
                return f"{key}={v!r} must be an integer in 0..{n}"
        for key, correct in zip(self.CONFUSION, self.sum_names, strict=True):
            blob = metrics.get(key)
            if blob is None:
                continue
            total = pooled_confusion([blob])
            if total is None or total.min() < 0 or int(total.sum()) != n \
                    or int(np.trace(total)) != metrics[correct]:
                return f"{key}: not the confusion counts of {n} samples with {correct}"
        return None

    def pooled_extras(self, client_metrics: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Macro and weighted F1 of G and P from the confusion counts summed over clients
        (seed 003's tables report both); None where a client sent no confusion counts."""
        out: dict[str, Any] = {}
        for key, who in zip(self.CONFUSION, ("global", "personal"), strict=True):
            total = pooled_confusion([m.get(key) for m in client_metrics])
            macro, weighted = f1_scores(total) if total is not None else (None, None)
            out[f"{who}_macro_f1"] = macro
            out[f"{who}_weighted_f1"] = weighted
        return out


def pooled_confusion(blobs: Sequence[Any]) -> np.ndarray | None:
    """Sum of clients' C x C confusion counts (int64 bytes); None if any client lacks them
    or they disagree in size (read with np.frombuffer: no unpickling)."""
    arrays = []
    for blob in blobs:
        if not isinstance(blob, bytes) or len(blob) % 8:
            return None
        arrays.append(np.frombuffer(blob, dtype="<i8"))
    if not arrays or len({a.size for a in arrays}) != 1:
        return None
    c = int(round(np.sqrt(arrays[0].size)))
    if c * c != arrays[0].size:
        return None
    return np.sum(arrays, axis=0).reshape(c, c)


def f1_scores(confusion: np.ndarray) -> tuple[float | None, float | None]:
    """(macro F1, support-weighted F1) of a true x predicted confusion matrix, over the classes
    that occur as a label or a prediction (scikit-learn's convention; a class never predicted
    or never present scores 0)."""
    conf = np.asarray(confusion, dtype=np.float64)
    tp = np.diag(conf)
    support, predicted = conf.sum(axis=1), conf.sum(axis=0)
    seen = (support + predicted) > 0
    if not seen.any():
        return None, None
    f1 = np.divide(2 * tp, support + predicted, out=np.zeros_like(tp), where=seen)
    weighted = float(np.sum(support * f1) / support.sum()) if support.sum() > 0 else None
    return float(f1[seen].mean()), weighted


def _as_vector(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A regression output [B] or [B, 1] as [B]; anything else would broadcast silently."""
    if output.dim() == 2 and output.shape[1] == 1:
        output = output[:, 0]
    if output.shape != target.shape or target.dim() != 1:
        raise ValueError(f"regression: output {list(output.shape)} and target "
                         f"{list(target.shape)} must be [B] (or output [B, 1]) and [B]")
    return output


class Regression(Task):
    """MSE on (standardized) scalar targets; G and P are R^2 over the pooled test targets.

    Clients report n (num_examples), sum y, sum y^2 and both models' SSE in float64, so
    R^2 = 1 - SSE / (sum y^2 - (sum y)^2 / n) is exact over any union of clients. R^2 is
    unchanged by an affine map applied to targets and predictions alike, so standardizing
    targets does not change it.
    """

    name = "regression"
    metric = "r2"
    higher_is_better = True
    sum_names = ("sum-y", "sum-y2", "sse-global", "sse-personal")
    sum_dtype = torch.float64
    # a client's total sum of squares at or below this fraction of sum y^2 is rounding error:
    # its targets are constant and R^2 is undefined
    CONSTANT_TOL = 1e-12

    def loss(self, output: torch.Tensor, target: torch.Tensor,
             reduction: str = "mean") -> torch.Tensor:
        out = _as_vector(output, target)
        return F.mse_loss(out, target.to(out.dtype), reduction=reduction)

    def batch_sums(self, out_global: torch.Tensor, out_personal: torch.Tensor,
                   target: torch.Tensor) -> torch.Tensor:
        y = target.double()
        g = _as_vector(out_global, target).double()
        p = _as_vector(out_personal, target).double()
        return torch.stack([y.sum(), (y * y).sum(), ((g - y) ** 2).sum(), ((p - y) ** 2).sum()])

    def scores(self, n: int, sums: Sums) -> tuple[float | None, float | None]:
        if not n:
            return None, None
        sum_y2 = float(sums["sum-y2"])
        sst = sum_y2 - float(sums["sum-y"]) ** 2 / n
        if sst <= self.CONSTANT_TOL * sum_y2:
            return None, None
        return 1.0 - float(sums["sse-global"]) / sst, 1.0 - float(sums["sse-personal"]) / sst

    def check_sums(self, n: int, metrics: dict[str, Any]) -> str | None:
        """Finite sums; squares (sum y^2, both SSEs) >= 0; (sum y)^2 <= n sum y^2
        (Cauchy-Schwarz, with rounding room): an SSE below 0 would give R^2 above 1."""
        values = {k: metrics.get(k) for k in self.sum_names}
        for key, v in values.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                return f"{key}={v!r} must be a finite number"
        for key in ("sum-y2", "sse-global", "sse-personal"):
            if values[key] < 0:  # type: ignore[operator]
                return f"{key}={values[key]!r} must be >= 0"
        sum_y, sum_y2 = float(values["sum-y"]), float(values["sum-y2"])  # type: ignore[arg-type]
        if sum_y * sum_y > n * sum_y2 * (1 + 1e-9) + 1e-9:
            return f"sum-y={sum_y!r}, sum-y2={sum_y2!r}: impossible for {n} samples"
        return None


class Detection(Task):
    """Object detection (seed 004's VisDrone row): the detector's own loss; G and P are mAP-50
    from per-(class, confidence bin) histograms that add over clients (fedapps/detection.py).

    Targets are padded per image, [B, M, 5] rows (class, cx, cy, w, h) with box coordinates as
    fractions of the image side and class < 0 for padding; outputs are `DetectorOutput`s
    (fedapps/yolo.py). Each predictor's histogram travels as int64 bytes."""

    name = "detection"
    metric = "map50"
    higher_is_better = True
    sum_names = ("detection-global", "detection-personal")
    sum_dtype = torch.long
    clip_grad_norm = 10.0  # Ultralytics' trainer clips every step's gradient norm at 10

    @staticmethod
    def loss_batch(target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Padded targets as the flat batch Ultralytics' loss reads."""
        valid = target[..., 0] >= 0
        image, _ = torch.nonzero(valid, as_tuple=True)
        rows = target[valid].float()
        return {"batch_idx": image.float(), "cls": rows[:, :1], "bboxes": rows[:, 1:5]}

    def loss(self, output: Any, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Box + class + DFL loss per image, averaged ("mean") or summed over the batch."""
        total, _ = output.criterion(output.raw, self.loss_batch(target))
        summed = total.sum()  # Ultralytics returns the three terms x batch size
        return summed / len(target) if reduction == "mean" else summed

    def batch_sums(self, out_global: Any, out_personal: Any,
                   target: torch.Tensor) -> torch.Tensor:
        from fedapps.detection import detections, histogram

        return torch.cat([histogram(detections(out.decoded), target, out.image_side,
                                    out.decoded.shape[1] - 4)
                          for out in (out_global, out_personal)])

    def to_metrics(self, values: Sequence[float]) -> Sums:
        """Both histograms as int64 bytes (Flower metrics are scalars or bytes)."""
        counts = np.rint(np.asarray(values, dtype=np.float64)).astype("<i8")
        if counts.size % 2:
            raise ValueError(f"detection: {counts.size} counts, not two histograms")
        half = counts.size // 2
        return {k: counts[i * half:(i + 1) * half].tobytes()
                for i, k in enumerate(self.sum_names)}

    def read(self, sums: dict[str, Any]) -> dict[str, Any]:
        """The two histograms as int64 arrays (np.frombuffer: no unpickling)."""
        out = {}
        for key in self.sum_names:
            blob = sums.get(key)
            if not isinstance(blob, bytes) or len(blob) % 8:
                raise ValueError(f"detection evaluation: client metrics lack {key}")
            out[key] = np.frombuffer(blob, dtype="<i8").astype(np.int64)
        return out

    def scores(self, n: int, sums: Sums) -> tuple[float | None, float | None]:
        from fedapps.detection import map50

        if not n:
            return None, None
        return map50(sums["detection-global"]), map50(sums["detection-personal"])

    def check_sums(self, n: int, metrics: dict[str, Any]) -> str | None:
        from fedapps.detection import histogram_problem

        try:
            hists = self.read(metrics)
        except ValueError as err:
            return str(err)
        for key, h in hists.items():
            problem = histogram_problem(h)
            if problem:
                return f"{key}: {problem}"
        return None


TASKS: dict[str, Task] = {"classification": Classification(), "regression": Regression(),
                          "detection": Detection()}


def get_task(name: str) -> Task:
    """The registered task called `name` (a dataset names its task)."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; one of {sorted(TASKS)}") from None
