"""Weights & Biases mirror of the results files. Optional: a failure here never fails a run."""

from __future__ import annotations

import os
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.common import log


class WandbTracker:
    """Logs config, per-round scalars, the summary and plots to one W&B run (or nothing)."""

    def __init__(self, cfg: dict[str, Any], run_dir: Path, run_name: str) -> None:
        self.run = None
        wb = cfg["wandb"]
        mode = os.environ.get("WANDB_MODE") or wb["mode"]
        if not wb["enabled"] or mode == "disabled":
            return
        try:
            import wandb

            self.run = wandb.init(
                project=wb["project"], entity=wb["entity"], name=run_name, config=cfg,
                group=wb.get("group") or cfg["experiment"], job_type=cfg["algorithm"],
                dir=str(run_dir),
                mode=mode, reinit="finish_previous")
        except Exception as err:  # no account, no network, bad key: results files still count
            log(WARNING, "W&B disabled for this run: %s", err)
            self.run = None

    def log_round(self, record: dict[str, Any]) -> None:
        if self.run is None:
            return
        scalars = {k: v for k, v in record.items()
                   if isinstance(v, int | float) and not isinstance(v, bool) and k != "round"}
        self.run.log(scalars, step=int(record["round"]))

    def finish(self, summary: dict[str, Any], plots: list[Path]) -> None:
        if self.run is None:
            return
        import wandb

        self.run.summary.update({k: v for k, v in summary.items() if not isinstance(v, list)})
        for plot in plots:
            self.run.log({plot.stem: wandb.Image(str(plot))})
        self.run.finish()
        self.run = None
