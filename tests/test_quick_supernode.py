"""The opt-in quick SuperNode: Flower's SuperNode loop with its idle sleeps shortened, and the
refusal to patch a loop it does not recognise."""

import importlib
import sys
import time

import pytest

from fedapps import quick_supernode as quick
from fedapps.deploy import supernode_command, warm_clientapp_command
from fedapps.errors import ConfigError


def test_the_loops_sleeps_are_shortened_and_nothing_else():
    slept = []
    sleeps = quick.QuickSleeps(0.5, sleep=slept.append)
    for seconds in (3, 0.5, 0.5, 1.25, 3.0):
        sleeps.sleep(seconds)
    # the empty-pull sleep -> the interval; the reply checks -> 0.05 s; others unchanged
    assert slept == [0.5, 0.05, 0.05, 1.25, 0.5]
    assert quick.QuickSleeps(0.2, sleep=slept.append).reply_check == pytest.approx(0.02)
    assert sleeps.time is time.time and sleeps.monotonic is time.monotonic  # the rest: time's


@pytest.mark.parametrize("seconds", [0, -1, 0.01, 3.5, float("nan")])
def test_an_interval_outside_0_05_to_3_s_is_refused(seconds):
    with pytest.raises(ConfigError, match="--pull-interval .*must be from 0.05 s to "
                                          "Flower's own 3 s"):
        quick.QuickSleeps(seconds)


def test_the_installed_flower_has_the_loop_this_option_shortens():
    """Fails when a Flower upgrade changes its SuperNode loop: the option must be rechecked
    against the new loop (its sleeps, what they wait for) before the pin moves."""
    quick.check_loop(importlib.import_module("flwr.supernode.start_client_internal"))


def test_another_loop_is_refused_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "other_loop.py").write_text(
        "import time\n\ndef loop():\n    while True:\n        time.sleep(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    other = importlib.import_module("other_loop")
    with pytest.raises(ConfigError) as err:
        quick.check_loop(other)
    assert "found ['1']" in str(err.value) and "run without --pull-interval" in str(err.value)
    assert "\n" not in str(err.value)


def test_an_already_patched_loop_is_refused(tmp_path, monkeypatch):
    loop = importlib.import_module("flwr.supernode.start_client_internal")
    monkeypatch.setattr(loop, "time", quick.QuickSleeps(1.0))
    with pytest.raises(ConfigError, match="not the one this option shortens"):
        quick.check_loop(loop)


def test_install_patches_only_the_loops_module(monkeypatch):
    loop = importlib.import_module("flwr.supernode.start_client_internal")
    monkeypatch.setattr(loop, "time", time)  # undone after the test
    flower_pull = loop.pull_objects
    monkeypatch.setattr(loop, "pull_objects", flower_pull)
    held = []  # the Runtime API's holds: tests/test_held_pulls.py (they patch Flower's classes)
    monkeypatch.setattr(quick, "hold_runtime_pulls", lambda: held.append(True) or True)
    installed = quick.install(0.25)
    assert held == [True]
    assert loop.time is installed and installed.pull_interval == 0.25
    assert time.sleep is not installed.sleep  # the real module is untouched
    # a message's objects not yet at the SuperLink: looked for again after 0.05 s, up to 0.25
    assert loop.pull_objects.func is flower_pull
    assert loop.pull_objects.keywords == {"initial_backoff": 0.05, "backoff_cap": 0.25,
                                          "max_tries_per_object": None}  # Flower's 2 h holds


def test_bad_interval_exits_before_flower_starts(capsys):
    with pytest.raises(SystemExit) as exit_:
        quick.main(["--pull-interval", "0", "--insecure"])
    assert str(exit_.value) == "fedapps: --pull-interval 0: must be from 0.05 s to Flower's " \
                               "own 3 s"


def test_commands_of_a_quick_node():
    args = ["--insecure", "--superlink", "127.0.0.1:9092"]
    assert supernode_command(args, None) == ["flower-supernode", *args]
    assert supernode_command(args, 0.5) == [sys.executable, "-m", "fedapps.quick_supernode",
                                            "--pull-interval", "0.5", *args]
    assert warm_clientapp_command(9094, 7)[-2:] == ["--parent-pid", "7"]
    assert warm_clientapp_command(9094, 7, 0.5)[-2:] == ["--poll-max", "0.5"]
    # a pull interval above the ClientApp's own 1 s idle wait leaves that wait as it is
    assert warm_clientapp_command(9094, 7, 2.0) == warm_clientapp_command(9094, 7)


def test_unknown_short_options_pass_through_to_flower(monkeypatch):
    """`--p` is not taken for --pull-interval (argparse's prefix matching is off)."""
    passed = []
    monkeypatch.setattr(quick, "install", lambda seconds: None)
    import flwr.supernode.cli as flower_cli

    monkeypatch.setattr(flower_cli, "flower_supernode", lambda: passed.append(list(sys.argv)))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    quick.main(["--pull-interval", "0.5", "--p", "9", "--insecure"])
    assert passed == [["flower-supernode", "--p", "9", "--insecure"]]
