"""The overhead benchmark runs end to end in a tiny configuration; its format is checked."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_quick_benchmark_writes_its_report(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "simulations.benchmark", "--quick",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "benchmark.json").read_text())
    for key in ("plain_1thread", "plain_all_threads", "flower", "ratio_vs_1thread",
                "ratio_vs_all_threads", "scaling"):
        assert key in res
    assert len(res["flower"]["round_seconds"]) == 2 and res["flower"]["bytes_down"] > 0
    assert res["ratio_vs_1thread"] > 0 and res["scaling"][0]["clients"] == 10
    # the plain loop does exactly the simulation's work: the same seed gives the same model
    assert res["flower"]["final_global_accuracy"] == res["plain_1thread"]["final_global_accuracy"]
    md = (tmp_path / "benchmark.md").read_text()
    assert "| (a) Flower simulation |" in md and "Ratio (a)/(b) per round:" in md
    assert "| total clients | start-up + teardown | per round (steady) |" in md
    # the sampler saw the whole process tree: at least the ServerApp and a Ray actor, each
    # holding PyTorch (several hundred MB), beyond the largest single child
    scale = res["scaling"][0]
    assert scale["peak_tree_rss_mb"] > res["flower"]["largest_child_peak_rss_mb"] > 100
    assert 0 < scale["peak_tree_pss_mb"] <= scale["peak_tree_rss_mb"]
    assert scale["startup"] > 0
