"""Real deployments on loopback: a SuperLink and SuperNode processes, as on edge devices."""

import json
import signal
import time
from pathlib import Path

import pytest

from fedapps.deploy import run_federation
from fedapps.launcher import descendants, run_experiment

pytestmark = pytest.mark.integration

QUIET = lambda line: False  # noqa: E731 - keep test output short


def rounds(run_dir):
    return json.loads((run_dir / "results.json").read_text())["rounds"]


def command_line(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def watch_clientapps(seen):
    """A `during` hook: collect every process that runs a ClientApp beside the nodes."""
    def watch(nodes):
        while any(node.alive() for node in nodes):
            for node in nodes:
                for pid in descendants(node.process.pid) + [node.worker.pid]:
                    cmd = command_line(pid)
                    if "flwr-clientapp" in cmd or "warm_clientapp" in cmd:
                        seen[pid] = "warm" if "warm_clientapp" in cmd else "per-message"
            time.sleep(0.5)
    return watch


@pytest.mark.parametrize("experiment", ["quickstart", "fedreb-quick"])
def test_deployment_gives_the_simulation_numbers(tmp_path, experiment):
    sets = ["rounds=2", "federation.num-clients=3", "federation.fraction-fit=1.0"]
    sim, dep = tmp_path / "sim", tmp_path / "dep"
    seen = {}
    assert run_experiment(experiment, sets, 3, sim, show=QUIET) == "finished:completed"
    assert run_federation(experiment, sets, 3, dep, state_root=tmp_path / "state",
                          show=QUIET, during=watch_clientapps(seen)) == "finished:completed"
    # every message of a node ran in its one long-running ClientApp process (3 nodes x 5
    # messages would be 15 flwr-clientapp processes with Flower's default isolation)
    assert sorted(seen.values()) == ["warm"] * 3
    for a, b in zip(rounds(sim), rounds(dep), strict=True):
        assert a["global_accuracy"] == pytest.approx(b["global_accuracy"], abs=1e-9)
        assert a["personal_accuracy"] == pytest.approx(b["personal_accuracy"], abs=1e-9)
        assert a["fit_clients"] == b["fit_clients"]


def test_bad_updates_and_crashes_are_counted_not_aggregated(tmp_path):
    sets = ["rounds=2", "federation.num-clients=5", "federation.fraction-fit=1.0",
            "federation.min-fit-fraction=0.2", "federation.round-timeout=30"]
    faults = {1: {"fault": "nan"}, 2: {"fault": "raise"}, 3: {"fault": "shape"},
              4: {"fault": "hang"}}
    out = tmp_path / "run"
    status = run_federation("quickstart", sets, 5, out, node_extra=faults, show=QUIET)
    assert status == "finished:completed"
    for r in rounds(out):
        assert r["rejected_updates"] == 2  # NaN weights and the wrong shape
        assert r["failures"] == 4  # + the crash and the timeout
        assert list(r["client_fit_metrics"]) == ["0"]  # only the healthy client is averaged
        assert any("NaN" in f for f in r["failure_reasons"])
        assert any("expected" in f for f in r["failure_reasons"])
    assert rounds(out)[-1]["global_accuracy"] > 0.1


def test_too_few_clients_stop_the_run_with_a_checkpoint(tmp_path):
    from fedapps import checkpoint

    sets = ["rounds=3", "federation.num-clients=2", "federation.fraction-fit=1.0",
            "federation.min-fit-fraction=1.0"]
    out = tmp_path / "run"
    status = run_federation("quickstart", sets, 2, out, show=QUIET,
                            node_extra={1: {"fault": "raise", "fault-from-round": "2"}})
    assert status != "finished:completed"
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["status"].startswith("stopped: round 2: 1 valid updates of 2 sampled")
    assert checkpoint.load(out).round == 1  # the last completed round, ready for resume


def test_restarted_supernode_resumes_its_personal_head_from_state_dir(tmp_path):
    sets = ["rounds=4", "federation.num-clients=3", "federation.fraction-fit=1.0",
            "federation.min-fit-fraction=0.3", "federation.round-timeout=45"]
    out = tmp_path / "run"

    def kill_and_restart(nodes):
        deadline = time.time() + 600
        while time.time() < deadline:
            path = out / "results.json"
            if path.is_file() and len(json.loads(path.read_text())["rounds"]) >= 2:
                break
            time.sleep(0.5)
        nodes[1].stop(signal.SIGKILL)
        nodes[1].start()

    status = run_federation("fedreb-quick", sets, 3, out, state_root=tmp_path / "state",
                            during=kill_and_restart, show=QUIET)
    assert status == "finished:completed"
    done = rounds(out)
    # the restarted node's first message (fit or evaluation) loaded H2 from its state-dir
    restored = [r.get("clients_state_from_disk", []) for r in done[2:]] + \
        [[1] if r["client_fit_metrics"].get("1", {}).get("state-from-disk") else [] for r in done]
    assert any(1 in r for r in restored)
    assert not any(r.get("clients_state_from_disk") for r in done[:2])  # nothing before
    assert (tmp_path / "state" / "node-1").is_dir()
    assert rounds(out)[-1]["personal_accuracy"] > rounds(out)[-1]["global_accuracy"]


def test_tls_and_node_authentication(tmp_path):
    from fedapps.deploy import SuperNode, node_config

    secure = tmp_path / "certs"
    refused = {}

    def intruder(nodes):
        # a node whose key was never registered tries to join the same federation
        from importlib.util import module_from_spec, spec_from_file_location
        from pathlib import Path

        spec = spec_from_file_location("mc", Path(__file__).parents[1] / "deploy" / "make_certs.py")
        mc = module_from_spec(spec)
        spec.loader.exec_module(mc)
        mc.make_node_key(secure, 9)
        node = SuperNode(nodes[0].link, 9, node_config(0, 2, None, None),
                         ["--root-certificates", str(secure / "ca.pem"),
                          "--auth-supernode-private-key", str(secure / "node-9")]).start()
        node.process.wait(timeout=120)
        refused["code"] = node.process.returncode
        refused["log"] = node.log_path.read_text()

    out = tmp_path / "run"
    status = run_federation("quickstart", ["rounds=2", "federation.num-clients=2"], 2, out,
                            secure=secure, during=intruder, show=QUIET)
    assert status == "finished:completed"
    assert rounds(out)[-1]["global_accuracy"] > 0.1
    assert refused["code"] != 0 and "Failed to activate SuperNode" in refused["log"]
