"""Where a client message's time goes: inside the client, or on the way there and back.

Each fit or evaluate answer carries when the client's work began (wall clock, at the
ClientApp's client_fn) and how long it took until the client returned; the server notes when
Flower's worker thread began the message's call and when the answer came back. Deployed, the
server has a thread per message (fedapps/server_app.py), so "sent" is the step's start; in a
simulation Flower's pool (cores + 4 threads) may hold a message back, and that wait is not
counted (the simulation's Ray workers queue the messages anyway). Per message:

- round trip: sent -> answer back, on the server's clock;
- client: client_fn to the client's return (building the client, loading the model, training
  or evaluating), on the client's clock;
- client CPU: the CPU seconds of that call's thread over the same span (time.thread_time), so
  a slower client shows whether it computed more or waited for a core;
- outside = round trip - client: transport, queues, polling and process start, free of any
  clock offset;
- delivery = client start - sent, and reply = back - client end (serializing the answer
  included): the outside time split in two, meaningful only where the server's and the
  client's clocks agree (one machine, as in the simulation and `deploy-local`, or devices
  synchronised well below a step's length);
- on a node with a warm ClientApp (fedapps/warm_clientapp.py) the delivery splits further, as
  that process stamps the task when it takes it from its SuperNode and when it has pulled the
  message, context and FAB: to_node = taken - sent (the server's push through the SuperLink,
  the SuperNode's pull, the ClientApp's poll, and any wait behind the node's previous task),
  pull = pulled - taken (opening the task's connection, the Runtime API's PullTaskInput,
  PullMessages and object pulls), start = client start - pulled (loading a new FAB's app, and
  the ClientApp's message handling up to client_fn). Per message to_node + pull + start =
  delivery. A Flower ClientApp process per message stamps nothing.

A deployed step slower than the simulated one shows here whether its clients computed longer
or its messages travelled longer (docs/PERFORMANCE.md). Results keep a per-round summary
(results.json `timing`): each part's median and maximum on its own (medians of parts do not
add up to the median of their sum), the split's over the stamped messages only
(`split_messages` of `messages`); the keys never reach `client_fit_metrics`, which stay
deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

CLIENT_START, CLIENT_SECONDS = "client-start", "client-seconds"
CLIENT_CPU = "client-cpu-seconds"
TASK_TAKEN, INPUT_PULLED = "task-taken", "input-pulled"  # warm ClientApp's stamps (time.time())
TASK_STAMPS = (TASK_TAKEN, INPUT_PULLED)
TIMING_KEYS = frozenset((CLIENT_START, CLIENT_SECONDS, CLIENT_CPU, *TASK_STAMPS))
SPLIT_PARTS = ("to_node", "pull", "start")  # the delivery's parts, from the stamps
PARTS = ("round_trip", "client", "outside", "delivery", "reply", *SPLIT_PARTS, "client_cpu")
# The warm ClientApp hands its stamps to client_fn in the node config under these keys, and
# removes them before the context goes back to the SuperNode.
NODE_STAMP_PREFIX = "fedapps-"


def client_clocks() -> tuple[float, float, float]:
    """The clocks at a client call's start, for client_timing: time.time(), perf_counter() and
    the thread's CPU seconds."""
    return time.time(), time.perf_counter(), time.thread_time()


def client_timing(clocks: tuple[float, float, float],
                  stamps: Mapping[str, float] | None = None) -> dict[str, float]:
    """The metrics a client adds to an answer, from `clocks` at its call's start
    (client_clocks()): its start (time.time()), length and CPU seconds, and the warm
    ClientApp's stamps of the task where it has them."""
    wall, started, cpu = clocks
    return {**(stamps or {}), CLIENT_START: wall, CLIENT_SECONDS: time.perf_counter() - started,
            CLIENT_CPU: time.thread_time() - cpu}


def is_number(v: Any) -> bool:
    """A finite int or float, not a bool."""
    return isinstance(v, int | float) and not isinstance(v, bool) and bool(np.isfinite(v))


def node_stamps(node_config: Mapping[str, Any]) -> dict[str, float]:
    """The warm ClientApp's stamps of this task, read from the node config (none elsewhere)."""
    return {k: float(node_config[NODE_STAMP_PREFIX + k]) for k in TASK_STAMPS
            if is_number(node_config.get(NODE_STAMP_PREFIX + k))}


def message_timing(sent: float, back: float, metrics: Mapping[str, Any]) -> list[float] | None:
    """One answer's seconds per part of PARTS, from the server's wall-clock `sent`/`back` and
    the client's metrics (to_node, pull and start NaN without a warm ClientApp's stamps,
    client_cpu NaN where the client did not measure it); None when the client reported no
    timing (a client of older code, a test double)."""
    start, seconds = metrics.get(CLIENT_START), metrics.get(CLIENT_SECONDS)
    if not (is_number(start) and is_number(seconds)):
        return None
    trip, start, seconds = back - sent, float(start), float(seconds)
    taken, pulled = (metrics.get(k) for k in TASK_STAMPS)
    split = ([taken - sent, pulled - taken, start - pulled]
             if is_number(taken) and is_number(pulled) else [np.nan] * len(SPLIT_PARTS))
    cpu = metrics.get(CLIENT_CPU)
    return [trip, seconds, trip - seconds, start - sent, back - (start + seconds), *split,
            float(cpu) if is_number(cpu) else np.nan]


def summarize(timings: Sequence[Sequence[float]]) -> dict[str, float | int]:
    """Median and maximum of each part over a phase's messages, in seconds (ms precision),
    each over the messages that have it; a part no message has (the warm ClientApp's split,
    elsewhere) is left out, and `split_messages` counts those that have the split."""
    if not timings:
        return {}
    a = np.asarray([list(t) + [np.nan] * (len(PARTS) - len(t)) for t in timings], dtype=float)
    out: dict[str, float | int] = {"messages": len(a)}
    split = int((~np.isnan(a[:, PARTS.index(SPLIT_PARTS[0])])).sum())
    if split:
        out["split_messages"] = split
    for i, part in enumerate(PARTS):
        column = a[:, i][~np.isnan(a[:, i])]
        if len(column):  # + 0.0: no -0.0 in results.json
            out[f"{part}_median"] = round(float(np.median(column)), 3) + 0.0
            out[f"{part}_max"] = round(float(column.max()), 3) + 0.0
    return out
