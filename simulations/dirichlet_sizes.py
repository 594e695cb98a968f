"""Client-size spread of the Dirichlet split, capped against uncapped (issue 16 item 1).

    python -m simulations.dirichlet_sizes [--samples 60000] [--clients 20] [--alpha 0.1]
                                          [--seeds 5] [--min-size 10]

Splits a synthetic label vector (10 equal classes; the sizes depend only on the class sizes, so
70,000 gives exactly the merged Fashion-MNIST pool's split) with `data.partitioner=dirichlet`
both ways, and prints per seed the coefficient of variation of the client sizes (population std
/ mean), the largest client and the partition's EMD.
"""

from __future__ import annotations

import argparse

import numpy as np

from fedapps.data.partition import class_counts, emd, partition_indices


def size_spread(balance: str, num_samples: int = 60_000, num_clients: int = 20,
                alpha: float = 0.1, seeds: int = 5, min_size: int = 10
                ) -> tuple[list[float], list[int], list[float]]:
    """(coefficient of variation, largest client, EMD) per seed 0..seeds-1."""
    labels = np.repeat(np.arange(10), num_samples // 10)
    cvs, largest, emds = [], [], []
    for seed in range(seeds):
        parts = partition_indices(labels, num_clients, "dirichlet", seed=seed, alpha=alpha,
                                  min_size=min_size, balance=balance)
        sizes = np.array([len(p) for p in parts])
        cvs.append(float(sizes.std() / sizes.mean()))
        largest.append(int(sizes.max()))
        emds.append(emd(class_counts(parts, labels, 10)))
    return cvs, largest, emds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=60_000)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--min-size", type=int, default=10)
    args = p.parse_args(argv)
    print(f"{args.samples} labels, {args.clients} clients, alpha {args.alpha}, "
          f"min-size {args.min_size}, seeds 0-{args.seeds - 1}")
    for balance in ("none", "capped"):
        cvs, largest, emds = size_spread(balance, args.samples, args.clients, args.alpha,
                                         args.seeds, args.min_size)
        print(f"{balance:>6}: CV {' '.join(f'{c:.3f}' for c in cvs)} "
              f"(range {min(cvs):.2f}-{max(cvs):.2f}); largest "
              f"{' '.join(str(n) for n in largest)}; EMD {' '.join(f'{e:.3f}' for e in emds)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
