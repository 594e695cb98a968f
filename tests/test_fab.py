"""The app bundle (FAB) Flower builds from this project and ships to the SuperLink and to every
SuperNode: all the code and config the apps run, none of the docs or test helpers (pyproject's
`fab-exclude`), and Flower's own build accepts the rules."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from flwr.cli.build import build_fab_from_disk

ROOT = Path(__file__).resolve().parents[1]


def test_the_fab_holds_the_apps_code_and_config_and_leaves_out_docs_and_tests():
    names = set(zipfile.ZipFile(io.BytesIO(build_fab_from_disk(ROOT))).namelist())
    assert not any(n.startswith(("docs/", "tests/")) for n in names)
    assert ".gitignore" not in names
    # every module of the packages the ServerApp and ClientApp import, and every config file
    for package in ("fedapps", "strategies", "clients", "simulations"):
        modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / package).rglob("*.py")
                   if "__pycache__" not in p.parts}
        assert modules and modules <= names, sorted(modules - names)[:5]
    configs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "conf").rglob("*.yaml")}
    assert configs and configs <= names, sorted(configs - names)[:5]
    assert {"pyproject.toml", "README.md", "LICENSE"} <= names


def test_fab_cost_compares_the_fab_with_and_without_the_exclusion(tmp_path, monkeypatch):
    """simulations/fab_cost.py's two bundles differ by exactly the excluded files."""
    from simulations.fab_cost import fabs, install_seconds

    bundles = fabs()
    names = {k: set(zipfile.ZipFile(io.BytesIO(v)).namelist()) for k, v in bundles.items()}
    dropped = names["without fab-exclude"] - names["as built"]
    assert names["as built"] < names["without fab-exclude"]
    assert dropped and all(n.startswith(("docs/", "tests/")) for n in dropped)
    assert "docs/RESULTS.md" in dropped and "tests/inprocess.py" in dropped
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    times = install_seconds(bundles, repeats=1)
    assert len(list((tmp_path / "apps").iterdir())) == 2  # both installed, here only
    assert all(len(t) == 1 and t[0] > 0 for t in times.values())
