"""A slow or hung client is reported while Flower waits for it, and the default round timeout
is finite (issue 19 item 7)."""

import logging
import re
import time

import numpy as np
from flwr.common import Code, FitRes, GetPropertiesRes, Status, ndarrays_to_parameters
from flwr.server.server import fit_clients

from fedapps.config import load_config
from strategies.fedavg import FedAvg
from strategies.waiting import waiting_line
from tests.inprocess import ProxyManager

OK = Status(Code.OK, "")
INIT = [np.zeros(3, dtype=np.float32)]


class Proxy:
    """Answers at once, or (hung) only fails when the timeout is over, as Flower's grid
    proxy does when the message's time to live expires."""

    def __init__(self, pid: int, hung: bool = False) -> None:
        self.cid, self.pid, self.hung = f"node{pid}", pid, hung

    def get_properties(self, ins, timeout, group_id):
        return GetPropertiesRes(OK, {"partition-id": self.pid, "num-train": 10, "num-test": 5})

    def fit(self, ins, timeout, group_id):
        if self.hung:
            time.sleep(timeout)
            raise TimeoutError(f"no answer from node{self.pid} within {timeout}s")
        arrays = [np.full(3, float(self.pid), dtype=np.float32)]
        return FitRes(OK, ndarrays_to_parameters(arrays), 10, {"partition-id": self.pid})


def test_default_round_timeout_is_finite():
    cfg = load_config("quickstart")
    assert cfg.federation["round-timeout"] == 600


def test_waiting_line_names_the_missing_clients():
    assert waiting_line("round 3 step 2/4", [4, 7], 5, 30.4, 600.0) == (
        "[fedapps] round 3 step 2/4: waiting for 2 of 5 clients (partition 4, 7), 30s so far, "
        "timeout 600s")


def test_a_hung_client_is_reported_while_flower_waits_and_the_reports_stop_after():
    """Flower's own fit loop with a 1.5 s timeout and reports every 0.3 s: lines name the hung
    client (2 of 3 answered at once) while Flower waits, the round aggregates the other two,
    and no line follows once the answers reached the strategy."""
    strategy = FedAvg(initial_arrays=INIT, num_rounds=2, num_clients=3, clients_per_round=3,
                      seed=0, min_fit_fraction=0.5, round_timeout=1.5, wait_report_seconds=0.3)
    manager = ProxyManager([Proxy(0), Proxy(1), Proxy(2, hung=True)])
    flwr_logger = logging.getLogger("flwr")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    flwr_logger.addHandler(handler)
    try:
        instructions = strategy.configure_fit(1, ndarrays_to_parameters(INIT), manager)
        results, failures = fit_clients(instructions, max_workers=None, timeout=1.5, group_id=1)
        assert len(results) == 2 and len(failures) == 1
        params, _ = strategy.aggregate_fit(1, results, failures)
        waited = [line for line in lines if "waiting for" in line]
        time.sleep(0.8)
        after = [line for line in lines if "waiting for" in line]
    finally:
        flwr_logger.removeHandler(handler)
    assert params is not None
    np.testing.assert_allclose(strategy.global_arrays[0], 0.5)  # (0 * 10 + 1 * 10) / 20
    assert 2 <= len(waited) <= 5, waited  # at 0.3, 0.6, 0.9, 1.2 s (a loaded CI may miss one)
    pattern = (r"\[fedapps\] round 1: waiting for 1 of 3 clients \(partition 2\), "
               r"\d+s so far, timeout 2s")
    assert all(re.fullmatch(pattern, line) for line in waited), waited
    assert after == waited  # nothing once the answers are in


class SlowProxy(Proxy):
    """Answers only once all 12 of a step's calls are in progress (a barrier)."""

    barrier = None

    def fit(self, ins, timeout, group_id):
        SlowProxy.barrier.wait()
        return super().fit(ins, timeout, group_id)


def test_a_deployed_step_has_every_message_in_flight_at_once(tmp_path):
    """Deployed, the ServerApp's Flower server runs a thread per message of a step, set at the
    first handshake with a deployed node: Flower's default pool (cores + 4 threads, 6 on a
    2-core machine) sent a 12-client step in waves. A simulation keeps Flower's pool."""
    import threading

    from flwr.common import Context, RecordDict
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.superlink.grid import HttpGrid

    from fedapps.server_app import server_fn

    run_config = {"experiment": "quickstart", "overrides": "federation.num-clients=12",
                  "output-dir": str(tmp_path), "run-name": "r"}
    server = server_fn(Context(run_id=1, node_id=0, state=RecordDict(), node_config={},
                               run_config=run_config)).server
    nodes = server.strategy.nodes
    nodes._ask([Proxy(0)], [5.0])  # a simulated node: Flower's pool stays
    assert server.max_workers is None

    class Deployed(GridClientProxy):
        def get_properties(self, ins, timeout, group_id):
            return Proxy(1).get_properties(ins, timeout, group_id)

    nodes._ask([Deployed(1, HttpGrid(token="t"), run_id=0)], [5.0])
    assert server.max_workers == 12
    strategy = FedAvg(initial_arrays=INIT, num_rounds=1, num_clients=12, clients_per_round=12,
                      seed=0)
    manager = ProxyManager([SlowProxy(i) for i in range(12)])
    instructions = strategy.configure_fit(1, ndarrays_to_parameters(INIT), manager)
    SlowProxy.barrier = threading.Barrier(12, timeout=10)  # breaks if fewer run at once
    results, failures = fit_clients(instructions, max_workers=server.max_workers, timeout=20,
                                    group_id=1)
    assert len(results) == 12 and not failures
