"""FedAIoT sources (seed 004 chapter 2): IoT datasets read from their public raw formats.

Each module reads one dataset's raw files, preprocesses them as the thesis says, caches the
resulting arrays (`common.cached_arrays`, keyed by the raw files' names, sizes and mtimes) and
registers a `DatasetInfo` in `DATASETS`. A missing dataset is one line naming the expected layout
under the data root and where the data comes from (`common.require`).
"""

from __future__ import annotations

from fedapps.data.iot import (  # noqa: F401  (each module registers its datasets)
    aep,
    casas,
    epic_sounds,
    ut_har,
    visdrone,
    widar,
    wisdm,
)
