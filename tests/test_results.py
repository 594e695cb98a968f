import json

import pytest

from fedapps.config import load_config, to_container
from fedapps.results import ResultsWriter, summarize


def rec(r, g, p, down=100, up=50, failures=0):
    return {"round": r, "global_accuracy": g, "personal_accuracy": p, "bytes_down": down,
            "bytes_up": up, "bytes_down_eval": 0, "seconds": 0.5, "fit_clients": [0, 1],
            "failures": failures, "failure_reasons": []}


def test_summary_best_and_final_may_come_from_different_rounds():
    rounds = [rec(1, 0.5, 0.9), rec(2, 0.7, 0.8), rec(3, None, None), rec(4, 0.6, 0.85)]
    s = summarize(rounds)
    assert s["best_global_accuracy"] == 0.7 and s["best_personal_accuracy"] == 0.9
    assert s["final_global_accuracy"] == 0.6 and s["final_personal_accuracy"] == 0.85
    assert s["total_bytes_down"] == 400 and s["rounds_completed"] == 4


def test_writer_keeps_files_current_and_logs_to_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = to_container(load_config("quickstart", ["wandb.enabled=true", "rounds=2"]))
    part = {"emd": 0.4, "min_client_samples": 12}
    writer = ResultsWriter(tmp_path / "run", cfg, part, num_rounds=2)
    writer.on_round(rec(1, 0.5, 0.6))
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["summary"]["status"] == "running" and len(doc["rounds"]) == 1
    writer.on_round(rec(2, 0.75, 0.8))
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["summary"]["status"] == "completed"
    assert doc["summary"]["best_global_accuracy"] == 0.75 and doc["summary"]["emd"] == 0.4
    csv_lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert csv_lines[0].startswith("round,global_accuracy,personal_accuracy")
    assert len(csv_lines) == 3
    assert (tmp_path / "run" / "accuracy.png").stat().st_size > 1000
    assert "seed: 0" in (tmp_path / "run" / "config.yaml").read_text()
    # W&B offline run directory with the logged history
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("run-*.wandb"))


@pytest.mark.parametrize("mode", ["disabled"])
def test_wandb_disabled_writes_nothing(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("WANDB_MODE", mode)
    cfg = to_container(load_config("quickstart", ["wandb.enabled=true", "rounds=1"]))
    writer = ResultsWriter(tmp_path / "run", cfg, {"emd": 0.0, "min_client_samples": 1}, 1)
    writer.on_round(rec(1, 0.5, 0.5))
    assert not (tmp_path / "run" / "wandb").exists()


def test_environments_record_this_machine_and_grow_only_when_a_resume_runs_elsewhere(tmp_path):
    import numpy
    import torch

    cfg = to_container(load_config("quickstart", ["rounds=3"]))
    part = {"emd": 0.4, "min_client_samples": 12}
    run = tmp_path / "run"
    writer = ResultsWriter(run, cfg, part, num_rounds=3)
    writer.on_round(rec(1, 0.5, 0.6))
    here = json.loads((run / "results.json").read_text())["environments"]
    assert len(here) == 1
    assert here[0]["torch"] == torch.__version__ and here[0]["numpy"] == numpy.__version__
    assert here[0]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    # a resume on the same machine adds nothing
    ResultsWriter(run, cfg, part, num_rounds=3, resume_after=1).on_round(rec(2, 0.6, 0.6))
    assert json.loads((run / "results.json").read_text())["environments"] == here
    # a run begun elsewhere (another CPU kind) and resumed here keeps both, oldest first
    doc = json.loads((run / "results.json").read_text())
    elsewhere = {**here[0], "cpu_capability": "AVX512", "torch": "2.15.0"}
    (run / "results.json").write_text(json.dumps({**doc, "environments": [elsewhere]}))
    ResultsWriter(run, cfg, part, num_rounds=3, resume_after=2).on_round(rec(3, 0.7, 0.7))
    doc = json.loads((run / "results.json").read_text())
    assert doc["environments"] == [elsewhere, here[0]] and len(doc["rounds"]) == 3
