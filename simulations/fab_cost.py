"""What the app bundle (FAB) costs a node: its bytes, and the time Flower's `install_from_fab`
takes for it once it is installed, which a ClientApp process started per message (`fedapps node
--cold`, Flower's default) pays for every message: it unzips and hashes every file of the FAB
before it finds the install there. The project's FAB as built (pyproject's `fab-exclude`)
against the same files without that exclusion, timed interleaved in one process:

    python -m simulations.fab_cost [--repeats 30]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[1]


def fabs(root: Path = ROOT) -> dict[str, bytes]:
    """{"without fab-exclude": ..., "as built": ...}: the project's FAB both ways."""
    from flwr.cli.build import build_fab_from_files
    from flwr.cli.utils import collect_files

    files: dict[str, bytes | Path] = dict(collect_files(root))
    config = tomllib.loads((root / "pyproject.toml").read_text())
    config["tool"]["flwr"]["app"].pop("fab-exclude", None)
    everything = {**files, "pyproject.toml": tomli_w.dumps(config).encode()}
    return {"without fab-exclude": build_fab_from_files(everything)[0],
            "as built": build_fab_from_files(files)[0]}


def install_seconds(bundles: dict[str, bytes], repeats: int) -> dict[str, list[float]]:
    """Each bundle's `install_from_fab` time when it is installed already, interleaved."""
    from flwr.cli.install import install_from_fab

    with contextlib.redirect_stdout(io.StringIO()):  # Flower's "Successfully installed"
        for fab in bundles.values():
            install_from_fab(fab, skip_prompt=True)
    times: dict[str, list[float]] = {name: [] for name in bundles}
    for _ in range(repeats):
        for name, fab in bundles.items():
            start = time.perf_counter()
            install_from_fab(fab, skip_prompt=True)
            times[name].append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1")
    bundles = fabs()
    with tempfile.TemporaryDirectory() as home:
        os.environ["FLWR_HOME"] = home  # installs go here, not into the user's Flower home
        times = install_seconds(bundles, args.repeats)
    base = statistics.median(times["without fab-exclude"])
    print("| FAB | files | bytes | install_from_fab, installed (median) | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for name, fab in bundles.items():
        files = len(zipfile.ZipFile(io.BytesIO(fab)).namelist())
        median = statistics.median(times[name])
        print(f"| {name} | {files} | {len(fab):,} | {1000 * median:.0f} ms | "
              f"{median / base:.2f} |")


if __name__ == "__main__":
    main()
