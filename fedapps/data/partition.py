"""Partitioners (a name -> function + typed parameters table) and the EMD skew metric.

The label partitioners are flwr-datasets' own (IID, Dirichlet, pathological), fed an in-memory
label-only dataset; the natural partitioner, seed 002's skew samplers (limit-label, q,
limit-label-q, EMD-targeted) with their closed-form EMDs and inverse solvers, seed 004's FedAIoT
schemes (`fedaiot_partition.py`), the per-client stratified train/test split and EMD are ours.
Validation and the partition cache key are derived from `PARTITIONERS`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedapps.data import fedaiot_partition as fedaiot
from fedapps.data.params import Param
from fedapps.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from fedapps.data.datasets import DatasetInfo


def _label_dataset(labels: np.ndarray):  # -> datasets.Dataset
    """In arrow format: flwr-datasets reads the label column and we read each partition's
    `idx` column whole instead of row by row (the same indices, about 4x faster at 60k)."""
    from datasets import Dataset

    return Dataset.from_dict({"label": labels.tolist(),
                              "idx": np.arange(len(labels)).tolist()}).with_format("arrow")


@dataclass(frozen=True)
class PartitionInput:
    """What a partitioner may look at: the candidate samples' labels, regression targets,
    natural client ids and (on demand: only feature clusters read them) their inputs."""

    num_samples: int
    labels: np.ndarray | None = None  # int64 class labels (None for regression sources)
    client_ids: np.ndarray | None = None  # natural client id per sample (subject, home, ...)
    num_classes: int | None = None
    targets: np.ndarray | None = None  # float regression targets (None for classification)
    inputs: Callable[[], torch.Tensor] | None = None  # the pool's raw inputs (a view, no copy)


@dataclass(frozen=True)
class Partitioner:
    """A seeded partitioner: `fn(data, num_clients, seed, **params) -> indices per client`."""

    fn: Callable[..., list[np.ndarray]]
    params: tuple[Param, ...] = ()
    needs_labels: bool = False
    needs_client_ids: bool = False
    needs_targets: bool = False  # a regression target (`PartitionInput.targets`)
    needs_inputs: bool = False  # the samples' inputs (`PartitionInput.inputs`)
    # extra dataset-dependent check of the read params before any run: (params, info) -> None
    check: Callable[[dict[str, Any], DatasetInfo], None] | None = None
    doc: str = ""
    # inverse solver for data.target-emd: (params, target, SolveContext) -> params to run with
    solve: Callable[[dict[str, Any], float, SolveContext], dict[str, Any]] | None = None


@dataclass(frozen=True)
class SolveContext:
    """What an inverse solver may use; `class_sizes` (the pool's samples per class, loaded on
    demand) is None during config validation, where only closed forms are checked."""

    num_classes: int
    num_clients: int
    seed: int
    class_sizes: Callable[[], np.ndarray] | None = None


def _iid(data: PartitionInput, num_clients: int, seed: int) -> list[np.ndarray]:
    """flwr-datasets' IidPartitioner splits contiguously: the assignment is shuffled by seed."""
    from flwr_datasets.partitioner import IidPartitioner

    labels = data.labels if data.labels is not None else np.zeros(data.num_samples, np.int64)
    parts = _load_all(IidPartitioner(num_partitions=num_clients), labels, num_clients)
    perm = np.random.default_rng(seed).permutation(data.num_samples)
    return [perm[p] for p in parts]


def _dirichlet_partitioner(data: PartitionInput, num_clients: int, seed: int, alpha: float,
                           min_size: int, balance: str = "none") -> list[np.ndarray]:
    assert data.labels is not None
    return _dirichlet(data.labels, num_clients, seed, alpha, min_size, balance)


def _shards(data: PartitionInput, num_clients: int, seed: int,
            labels_per_client: int) -> list[np.ndarray]:
    from flwr_datasets.partitioner import PathologicalPartitioner

    assert data.labels is not None
    part = PathologicalPartitioner(
        num_partitions=num_clients, partition_by="label",
        num_classes_per_partition=labels_per_client,
        class_assignment_mode="first-deterministic", shuffle=True, seed=seed)
    return _load_all(part, data.labels, num_clients)


def _check_shards(params: dict[str, Any], info: DatasetInfo) -> None:
    lpc, num_classes = params["labels_per_client"], info.num_classes
    if num_classes is not None and lpc > num_classes:
        raise ConfigError(f"data.labels-per-client={lpc}: must be <= {num_classes} "
                          "(classes in the dataset)")


def _natural(data: PartitionInput, num_clients: int, seed: int) -> list[np.ndarray]:
    """One client per natural id (subject, home, domain): sorted ids map to partitions 0..K-1.

    The seed is unused: the assignment is fixed by the data. K must equal num-clients, so a
    config never silently merges or drops natural clients."""
    assert data.client_ids is not None
    ids = np.asarray(data.client_ids)
    unique = np.unique(ids)  # sorted
    if len(unique) != num_clients:
        raise ConfigError(f"federation.num-clients={num_clients}: data.partitioner=natural needs "
                          f"one client per natural client id ({len(unique)} in this pool)")
    order = np.searchsorted(unique, ids)
    return [np.flatnonzero(order == k).astype(np.int64) for k in range(num_clients)]


# ---- seed 002: skew samplers with closed-form EMDs (eq. 3.3, no 1/2 factor) ----------------
#
# Every sampler below fixes a [clients, classes] weight matrix W (column y = how class y's
# samples are shared among the clients, columns sum to 1), turns it into whole sample counts
# with `_quotas` and hands out each class's shuffled samples by those counts. The thesis draws
# each sample at random with these probabilities; giving every client its expected count instead
# (rounded by largest remainder, ties broken at random by the seed) keeps its construction and
# makes the measured EMD equal the closed form up to rounding. `data.draw=per-sample` draws as
# the thesis does (a multinomial per class: each sample to client k with probability W[k, y]), so
# sizes and EMD equal the closed form only in expectation; ll(t, f) and ll_q(t, q) then differ
# at equal EMD, which expected counts make the same split.

_SOLVED_DIGITS = 12  # solved parameters are rounded so that an explicit run can name them


def _rounded(value: float, digits: int = _SOLVED_DIGITS) -> float:
    return float(f"{value:.{digits}g}")


def _num_classes(data: PartitionInput) -> int:
    assert data.labels is not None
    return int(data.num_classes or int(data.labels.max()) + 1)


def _quotas(sizes: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[K, M] whole counts: class y's sizes[y] samples split by weights[:, y]; floors first,
    the leftovers (integer division) one each to the largest remainders, ties at random."""
    exact = weights * sizes[None, :]
    counts = np.floor(exact + 1e-9).astype(np.int64)
    remainder = np.round(exact - counts, 9)
    for y in range(len(sizes)):
        left = int(sizes[y] - counts[:, y].sum())
        order = np.lexsort((rng.random(len(counts)), -remainder[:, y]))
        if left > 0:
            counts[order[:left], y] += 1
        elif left < 0:  # float noise floored one up: take it back from the smallest remainders
            counts[order[::-1][:-left], y] -= 1
    return counts


def _every_class(counts: np.ndarray) -> np.ndarray:
    """Seed 002 section 4.4 (FedAug needs it): a client without a class gets one sample of it
    from the client holding the most of that class (its label-set holders)."""
    counts = counts.copy()
    for y in range(counts.shape[1]):
        if counts[:, y].sum() < len(counts):
            raise ConfigError(f"data.every-class=true: class {y} has {counts[:, y].sum()} "
                              f"samples, fewer than the {len(counts)} clients")
        for k in np.flatnonzero(counts[:, y] == 0):
            donor = int(np.argmax(counts[:, y]))
            counts[donor, y] -= 1
            counts[k, y] += 1
    return counts


DRAWS = ("expected", "per-sample")


def _draw_counts(sizes: np.ndarray, weights: np.ndarray, rng: np.random.Generator,
                 draw: str) -> np.ndarray:
    """[K, M] counts: expected counts (`_quotas`), or per sample, one multinomial draw per class
    (the samples are then dealt in a random order, so this is each sample going to client k with
    probability weights[k, y], independently)."""
    if draw not in DRAWS:  # the config path checks this; direct callers too
        raise ValueError(f"draw={draw!r}: one of {', '.join(DRAWS)}")
    if draw == "expected":
        return _quotas(sizes, weights, rng)
    return np.stack([rng.multinomial(n, weights[:, y] / weights[:, y].sum())
                     for y, n in enumerate(sizes)], axis=1).astype(np.int64)


def _by_weights(data: PartitionInput, weights: np.ndarray, seed: int,
                every_class: bool = False, draw: str = "expected") -> list[np.ndarray]:
    """Indices per client: each class's samples, shuffled, cut by the counts of `weights`
    (expected counts, or drawn per sample: `_draw_counts`)."""
    assert data.labels is not None
    labels = np.asarray(data.labels)
    num_classes = weights.shape[1]
    rng = np.random.default_rng([seed, 2])
    counts = _draw_counts(np.bincount(labels, minlength=num_classes), weights, rng, draw)
    if every_class:
        counts = _every_class(counts)
    parts: list[list[np.ndarray]] = [[] for _ in range(len(weights))]
    for y in range(num_classes):
        members = rng.permutation(np.flatnonzero(labels == y))
        for k, chunk in enumerate(np.split(members, np.cumsum(counts[:, y])[:-1])):
            parts[k].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def label_sets(num_clients: int, num_classes: int, label_limit: int) -> np.ndarray:
    """[K, M] bool: Omega_k = {(k t + j) mod M : j < t}. Circulant with stride t, so every label
    is in exactly tK/M sets (eq. 3.4a) whenever M divides tK, also when K is not a multiple of M
    (the spec's stride-1 suggestion needs K = cM); |Omega_k| = t (eq. 3.4b)."""
    t, m = label_limit, num_classes
    if t > m:
        raise ConfigError(f"data.label-limit={t}: must be <= {m} (classes in the dataset)")
    if (t * num_clients) % m:
        raise ConfigError(f"data.label-limit={t}: label-limit x num-clients ({t} x {num_clients})"
                          f" must be a multiple of the {m} classes, so every label is in exactly "
                          "tK/M clients' label sets")
    sets = np.zeros((num_clients, m), dtype=bool)
    for k in range(num_clients):
        sets[k, (k * t + np.arange(t)) % m] = True
    return sets


def ll_emd(label_limit: int, fraction_noniid: float, num_classes: int) -> float:
    """Eq. 3.6b: EMD of ll(t, f) = 2f - 2tf/M (every client alike)."""
    return 2 * fraction_noniid - 2 * label_limit * fraction_noniid / num_classes


def q_emd(q: float, num_classes: int) -> float:
    """Eq. 3.8: EMD of q(q) = 2q - 2/M for q >= 1/M (in general 2|q - 1/M|)."""
    return 2 * abs(q - 1 / num_classes)


def llq_emd(label_limit: int, q: float, num_classes: int) -> float:
    """Eq. 3.13: EMD of ll_q(t, q) = 2q - 2t/M for q >= t/M (in general 2|q - t/M|)."""
    return 2 * abs(q - label_limit / num_classes)


def _limit_label(data: PartitionInput, num_clients: int, seed: int, label_limit: int,
                 fraction_noniid: float, every_class: bool, draw: str = "expected"
                 ) -> list[np.ndarray]:
    """ll(t, f), seed 002 section 3.1: a share f of every label is split evenly among the tK/M
    clients whose label set holds it, the share 1 - f evenly among all K clients.

    Choices the spec leaves open: Omega_k as in `label_sets`; expected counts rounded by largest
    remainder (leftovers of the integer division to random clients, by the seed); with balanced
    classes every client gets N/K samples and EMD = 2f - 2tf/M up to rounding. `every_class`
    then moves one sample of each missing class to the client lacking it (`_every_class`), which
    lowers the EMD slightly below the closed form."""
    m = _num_classes(data)
    sets = label_sets(num_clients, m, label_limit)
    holders = label_limit * num_clients // m
    weights = fraction_noniid * sets / holders + (1 - fraction_noniid) / num_clients
    return _by_weights(data, weights, seed, every_class, draw)


def _llq_weights(num_clients: int, num_classes: int, label_limit: int, q: float) -> np.ndarray:
    """Eq. 3.10: a share q of label y to the tK/M holders, 1 - q to the other K - tK/M."""
    if label_limit >= num_classes:
        raise ConfigError(f"data.label-limit={label_limit}: limit-label-q needs label-limit < "
                          f"{num_classes} (classes), so some clients lack each label")
    sets = label_sets(num_clients, num_classes, label_limit)
    holders = label_limit * num_clients // num_classes
    return q * sets / holders + (1 - q) * ~sets / (num_clients - holders)


def _limit_label_q(data: PartitionInput, num_clients: int, seed: int, label_limit: int, q: float,
                   every_class: bool, draw: str = "expected") -> list[np.ndarray]:
    """ll_q(t, q), seed 002 section 3.3: a share q of each label goes evenly to the tK/M clients
    whose label set holds it, the rest evenly to the K - tK/M others (eq. 3.10), so client k's
    distribution is q/t on its labels and (1 - q)/(M - t) elsewhere (eq. 3.12).

    Choices: Omega_k as in `label_sets`; expected counts rounded by largest remainder (the thesis
    flips a coin per sample, so its sizes are equal only in expectation, as with
    `draw="per-sample"`; ours are N/K for balanced classes); `every_class` as for limit-label
    (only matters at q = 1)."""
    weights = _llq_weights(num_clients, _num_classes(data), label_limit, q)
    return _by_weights(data, weights, seed, every_class, draw)


def _q_sampler(data: PartitionInput, num_clients: int, seed: int, q: float,
               every_class: bool, draw: str = "expected") -> list[np.ndarray]:
    """q(q), seed 002 section 3.2 (FLTrust): client k is in group k mod M (FLTK's rule); a share
    q of label y goes to group y's members, the rest evenly to the other groups' members, so
    p_k(y) = q on its group's label and (1 - q)/(M - 1) elsewhere (eq. 3.7). Needs K to be a
    multiple of M; this is ll_q(1, q) exactly, with the same rounding choices."""
    m = _num_classes(data)
    if num_clients % m:
        raise ConfigError(f"federation.num-clients={num_clients}: data.partitioner=q needs a "
                          f"multiple of the {m} classes (one group of clients per label)")
    return _by_weights(data, _llq_weights(num_clients, m, 1, q), seed, every_class, draw)


ROBINHOOD_TOL = 1e-3  # |EMD(D) - target| at which the solver stops (not given by the thesis)
ROBINHOOD_STEPS = 1_000_000


def robinhood(target: float, num_classes: int, rng: np.random.Generator,
              tol: float = ROBINHOOD_TOL) -> np.ndarray:
    """Seed 002 Algorithm 1: a label distribution D with sum_y |D_y - 1/M| within tol of target.

    Random pairs trade mass: rich gains from poor while the EMD is too small, poor gains from
    rich while it is too big. Open choices: D starts from Dir(1) (uniform on the simplex); tol =
    1e-3; at most a million trades; targets within tol of 0 or 2 - 2/M return uniform / one-hot
    (the trades only approach those ends)."""
    m = num_classes
    top = 2 - 2 / m
    if not 0 <= target <= top + 1e-12:
        raise ConfigError(f"data.target-emd={target:g}: emd reaches [0, {top:.3f}] with "
                          f"{m} classes")
    if target >= top - tol:
        d = np.zeros(m)
        d[rng.integers(m)] = 1.0
        return d
    if target <= tol:
        return np.full(m, 1 / m)
    d = rng.dirichlet(np.ones(m))
    value = float(np.abs(d - 1 / m).sum())
    for _ in range(ROBINHOOD_STEPS):
        if abs(target - value) <= tol:
            return d
        i, j = rng.choice(m, 2, replace=False)
        if d[i] < d[j]:
            i, j = j, i
        # too small: poor gives to rich; too big: rich gives to poor
        delta = rng.uniform(0, d[j]) if value < target else -rng.uniform(0, (d[i] - d[j]) / 2)
        d[i] += delta
        d[j] -= delta
        value = float(np.abs(d - 1 / m).sum())
    raise ConfigError(f"data.target-emd={target:g}: the Robinhood solver did not converge")


def _emd_sampler(data: PartitionInput, num_clients: int, seed: int,
                 target_emd: float | None) -> list[np.ndarray]:
    """Zhao et al.'s EMD-targeted split (seed 002 section 3.5): one distribution D from the
    Robinhood solver (seeded), client k wants D circularly shifted by k (p_k(y) = D[(y-k) mod M]),
    so all data is handed out and every client holds its own samples.

    Choices: each class's samples are split among the clients in proportion to their wanted
    share of it (largest-remainder rounding), which hands out all data; with K a multiple of M
    and balanced classes every client gets N/K samples and exactly the shifted D (EMD = target
    within the solver's tol plus rounding); otherwise sizes and EMD drift (the measured EMD is
    what results report). A class no client wants (only when K < M) is spread evenly."""
    if target_emd is None:
        raise ConfigError("data.target-emd: not set; data.partitioner=emd needs a target EMD")
    m = _num_classes(data)
    d = robinhood(target_emd, m, np.random.default_rng([seed, 2, 1]))
    wanted = np.stack([np.roll(d, k) for k in range(num_clients)])  # [k, y] = D[(y - k) mod M]
    totals = wanted.sum(axis=0)
    weights = np.where(totals > 0, wanted / np.where(totals > 0, totals, 1), 1 / num_clients)
    return _by_weights(data, weights, seed)


def _check_label_limit(params: dict[str, Any], info: DatasetInfo) -> None:
    t, num_classes = params["label_limit"], info.num_classes
    if num_classes is not None and t > num_classes:
        raise ConfigError(f"data.label-limit={t}: must be <= {num_classes} (classes in the "
                          "dataset)")


def _check_emd(params: dict[str, Any], info: DatasetInfo) -> None:
    target, num_classes = params["target_emd"], info.num_classes
    if target is None:
        raise ConfigError("data.target-emd: not set; data.partitioner=emd needs a target EMD")
    if num_classes is not None and target > 2 - 2 / num_classes + 1e-12:
        raise ConfigError(f"data.target-emd={target:g}: emd reaches [0, "
                          f"{2 - 2 / num_classes:.3f}] with {num_classes} classes")


# ---- seed 004: the FedAIoT schemes (fedaiot_partition.py) ------------------------------------
#
# One Dirichlet variant (B1) over three groupings: classes, equal-frequency bins of a regression
# target, KMeans clusters of input features; all draws from one generator seeded by (seed, 4).

def _fedaiot_rng(seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, 4])


def _fedaiot_labels(data: PartitionInput, num_clients: int, seed: int, alpha: float,
                    min_size: int, max_iterations: int) -> list[np.ndarray]:
    assert data.labels is not None
    return fedaiot.fedaiot_dirichlet(data.labels, num_clients, _fedaiot_rng(seed), alpha,
                                     min_size, max_iterations)


def _fedaiot_quantiles(data: PartitionInput, num_clients: int, seed: int, alpha: float,
                       min_size: int, max_iterations: int, bins: int) -> list[np.ndarray]:
    assert data.targets is not None
    return fedaiot.fedaiot_dirichlet(fedaiot.quantile_bins(data.targets, bins), num_clients,
                                     _fedaiot_rng(seed), alpha, min_size, max_iterations)


def _fedaiot_clusters(data: PartitionInput, num_clients: int, seed: int, alpha: float,
                      min_size: int, max_iterations: int, clusters: int, features: str
                      ) -> list[np.ndarray]:
    assert data.inputs is not None
    groups = fedaiot.feature_clusters(data.inputs(), clusters, features, seed)
    return fedaiot.fedaiot_dirichlet(groups, num_clients, _fedaiot_rng(seed), alpha, min_size,
                                     max_iterations)


def _check_fedaiot_clusters(params: dict[str, Any], info: DatasetInfo) -> None:
    """vgg19 needs 3-channel images the conv layers take (the weights file is data: checked
    with the data, `cluster_weights_needed`)."""
    if params["features"] != "vgg19":
        return
    shape = info.shape
    uint8 = info.normalization in ("image", "unit")  # uint8 pixels in the pool
    if not uint8 or len(shape) != 3 or shape[0] != 3 or min(shape[1:]) < 32:
        raise ConfigError(f"data.fedaiot.cluster-features=vgg19: needs [3, >=32, >=32] images "
                          f"(this dataset: {list(shape)}); use data.fedaiot.cluster-features=raw")


def cluster_weights_needed(cfg: Any) -> bool:
    """Whether this config's partition embeds images with VGG-19 (its weights file is data)."""
    return cfg.data.partitioner == "fedaiot-clusters" \
        and cfg.data.fedaiot["cluster-features"] == "vgg19"


def _disjoint_label(data: PartitionInput, num_clients: int, seed: int,
                    labels_per_client: int) -> list[np.ndarray]:
    assert data.labels is not None
    return fedaiot.disjoint_label(data.labels, _num_classes(data), num_clients,
                                  labels_per_client, np.random.default_rng([seed, 5]))


# ---- inverse solvers: data.target-emd -> the sampler's parameter ------------------------------

def _top(m: int) -> float:
    return 2 - 2 / m


def _unreachable(target: float, what: str, low: float, high: float) -> ConfigError:
    return ConfigError(f"data.target-emd={target:g}: {what} reaches EMD in [{low:.3f}, "
                       f"{high:.3f}]")


def ll_solutions(target: float, num_classes: int) -> list[tuple[int, float]]:
    """Every (t, f) of ll with EMD = target (section 3.3): f = EMD / (2(1 - t/M)) for t in
    1..M-1, kept if 0 <= f <= 1. A float within 1e-9 of 1 counts as 1 (0.4 / 0.4 in floats is
    1.0000000000000002, which excluded t = 8 at EMD 0.4 in the thesis)."""
    out = []
    for t in range(1, num_classes):
        f = target / (2 * (1 - t / num_classes))
        if -1e-9 <= f <= 1 + 1e-9:
            out.append((t, _rounded(min(max(f, 0.0), 1.0))))
    return out


def _solve_ll(params: dict[str, Any], target: float, ctx: SolveContext) -> dict[str, Any]:
    """ll: f for the configured label-limit; the error lists every t that reaches the target."""
    m = ctx.num_classes
    f = _for_label_limit(params, target, dict(ll_solutions(target, m)), "limit-label", m, "f")
    return {**params, "fraction_noniid": f}


def _solve_llq(params: dict[str, Any], target: float, ctx: SolveContext) -> dict[str, Any]:
    """ll_q: q = EMD/2 + t/M (the q >= t/M branch), t the configured label-limit."""
    m = ctx.num_classes
    reach = {s: target / 2 + s / m for s in range(1, m) if target / 2 + s / m <= 1 + 1e-9}
    q = _for_label_limit(params, target, reach, "limit-label-q", m, "q")
    return {**params, "q": _rounded(min(q, 1.0))}


def _for_label_limit(params: dict[str, Any], target: float, reach: dict[int, float],
                     sampler: str, m: int, name: str) -> float:
    """The solved parameter for the configured label-limit t; one-line errors that list the
    reachable range, or every t that reaches the target."""
    t = params["label_limit"]
    if not reach:
        raise _unreachable(target, sampler, 0, _top(m))
    if t not in reach:
        listed = ", ".join(f"{s} ({name}={v:.3f})" for s, v in reach.items())
        raise ConfigError(f"data.target-emd={target:g}: data.label-limit={t} cannot reach it "
                          f"({name} <= 1); reachable with data.label-limit {listed}")
    return reach[t]


def _solve_q(params: dict[str, Any], target: float, ctx: SolveContext) -> dict[str, Any]:
    """q: q = EMD/2 + 1/M."""
    q = target / 2 + 1 / ctx.num_classes
    if q > 1 + 1e-9:
        raise _unreachable(target, "q", 0, _top(ctx.num_classes))
    return {**params, "q": _rounded(min(q, 1.0))}


DIRICHLET_ALPHAS = (1e-3, 1e3)  # bisection bounds on alpha (spec section 9 item 6)
DIRICHLET_DRAWS = 20  # draws averaged per alpha


def dirichlet_mean_emd(class_sizes: np.ndarray, num_clients: int, alpha: float, min_size: int,
                       seed: int, draws: int = DIRICHLET_DRAWS, balance: str = "none") -> float:
    """Mean EMD of `draws` Dir(alpha) splits, counted as flwr-datasets cuts them (cumulative
    proportions x class size, truncated; `balance="capped"` applies `_dirichlet`'s cap class by
    class), redrawn (up to 100 times) until every client has min_size samples. The draws' seeds
    do not depend on alpha, so the bisection sees the same random numbers at every alpha."""
    sizes = np.asarray(class_sizes, dtype=np.int64)
    values = []
    for r in range(draws):
        rng = np.random.default_rng([seed, 3, r])
        for _ in range(100):
            props = rng.dirichlet(np.full(num_clients, alpha), size=len(sizes))  # [M, K]
            props = np.nan_to_num(props)
            if balance == "capped":
                counts = _capped_counts(props, sizes)
            else:
                cuts = (np.cumsum(props, axis=1) * sizes[:, None]).astype(np.int64)
                cuts[:, -1] = sizes
                counts = np.diff(np.concatenate([np.zeros((len(sizes), 1), np.int64), cuts],
                                                1)).T
            if counts.sum(axis=1).min() >= min_size:
                break
        values.append(emd(counts))
    return float(np.mean(values))


def _capped_counts(props: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """[K, M] counts of a capped Dirichlet split (`_dirichlet`): class y's proportions
    `props[y]` lose the clients already above N/K, are renormalized and cut as above."""
    num_clients = props.shape[1]
    average = sizes.sum() / num_clients
    counts = np.zeros((num_clients, len(sizes)), np.int64)
    for y, size in enumerate(sizes):
        share = props[y] * (counts.sum(axis=1) <= average)
        cuts = (np.cumsum(share / share.sum()) * size).astype(np.int64)
        cuts[-1] = size
        counts[:, y] = np.diff(cuts, prepend=0)
    return counts


def _solve_dirichlet(params: dict[str, Any], target: float, ctx: SolveContext
                     ) -> dict[str, Any]:
    """Dirichlet: bisection on log alpha over [1e-3, 1e3] until the mean EMD of 20 draws on the
    pool's class sizes matches the target (40 halvings; alpha rounded to 6 digits). The run
    itself is one more draw (flwr-datasets, the config's seed), so its EMD scatters about the
    target by the draws' spread (about 0.06 at M = K = 10). Without the pool (config
    validation) only the nominal range [0, 2 - 2/M] is checked."""
    m = ctx.num_classes
    if not 0 <= target <= _top(m):
        raise _unreachable(target, "dirichlet", 0, _top(m))
    if ctx.class_sizes is None:
        return params
    sizes, k, min_size = ctx.class_sizes(), ctx.num_clients, params["min_size"]
    balance = params.get("balance", "none")

    def mean_emd(log_alpha: float) -> float:
        return dirichlet_mean_emd(sizes, k, float(np.exp(log_alpha)), min_size, ctx.seed,
                                  balance=balance)

    lo, hi = np.log(DIRICHLET_ALPHAS[0]), np.log(DIRICHLET_ALPHAS[1])
    most, least = mean_emd(lo), mean_emd(hi)  # small alpha: large EMD
    if not least <= target <= most:
        raise _unreachable(target, f"dirichlet (alpha in [{DIRICHLET_ALPHAS[0]:g}, "
                           f"{DIRICHLET_ALPHAS[1]:g}], mean of {DIRICHLET_DRAWS} draws)",
                           least, most)
    for _ in range(40):
        mid = (lo + hi) / 2
        if mean_emd(mid) > target:
            lo = mid
        else:
            hi = mid
    return {**params, "alpha": _rounded(float(np.exp((lo + hi) / 2)), 6)}


TARGET_EMD = Param("target_emd", "data.target-emd", float, None, low=0, nullable=True,
                   doc="target EMD: the sampler's parameter is solved for it (null: use them)")


def resolve_params(name: str, params: dict[str, Any], target: float | None,
                   ctx: SolveContext) -> dict[str, Any]:
    """The parameters partitioner `name` runs with: with a target EMD, the solved ones (the
    target itself is then not a parameter, so an explicit run with the solved values is the
    same partition and the same cache key)."""
    part = PARTITIONERS[name]
    if target is None or TARGET_EMD in part.params:
        return params
    if part.solve is None:
        solvable = ", ".join(n for n, p in PARTITIONERS.items()
                             if p.solve is not None or TARGET_EMD in p.params)
        raise ConfigError(f"data.target-emd={target:g}: data.partitioner={name} has no EMD "
                          f"solver (one of: {solvable})")
    return part.solve(params, target, ctx)


def client_emd(counts: np.ndarray) -> np.ndarray:
    """Each client's sum_i |p_k(i) - p(i)| (p = the pool's distribution); `emd` weighs these by
    n_k / N."""
    counts = np.asarray(counts, dtype=np.float64)
    p = counts.sum(axis=0) / counts.sum()
    p_k = counts / np.maximum(counts.sum(axis=1), 1)[:, None]
    return np.abs(p_k - p).sum(axis=1)


ALPHA = Param("alpha", "data.alpha", float, 0.1, low=0, low_open=True,
              doc="Dirichlet concentration")
MIN_SIZE = Param("min_size", "data.min-size", int, 10, low=1,
                 doc="Dirichlet: redraw until every client holds this many samples")
DIRICHLET_BALANCE = Param("balance", "data.dirichlet-balance", str, "none",
                          choices=("none", "capped"),
                          doc="Dirichlet: capped = a client above N/K gets no share of the "
                              "next class (seeds 000/001 presets); none = uncapped")
LABELS_PER_CLIENT = Param("labels_per_client", "data.labels-per-client", int, 2, low=1,
                          doc="shards: classes per client")
LABEL_LIMIT = Param("label_limit", "data.label-limit", int, 2, low=1,
                    doc="limit-label(-q): labels in each client's set (t)")
FRACTION_NONIID = Param("fraction_noniid", "data.fraction-noniid", float, 1.0, low=0, high=1,
                        doc="limit-label: share of each label kept for its set holders (f)")
Q = Param("q", "data.q", float, 0.5, low=0, high=1,
          doc="q, limit-label-q: share of each label for its group / set holders")
EVERY_CLASS = Param("every_class", "data.every-class", bool, False,
                    doc="samplers: give every client at least one sample of every class")
DRAW = Param("draw", "data.draw", str, "expected", choices=DRAWS,
             doc="limit-label, q, limit-label-q: each client's expected count of each class, "
                 "or each sample drawn at random (the thesis's ll_q and q)")
FEDAIOT_MIN_SIZE = Param("min_size", "data.fedaiot.min-size", int, 20, low=1,
                         doc="FedAIoT Dirichlet: samples every client ends with (redraws, repair)")
MAX_ITERATIONS = Param("max_iterations", "data.fedaiot.max-iterations", int, 10_000, low=1,
                       doc="FedAIoT Dirichlet: draws before the repair")
BINS = Param("bins", "data.fedaiot.bins", int, 10, low=2,
             doc="fedaiot-quantiles: equal-frequency bins of the target (pseudo-classes)")
CLUSTERS = Param("clusters", "data.fedaiot.clusters", int, 10, low=2,
                 doc="fedaiot-clusters: KMeans clusters (pseudo-classes)")
CLUSTER_FEATURES = Param("features", "data.fedaiot.cluster-features", str, "raw",
                         choices=("raw", "vgg19"),
                         doc="fedaiot-clusters: standardized raw inputs or VGG-19 ImageNet "
                             "embeddings")
FEDAIOT = (ALPHA, FEDAIOT_MIN_SIZE, MAX_ITERATIONS)

# name -> partitioner. Adding one = a function above + one entry here (+ its keys in
# conf/defaults.yaml); validation and the cache key follow from the entry.
PARTITIONERS: dict[str, Partitioner] = {
    "dirichlet": Partitioner(_dirichlet_partitioner, (ALPHA, MIN_SIZE, DIRICHLET_BALANCE),
                             needs_labels=True,
                             solve=_solve_dirichlet,
                             doc="per-class Dir(alpha) proportions (seeds 000/001)"),
    "iid": Partitioner(_iid, doc="uniform random split"),
    "shards": Partitioner(_shards, (LABELS_PER_CLIENT,), needs_labels=True, check=_check_shards,
                          doc="pathological: labels-per-client classes per client"),
    "natural": Partitioner(_natural, needs_client_ids=True,
                           doc="one client per natural client id of the source"),
    "limit-label": Partitioner(_limit_label, (LABEL_LIMIT, FRACTION_NONIID, EVERY_CLASS, DRAW),
                               needs_labels=True, check=_check_label_limit, solve=_solve_ll,
                               doc="seed 002 ll(t, f): EMD 2f - 2tf/M"),
    "q": Partitioner(_q_sampler, (Q, EVERY_CLASS, DRAW), needs_labels=True, solve=_solve_q,
                     doc="seed 002 q(q): EMD 2q - 2/M"),
    "limit-label-q": Partitioner(_limit_label_q, (LABEL_LIMIT, Q, EVERY_CLASS, DRAW),
                                 needs_labels=True, check=_check_label_limit, solve=_solve_llq,
                                 doc="seed 002 ll_q(t, q): EMD 2q - 2t/M"),
    "emd": Partitioner(_emd_sampler, (TARGET_EMD,), needs_labels=True, check=_check_emd,
                       doc="seed 002 EMD-targeted (Robinhood D, shifted per client)"),
    "fedaiot-dirichlet": Partitioner(_fedaiot_labels, FEDAIOT, needs_labels=True,
                                     doc="seed 004 B1: per-class Dir(alpha), capacity, repair"),
    "fedaiot-quantiles": Partitioner(_fedaiot_quantiles, (*FEDAIOT, BINS), needs_targets=True,
                                     doc="seed 004: FedAIoT Dirichlet over target bins"),
    "fedaiot-clusters": Partitioner(_fedaiot_clusters, (*FEDAIOT, CLUSTERS, CLUSTER_FEATURES),
                                    needs_inputs=True, check=_check_fedaiot_clusters,
                                    doc="seed 004 B2: FedAIoT Dirichlet over KMeans clusters"),
    "disjoint-label": Partitioner(_disjoint_label, (LABELS_PER_CLIENT,), needs_labels=True,
                                  check=_check_shards,
                                  doc="seed 004: at most labels-per-client classes, shards"),
}


def run_partitioner(name: str, data: PartitionInput, num_clients: int, seed: int,
                    params: dict[str, Any]) -> list[np.ndarray]:
    """Indices (into the candidates) of each client's data, by the table entry `name`."""
    if name not in PARTITIONERS:
        raise ConfigError(f"data.partitioner={name!r}: allowed: {', '.join(PARTITIONERS)}")
    part = PARTITIONERS[name]
    if num_clients > data.num_samples:
        raise ConfigError(f"federation.num-clients={num_clients}: more clients than samples "
                          f"({data.num_samples})")
    if part.needs_labels and data.labels is None:
        raise ConfigError(f"data.partitioner={name}: needs class labels; this dataset has none")
    if part.needs_client_ids and data.client_ids is None:
        raise ConfigError(f"data.partitioner={name}: this dataset has no natural client ids")
    if part.needs_targets and data.targets is None:
        raise ConfigError(f"data.partitioner={name}: needs a regression target; this dataset "
                          "has none")
    if part.needs_inputs and data.inputs is None:
        raise ConfigError(f"data.partitioner={name}: needs the samples' inputs")
    parts = part.fn(data, num_clients, seed, **params)
    empty = [k for k, p in enumerate(parts) if len(p) == 0]
    if empty:  # a client without data cannot train or be evaluated
        raise ConfigError(f"data.partitioner={name}: {len(empty)} of {num_clients} clients get "
                          f"no samples (first: client {empty[0]}; {data.num_samples} samples); "
                          "use fewer clients or another setting")
    return parts


def partition_indices(
    labels: np.ndarray,
    num_clients: int,
    scheme: str,
    seed: int,
    alpha: float = 0.1,
    labels_per_client: int = 2,
    min_size: int = 10,
    balance: str = "none",
) -> list[np.ndarray]:
    """Indices (into `labels`) of each client's data for a label-based scheme (kept for
    callers that hold only labels; the config path goes through `run_partitioner`)."""
    given = {"alpha": alpha, "labels_per_client": labels_per_client, "min_size": min_size,
             "balance": balance}
    params = {p.name: given[p.name] for p in PARTITIONERS[scheme].params} \
        if scheme in PARTITIONERS else {}
    data = PartitionInput(len(labels), labels=labels, num_classes=int(labels.max()) + 1)
    return run_partitioner(scheme, data, num_clients, seed, params)


def _load_all(partitioner, labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
    partitioner.dataset = _label_dataset(labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flwr-datasets warns on every Dirichlet redraw
        return [np.asarray(partitioner.load_partition(i)["idx"], dtype=np.int64)
                for i in range(num_clients)]


def _dirichlet(labels: np.ndarray, num_clients: int, seed: int, alpha: float, min_size: int,
               balance: str = "none", attempts: int = 20) -> list[np.ndarray]:
    """Seeds 000/001 (DECISIONS): per-class proportions ~ Dir(alpha * 1_N), class by class.

    `balance="capped"`: before each class is cut, a client already holding more than N/K
    samples gets a zero share and the others' shares are renormalized (flwr-datasets'
    self_balancing, the cap of PFLlib's dataset_utils.py `p * (len(idx_j) < N/num_clients)`
    and Yurochkin et al.'s code that seed 000 cites as [38]; PFLlib caps at >= N/K, flwr-datasets
    at > N/K: they differ only for a client holding exactly N/K). `"none"` leaves the draw as
    it is. Minimum client size (both): the whole split is redrawn until every client holds
    >= min_size samples (DECISIONS: 10); flwr-datasets redraws 10 times per seed, so we go on
    with derived seeds (deterministic) before giving up with a one-line error."""
    from flwr_datasets.partitioner import DirichletPartitioner

    for attempt in range(attempts):
        part = DirichletPartitioner(
            num_partitions=num_clients, partition_by="label", alpha=alpha,
            min_partition_size=min_size, self_balancing=balance == "capped", shuffle=True,
            seed=seed + 1_000_003 * attempt)
        try:
            return _load_all(part, labels, num_clients)
        except ValueError:
            continue
    raise ConfigError(
        f"data.alpha={alpha}: no Dirichlet draw gave all {num_clients} clients "
        f"data.min-size={min_size} samples in {attempts * 10} tries; raise alpha or lower "
        "min-size/num-clients")


def split_train_test(
    indices: np.ndarray, labels: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Per-client local split, stratified: each class gives round(n * f) samples to test."""
    train, test = [], []
    client_labels = labels[indices]
    for c in np.unique(client_labels):
        members = rng.permutation(indices[client_labels == c])
        n_test = int(np.floor(len(members) * test_fraction + 0.5))
        test.append(members[:n_test])
        train.append(members[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def official_test_shares(parts: list[np.ndarray], labels: np.ndarray, num_train: int,
                         num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Seed 004's local test sets as the FedRolex/HeteroFL code builds them (`non_iid(test,
    label_split)`): each class's official test samples (pool rows >= num_train) are dealt in
    equal shares (sizes differing by at most one; a seeded permutation) to the clients whose
    shard holds the class, in partition order. So a client tests on its own classes only and
    every official test sample of a class some client holds is tested exactly once."""
    holders = class_counts(parts, labels, num_classes) > 0
    test_labels = labels[num_train:]
    shares: list[list[np.ndarray]] = [[] for _ in parts]
    for c in range(num_classes):
        owners = np.flatnonzero(holders[:, c])
        members = num_train + rng.permutation(np.flatnonzero(test_labels == c))
        if len(owners) == 0:
            continue  # nobody trains on this class: nobody tests on it
        for k, share in zip(owners, np.array_split(members, len(owners)), strict=True):
            shares[k].append(share)
    return [np.sort(np.concatenate(s)) if s else np.zeros(0, np.int64) for s in shares]


def class_counts(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> np.ndarray:
    """[clients, classes] matrix of sample counts."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


def emd(counts: np.ndarray) -> float:
    """Earth Mover's Distance of a partition (seed 002, DECISIONS: no 1/2 factor).

    EMD = sum_k n_k / N * sum_i |p_k(i) - p(i)|, p = the label distribution of all the data.
    """
    counts = np.asarray(counts, dtype=np.float64)
    n_k = counts.sum(axis=1)
    total = n_k.sum()
    p = counts.sum(axis=0) / total
    p_k = counts / np.maximum(n_k, 1)[:, None]
    return float(np.sum(n_k / total * np.abs(p_k - p).sum(axis=1)))
