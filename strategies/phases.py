"""Phase-shift math (seed 002 Alg. 2/3, no Flower): the queue of client groups, each group's
role, the drift-correction merge, the epoch-reduction factor and fractional epochs as steps.

Kept apart from the strategy and the client so that both read the same rules and the tests
check them by value; see strategies/phaseshift.py for the choices the thesis leaves open.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from strategies.aggregation import weighted_average
from strategies.sampling import sample_clients

FRESH = "fresh"  # newest group: start from the received server model, keep the local model
CORRECT = "correct"  # middle groups: drift-correction merge, train, keep the local model
RETURN = "return"  # oldest group: merge, train, upload
FRESH_RETURN = "fresh-return"  # start fresh and upload (n = 1, and the newest in the last round)
ROLES = (FRESH, CORRECT, RETURN, FRESH_RETURN)
UPLOADING = (RETURN, FRESH_RETURN)
QUEUE_STREAM = 2002  # rng stream of the initial queue (round 0)


def group_sizes(clients_per_round: int, phases: int) -> list[int]:
    """Size of the group drawn at round t is sizes[t % phases]: near-equal sizes that always sum
    to the clients per round over the n groups in the queue, whatever the remainder."""
    if not 1 <= phases <= clients_per_round:
        raise ValueError(f"{phases} phases need 1 <= phases <= {clients_per_round} clients")
    base, extra = divmod(clients_per_round, phases)
    return [base + (i < extra) for i in range(phases)]


def phase_queue(seed: int, num_clients: int, clients_per_round: int, phases: int,
                server_round: int) -> list[list[int]]:
    """The queue Q during `server_round`, newest group first (Alg. 2 with the digest's
    semantics): n - 1 initial disjoint groups from a seeded permutation, then each round the
    oldest group goes back to the pool and a new group is drawn from the clients not in the
    queue with the FedAvg sampler (so n = 1 draws exactly FedAvg's clients).

    A pure function of (seed, round): a resume recomputes it instead of checkpointing it."""
    sizes = group_sizes(clients_per_round, phases)
    if clients_per_round > num_clients:
        raise ValueError(f"{clients_per_round} clients per round > {num_clients} clients")
    perm = np.random.default_rng([seed, QUEUE_STREAM]).permutation(num_clients)
    queue: list[list[int]] = []
    start = 0
    for j in range(phases - 1):  # groups drawn "at rounds 0, -1, ..., 2 - n"
        size = sizes[-j % phases]
        queue.append(sorted(int(p) for p in perm[start:start + size]))
        start += size
    for t in range(1, server_round + 1):
        queue = queue[:phases - 1]  # the oldest group is popped back into the pool
        busy = {p for group in queue for p in group}
        pool = [p for p in range(num_clients) if p not in busy]
        queue.insert(0, sample_clients(seed, t, pool, sizes[t % phases]))
    return queue


def phase_role(position: int, phases: int, last_round: bool) -> str:
    """Role of the group at queue position (0 = newest): the newest starts fresh, the oldest
    returns, the rest correct; in the run's last round every group also uploads."""
    fresh = position == 0
    upload = position == phases - 1 or last_round
    if fresh:
        return FRESH_RETURN if upload else FRESH
    return RETURN if upload else CORRECT


def drift_correction(server: Sequence[np.ndarray], local: Sequence[np.ndarray],
                     server_examples: int, local_examples: int) -> list[np.ndarray]:
    """w <- N/(n_k+N) w_t + n_k/(n_k+N) w_local: FedAvg of the server model (N = the samples
    of the group that produced it) and the client's local model (its own n_k)."""
    return weighted_average([list(server), list(local)], [server_examples, local_examples])


def epoch_scale(phases: int, mode: str) -> float:
    """Local epochs per round relative to train.local-epochs: 1 in communication-reduction
    mode, (n+1)/(2n) in epoch-reduction mode (eq. 4.3: same traffic per epoch as FedAvg)."""
    return (phases + 1) / (2 * phases) if mode == "epoch" else 1.0


def transfer_ratio(phases: int) -> float:
    """Model transfers per round against FedAvg with the same active clients (eq. 4.2): every
    active client downloads, one group in n uploads."""
    return (phases + 1) / (2 * phases)


def local_steps(epochs: float, num_examples: int, batch_size: int) -> int:
    """Minibatch steps of `epochs` (possibly fractional) local epochs: an epoch is
    ceil(n_k / B) minibatches (the last one partial, as the epoch loop runs it), so an integer E
    gives exactly the epoch loop's steps; a fractional E rounds half up, at least one step."""
    per_epoch = math.ceil(num_examples / batch_size)
    return max(1, math.floor(epochs * per_epoch + 0.5))
