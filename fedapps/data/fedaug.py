"""FedAug (seed 002 chapter 5): raise a client's rarest classes with augmented copies until its
label distribution has a target "augmented-EMD".

Algorithm 4 (class counts sorted in *decreasing* order, DECISIONS seed 002) finds the k bottom
classes and the level L (eq. 5.4) they are raised to; eq. 5.9 gives the share of unaltered data.
Only a client whose EMD exceeds the target augments. The copies are drawn with replacement from
the class's own samples (digest section 9 item 15), appended after the originals, and are given
a fresh random augmentation every time a training batch contains them (`OnTheFly`); the
originals are never altered. Compute stays fair (section 9 item 14): by default a client runs
E x ceil(N_orig / B) steps drawn from the augmented set (`compute: steps`, reading (a));
`compute: epochs` runs E full epochs over the enlarged set (reading (b), where the baseline's E
must be raised by N_aug / N_orig by hand).

The EMD here is the thesis's per-client one against the uniform distribution 1/M (eq. 5.1; the
derivation assumes a uniform global distribution, section 9 item 22).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedapps.data import rebalance
from fedapps.data.params import Param
from fedapps.errors import ConfigError

if TYPE_CHECKING:
    from fedapps.data import ClientData
    from fedapps.data.transforms import TransformContext

COMPUTE = ("steps", "epochs")  # section 9 item 14: reading (a) (default) / reading (b)
# The sampler option that gives every client at least one sample of every class (seed 002
# section 4.4); FedAug cannot raise a class a client does not hold.
EVERY_CLASS_OPTION = "data.every-class=true"


# ---- pure math (eqs. 5.1-5.9, Algorithm 4) --------------------------------------------------
def uniform_emd(counts: Sequence[float]) -> float:
    """A client's EMD against the uniform distribution: sum_i |n_i / N - 1/M| (eq. 5.1)."""
    n, m = float(sum(counts)), len(counts)
    return sum(abs(c / n - 1 / m) for c in counts)


def level_eq_5_4(k: int, s: float, m: int, emd: float) -> float:
    """Eq. 5.4: the level L of the k bottom classes when the top M - k sum to s and the EMD
    is `emd`: L = (2 k s - EMD s M) / (2 k M + EMD k M - 2 k^2)."""
    return (2 * k * s - emd * s * m) / (2 * k * m + emd * k * m - 2 * k * k)


@dataclass(frozen=True)
class Level:
    """Algorithm 4's answer: raise the k smallest classes to L; s = sum of the M - k kept."""

    k: int
    level: float
    kept_sum: float


def calculate_level(counts: Sequence[float], target_emd: float) -> Level:
    """Algorithm 4 (CALCULATE-L) with the counts sorted decreasing (the printed "increasing"
    returns L <= 0; digest section 5.2). Without a break the k = 1 level is returned (item 16)."""
    d = sorted((float(c) for c in counts), reverse=True)
    m = len(d)
    if m < 2:
        raise ValueError("FedAug needs at least 2 classes")
    s, k, level = 0.0, m, 0.0
    for i in range(m - 1):  # i = 1..M-1 in the thesis
        k -= 1
        s += d[i]
        level = level_eq_5_4(k, s, m, target_emd)
        if d[i + 1] <= level:
            break
    return Level(k, level, s)


def common_level(counts: Sequence[float], k: int) -> float:
    """L' of section 5.3: the common level the k smallest classes sit at now, (N - s_{M-k}) / k.
    Eq. 5.4 at the client's original EMD gives the same value whenever those classes are at
    or below 1/M (eq. 5.5); this form also holds when Algorithm 4 stops on a tie (D_{i+1} = L)
    with classes above 1/M among the k."""
    d = sorted((float(c) for c in counts), reverse=True)
    return sum(d[len(d) - k:]) / k


def unaltered_ratio(counts: Sequence[float], target_emd: float) -> float:
    """Eq. 5.9: unaltered / total = N / (N + k (L - L')) with L from Algorithm 4 at the target
    and L' the bottom classes' common level now (k(L - L') = the samples added). 1.0 when the
    client's EMD does not exceed the target (it does not augment)."""
    n = float(sum(counts))
    if uniform_emd(counts) <= target_emd:
        return 1.0
    lv = calculate_level(counts, target_emd)
    return n / (n + lv.k * (lv.level - common_level(counts, lv.k)))


def target_counts(counts: Sequence[int], target_emd: float) -> list[int]:
    """Per-class counts after FedAug: every class below L raised to ceil(L) (item 15);
    unchanged when the client's EMD does not exceed the target."""
    if uniform_emd(counts) <= target_emd:
        return [int(c) for c in counts]
    top = math.ceil(calculate_level(counts, target_emd).level - 1e-9)  # exact L stays L
    return [max(int(c), top) for c in counts]


# ---- copies and their augmentation -----------------------------------------------------------
def copy_sources(labels: np.ndarray, counts_after: Sequence[int],
                 rng: np.random.Generator) -> np.ndarray:
    """Indices of the originals each added copy is made from, class by class (with
    replacement from the class's own samples)."""
    parts = []
    for c, want in enumerate(counts_after):
        members = np.flatnonzero(labels == c)
        extra = int(want) - len(members)
        if extra > 0:
            parts.append(rng.choice(members, size=extra, replace=True))
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


class _Noise:
    """Additive Gaussian pixel noise on uint8 images, with probability p (section 5.4 "noise";
    level unspecified, item 15: sigma 0.05 of the range)."""

    def __init__(self, p: float = 0.5, sigma: float = 0.05) -> None:
        self.p, self.sigma = p, sigma

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        if float(torch.rand(())) >= self.p:
            return img
        noisy = img.float() + torch.randn(img.shape) * (255 * self.sigma)
        return noisy.round().clamp(0, 255).to(torch.uint8)


def augmenter(shape: tuple[int, ...], allow_flip: bool) -> Callable:
    """Section 5.4's random transforms for one uint8 image: (horizontal flip, where the dataset
    allows it: not for digits/characters, DECISIONS), affine with rotation in [-20, 20] degrees,
    perspective, noise; RGB also colour jitter and greyscale. Each is applied with some
    probability; the thesis gives no probabilities or other ranges (item 15), these are ours."""
    from torchvision.transforms import v2

    steps: list = [v2.RandomHorizontalFlip(0.5)] if allow_flip else []
    steps += [v2.RandomApply([v2.RandomAffine(degrees=20)], p=0.5),
              v2.RandomPerspective(distortion_scale=0.3, p=0.5)]
    if shape[0] == 3:
        steps += [v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4)], p=0.5),
                  v2.RandomGrayscale(p=0.2)]
    steps.append(_Noise())
    return v2.Compose(steps)


@dataclass(frozen=True)
class OnTheFly:
    """Re-augments the added copies of a training batch (rows >= n_orig) each time they are
    drawn; the originals pass through unchanged. Seeded from the client's batch generator, so a
    round's batches depend only on (seed, round, client)."""

    n_orig: int
    raw_copies: torch.Tensor  # uint8 source image of each copy, in row order
    normalize: Callable[[torch.Tensor], torch.Tensor]
    transform: Callable

    def __call__(self, x: torch.Tensor, idx: torch.Tensor,
                 generator: torch.Generator) -> torch.Tensor:
        batch = x[idx]
        rows = torch.nonzero(idx >= self.n_orig).flatten()
        if len(rows) == 0:
            return batch
        seed = int(torch.randint(2**62, (1,), generator=generator))
        src = (idx[rows] - self.n_orig).cpu()
        fresh = rebalance.augment_each(self.raw_copies[src], self.transform, seed)
        batch[rows] = self.normalize(fresh).to(batch.device, batch.dtype)
        return batch


# ---- the `fedaug` transform -------------------------------------------------------------------
PARAMS = (
    Param("target_emd", "data.fedaug.target-emd", float, 0.8, low=0, high=2,
          doc="augmented-EMD: the EMD a client is raised to (DECISIONS seed 002: 0.8)"),
    Param("compute", "data.fedaug.compute", str, "steps", choices=COMPUTE,
          doc="steps: E x ceil(N_orig/B) steps from the augmented set (reading (a)); "
              "epochs: E epochs over the augmented set (reading (b))"),
)


def transform(ctx: TransformContext, data: ClientData) -> ClientData:
    """The `fedaug` transform: x/y_train become originals + copies (copies last); extras
    `n_orig`, `n_augmented`, `fedaug_level`, `fedaug_k`, and for an augmenting client
    `augment_rows` (OnTheFly) and, with compute=steps, `epoch_samples` = N_orig. A client whose EMD
    does not exceed the target is returned unchanged (it trains exactly as without FedAug)."""
    fd, pid = ctx.fd, ctx.partition_id
    idx = fd.train_idx[pid]
    if len(data.y_train) != len(idx):
        raise ConfigError("data.transforms: fedaug must come before transforms that change "
                          "the number of train samples")
    labels = data.y_train.cpu().numpy()
    num_classes = int(fd.pool.num_classes)
    counts = np.bincount(labels, minlength=num_classes)
    target = float(ctx.params["target_emd"])
    after = target_counts(counts.tolist(), target)
    missing = [c for c in range(num_classes) if counts[c] == 0 and after[c] > 0]
    if missing:
        raise ConfigError(f"data.transforms: fedaug: client {pid} has no sample of class "
                          f"{missing[0]} and cannot augment it; use a sampler that gives every "
                          f"client every class ({EVERY_CLASS_OPTION})")
    sources = copy_sources(labels, after, ctx.rng())
    if len(sources) == 0:
        return data.replace(extras={"n_orig": len(labels), "n_augmented": 0})
    lv = calculate_level(counts.tolist(), target)
    src = torch.from_numpy(sources)
    raw = fd.pool.x[idx][src]  # uint8 originals the copies are augmented from
    allow_flip = str(ctx.cfg.dataset) not in rebalance.NO_FLIP_DATASETS
    extras: dict = {
        "n_orig": len(labels), "n_augmented": len(sources), "fedaug_level": lv.level,
        "fedaug_k": lv.k,
        "augment_rows": OnTheFly(len(labels), raw, fd.normalize,
                                 augmenter(tuple(raw.shape[1:]), allow_flip))}
    if ctx.params["compute"] == "steps":  # an epoch = ceil(N_orig / B) steps (reading (a))
        extras["epoch_samples"] = len(labels)
    return data.replace(x_train=torch.cat([data.x_train, data.x_train[src]]),
                        y_train=torch.cat([data.y_train, data.y_train[src]]), extras=extras)
