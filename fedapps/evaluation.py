"""The one evaluation loop (clients' local test splits and the server's official test split)
and the server-side reductions of what it returns.

Clients and the server run the same loop so that a task's sums mean the same thing wherever
they are computed; the strategy pools client sums with `reduce_evaluations` and the server
scores its own with `summarize_central`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from fedapps.tasks import Sums, Task, client_percentiles

# Measured fastest on CPU (half the time of 512 for the ConvNet); bounds memory. The same on
# every device: models with static BatchNorm (HeteroFL, FedRolex) normalise with the batch's own
# statistics at evaluation, so the batch size is part of what the metric means.
EVAL_BATCH = 64

Predict = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# (partition id or None, num_examples, mean loss, metrics dict) per client
ClientEvaluation = tuple[int | None, int, float, dict[str, Any]]


def evaluate_sums(
    predict: Predict,
    x: torch.Tensor,
    y: torch.Tensor,
    task: Task,
    batch_size: int = EVAL_BATCH,
    device: torch.device | str | None = None,
) -> tuple[int, float, Sums]:
    """(n, summed loss of the global output, the task's sums) over (x, y) in batches.

    `predict(xb)` returns the global and the personalized outputs; the caller sets eval mode.
    Sums stay on the device and come to the host in one transfer at the end, not per batch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    dev = torch.device(device) if device is not None else x.device
    x, y = x.to(dev), y.to(dev)
    loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
    sums = torch.zeros(len(task.sum_names), dtype=task.sum_dtype, device=dev)
    with torch.no_grad():
        for start in range(0, len(y), batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size]
            out_g, out_p = predict(xb)
            loss_sum += task.loss(out_g, yb, reduction="sum").double()
            batch = task.batch_sums(out_g, out_p, yb)  # may be longer (e.g. confusion counts)
            sums = batch if start == 0 else sums + batch
    # one host sync: float64 holds counts exactly up to 2**53
    host = torch.cat([loss_sum.reshape(1), sums.double()]).tolist()
    return len(y), host[0], task.to_metrics(host[1:])


def reduce_evaluations(
    task: Task, results: Sequence[ClientEvaluation], num_clients: int
) -> dict[str, Any]:
    """The round's evaluation record: G and P pooled over every client's sums, the n-weighted
    loss, per-client scores indexed by partition id (None where absent or undefined) with
    their percentiles, and which clients reloaded their state from disk."""
    n = sum(r[1] for r in results)
    pooled = task.reduce([(r[1], r[3]) for r in results])
    loss = sum(r[2] * r[1] for r in results) / n if n else None
    m = task.metric
    per_g: list[float | None] = [None] * num_clients
    per_p: list[float | None] = [None] * num_clients
    for (pid, n_client, _, _), g, p in zip(results, pooled[f"client_global_{m}"],
                                           pooled[f"client_personal_{m}"], strict=True):
        if n_client and isinstance(pid, int) and 0 <= pid < num_clients:
            per_g[pid], per_p[pid] = g, p
    return {
        f"global_{m}": pooled[f"global_{m}"],
        f"personal_{m}": pooled[f"personal_{m}"],
        "loss": loss,
        "eval_clients": len(results),
        "eval_samples": n,
        **client_percentiles([v for v in per_g if v is not None], "global_client"),
        **client_percentiles([v for v in per_p if v is not None], "personal_client"),
        **task.pooled_extras([r[3] for r in results]),
        f"client_global_{m}": per_g,
        f"client_personal_{m}": per_p,
        # clients whose personal state came back from state-dir (a restarted node)
        "clients_state_from_disk": sorted(
            int(pid) for pid, _, _, metrics in results
            if metrics.get("state-from-disk") == 1 and pid is not None),
    }


def summarize_central(task: Task, n: int, loss_sum: float, sums: Sums) -> dict[str, Any]:
    """The server's official-test record of the global model (the personal sums are ignored:
    the server has no personalized model): official_test_<metric> (None where undefined) and
    official_test_loss, the mean loss."""
    g, _ = task.scores(n, task.read(sums))
    extras = {f"official_test_{k[len('global_'):]}": v
              for k, v in task.pooled_extras([sums]).items() if k.startswith("global_")}
    return {f"official_test_{task.metric}": g, "official_test_loss": loss_sum / max(n, 1),
            **extras}
