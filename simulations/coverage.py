"""How many of a round's clients update each node of a layer under each sub-model scheme.

Explains accuracy differences between FedRolex, HeteroFL and Federated Dropout: the number of
client updates averaged into a parameter per round (its "cohort") is what selective averaging
divides by. Pure index arithmetic, no training:

    python -m simulations.coverage --width 128 --rounds 100 --clients 10
"""

from __future__ import annotations

import argparse

import numpy as np

from strategies.partial import capacities
from strategies.submodel import node_indices

LEVELS = [1.0, 0.5, 0.25, 0.125, 0.0625]


def cohort_sizes(scheme: str, width: int, rounds: int, clients: int,
                 levels: list[float] = LEVELS, seed: int = 0) -> np.ndarray:
    """[rounds, width] count of the round's clients whose sub-model holds each node, with
    capacities drawn uniformly over `levels` every round (dynamic assignment)."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((rounds, width), dtype=np.int64)
    for j in range(rounds):
        for beta in capacities("uniform", levels, clients, 0.0, rng):
            counts[j, node_indices(scheme, width, float(beta), j, rng)] += 1
    return counts


def summary(counts: np.ndarray) -> dict[str, float]:
    """Mean cohort of the first and last eighth of the nodes, and the share of (round, node)
    pairs no client updated."""
    eighth = max(1, counts.shape[1] // 8)
    return {"leading": float(counts[:, :eighth].mean()),
            "trailing": float(counts[:, -eighth:].mean()),
            "all": float(counts.mean()),
            "untouched": float((counts == 0).mean())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--clients", type=int, default=10)
    args = p.parse_args(argv)
    print("| scheme | leading 1/8 | trailing 1/8 | all nodes | untouched (round, node) |")
    print("| --- | --- | --- | --- | --- |")
    for name, scheme in (("FedRolex", "rolling"), ("HeteroFL", "static"),
                         ("Federated Dropout", "random")):
        s = summary(cohort_sizes(scheme, args.width, args.rounds, args.clients))
        print(f"| {name} | {s['leading']:.2f} | {s['trailing']:.2f} | {s['all']:.2f} | "
              f"{100 * s['untouched']:.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
