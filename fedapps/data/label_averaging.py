"""Label averaging (seed 003 Algorithm 3, DECISIONS): each client oversamples its minority
classes up to the network's mean count per class.

gvec[c] = mean over all K clients of their train-split count of class c. In the thesis the
clients report their counts once and the server sends gvec back. Here every node computes gvec
from the partition itself: the partition (and so every client's counts) is a function of the
seed that every node already derives, so the result is the same numbers the server would
compute from the reported counts, without the extra message. The counts are the partition's
labels, i.e. before any transform listed earlier in data.transforms.

A client oversamples (with replacement, from its own train samples of that class) every class
c with 0 < n_c < round(gvec[c]) up to round(gvec[c]) (half up); absent classes stay absent and
the test split is untouched (spec section 7, items 13-18). `redraw: true` (the pseudo-code, and
the default) draws new copies every round, seeded by (seed, partition id, position, round),
through the `round_data` extra the base client applies before each fit; `redraw: false` draws
once per client. Clients report the oversampled size as num_examples: it is what they train on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from fedapps.data.params import Param
from fedapps.data.rebalance import round_half_up

if TYPE_CHECKING:
    from fedapps.data import ClientData
    from fedapps.data.transforms import TransformContext

PARAMS = (Param("redraw", "data.label-averaging.redraw", bool, True,
                doc="draw new copies every round (true) or once per client (false)"),)


def class_targets(counts: np.ndarray) -> np.ndarray:
    """round(gvec) per class, gvec = the mean of a [clients, classes] count matrix."""
    gvec = np.asarray(counts, dtype=np.float64).mean(axis=0)
    return np.asarray([round_half_up(g) for g in gvec], dtype=np.int64)


def oversample(labels: np.ndarray, targets: np.ndarray, rng: np.random.Generator
               ) -> np.ndarray:
    """Indices (into `labels`) of the copies that bring every present class below its target
    up to it, drawn with replacement; class by class in ascending order."""
    counts = np.bincount(labels, minlength=len(targets))
    extra = [rng.choice(np.flatnonzero(labels == c), size=int(targets[c] - counts[c]))
             for c in range(len(targets)) if 0 < counts[c] < targets[c]]
    return np.concatenate(extra) if extra else np.zeros(0, dtype=np.int64)


def extended(data: ClientData, targets: np.ndarray, rng: np.random.Generator) -> ClientData:
    """The train split with the oversampled copies appended."""
    idx = oversample(data.y_train.cpu().numpy(), targets, rng)
    at = torch.from_numpy(idx).to(data.y_train.device)
    return data.replace(x_train=torch.cat([data.x_train, data.x_train[at]]),
                        y_train=torch.cat([data.y_train, data.y_train[at]]),
                        extras={"n_oversampled": len(idx)})


def transform(ctx: TransformContext, data: ClientData) -> ClientData:
    targets = class_targets(ctx.fd.counts("train"))
    info = {"label_averaging_targets": targets}
    if not ctx.params["redraw"]:
        return extended(data, targets, ctx.rng()).replace(extras=info)

    def round_data(current: ClientData, server_round: int) -> ClientData:
        """This round's draw on the client's train set (the base client calls it per fit)."""
        return extended(current, targets, ctx.rng(server_round))

    # every round's draw has this size: what the client declares at its handshake, so the
    # server's bound on num_examples admits the oversampled rounds
    counts = np.bincount(data.y_train.cpu().numpy(), minlength=len(targets))
    added = sum(int(t - n) for n, t in zip(counts, targets, strict=True) if 0 < n < t)
    return data.replace(extras={**info, "round_data": round_data, "n_oversampled": 0,
                                "round_train_size": len(data.y_train) + added})
