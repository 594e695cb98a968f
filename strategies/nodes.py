"""Node identity: which connected Flower node holds which partition, and what the server knows
about it (its train and test sizes), from one handshake (get_properties) per node.

Nothing a node says is trusted further than it can be checked: a node whose handshake answer
is impossible (a partition id outside the federation, missing or impossible sizes) is logged
and ignored, never asked again, and never stops the run; one whose handshake fails (an error
reply, e.g. a node started with a partition id its ClientApp refuses, or a timeout, or a
SuperLink error under load) is asked again on the next calls, and ignored after
HANDSHAKE_TRIES failures. A node claiming a partition
that a live node already holds is a duplicate: it is warned about and kept on standby, so a
partition is never counted twice; it takes over only if the holder leaves. A restarted node
(a new node id for a partition whose holder no longer answers) replaces the old one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

from flwr.common import Code, GetPropertiesIns, log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from strategies.replies import hasten

# How long a partition's holder may take to answer when another node claims its partition:
# a live holder answers in about a second; a killed one never does (a restarted node waits this
# long once before it replaces its old self).
PROBE_TIMEOUT = 10.0
HANDSHAKE_TRIES = 3  # failed handshakes before a node is ignored for good (retries: PROBE_TIMEOUT)


@dataclass(frozen=True)
class NodeFacts:
    """What the server accepted from a node's handshake: the bounds on what it may claim."""

    partition_id: int
    num_train: int  # its training set (after transforms that enlarge it): max num_examples
    num_test: int  # its local test split: the exact n of its evaluation


def is_count(value: Any) -> bool:
    """A non-negative int that is not a bool (True is an int in Python)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_handshake(props: dict[str, Any], num_clients: int,
                    known_sizes: Sequence[tuple[int, int]] | None = None) -> NodeFacts | str:
    """The node's facts, or why its handshake is refused. `known_sizes` are the server's own
    (train, test) sizes of each partition: the test split is never transformed, so it must
    match exactly; transforms may only enlarge the training set."""
    pid = props.get("partition-id")
    if not is_count(pid) or pid >= num_clients:
        return f"partition-id={pid!r} is not in 0..{num_clients - 1}"
    num_train, num_test = props.get("num-train"), props.get("num-test")
    if not is_count(num_train) or not is_count(num_test):
        return f"partition {pid}: num-train={num_train!r} num-test={num_test!r} must be counts"
    if known_sizes is not None:
        train, test = known_sizes[pid]
        if num_test != test or num_train < train:
            return (f"partition {pid}: num-train={num_train} num-test={num_test}, but the "
                    f"partition has {train} train and {test} test samples")
    return NodeFacts(pid, num_train, num_test)


class NodeDirectory:
    def __init__(self, num_clients: int, timeout: float = 120.0,
                 known_sizes: Sequence[tuple[int, int]] | None = None,
                 probe_timeout: float = PROBE_TIMEOUT) -> None:
        self.num_clients = num_clients
        self.timeout = timeout
        self.known_sizes = list(known_sizes) if known_sizes is not None else None
        self.probe_timeout = min(probe_timeout, timeout)
        self.partition_of: dict[str, int] = {}  # node id (cid) -> partition id, one per pid
        self.facts: dict[str, NodeFacts] = {}  # node id -> its accepted handshake
        self.standby: dict[str, int] = {}  # duplicates: node id -> the partition it claimed
        self.ignored: dict[str, str] = {}  # node id -> why (never asked again)
        self.failed: dict[str, int] = {}  # node id -> failed handshakes so far
        self.started = False
        self.on_deployed: Callable[[], None] | None = None  # told once a node is deployed

    def facts_of(self, proxy: ClientProxy | None) -> NodeFacts | None:
        """The handshake of the node behind `proxy`, if it holds a partition."""
        if proxy is None or proxy.cid not in self.partition_of:
            return None
        return self.facts[proxy.cid]

    def clients_by_partition(self, client_manager: ClientManager) -> dict[int, ClientProxy]:
        """Connected clients keyed by partition id, asking each new node once. The first call
        waits (up to the timeout) until every partition has a node: a bad node that connected
        first must not leave a good one out of round 1."""
        first = not self.started
        self.started = True
        if first:
            client_manager.wait_for(self.num_clients, timeout=int(self.timeout))
        deadline = time.monotonic() + self.timeout
        proxies = client_manager.all()
        self._update(proxies)
        while first and len(self.held(proxies)) < self.num_clients:
            remaining = int(deadline - time.monotonic())
            if remaining <= 0 or not client_manager.wait_for(len(proxies) + 1, remaining):
                break
            more = client_manager.all()
            if set(more) <= set(proxies):
                break  # a manager that does not block (tests): nothing new will come
            proxies = more
            self._update(proxies)
        return self.held(proxies)

    def held(self, proxies: dict[str, ClientProxy]) -> dict[int, ClientProxy]:
        return {pid: proxies[cid] for cid, pid in self.partition_of.items() if cid in proxies}

    # ---- handshakes --------------------------------------------------------------------------
    def _ask(self, proxies: Sequence[ClientProxy], timeouts: Sequence[float]
             ) -> list[dict[str, Any] | str]:
        """Each node's properties, or why it gave none (asked in parallel, never raises)."""
        ins = GetPropertiesIns(config={})

        def ask(proxy: ClientProxy, timeout: float) -> dict[str, Any] | str:
            try:
                res = proxy.get_properties(ins, timeout=timeout, group_id=0)
            except Exception as err:  # an error reply, a timeout, a lost node
                return f"handshake failed: {type(err).__name__}: {str(err)[:160]}"
            if res.status.code != Code.OK:
                return f"handshake failed: {res.status.message[:160]}"
            return dict(res.properties)

        if not proxies:
            return []
        deployed = [hasten(proxy) for proxy in proxies]  # replies seen within 0.5 s, deployed
        if any(deployed) and self.on_deployed is not None:
            self.on_deployed()
        with ThreadPoolExecutor(max_workers=min(32, len(proxies))) as pool:
            return list(pool.map(ask, proxies, timeouts))

    def _update(self, proxies: dict[str, ClientProxy]) -> None:
        self._promote_standby(proxies)
        known = set(self.partition_of) | set(self.standby) | set(self.ignored)
        unknown = [p for cid, p in proxies.items() if cid not in known]
        timeouts = [self.probe_timeout if p.cid in self.failed else self.timeout for p in unknown]
        conflicts: list[tuple[ClientProxy, NodeFacts]] = []
        for proxy, answer in zip(unknown, self._ask(unknown, timeouts), strict=True):
            if isinstance(answer, str):
                self._failed(proxy.cid, answer)
                continue
            facts = check_handshake(answer, self.num_clients, self.known_sizes)
            if isinstance(facts, str):
                self.ignored[proxy.cid] = facts
                log(WARNING, "[fedapps] node %s ignored: %s", proxy.cid, facts)
                continue
            holder = self.holder(facts.partition_id)
            if holder is None or holder not in proxies:
                if holder is not None:
                    log(INFO, "[fedapps] node %s replaces node %s (partition %d), which left",
                        proxy.cid, holder, facts.partition_id)
                self._assign(proxy.cid, facts, replacing=holder)
            else:
                conflicts.append((proxy, facts))
        self._resolve(conflicts, proxies)

    def _failed(self, cid: str, reason: str) -> None:
        self.failed[cid] = tries = self.failed.get(cid, 0) + 1
        if tries >= HANDSHAKE_TRIES:
            self.ignored[cid] = reason
            log(WARNING, "[fedapps] node %s ignored: %s (%d tries)", cid, reason, tries)
        else:
            log(WARNING, "[fedapps] node %s: %s (try %d of %d; asked again later)", cid,
                reason, tries, HANDSHAKE_TRIES)

    def _resolve(self, conflicts: list[tuple[ClientProxy, NodeFacts]],
                 proxies: dict[str, ClientProxy]) -> None:
        """A claim on a held partition: the holder is asked again; if it still answers with
        that partition, the newcomer is a duplicate; if not, the newcomer replaces it."""
        for proxy, facts in conflicts:
            pid = facts.partition_id
            holder = self.holder(pid)
            assert holder is not None
            answer = self._ask([proxies[holder]], [self.probe_timeout])[0]
            if isinstance(answer, dict) and answer.get("partition-id") == pid:
                self.standby[proxy.cid] = pid
                self.facts[proxy.cid] = facts
                log(WARNING, "[fedapps] node %s claims partition %d, which node %s holds: "
                    "duplicate ignored (kept on standby, not counted)", proxy.cid, pid, holder)
            else:
                self.ignored[holder] = f"did not answer; replaced by node {proxy.cid}"
                log(WARNING, "[fedapps] node %s claims partition %d, which node %s holds but "
                    "did not answer within %.0f s: replaced (a restarted node)", proxy.cid,
                    pid, holder, self.probe_timeout)
                self._assign(proxy.cid, facts, replacing=holder)

    def _promote_standby(self, proxies: dict[str, ClientProxy]) -> None:
        """A duplicate takes over a partition whose holder has left the federation."""
        for cid, pid in list(self.standby.items()):
            if cid not in proxies:
                del self.standby[cid]
                continue
            holder = self.holder(pid)
            if holder is None or holder not in proxies:
                del self.standby[cid]
                log(INFO, "[fedapps] node %s takes over partition %d", cid, pid)
                self._assign(cid, self.facts[cid], replacing=holder)

    def holder(self, partition_id: int) -> str | None:
        for cid, pid in self.partition_of.items():
            if pid == partition_id:
                return cid
        return None

    def _assign(self, cid: str, facts: NodeFacts, replacing: str | None) -> None:
        if replacing is not None:
            self.partition_of.pop(replacing, None)
            self.facts.pop(replacing, None)
        self.partition_of[cid] = facts.partition_id
        self.facts[cid] = facts
