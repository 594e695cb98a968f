"""Node identity: which connected Flower node holds which partition. Each node is asked once
(get_properties); a restarted node comes back with a new node id and replaces its old one."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from logging import WARNING

from flwr.common import GetPropertiesIns, log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy


class NodeDirectory:
    def __init__(self, num_clients: int, timeout: float = 120.0) -> None:
        self.num_clients = num_clients
        self.timeout = timeout
        self.partition_of: dict[str, int] = {}  # node id (cid) -> partition id

    def clients_by_partition(self, client_manager: ClientManager) -> dict[int, ClientProxy]:
        """Connected clients keyed by partition id, asking each new node once."""
        if not self.partition_of:
            client_manager.wait_for(self.num_clients, timeout=int(self.timeout))
        proxies = client_manager.all()
        unknown = [p for cid, p in proxies.items() if cid not in self.partition_of]
        if unknown:
            ins = GetPropertiesIns(config={})
            with ThreadPoolExecutor(max_workers=min(32, len(unknown))) as pool:
                answers = list(pool.map(
                    lambda p: p.get_properties(ins, timeout=self.timeout, group_id=0), unknown))
            for proxy, res in zip(unknown, answers, strict=True):
                pid = res.properties.get("partition-id")
                if isinstance(pid, int) and 0 <= pid < self.num_clients:
                    for old in [c for c, p in self.partition_of.items() if p == pid]:
                        del self.partition_of[old]
                    self.partition_of[proxy.cid] = pid
                else:
                    log(WARNING, "node %s reported partition-id %r; ignored", proxy.cid, pid)
        return {self.partition_of[cid]: proxy for cid, proxy in proxies.items()
                if cid in self.partition_of}
