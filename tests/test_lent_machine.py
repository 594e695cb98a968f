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


def test_missing_inputs_are_one_line_errors_before_any_work(tmp_path):
    """`run` on a folder `pack` did not fill, and `pack` without the dataset, stop at once with
    a line that says what is missing (before minutes of downloading or a traceback there)."""
    out = subprocess.run(["bash", str(SCRIPT), "run", str(tmp_path)], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "o")})
    assert out.returncode == 2 and out.stderr.strip().endswith("(make them with: pack DIR)")
    assert not (tmp_path / "o").exists()
    out = subprocess.run(["bash", str(SCRIPT), "pack", str(tmp_path / "p")], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin",
                                         "FEDAPPS_DATA_ROOT": str(tmp_path)})
    assert out.returncode == 2 and "no Fashion-MNIST .gz files in" in out.stderr
    assert not (tmp_path / "p").exists()
