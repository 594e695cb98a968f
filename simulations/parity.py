"""Numerical parity check for refactors: same config and seed must give the same numbers.

Runs a fixed set of short experiments (seed 0, 3 rounds) as real simulations through the
project's own runner (`fedapps run`, one fresh output directory per case, one case at a time),
and records each round's G, P, official-test accuracy and loss plus the partition's EMD.
Run it on the code before a refactor (`--out before.json`) and after it
(`--out after.json --compare before.json`): it prints the largest difference per case and exits
1 if any exceeds 1e-9 or a case or round is missing.

    python -m simulations.parity --out before.json
    python -m simulations.parity --out after.json --compare before.json [--cases quickstart-fedavg]
    python -m simulations.parity --out after.json --compare before.json --no-run  # compare only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA_ROOT = os.environ.get("FEDAPPS_DATA_ROOT", str(ROOT.parent / "shared" / "data"))
ALGORITHMS = ("fedavg", "fedprox", "feddyn", "ditto", "fedper", "fedrep", "fedbabu", "fedrod",
              "gpfl", "fedreb", "fedreg", "fedrolex", "heterofl", "feddropout")
METRICS = ("global_accuracy", "personal_accuracy", "official_test_accuracy", "loss")
TOLERANCE = 1e-9

# case -> (experiment, --set overrides, needs the shared data root); seed 0 is every preset's
# default and is set explicitly anyway. No algorithm needs extra keys on quickstart (digits).
CASES: dict[str, tuple[str, list[str], bool]] = {
    **{f"quickstart-{a}": ("quickstart", [f"algorithm={a}"], False) for a in ALGORITHMS},
    "fedreb-fmnist": ("fedreb-fmnist", [], True),
    "fedrolex-fmnist": ("fedrolex-fmnist", ["eval.eval-every=1"], True),
}


def run_case(name: str, workdir: Path) -> dict[str, Any]:
    """One `fedapps run` into workdir/name; the per-round numbers of its results.json."""
    experiment, sets, data = CASES[name]
    cmd = [sys.executable, "-m", "simulations.cli", "run", experiment, "--overwrite"]  # rerun
    for item in ("seed=0", "rounds=3", *sets, f"output.output-dir={workdir}",
                 f"output.run-name={name}"):
        cmd += ["--set", item]
    env = {**os.environ, **({"FEDAPPS_DATA_ROOT": DATA_ROOT} if data else {})}
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    wall = round(time.monotonic() - start, 1)
    results = workdir / name / "results.json"
    if proc.returncode != 0 or not results.is_file():
        return {"error": f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}",
                "wall_s": wall}
    doc = json.loads(results.read_text())
    rounds = [{"round": r["round"], **{k: r[k] for k in METRICS if k in r}}
              for r in doc["rounds"]]
    return {"rounds": rounds, "emd": doc["partition"]["emd"], "wall_s": wall}


def diff(a: float | None, b: float | None) -> float:
    if a is None and b is None:
        return 0.0
    if a is None or b is None:
        return math.inf
    return abs(a - b)


def compare(before: dict[str, Any], after: dict[str, Any], cases: list[str]) -> bool:
    """Print the largest |difference| per case and metric; True if all are within TOLERANCE."""
    ok = True
    for name in cases:
        b, a = before.get(name), after.get(name)
        if not b or not a or "rounds" not in b or "rounds" not in a:
            print(f"{name}: MISSING or FAILED (before: {bool(b and 'rounds' in b)}, "
                  f"after: {bool(a and 'rounds' in a)})")
            ok = False
            continue
        rb, ra = ({r["round"]: r for r in x["rounds"]} for x in (b, a))
        worst = {k: max((diff(rb[i].get(k), ra[i].get(k)) for i in rb if i in ra), default=0.0)
                 for k in METRICS}
        worst["emd"] = diff(b["emd"], a["emd"])
        bad = rb.keys() != ra.keys() or any(v > TOLERANCE for v in worst.values())
        ok &= not bad
        rounds = "" if rb.keys() == ra.keys() else f"  rounds {sorted(rb)} vs {sorted(ra)}"
        print(f"{name:28s} {'FAIL' if bad else 'ok  '} "
              + "  ".join(f"{k} {v:.3g}" for k, v in worst.items()) + rounds)
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="JSON file to write (or read)")
    p.add_argument("--compare", type=Path, help="earlier JSON to compare against")
    p.add_argument("--cases", help="comma-separated case names (default: all)")
    p.add_argument("--no-run", action="store_true", help="only compare --out with --compare")
    p.add_argument("--workdir", type=Path, help="where the runs go (default: a temp dir)")
    args = p.parse_args(argv)
    cases = args.cases.split(",") if args.cases else list(CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    if args.no_run:
        out = json.loads(args.out.read_text())
    else:
        print(f"parity: running {len(cases)} cases with the code in {ROOT}", flush=True)
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="parity-"))
        out = {}
        for name in cases:
            out[name] = run_case(name, workdir.resolve())
            status = "FAILED" if "error" in out[name] else "done"
            print(f"parity: {name} {status} in {out[name]['wall_s']}s", flush=True)
            args.out.write_text(json.dumps(out, indent=1) + "\n")
    if args.compare is None:
        return 1 if any("error" in v for v in out.values()) else 0
    return 0 if compare(json.loads(args.compare.read_text()), out, cases) else 1


if __name__ == "__main__":
    sys.exit(main())
