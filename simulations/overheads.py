"""Two per-run overheads, each measured side by side with what it replaced, alternating:

    python -m simulations.overheads              # both
    python -m simulations.overheads --only config

- status: the SuperLink's final status of one finished quickstart run (1 round), asked with
  `flwr ls` (a process importing Flower's CLI) and over the Control API from this process
  (`LocalSuperLink.run_status`); both must give the same answer.
- config: `load_config` (plain-dict merge of files parsed once per process) against OmegaConf's
  own merge of the same files (`omegaconf_merged`, what load_config did before; the reference
  tests/test_config.py compares it with).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONFIGS = [("quickstart", []), ("thesis-fmnist", ["rounds=3", "data.partitioner=emd"]),
           ("fedreb-fmnist", ["algorithm=ditto", "algo.personal-epochs=1"])]


def omegaconf_merged(experiment: str, overrides: Sequence[str]) -> DictConfig:
    """defaults < dataset < algorithm < experiment < overrides merged by OmegaConf itself, each
    file parsed again: the independent reference of fedapps.config.load_config (no key checks)."""
    from fedapps.config import CONF_DIR

    over = OmegaConf.from_dotlist(list(overrides))
    name = over.pop("experiment", experiment)
    exp = OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml")
    defaults = OmegaConf.load(CONF_DIR / "defaults.yaml")

    def chosen(key: str) -> str:
        return next(str(src[key]) for src in (over, exp, defaults) if key in src)

    merged = OmegaConf.merge(defaults,
                             OmegaConf.load(CONF_DIR / "dataset" / f"{chosen('dataset')}.yaml"),
                             OmegaConf.load(CONF_DIR / "algorithm" / f"{chosen('algorithm')}.yaml"),
                             exp, over)
    assert isinstance(merged, DictConfig)
    merged.experiment = name
    return merged


def config_times(repeats: int = 5) -> dict[str, list[float]]:
    """Milliseconds per config of each way, CONFIGS ten times per repeat, alternating."""
    from fedapps.config import load_config

    ways = {"omegaconf merge": omegaconf_merged, "load_config": load_config}
    for way in ways.values():
        way("quickstart", [])  # imports and the file cache: not what a repeat measures
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, way in ways.items():
            start = time.perf_counter()
            for experiment, overrides in CONFIGS * 10:
                way(experiment, overrides)
            times[name].append((time.perf_counter() - start) / (len(CONFIGS) * 10) * 1000)
    return times


def status_times(repeats: int = 3) -> tuple[str, dict[str, list[float]]]:
    """Seconds per status query of each way on one finished quickstart run, alternating."""
    from fedapps import rundir
    from fedapps.launcher import LocalSuperLink, submit

    out = Path(tempfile.mkdtemp(prefix="overheads-")) / "run"
    times: dict[str, list[float]] = {"flwr ls": [], "control api": []}
    with rundir.claim(out, rundir.NEW) as run_id:
        config = {"experiment": "quickstart", "overrides": "rounds=1",
                  "output-dir": str(out.parent), "run-name": out.name, "run-id": run_id,
                  "client-state-dir": str(rundir.client_state_root(out))}
        with LocalSuperLink(out.parent / "link") as link:
            flower_id, status = submit(link, config, 10, show=lambda line: False)
            assert flower_id is not None, status
            for _ in range(repeats):
                for name, ask in (("flwr ls", lambda: link._flwr_ls_status(flower_id)),
                                  ("control api",
                                   lambda: link._control_api_status(int(flower_id)))):
                    start = time.perf_counter()
                    answer = ask()
                    times[name].append(time.perf_counter() - start)
                    assert answer == status, (name, answer, status)
    return status, times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulations.overheads",
                                description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["config", "status"], default=None)
    args = p.parse_args(argv)
    if args.only in (None, "config"):
        for name, ms in config_times().items():
            print(f"config, {name}: median {statistics.median(ms):.1f} ms a config "
                  f"(repeats {', '.join(f'{x:.1f}' for x in ms)})")
    if args.only in (None, "status"):
        status, times = status_times()
        for name, seconds in times.items():
            print(f"status, {name}: {', '.join(f'{x * 1000:.0f}' for x in seconds)} ms "
                  f"(answer {status})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
