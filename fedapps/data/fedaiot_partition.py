"""FedAIoT partition schemes (seed 004 section 2.2.1, ambiguities B1 and B2).

The thesis's Dirichlet scheme as the FedAIoT reference runs it (B1; written from a reading of
AIoT-MLSys-Lab/FedAIoT `partition/dirichlet.py`, not copied), over classes or over pseudo-classes:
equal-frequency bins of a regression target (scheme 3) or KMeans clusters of input features
(scheme 2, B2); and the thesis's disjoint-label shards. Plain array functions: `partition.py`
wraps them into table entries, so this module knows nothing of configs.
"""

from __future__ import annotations

import numpy as np
import torch

from fedapps.errors import ConfigError


def allocate(group_sizes: np.ndarray, props: np.ndarray, capacity: float) -> np.ndarray:
    """[clients, groups] counts of one draw: group k's n_k samples are cut by props[k] (over
    clients), groups in order, except that a client already holding >= `capacity` samples
    (|D|/N) gets a zero share of every later group. Cuts as the reference makes them:
    cumulative proportions x n_k, truncated. If every client under capacity has a zero
    proportion (Dirichlet underflow at tiny alpha; the reference divides by zero), those
    clients share equally."""
    num_clients = props.shape[1]
    counts = np.zeros((num_clients, len(group_sizes)), dtype=np.int64)
    for k, (n, p) in enumerate(zip(group_sizes, props, strict=True)):
        open_ = counts.sum(axis=1) < capacity
        share = p * open_
        share = share / share.sum() if share.sum() > 0 else open_ / open_.sum()
        cuts = (np.cumsum(share) * n).astype(np.int64)[:-1]
        counts[:, k] = np.diff(np.concatenate([[0], cuts, [n]]))
    return counts


def repair(parts: list[np.ndarray], min_size: int) -> list[np.ndarray]:
    """The reference's repair after the last draw: while some client holds fewer than
    `min_size`, the (first) smallest takes the last `min_size - n_small` samples of the (first)
    largest. Ends when the total is >= clients x min_size (checked by the caller): each move
    lowers the summed shortfall by at least one, as the largest client then holds more than
    min_size."""
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    sizes = np.array([len(p) for p in parts])
    while sizes.min() < min_size:
        small, large = int(np.argmin(sizes)), int(np.argmax(sizes))
        moved = min_size - sizes[small]
        parts[small] = np.concatenate([parts[small], parts[large][-moved:]])
        parts[large] = parts[large][:-moved]
        sizes[small], sizes[large] = len(parts[small]), len(parts[large])
    return parts


def fedaiot_dirichlet(groups: np.ndarray, num_clients: int, rng: np.random.Generator,
                      alpha: float, min_size: int, max_iterations: int) -> list[np.ndarray]:
    """Seed 004 B1, the reference's variant: for each group (class or pseudo-class) k in order,
    proportions over clients ~ Dir(alpha 1_N), cut by `allocate` (the capacity rule); drawn
    again until every client holds >= min_size samples or `max_iterations` draws were made;
    each group's samples are then shuffled and dealt by the last draw's counts (a client's
    samples in group order), and `repair` tops up the clients still short. Indices (into
    `groups`) sorted per client.

    The reference draws each class's proportions once and keeps them (a defaultdict), so its
    redraws only reshuffle and never change a size: `max_iterations=1` gives its behaviour (one
    draw, then the repair); the default 10,000 redraws as the thesis describes."""
    groups = np.asarray(groups, dtype=np.int64)
    if len(groups) < num_clients * min_size:
        raise ConfigError(f"data.fedaiot.min-size={min_size}: {num_clients} clients x "
                          f"{min_size} > {len(groups)} samples")
    sizes = np.bincount(groups)
    for _ in range(max_iterations):
        props = rng.dirichlet(np.full(num_clients, alpha), size=len(sizes))
        counts = allocate(sizes, props, len(groups) / num_clients)
        if counts.sum(axis=1).min() >= min_size:
            break
    dealt: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k in range(len(sizes)):
        members = rng.permutation(np.flatnonzero(groups == k))
        for client, chunk in enumerate(np.split(members, np.cumsum(counts[:, k])[:-1])):
            dealt[client].append(chunk)
    parts = [np.concatenate(d) for d in dealt]
    return [np.sort(p) for p in repair(parts, min_size)]


def quantile_bins(targets: np.ndarray, bins: int) -> np.ndarray:
    """Seed 004 scheme 3: each sample's equal-frequency bin of the target, by rank (a stable
    sort, so equal targets are ranked by index): bin = floor(rank x bins / N), which makes bin
    sizes floor or ceil of N/bins even with tied targets."""
    t = np.asarray(targets, dtype=np.float64)
    if t.ndim == 2 and t.shape[1] == 1:
        t = t[:, 0]
    if t.ndim != 1:
        raise ConfigError(f"data.partitioner=fedaiot-quantiles: needs a one-dimensional "
                          f"regression target (this one has shape {list(t.shape[1:])})")
    out = np.empty(len(t), dtype=np.int64)
    out[np.argsort(t, kind="stable")] = np.arange(len(t)) * bins // len(t)
    return out


def raw_features(inputs: torch.Tensor) -> np.ndarray:
    """Flattened inputs as float32 (KMeans's memory), each feature standardized over the
    samples (constant ones become 0)."""
    x = inputs.reshape(len(inputs), -1).float().numpy()
    std = x.std(axis=0)
    return (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)


VGG_BATCH = 64


def vgg19_embeddings(images: torch.Tensor) -> np.ndarray:
    """[N, 512]: uint8 [N, 3, H, W] images (H, W >= 32) through VGG-19's ImageNet conv layers
    (torchvision's input scaling, at their own size), then a global average pool. The weights
    must be the published file (`fedapps.pretrained`): never a random extractor."""
    from fedapps.pretrained import IMAGENET_MEAN, IMAGENET_STD, load_vgg19_features, vgg19_features

    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3 \
            or min(images.shape[2:]) < 32:
        raise ConfigError("data.fedaiot.cluster-features=vgg19: needs uint8 [3, >=32, >=32] "
                          f"images (this source has {images.dtype} {list(images.shape[1:])}); "
                          "use data.fedaiot.cluster-features=raw")
    net = vgg19_features().eval()
    load_vgg19_features(net, "data.fedaiot.cluster-features=vgg19",
                        "set data.fedaiot.cluster-features=raw")
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    out = []
    with torch.no_grad():
        for batch in images.split(VGG_BATCH):
            x = (batch.float() / 255 - mean) / std
            out.append(net(x).mean(dim=(2, 3)).numpy())
    return np.concatenate(out)


def feature_clusters(inputs: torch.Tensor, clusters: int, features: str, seed: int
                     ) -> np.ndarray:
    """Seed 004 scheme 2 (B2: KMeans, not the thesis's "K-nearest neighbors"): each sample's
    KMeans cluster (scikit-learn, k-means++, 10 initializations, random_state from the seed) of
    its `vgg19` embedding or its standardized `raw` features."""
    from sklearn.cluster import KMeans

    if len(inputs) < clusters:
        raise ConfigError(f"data.fedaiot.clusters={clusters}: more clusters than samples "
                          f"({len(inputs)})")
    x = vgg19_embeddings(inputs) if features == "vgg19" else raw_features(inputs)
    km = KMeans(n_clusters=clusters, n_init=10, random_state=seed % 2**32)
    return km.fit_predict(x).astype(np.int64)


def disjoint_label(labels: np.ndarray, num_classes: int, num_clients: int,
                   labels_per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Seed 004 "Disjoint Label": every class is cut into s = C_l K / M shards (its samples in
    pool order, contiguous, the n mod s leftovers one each to the first shards); the M s shard
    slots (every class s times) are shuffled and dealt C_l to each client, so a client holds at
    most C_l classes; each class's shards go to its slots in random order. A client dealt one
    class twice keeps both shards (the reference keeps one of them and drops the other)."""
    m, t = num_classes, labels_per_client
    if t > m:
        raise ConfigError(f"data.labels-per-client={t}: must be <= {m} (classes in the dataset)")
    if (t * num_clients) % m:
        raise ConfigError(f"data.labels-per-client={t}: labels-per-client x num-clients ({t} x "
                          f"{num_clients}) must be a multiple of the {m} classes (shards per "
                          "class)")
    s = t * num_clients // m
    shards = []
    for y in range(m):
        members = np.flatnonzero(np.asarray(labels) == y)
        if len(members) < s:
            raise ConfigError(f"data.partitioner=disjoint-label: class {y} has {len(members)} "
                              f"samples, fewer than its {s} shards")
        base, left = divmod(len(members), s)
        body, rest = members[:len(members) - left], members[len(members) - left:]
        shards.append([np.concatenate([body[i * base:(i + 1) * base], rest[i:i + 1]])
                       for i in range(s)])
    slots = rng.permutation(np.repeat(np.arange(m), s))
    dealt: list[np.ndarray] = [np.empty(0, np.int64)] * len(slots)
    for y in range(m):
        for slot, shard in zip(np.flatnonzero(slots == y), rng.permutation(s), strict=True):
            dealt[slot] = shards[y][shard]
    return [np.sort(np.concatenate(dealt[k * t:(k + 1) * t])).astype(np.int64)
            for k in range(num_clients)]
