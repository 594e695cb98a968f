"""Round records: what a round accumulates over its steps, the record written to results.json
and the progress line. Plain data; the strategy adaptor only feeds it."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from flwr.common import Scalar

from fedapps.metrics import PERCENT_METRICS
from fedapps.timing import summarize

# Traffic counters of a round, all in bytes of serialized arrays (config and metric scalars,
# a few hundred bytes per message, are not counted).
TRAFFIC = ("bytes_down", "bytes_up", "bytes_down_eval", "bytes_down_xeval", "bytes_up_xeval")


@dataclass
class RoundLog:
    """What a round accumulates from its first step's plan to the end of its evaluation."""

    round: int
    started: float = field(default_factory=time.perf_counter)
    fit_done: float | None = None  # when the last aggregation finished: splits fit/eval time
    steps: int = 0  # steps completed
    fit_clients: list[int] = field(default_factory=list)  # sorted, over all steps
    instructions: int = 0  # training/cross-evaluation messages sent, over all steps
    bytes_down: int = 0
    bytes_up: int = 0
    bytes_down_eval: int = 0
    bytes_down_xeval: int = 0
    bytes_up_xeval: int = 0
    failures: int = 0
    rejected: int = 0
    fit_metrics: dict[int, dict[str, Scalar]] = field(default_factory=dict)
    central: dict[str, float] = field(default_factory=dict)
    failure_reasons: list[str] = field(default_factory=list)
    eval_expected: list[int] | None = None  # who must evaluate for a complete G (contract)
    # per phase ("fit": every step's training and cross-evaluation messages, "evaluate"), one
    # seconds per part of fedapps/timing.py's PARTS, per answer
    timings: dict[str, list[list[float]]] = field(default_factory=dict)

    def add_clients(self, partition_ids: list[int]) -> None:
        self.fit_clients = sorted(set(self.fit_clients) | set(partition_ids))

    def add_timings(self, phase: str, timings: list[list[float]]) -> None:
        """A step's answers' timings, added to the round's for that phase."""
        self.timings.setdefault(phase, []).extend(timings)

    def to_json(self) -> str:
        """The open round for a mid-round checkpoint (time as seconds already spent)."""
        doc = asdict(self)
        doc["elapsed"] = time.perf_counter() - self.started
        doc["fit_elapsed"] = (self.fit_done - self.started) if self.fit_done else None
        doc.pop("started")
        doc.pop("fit_done")
        doc["fit_metrics"] = {str(k): v for k, v in self.fit_metrics.items()}
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> RoundLog:
        doc = json.loads(text)
        now = time.perf_counter()
        elapsed, fit_elapsed = doc.pop("elapsed"), doc.pop("fit_elapsed")
        doc["fit_metrics"] = {int(k): v for k, v in doc["fit_metrics"].items()}
        log = cls(**doc, started=now - elapsed)
        log.fit_done = log.started + fit_elapsed if fit_elapsed is not None else None
        return log


def population(evaluated: list[int], expected: list[int]) -> dict[str, Any]:
    """The evaluated population against the contract: G over fewer clients (a node down, a
    rejected answer) is not the same quantity, so the round is marked incomplete and
    fedapps.results leaves it out of best/final G unless eval.allow-partial is set."""
    missing = sorted(set(expected) - set(evaluated))
    return {"eval_expected": len(expected), "eval_missing": missing,
            "eval_complete": sorted(evaluated) == sorted(expected)}


def round_record(rlog: RoundLog, metrics: dict[str, Any], metric: str = "accuracy"
                 ) -> dict[str, Any]:
    """The results.json entry of a finished round (contract in README); `metric` is the
    task's (accuracy, r2), giving global_<metric> and personal_<metric>."""
    now = time.perf_counter()
    seconds = now - rlog.started
    fit_seconds = (rlog.fit_done or now) - rlog.started
    metrics = dict(metrics)
    return {
        "round": rlog.round,
        f"global_{metric}": metrics.pop(f"global_{metric}", None),
        f"personal_{metric}": metrics.pop(f"personal_{metric}", None),
        **{key: getattr(rlog, key) for key in TRAFFIC},
        "seconds": seconds,
        "fit_seconds": fit_seconds,
        "eval_seconds": seconds - fit_seconds,
        "steps": rlog.steps,
        "fit_clients": rlog.fit_clients,
        "fit_instructions": rlog.instructions,
        "failures": rlog.failures + rlog.rejected,
        "rejected_updates": rlog.rejected,
        "failure_reasons": rlog.failure_reasons,
        "client_fit_metrics": {str(k): v for k, v in sorted(rlog.fit_metrics.items())},
        "timing": {phase: summarize(t) for phase, t in rlog.timings.items() if t},
        **rlog.central,
        **metrics,
    }


def format_metric(v: float | None, metric: str = "accuracy") -> str:
    """Accuracy as a percentage (mAP-50 too, named), any other metric (R^2) as a plain
    number, fixed width."""
    if metric == "accuracy":
        return "   -  " if v is None else f"{100 * v:5.2f}%"
    if metric in PERCENT_METRICS:
        return f"{metric} " + ("   -  " if v is None else f"{100 * v:5.2f}%")
    return f"{metric} " + ("   -  " if v is None else f"{v:.4f}")


def progress_line(record: dict[str, Any], num_rounds: int, eta_seconds: float,
                  metric: str = "accuracy") -> str:
    """One line per round: G and P in the task's metric, successes, failures, time, ETA."""
    sent = record.get("fit_instructions", len(record["fit_clients"]))
    steps = record.get("steps", 1)
    step_part = f" ({steps} steps)" if steps > 1 else ""
    g, p = record.get(f"global_{metric}"), record.get(f"personal_{metric}")
    partial = "" if record.get("eval_complete", True) else \
        f" (partial: {record['eval_clients']}/{record['eval_expected']} clients)"
    official = record.get(f"official_test_{metric}")
    test = "" if official is None else f"  official test {format_metric(official, metric)}"
    return (f"[fedapps] round {record['round']}/{num_rounds}{step_part}  "
            f"G {format_metric(g, metric)}  P {format_metric(p, metric)}{partial}{test}  "
            f"fit {sent - record['failures']}/{sent}  failures {record['failures']}  "
            f"{record['seconds']:.1f}s  ETA {eta_seconds:.0f}s")


def step_line(server_round: int, num_rounds: int, step: int, steps: int, seconds: float) -> str:
    """Progress inside a multi-step round."""
    return (f"[fedapps] round {server_round}/{num_rounds} step {step + 1}/{steps} done "
            f"({seconds:.1f}s)")
