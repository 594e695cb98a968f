"""Finished runs in their kept form: what docs/results/<grid>/<cell>-s<seed>/ holds.

A run directory in outputs/ holds checkpoints, logs and plots besides its numbers; what a
results page needs to be checked and replotted later is config.yaml, metrics.csv and
results.json, the last gzipped (to about an eighth: a 12-round, 20-client run's 64 KB keep as
8 KB). The grid runner reads either form, so `fedapps reproduce GRID --table-only
--output-dir docs/results` rebuilds a page's tables and plots from the kept files alone.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any

RESULTS, KEPT_RESULTS = "results.json", "results.json.gz"
KEPT_FILES = ("config.yaml", "metrics.csv")  # copied as they are, when present


def read_results(run_dir: Path) -> dict[str, Any] | None:
    """The run's results.json, or its gzipped kept copy when only that exists; None when
    neither can be read as JSON (absent, half written, corrupt)."""
    try:
        if (run_dir / RESULTS).is_file():
            text = (run_dir / RESULTS).read_text()
        else:
            text = gzip.decompress((run_dir / KEPT_RESULTS).read_bytes()).decode()
        doc = json.loads(text)
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def keep_run(run_dir: Path, kept_dir: Path) -> bool:
    """Copy a finished run into `kept_dir` in the kept form; False (and nothing written) when
    `kept_dir` already holds a kept run, so keeping again never replaces what a page cites.

    results.json.gz is written last and renamed into place: a keep cut short leaves no file
    the grid runner would take for a finished run. The gzip header carries no name or time,
    so keeping the same run twice gives the same bytes.
    """
    if (kept_dir / KEPT_RESULTS).exists() or (kept_dir / RESULTS).exists():
        return False
    kept_dir.mkdir(parents=True, exist_ok=True)
    for name in KEPT_FILES:
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, kept_dir / name)
    if (run_dir / RESULTS).is_file():
        packed = gzip.compress((run_dir / RESULTS).read_bytes(), compresslevel=9, mtime=0)
    else:  # kept already (a kept folder copied on): as it is
        packed = (run_dir / KEPT_RESULTS).read_bytes()
    tmp = kept_dir / f".{KEPT_RESULTS}.tmp"
    tmp.write_bytes(packed)
    os.replace(tmp, kept_dir / KEPT_RESULTS)
    return True
