"""Who a step is still waiting for, said every `every` seconds while clients are slow.

Flower waits for a step's answers inside its own loop (up to `federation.round-timeout`), where
a hung or slow client would otherwise leave no trace for minutes. The strategy wraps each
instruction's client proxy so that every client's answer (or failure) is noted as Flower
receives it, and a daemon thread logs

    [fedapps] round 3: waiting for 1 of 5 clients (partition 4), 30s so far, timeout 600s

until the step's answers reach the strategy. The same wrapper notes when each message was sent
and when its answer came back, for the step's timing (fedapps/timing.py).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from logging import INFO
from typing import Any, TypeVar

from flwr.common import log
from flwr.server.client_proxy import ClientProxy

from fedapps.timing import message_timing

Ins = TypeVar("Ins")
WAIT_REPORT_SECONDS = 30.0


def waiting_line(label: str, pending: Sequence[int], total: int, seconds: float,
                 timeout: float | None) -> str:
    """One line naming the clients a step still waits for."""
    limit = f"timeout {timeout:.0f}s" if timeout else "no timeout (federation.round-timeout)"
    ids = ", ".join(str(p) for p in pending[:10]) + (", ..." if len(pending) > 10 else "")
    return (f"[fedapps] {label}: waiting for {len(pending)} of {total} clients "
            f"(partition {ids}), {seconds:.0f}s so far, {limit}")


class TrackedProxy(ClientProxy):
    """A client proxy that tells its step when the client's fit or evaluate call returned."""

    def __init__(self, inner: ClientProxy, partition_id: int, step: WaitingStep) -> None:
        super().__init__(inner.cid)
        self.inner, self.partition_id, self.step = inner, partition_id, step

    def __getattr__(self, name: str) -> Any:  # node_id and the like: the wrapped proxy's
        if name == "inner":  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def get_properties(self, ins, timeout, group_id):  # noqa: ANN001, ANN201 - Flower's API
        return self.inner.get_properties(ins, timeout, group_id)

    def get_parameters(self, ins, timeout, group_id):  # noqa: ANN001, ANN201
        return self.inner.get_parameters(ins, timeout, group_id)

    def fit(self, ins, timeout, group_id):  # noqa: ANN001, ANN201
        return self._timed(self.inner.fit, ins, timeout, group_id)

    def evaluate(self, ins, timeout, group_id):  # noqa: ANN001, ANN201
        return self._timed(self.inner.evaluate, ins, timeout, group_id)

    def _timed(self, call, ins, timeout, group_id):  # noqa: ANN001, ANN202
        sent = time.time()
        try:
            res = call(ins, timeout=timeout, group_id=group_id)
            self.step.timed(message_timing(sent, time.time(), getattr(res, "metrics", {})))
            return res
        finally:
            self.step.answered(self.partition_id)

    def reconnect(self, ins, timeout, group_id):  # noqa: ANN001, ANN201
        return self.inner.reconnect(ins, timeout, group_id)


class WaitingStep:
    """The clients of one step that have not answered yet, reported by a daemon thread that
    holds only a weak reference, so a step nobody ends (a test's) stops when it is freed."""

    def __init__(self, label: str, partition_ids: Sequence[int], every: float,
                 timeout: float | None, say: Callable[[str], None]) -> None:
        self.label, self.total, self.timeout = label, len(partition_ids), timeout
        self.pending = set(partition_ids)
        self.timings: list[list[float]] = []
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.done = threading.Event()
        threading.Thread(target=_report, args=(weakref.ref(self), self.done, every, say),
                         daemon=True, name=f"fedapps-waiting-{label}").start()

    def answered(self, partition_id: int) -> None:
        with self.lock:
            self.pending.discard(partition_id)

    def timed(self, timing: list[float] | None) -> None:
        """One answer's seconds per part (fedapps/timing.py PARTS)."""
        if timing is not None:
            with self.lock:
                self.timings.append(timing)

    def line(self) -> str | None:
        """The waiting line now, or None when every client has answered."""
        with self.lock:
            pending = sorted(self.pending)
        if not pending:
            return None
        return waiting_line(self.label, pending, self.total, time.monotonic() - self.started,
                            self.timeout)

    def stop(self) -> None:
        self.done.set()


def _report(ref: weakref.ref[WaitingStep], done: threading.Event, every: float,
            say: Callable[[str], None]) -> None:
    while not done.wait(every):
        step = ref()
        if step is None:
            return
        line = step.line()
        del step
        if line:
            say(line)


class Waiting:
    """Begins a `WaitingStep` for each step's instructions and ends it with the answers."""

    def __init__(self, every: float = WAIT_REPORT_SECONDS, timeout: float | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.every, self.timeout = every, timeout
        self.say = say or (lambda line: log(INFO, line))
        self.step: WaitingStep | None = None

    def begin(self, label: str, instructions: Sequence[tuple[int, ClientProxy, Ins]]
              ) -> list[tuple[ClientProxy, Ins]]:
        """The instructions with tracked proxies; reports start after `every` seconds."""
        self.end()
        if not instructions:
            return []
        step = WaitingStep(label, [pid for pid, _, _ in instructions], self.every,
                           self.timeout, self.say)
        self.step = step
        return [(TrackedProxy(proxy, pid, step), ins) for pid, proxy, ins in instructions]

    def end(self) -> list[list[float]]:
        """Stop the step's reports; its answers' timings (fedapps/timing.py), in arrival order."""
        if self.step is None:
            return []
        self.step.stop()
        timings, self.step = self.step.timings, None
        return timings
