"""A deployment keeps its processes' logs in the run directory and deletes its working folder
(fedapps/deploy.py); the benchmark reads each warm ClientApp task's memory from those logs."""

from fedapps.deploy import keep_logs
from simulations.deploy_benchmark import memory_table, task_cpu, task_cpu_table, task_memory


def test_logs_are_copied_and_the_working_folder_goes_only_after_a_completed_run(tmp_path,
                                                                                 capsys):
    for status, kept in (("finished:completed", False), ("finished:failed", True)):
        work, logs = tmp_path / status / "work", tmp_path / status / "run" / "logs"
        (work / "node-home-0").mkdir(parents=True)
        (work / "node-home-0" / "fab.zip").write_bytes(b"x" * 100)
        (work / "superlink.log").write_text("link\n")
        (work / "supernode-0.log").write_text("node 0\n")
        logs.mkdir(parents=True)
        (logs / "supernode-7.log").write_text("an earlier attempt's node\n")
        keep_logs(work, logs, status)
        assert sorted(p.name for p in logs.iterdir()) == ["superlink.log", "supernode-0.log"]
        assert (logs / "supernode-0.log").read_text() == "node 0\n"
        assert work.exists() is kept
    assert f"run status finished:failed; logs in {logs}, working folder {work}" in \
        capsys.readouterr().err


def test_task_memory_takes_each_columns_largest_value_per_message_type(tmp_path):
    line = "\x1b[92mINFO \x1b[0m:      [warm-clientapp] {} task done in 1.00 s (completed); {}\n"
    (tmp_path / "supernode-0.log").write_text(
        line.format("get_properties", "resident 270 MB before, 273 with its input, 320 after;"
                                      " peak 270 -> 330 MB")
        + line.format("train", "resident 319 MB before, 329 with its input, 375 after;"
                               " peak 330 -> 375 MB")
        + "unrelated line\n")
    (tmp_path / "supernode-1.log").write_text(
        line.format("train", "resident 350 MB before, 352 with its input, 370 after;"
                             " peak 372 -> 372 MB")
        + line.format("evaluate", "resident 392 MB before, 390 after; peak 392 -> 411 MB"))
    (tmp_path / "superlink.log").write_text(line.format("train", "resident 1 MB before, 2 after;"
                                                                 " peak 1 -> 9999 MB"))
    memory = task_memory(tmp_path)
    assert memory == {
        "evaluate": {"tasks": 1, "before_mb": 392, "input_mb": 0, "task_mb": -2,
                     "after_mb": 390, "peak_rise_mb": 19, "peak_mb": 411},
        "get_properties": {"tasks": 1, "before_mb": 270, "input_mb": 3, "task_mb": 47,
                           "after_mb": 320, "peak_rise_mb": 60, "peak_mb": 330},
        "train": {"tasks": 2, "before_mb": 350, "input_mb": 10, "task_mb": 46,
                  "after_mb": 375, "peak_rise_mb": 45, "peak_mb": 375}}
    table = memory_table({"deploy_warm": {"task_memory": memory}}, ["simulation", "deploy_warm"])
    assert table.splitlines()[2] == "| deploy_warm | evaluate | 1 | 392 | 0 | -2 | 390 | 19 | 411 |"
    assert task_memory(tmp_path / "missing") == {}
    assert memory_table({"simulation": {}}, ["simulation"]) == ""


def test_task_cpu_takes_each_message_types_medians(tmp_path):
    line = ("INFO : [warm-clientapp] {} task done in 1.00 s (completed); resident 1 MB before,"
            " 2 after; peak 1 -> 2 MB; CPU {} s, kernel {} s, {} page faults\n")
    (tmp_path / "supernode-0.log").write_text(
        line.format("evaluate", "0.40", "0.20", 120000) + line.format("train", "2.00", "0.05", 5000)
        + "INFO : [warm-clientapp] train task done in 1.00 s (completed)\n")  # no CPU part
    thread = line.replace(" page faults\n", " page faults, {} s in the task's thread\n")
    (tmp_path / "supernode-1.log").write_text(
        thread.format("evaluate", "0.30", "0.01", 40, "0.25")
        + thread.format("evaluate", "0.35", "0.03", 900, "0.27"))
    (tmp_path / "superlink.log").write_text(line.format("train", "9.00", "9.00", 9))
    cpu = task_cpu(tmp_path)
    assert cpu == {"evaluate": {"tasks": 3, "cpu_s": 0.35, "kernel_s": 0.03, "page_faults": 900,
                                "thread_s": 0.26},  # of the two lines that give it
                   "train": {"tasks": 1, "cpu_s": 2.0, "kernel_s": 0.05, "page_faults": 5000,
                             "thread_s": None}}
    table = task_cpu_table({"deploy_held": {"task_cpu": cpu}}, ["simulation", "deploy_held"])
    assert table.splitlines()[2] == "| deploy_held | evaluate | 3 | 0.35 | 0.03 | 900 | 0.26 |"
    assert table.splitlines()[3] == "| deploy_held | train | 1 | 2.00 | 0.05 | 5000 | - |"
    assert task_cpu(tmp_path / "missing") == {}
    assert task_cpu_table({"simulation": {}}, ["simulation"]) == ""


def test_each_deployed_mode_passes_its_settings_and_an_unknown_one_is_refused(capsys):
    import pytest

    from simulations.deploy_benchmark import main, mode_settings

    now = {"warm", "pull_interval", "link_hold", "one_process"}
    assert mode_settings("deploy_cold", 0.5, 5.0, now) == {"warm": False}
    assert mode_settings("deploy_warm", 0.5, 5.0, now) == {"warm": True}
    assert mode_settings("deploy_quick", 0.5, 5.0, now) == {"warm": True, "pull_interval": 0.5}
    assert mode_settings("deploy_held", 0.2, 3.0, now) == {
        "warm": True, "pull_interval": 0.2, "link_hold": 3.0}
    assert mode_settings("deploy_one", 0.5, 5.0, now) == {
        "warm": True, "pull_interval": 0.5, "link_hold": 5.0, "one_process": True}
    assert mode_settings("deploy_warm", 0.5, 5.0, {"show"}) == {}  # the code before: cold
    slots = now | {"compute_slots"}
    assert mode_settings("deploy_one", 0.5, 5.0, slots, 2) == {
        "warm": True, "pull_interval": 0.5, "link_hold": 5.0, "one_process": True,
        "compute_slots": 2}
    assert mode_settings("deploy_cold", 0.5, 5.0, slots, 2) == {"warm": False}  # not Flower's
    assert mode_settings("deploy_warm", 0.5, 5.0, slots, 0) == {"warm": True}
    assert mode_settings("deploy_warm", 0.5, 5.0, now, 2) == {"warm": True}  # the code before
    with pytest.raises(SystemExit):  # a typo once ran as deploy_cold without a word
        main(["--modes", "simulation,deploy_hold", "--out", "/nonexistent/never-written"])
    assert "--modes: unknown deploy_hold (of simulation, deploy_cold," in capsys.readouterr().err
