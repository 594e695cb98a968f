"""deploy/lent-machine.sh: the one prepared command for a borrowed many-core machine (issue 18).

Its `run` takes minutes (a dry run is `LOCAL=1 ROUNDS=1`, docs/PERFORMANCE.md); here only what
must hold before anyone spends borrowed time on it: the script parses, and a wrong call says how
to call it instead of doing anything.
"""

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "deploy" / "lent-machine.sh"


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_wrong_call_prints_usage():
    for args in ([], ["measure"], ["run"], ["pack"]):
        out = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True)
        assert out.returncode != 0, args
        assert "usage: lent-machine.sh" in out.stderr, (args, out.stderr)
