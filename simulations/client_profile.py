"""Size an edge device: time and peak memory of one client's round, measured in this process.

    FEDAPPS_DATA_ROOT=../shared/data python -m simulations.client_profile \\
        --experiment fedreb-fmnist --algorithm fedavg --threads 1 --epochs 5

Loads only what a SuperNode loads (the pool, its partition, its client's tensors), then times
one fit (the configured local epochs) and one evaluation of partition 0, and reports the peak
resident memory of the process (ru_maxrss) next to the sizes involved.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time

import torch

from clients.arrays import get_arrays
from fedapps.config import load_config
from fedapps.data import federated_data
from fedapps.registry import ALGORITHMS, algo_settings
from fedapps.runtime import train_settings
from fedapps.validation import validate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", default="fedreb-fmnist")
    p.add_argument("--algorithm", default="fedavg")
    p.add_argument("--partition-id", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--epochs", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    cfg = load_config(args.experiment, [f"algorithm={args.algorithm}",
                                        f"train.local-epochs={args.epochs}"])
    validate(cfg)
    spec = ALGORITHMS[cfg.algorithm]
    fd = federated_data(cfg)
    local = spec.client_data(cfg, fd, args.partition_id, "cpu")
    model = spec.model(cfg)
    client = spec.client(model, local, train_settings(cfg), args.partition_id,
                         algo=algo_settings(cfg))
    arrays = get_arrays(spec.model(cfg))
    setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    out, n, _ = client.fit(arrays, {"server-round": 1})
    fit = time.perf_counter() - t1
    t2 = time.perf_counter()
    _, n_test, _ = client.evaluate(out, {"server-round": 1})
    evaluation = time.perf_counter() - t2
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "experiment": args.experiment, "algorithm": args.algorithm,
        "threads": args.threads, "local_epochs": args.epochs,
        "train_samples": n, "test_samples": n_test,
        "model_parameters": sum(p.numel() for p in model.parameters()),
        "model_mb": sum(a.nbytes for a in arrays) / 2**20,
        "setup_seconds": round(setup, 2), "fit_seconds": round(fit, 2),
        "fit_ms_per_sample_epoch": round(1000 * fit / max(n * args.epochs, 1), 3),
        "evaluate_seconds": round(evaluation, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
