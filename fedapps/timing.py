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
- outside = round trip - client: transport, queues, polling and process start, free of any
  clock offset;
- delivery = client start - sent, and reply = back - client end (serializing the answer
  included): the outside time split in two, meaningful only where the server's and the
  client's clocks agree (one machine, as in the simulation and `deploy-local`, or devices
  synchronised well below a step's length).

A deployed step slower than the simulated one shows here whether its clients computed longer
or its messages travelled longer (docs/PERFORMANCE.md). Results keep a per-round summary
(results.json `timing`); the keys never reach `client_fit_metrics`, which stay deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

CLIENT_START, CLIENT_SECONDS = "client-start", "client-seconds"
TIMING_KEYS = frozenset((CLIENT_START, CLIENT_SECONDS))
PARTS = ("round_trip", "client", "outside", "delivery", "reply")


def client_timing(started_wall: float, started: float) -> dict[str, float]:
    """The metrics a client adds to an answer: its call's start (time.time()) and length."""
    return {CLIENT_START: started_wall, CLIENT_SECONDS: time.perf_counter() - started}


def message_timing(sent: float, back: float, metrics: Mapping[str, Any]) -> list[float] | None:
    """[round trip, client, outside, delivery, reply] of one answer (seconds), from the
    server's wall-clock `sent`/`back` and the client's metrics; None when the client reported
    no timing (a client of older code, a test double)."""
    start, seconds = metrics.get(CLIENT_START), metrics.get(CLIENT_SECONDS)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v)
               for v in (start, seconds)):
        return None
    trip = back - sent
    return [trip, float(seconds), trip - float(seconds), float(start) - sent,
            back - (float(start) + float(seconds))]


def summarize(timings: Sequence[Sequence[float]]) -> dict[str, float | int]:
    """Median and maximum of each part over a phase's messages, in seconds (ms precision)."""
    if not timings:
        return {}
    a = np.asarray(timings, dtype=float)
    out: dict[str, float | int] = {"messages": len(a)}
    for i, part in enumerate(PARTS):
        out[f"{part}_median"] = round(float(np.median(a[:, i])), 3)
        out[f"{part}_max"] = round(float(a[:, i].max()), 3)
    return out
