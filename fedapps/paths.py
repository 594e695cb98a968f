"""Where things live on disk: the conf/ directory and the data root (a leaf module)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def data_root(cfg: Any) -> Path:
    """The data root: config `data.data-root`, then $FEDAPPS_DATA_ROOT, then ./data."""
    root = cfg.data["data-root"] or os.environ.get("FEDAPPS_DATA_ROOT") or "data"
    return Path(str(root)).expanduser().resolve()
