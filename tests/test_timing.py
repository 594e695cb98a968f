"""Where a message's time goes (fedapps/timing.py): the client's report, the server's split,
and a step through Flower's own fit loop with known delays on either side of the client."""

import threading
import time

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.server.server import fit_clients

from fedapps.client_app import DeferredClient
from fedapps.timing import (
    CLIENT_CPU,
    CLIENT_SECONDS,
    CLIENT_START,
    INPUT_PULLED,
    NODE_STAMP_PREFIX,
    TASK_TAKEN,
    client_clocks,
    message_timing,
    node_stamps,
    summarize,
)
from strategies.fedavg import FedAvg
from tests.inprocess import ProxyManager
from tests.test_waiting import Proxy

OK = Status(Code.OK, "")
INIT = [np.zeros(3, dtype=np.float32)]


def test_a_message_is_split_by_the_clients_report():
    # sent at 100, client ran 100.5-102.5, answer back at 103
    t = message_timing(100.0, 103.0, {CLIENT_START: 100.5, CLIENT_SECONDS: 2.0})
    assert t[:5] == pytest.approx([3.0, 2.0, 1.0, 0.5, 0.5])  # trip, client, outside, there, back
    assert np.isnan(t[5:]).all()  # no warm ClientApp stamps: the delivery is not split; no CPU


def test_a_warm_clientapps_stamps_split_the_delivery():
    # sent at 100, taken by the node's ClientApp at 100.25, pulled by 100.375, client_fn 100.5
    t = message_timing(100.0, 103.0, {CLIENT_START: 100.5, CLIENT_SECONDS: 2.0,
                                      TASK_TAKEN: 100.25, INPUT_PULLED: 100.375,
                                      CLIENT_CPU: 1.5})
    assert t == pytest.approx([3.0, 2.0, 1.0, 0.5, 0.5, 0.25, 0.125, 0.125, 1.5])
    s = summarize([t, message_timing(100.0, 103.0, {CLIENT_START: 100.5, CLIENT_SECONDS: 2.0})])
    assert (s["to_node_median"], s["pull_max"], s["start_max"]) == (0.25, 0.125, 0.125)
    assert s["client_cpu_median"] == 1.5  # over the answer that measured it
    assert s["delivery_median"] == 0.5 and s["messages"] == 2  # unsplit answers still count
    assert s["split_messages"] == 1  # the split's medians are over the stamped answer only
    assert "split_messages" not in summarize([t[:5]])
    assert str(summarize([[0, 0, 0, -0.0004, 0]])["delivery_median"]) == "0.0"  # not -0.0
    assert "to_node_median" not in summarize([t[:5]])  # a part no answer has is left out


def test_the_node_config_carries_the_stamps_to_the_client():
    node = {"partition-id": 3, NODE_STAMP_PREFIX + TASK_TAKEN: 5.0,
            NODE_STAMP_PREFIX + INPUT_PULLED: 6}
    assert node_stamps(node) == {TASK_TAKEN: 5.0, INPUT_PULLED: 6.0}
    for bad in ("x", True, float("nan")):
        assert node_stamps({"partition-id": 3, NODE_STAMP_PREFIX + TASK_TAKEN: bad}) == {}
    client = DeferredClient(0, None, SlowClient, (1.0, time.perf_counter(), time.thread_time()),
                            node_stamps(node))
    _, _, metrics = client.fit(INIT, {})
    assert (metrics[TASK_TAKEN], metrics[INPUT_PULLED], metrics[CLIENT_START]) == (5.0, 6.0, 1.0)


@pytest.mark.parametrize("metrics", [{}, {CLIENT_START: 1.0}, {CLIENT_START: 1.0,
                                     CLIENT_SECONDS: float("nan")},
                                     {CLIENT_START: True, CLIENT_SECONDS: 1.0}])
def test_no_or_bad_report_gives_no_timing(metrics):
    assert message_timing(0.0, 1.0, metrics) is None


def test_summary_is_median_and_max_per_part():
    s = summarize([[3, 2, 1, 0.5, 0.5], [5, 1, 4, 3, 1], [4, 3, 1, 0.25, 0.75]])
    assert s["messages"] == 3
    assert (s["round_trip_median"], s["round_trip_max"]) == (4, 5)
    assert (s["client_median"], s["client_max"]) == (2, 3)
    assert (s["outside_median"], s["outside_max"]) == (1, 4)
    assert (s["delivery_median"], s["delivery_max"]) == (0.5, 3)
    assert (s["reply_median"], s["reply_max"]) == (0.75, 1)
    assert summarize([]) == {}


class SlowClient:
    def fit(self, parameters, config):
        time.sleep(0.1)
        return parameters, 7, {"loss": 0.5}

    def evaluate(self, parameters, config):
        time.sleep(0.1)
        return 0.5, 7, {"correct-global": 3}


def test_the_client_reports_from_client_fn_to_its_answer():
    made = client_clocks()
    time.sleep(0.2)  # client_fn's own work counts too
    client = DeferredClient(0, None, SlowClient, made)
    for _, n, metrics in (client.fit(INIT, {}), client.evaluate(INIT, {})):
        assert n == 7 and metrics[CLIENT_START] == made[0]
        assert metrics[CLIENT_SECONDS] >= 0.3  # 0.2 before the call, 0.1 in it
        assert 0 <= metrics[CLIENT_CPU] < 0.1  # asleep: the thread computed almost nothing
    assert metrics["correct-global"] == 3


class BusyClient(SlowClient):
    def fit(self, parameters, config):
        end = time.thread_time() + 0.3
        while time.thread_time() < end:  # 0.3 s of this thread's CPU, however long it takes
            pass
        return parameters, 7, {}


def test_the_client_reports_its_threads_cpu_not_other_threads():
    """client_cpu counts the call's own thread: another thread's spinning meanwhile is not the
    client's, as a warm ClientApp's other tasks in the same process are not."""
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        _, _, metrics = DeferredClient(0, None, BusyClient, client_clocks()).fit(INIT, {})
    finally:
        stop.set()
        spinner.join()
    assert 0.3 <= metrics[CLIENT_CPU] < 0.45
    assert metrics[CLIENT_SECONDS] >= metrics[CLIENT_CPU]


class TransitProxy(Proxy):
    """0.2 s on the way there, 0.1 s in the client, 0.3 s on the way back."""

    def fit(self, ins, timeout, group_id):
        time.sleep(0.2)
        start = time.time()
        time.sleep(0.1)
        res = super().fit(ins, timeout, group_id)
        res.metrics.update({CLIENT_START: start, CLIENT_SECONDS: time.time() - start})
        time.sleep(0.3)
        return res


def test_a_step_records_each_part_of_its_messages_and_keeps_them_out_of_client_metrics():
    strategy = FedAvg(initial_arrays=INIT, num_rounds=1, num_clients=3, clients_per_round=3,
                      seed=0, client_eval=False)
    records = []
    strategy.on_round = records.append
    manager = ProxyManager([TransitProxy(i) for i in range(3)])
    instructions = strategy.configure_fit(1, ndarrays_to_parameters(INIT), manager)
    results, failures = fit_clients(instructions, max_workers=None, timeout=10, group_id=1)
    assert isinstance(results[0][1], FitRes) and not failures
    strategy.aggregate_fit(1, results, failures)
    strategy.configure_evaluate(1, None, manager)  # no client evaluation: the round ends
    fit = records[0]["timing"]["fit"]
    assert fit["messages"] == 3
    slack = 1.0  # a loaded CI machine sleeps longer, never shorter
    for part, want in (("round_trip", 0.6), ("client", 0.1), ("outside", 0.5),
                       ("delivery", 0.2), ("reply", 0.3)):
        assert want - 0.01 <= fit[f"{part}_median"] <= want + slack, (part, fit)
    # the lower bounds tell the 0.2 s before the client from the 0.3 s after it
    assert records[0]["client_fit_metrics"] == {"0": {}, "1": {}, "2": {}}
    assert "to_node_median" not in fit  # no warm ClientApp here


def test_the_benchmark_reports_the_steady_rounds_median_split(tmp_path):
    """deploy_benchmark's round_stats takes each timing value's median over rounds 2..n (round
    1 holds every node's first message) and prints one row per mode and phase."""
    import json

    from simulations.deploy_benchmark import round_stats, timing_table

    def rnd(i, slowest, delivery):
        fit = {"messages": 5, "round_trip_max": slowest, "client_median": 1.0,
               "delivery_median": delivery, "reply_median": 0.5}
        return {"round": i, "seconds": slowest + 1, "fit_seconds": slowest, "eval_seconds": 1,
                "bytes_down": 1, "bytes_up": 1, "bytes_down_eval": 1, "global_accuracy": 0.5,
                "timing": {"fit": fit}}

    rounds = [rnd(1, 30.0, 20.0), rnd(2, 6.0, 2.0), rnd(3, 8.0, 3.0), rnd(4, 7.0, 1.0)]
    (tmp_path / "results.json").write_text(json.dumps({"rounds": rounds}))
    stats = round_stats(tmp_path)
    assert stats["timing"]["fit"]["round_trip_max"] == 7.0  # median of 6, 8, 7; not round 1
    assert stats["timing"]["fit"]["delivery_median"] == 2.0
    table = timing_table({"deploy_warm": stats}, ["deploy_warm"]).splitlines()
    assert table[2] == ("| deploy_warm | 8.00 (7.00, 1.00) | fit | 7.00 | 1.00 | - | 2.00 "
                        "| 0.50 | - | - | - |")
    # a warm ClientApp's split of the delivery, in every steady round, gets its columns
    for r in rounds[1:]:
        r["timing"]["fit"].update(to_node_median=1.5, pull_median=0.25, start_median=0.125,
                                  client_cpu_median=0.75)
    rounds[2]["timing"]["fit"].pop("start_median")  # not in every steady round: left out
    (tmp_path / "results.json").write_text(json.dumps({"rounds": rounds}))
    row = timing_table({"w": round_stats(tmp_path)}, ["w"]).splitlines()[2]
    assert row.endswith("| 1.00 | 0.75 | 2.00 | 0.50 | 1.50 | 0.25 | - |")


def test_the_benchmark_draws_a_median_messages_way(tmp_path):
    """deploy_benchmark's plot stacks each part's median: the warm ClientApp's split of
    the delivery where every split part is there, the whole delivery otherwise."""
    from simulations.deploy_benchmark import message_segments, plot_message_segments

    warm = {"to_node_median": 1.5, "pull_median": 0.25, "start_median": -0.001,
            "delivery_median": 1.75, "client_median": 2.0, "reply_median": 0.5}
    sim = {"delivery_median": 0.5, "client_median": 1.0, "reply_median": 0.125}
    report = {"simulation": {"timing": {"fit": sim}},
              "deploy_warm": {"timing": {"fit": warm, "evaluate": {**sim, "pull_median": 1}}}}
    rows = message_segments(report, ["simulation", "deploy_warm"])
    assert rows == [("simulation: fit", [("delivery", 0.5), ("client", 1.0), ("reply", 0.125)]),
                    ("deploy_warm: fit", [("to_node", 1.5), ("pull", 0.25), ("start", 0.0),
                                          ("client", 2.0), ("reply", 0.5)]),
                    ("deploy_warm: evaluate", [("delivery", 0.5), ("client", 1.0),
                                               ("reply", 0.125)])]
    path = plot_message_segments(report, ["simulation", "deploy_warm"], tmp_path / "m.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_message_segments({}, ["simulation"], tmp_path / "none.png") is None


def test_the_warm_clientapp_writes_the_keys_the_client_reads():
    """fedapps/warm_clientapp.py spells the keys out (it imports no fedapps module a FAB also
    brings); they must be the ones node_stamps reads."""
    from fedapps.timing import TASK_STAMPS
    from fedapps.warm_clientapp import STAMP_KEYS, stamp

    assert tuple(NODE_STAMP_PREFIX + k for k in TASK_STAMPS) == STAMP_KEYS
    node = {}
    stamp(node, 1.5, 2.5)
    assert node_stamps(node) == {TASK_TAKEN: 1.5, INPUT_PULLED: 2.5}


def test_the_benchmark_keeps_each_finished_mode_on_disk(tmp_path, capsys):
    """A benchmark stopped during a mode (a time limit, a crash) keeps the probe and the modes
    before it: save_partial writes the whole report so far and says which part finished."""
    import json

    from simulations.deploy_benchmark import save_partial

    report = {"experiment": "x", "startup_probe": {"imports_s": 2.5, "fit_s": 1.25}}
    save_partial(report, tmp_path, "startup_probe")  # before any mode: the probe is kept
    assert json.loads((tmp_path / "deploy_benchmark.json").read_text()) == report
    assert "startup_probe: imports 2.5 s, fit 1.25 s" in capsys.readouterr().out
    report["simulation"] = {"status": "finished:completed", "wall_s": 41.5,
                            "steady_seconds": 4.125}
    save_partial(report, tmp_path, "simulation")
    assert json.loads((tmp_path / "deploy_benchmark.json").read_text()) == report
    assert "simulation: finished:completed, 41.5 s, steady round 4.12 s" in capsys.readouterr().out
    report["deploy_warm"] = {"status": "finished:failed", "wall_s": 9.0}  # no rounds: 0.00
    save_partial(report, tmp_path, "deploy_warm")
    assert set(json.loads((tmp_path / "deploy_benchmark.json").read_text())) == {
        "experiment", "startup_probe", "simulation", "deploy_warm"}
    assert "deploy_warm: finished:failed, 9.0 s, steady round 0.00 s" in capsys.readouterr().out


def test_the_benchmark_shows_progress_lines_only_when_asked(tmp_path, monkeypatch):
    """--progress hands the runs the launcher's progress filter (a slow mode on a lent machine
    shows where it stands); without it every line of the run stays quiet."""
    import simulations.deploy_benchmark as bench

    shown: list[bool] = []

    class Stop(Exception):
        """Ends main before the tables: only the filter is under test."""

    def fake_run(experiment, sets, n, run_dir, show, total_cpus=None):
        shown.append(show("INFO :      [fedapps] round 2/8  G 85.42%"))
        raise Stop

    monkeypatch.setattr(bench, "startup_probe", lambda *a: {"imports_s": 1.0, "fit_s": 1.0})
    monkeypatch.setattr(bench, "run_experiment", fake_run)
    for flags in (["--progress"], []):
        with pytest.raises(Stop):
            bench.main(["--modes", "simulation", "--out", str(tmp_path), *flags])
    assert shown == [True, False]


def test_the_benchmark_repeats_the_modes_in_turn_and_reports_each_repeats_ratio(tmp_path,
                                                                               monkeypatch,
                                                                               capsys):
    """--repeat N runs simulation and deployment N times in turn, each into its own folder,
    and judges each deployed round against the simulated round of the same repeat: the
    ratios 5.0/4.0 = 1.25 and 5.5/5.0 = 1.1, median 1.175 (not 10.5/9.0 = 1.167 of the
    pooled rounds); a repeat whose deployment finished no round has no ratio."""
    import json

    import simulations.deploy_benchmark as bench

    steady = {("simulation", 1): 4.0, ("deploy_one", 1): 5.0, ("simulation", 2): 5.0,
              ("deploy_one", 2): 5.5, ("simulation", 3): 4.0, ("deploy_one", 3): None}
    calls = []

    def results(run_dir, mode):
        repeat = int(run_dir.parent.name.split("-")[1])
        calls.append((mode, repeat))
        seconds = steady[(mode, repeat)]
        rounds = [] if seconds is None else [
            {"round": i, "seconds": seconds if i > 1 else 30.0, "fit_seconds": 1.0,
             "eval_seconds": 1.0, "bytes_down": 1, "bytes_up": 1, "bytes_down_eval": 1,
             "global_accuracy": 0.5} for i in (1, 2, 3)]
        run_dir.mkdir(parents=True)
        (run_dir / "results.json").write_text(json.dumps({"rounds": rounds}))
        return "finished:completed"

    monkeypatch.setattr(bench, "startup_probe", lambda *a: {"imports_s": 1.0, "fit_s": 1.0})
    monkeypatch.setattr(bench, "run_experiment",
                        lambda experiment, sets, n, run_dir, show, **kw: results(run_dir,
                                                                                 "simulation"))
    monkeypatch.setattr(bench, "run_federation",
                        lambda experiment, sets, n, run_dir, **kw: results(run_dir,
                                                                           "deploy_one"))
    with pytest.raises(SystemExit):
        bench.main(["--repeat", "0", "--out", str(tmp_path)])
    assert "--repeat: 0, must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # before any run, not deep inside the first deployment
        bench.main(["--compute-slots", "-1", "--out", str(tmp_path)])
    assert "--compute-slots: -1, must be 0 (all at once) or more" in capsys.readouterr().err
    code = bench.main(["--modes", "simulation,deploy_one", "--repeat", "3",
                       "--out", str(tmp_path)])
    assert code == 1  # repeat 3's deployment has no accuracies to match
    assert calls == [("simulation", 1), ("deploy_one", 1), ("simulation", 2),
                     ("deploy_one", 2), ("simulation", 3), ("deploy_one", 3)]  # in turn
    summary = json.loads((tmp_path / "repeats.json").read_text())
    assert summary["steady_seconds"] == {"simulation": [4.0, 5.0, 4.0],
                                         "deploy_one": [5.0, 5.5, None]}
    assert summary["ratio_to_simulation"] == {"deploy_one": [1.25, 1.1, None]}
    assert summary["median_ratio"] == {"deploy_one": 1.175}
    for i in (1, 2, 3):  # each repeat keeps its own report and runs
        report = json.loads((tmp_path / f"repeat-{i}" / "deploy_benchmark.json").read_text())
        assert report["simulation"]["steady_seconds"] == steady[("simulation", i)]
    table = capsys.readouterr().out.split("| repeat |")[-1].splitlines()
    assert table[0] == " simulation | deploy_one |"
    assert table[2:] == ["| 1 | 4.00 s | 5.00 s (1.25x) |", "| 2 | 5.00 s | 5.50 s (1.10x) |",
                         "| 3 | 4.00 s | - |", "| median | 4.00 s | 5.25 s (1.18x) |",
                         "same accuracies in every repeat: False"]


def test_the_benchmark_can_train_as_many_clients_at_once_in_every_mode(tmp_path, monkeypatch,
                                                                      capsys):
    """--cpus N caps the simulation's Ray at N CPUs (N clients at once, as `fedapps run
    --cpus`) and --compute-slots N lets N deployed ClientApps compute at once: the same
    training in every mode, with the other cores left to Flower's own processes; both are in
    the report, and a --cpus below 1 is refused before any run."""
    import json

    import simulations.deploy_benchmark as bench

    seen = {}

    class Stop(Exception):
        """Ends main at the run: the arguments it gets are what is under test."""

    def fake_simulation(experiment, sets, n, run_dir, show, total_cpus=None):
        seen["simulation_cpus"] = total_cpus
        raise Stop

    def fake_deployment(experiment, sets, n, run_dir, show, state_root, during, warm=True,
                        pull_interval=None, link_hold=None, one_process=False,
                        compute_slots=None):  # run_federation's keywords, read by the benchmark
        seen["compute_slots"] = compute_slots
        raise Stop

    monkeypatch.setattr(bench, "startup_probe", lambda *a: {"imports_s": 1.0, "fit_s": 1.0})
    monkeypatch.setattr(bench, "run_experiment", fake_simulation)
    monkeypatch.setattr(bench, "run_federation", fake_deployment)
    with pytest.raises(SystemExit):
        bench.main(["--cpus", "0", "--out", str(tmp_path)])
    assert "--cpus: 0, must be at least 1" in capsys.readouterr().err
    for mode in ("simulation", "deploy_one"):
        with pytest.raises(Stop):
            bench.main(["--modes", mode, "--cpus", "1", "--compute-slots", "1",
                        "--out", str(tmp_path)])
    assert seen == {"simulation_cpus": 1, "compute_slots": 1}
    report = json.loads((tmp_path / "deploy_benchmark.json").read_text())
    assert (report["simulation_cpus"], report["compute_slots"]) == (1, 1)
