"""Prompt replies in a deployment: the ServerApp checks for a client's answer within 0.5 s.

Flower's deployed ServerApp talks to the SuperLink through an `HttpGrid`, whose
`send_and_receive` (what every fit and evaluate call of a legacy strategy goes through, one
`GridClientProxy` per node) pulls the reply and then sleeps 3 s before it looks again; the
simulation's `InMemoryGrid` looks every 0.1 s. So a deployed step noticed each answer up to 3 s
late and waited for the latest of them: measured on 20 SuperNodes, 5 a round, +3.4 s a fit step
and +4.0 s an evaluate step over the simulation (docs/PERFORMANCE.md, "On a quiet machine").

`hasten(proxy)` gives a deployed proxy a grid whose `send_and_receive` does the same push and
pulls through Flower's own `Grid` API, but looks again after 0.05 s, then doubles the wait up to
0.5 s: a reply is seen at most 0.5 s after it lands, at about ten pulls per client step of a few
seconds. Simulation proxies are left as they are. Measured (docs/PERFORMANCE.md, "Shorter
waits between steps"): no change in the warm deployed round on that setting (11.93 s against
11.85 s before), where the fit step's extra turned out not to be these waits; kept because it
removes up to 3 s a step wherever replies are the last thing waited for. The same grid's pulls
of a reply's objects retry on a short schedule too (`prompt_reply_objects`), and the pushes of
a step's messages go one at a time, so the model reaches the SuperLink once a step rather than
once per client (`push_lock`), and a message's legacy arrays travel as one object
(`fedapps.packed_arrays`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from logging import WARNING
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid
from flwr.supercore import log

from fedapps.held_pulls import HELD_SECONDS
from fedapps.packed_arrays import PackingError, pack_content, unpack_content

REPLY_POLL_FIRST_SECONDS, REPLY_POLL_MAX_SECONDS = 0.05, 0.5
_UNKNOWN_PULL: list[bool] = []  # non-empty once the warning below was logged


class PromptReplies(Grid):
    """A grid that forwards everything to `grid` but waits for replies on a short schedule."""

    def __init__(self, grid: Grid, first: float = REPLY_POLL_FIRST_SECONDS,
                 most: float = REPLY_POLL_MAX_SECONDS,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.grid, self.first, self.most = grid, first, most
        self.sleep, self.clock = sleep, clock

    def __getattr__(self, name: str) -> Any:
        if name == "grid":  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.grid, name)

    # Grid's abstract API, forwarded
    @property
    def run(self):  # noqa: ANN201 - Flower's Run
        return self.grid.run

    def set_run(self, run) -> None:  # noqa: ANN001 - Flower's Run
        self.grid.set_run(run)

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self):  # noqa: ANN201 - Grid has a concrete one; the wrapped grid's counts
        return self.grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Each message's legacy arrays packed into one object (fedapps/packed_arrays.py),
        and one push at a time per grid (`push_lock`): the step's messages share the model's
        arrays, which the SuperLink asks for again while an earlier push is still sending them,
        so pushed side by side every message sent the whole model (5 x 2.19 MB a fit step of
        the FMNIST preset); one after another, the second and later send only their own small
        objects (docs/PERFORMANCE.md, "Held pulls and one copy of the model a step")."""
        messages = list(messages)
        packed = [(m, pack_content(m.content)) for m in messages
                  if isinstance(m, Message) and m.has_content()]
        try:
            with push_lock(self.grid):
                return self.grid.push_messages(messages)
        finally:  # the caller keeps its message until the reply: not the packed copy too
            for message, records in packed:
                for key, record in records.items():
                    message.content[key] = record

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies, their packed arrays unpacked; a reply whose packing is malformed is
        left packed (logged): one tensor where a packed model has several, which the upload
        check rejects by its count (strategies/uploads.py)."""
        replies = list(self.grid.pull_messages(message_ids))
        for reply in replies:
            if isinstance(reply, Message) and reply.has_content():
                try:
                    unpack_content(reply.content)
                except PackingError as err:
                    log(WARNING, "[fedapps] reply from node %s: packed arrays malformed (%s)",
                        reply.metadata.src_node_id, err)
        return replies

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Push, then pull until every message has its reply or `timeout` seconds passed
        (a pull held by a holding SuperLink, fedapps/quick_superlink.py, may end up to its
        hold after the timeout); after a held pull, pull again at once."""
        pending = set(self.push_messages(messages))
        end = None if timeout is None else self.clock() + timeout
        replies: list[Message] = []
        wait = self.first
        while end is None or self.clock() < end:
            asked = self.clock()
            got = list(self.pull_messages(pending))
            replies.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if not pending:
                break
            if self.clock() - asked >= HELD_SECONDS:  # a holding SuperLink held the pull
                wait = self.first  # and answers the next one as soon as a reply is stored
                continue
            self.sleep(wait)
            wait = min(2 * wait, self.most)
        return replies


_PUSH_LOCKS: dict[int, threading.Lock] = {}
_PUSH_LOCKS_LOCK = threading.Lock()


def push_lock(grid: Grid) -> threading.Lock:
    """The lock that orders the pushes of every proxy of this grid (one per ServerApp)."""
    with _PUSH_LOCKS_LOCK:
        return _PUSH_LOCKS.setdefault(id(grid), threading.Lock())


def hasten(proxy: object) -> bool:
    """Give a deployed `GridClientProxy` (or one wrapped in `.inner` proxies) a PromptReplies
    grid; a simulated one (Flower's InMemoryGrid polls every 0.1 s already) is left alone.
    True if the proxy is a deployed one (hastened now or before)."""
    from flwr.superlink.grid import HttpGrid

    while proxy is not None and "grid" not in getattr(proxy, "__dict__", {}):
        proxy = getattr(proxy, "__dict__", {}).get("inner")
    if proxy is None:
        return False
    if isinstance(proxy.grid, HttpGrid):
        proxy.grid = PromptReplies(proxy.grid)
        if not prompt_reply_objects() and not _UNKNOWN_PULL:
            _UNKNOWN_PULL.append(True)  # said once a process
            log(WARNING, "[fedapps] Flower's reply object pulls left as they are (not flwr "
                         "1.41-1.42's): a reply whose objects are late waits 1 s or more")
    return isinstance(proxy.grid, PromptReplies)


def prompt_reply_objects() -> bool:
    """Make the deployed grid's reply pulls retry a missing object after 0.05 s, doubling to
    0.5 s (Flower: 1 s, doubling to 10 s). The SuperLink hands out a reply as soon as its
    message is stored, before the node has pushed the reply's objects (the model); a pull in
    that gap waited a second. False on a Flower whose pull this does not know (left as is)."""
    import flwr.superlink.grid.http_grid as http_grid

    from fedapps.object_retries import shorten

    return shorten(http_grid, "pull_objects", cap=REPLY_POLL_MAX_SECONDS)
