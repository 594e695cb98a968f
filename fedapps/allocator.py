"""Keep glibc's malloc from handing a batch's freed activations back to the OS every batch.

glibc serves a large allocation with its own mmap until one such block has been freed, then
raises its threshold to that block's size (for blocks up to 32 MB on 64-bit) and returns the
heap's free top to the OS whenever it exceeds twice the threshold. Which state a process is in
depends on what it happened to allocate and free before. A process still near the defaults
returns the evaluation loop's activations (the ConvNet's first convolution alone: 9.4 MB at
batch 64) to the OS after every batch and page-faults them back in at the next: on the FMNIST
preset a deployed node's client evaluation of ~1,000 examples took a median 61,000-71,000 minor
faults and 0.16-0.17 of its 0.41-0.45 CPU seconds in the kernel (docs/PERFORMANCE.md, "Page
faults at evaluation"). A node's ClientApp evaluates a few times in a run; a simulation's Ray
worker evaluates many times, and stops faulting once some large enough block has raised
glibc's thresholds.

`keep_freed_memory()` starts every process where glibc's own adaptation ends up: allocations
up to 32 MB from the heap, and up to 64 MB of free heap kept for the next batch. Resident memory
between tasks can stay up to that much higher (measured: 679-690 MB after an evaluation where
it was 657-678); the peak moved by less (672-682 -> 679-690 MB).
"""

from __future__ import annotations

import ctypes
import os
import platform

# glibc's malloc.h
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
# glibc's largest dynamic mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX), and the trim
# threshold it pairs with it (twice the mmap threshold)
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
# the user's own settings of what this sets or of what turns glibc's adaptation off (each as
# an environment variable and as a GLIBC_TUNABLES name), which this leaves alone
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                 "MALLOC_MMAP_MAX_")
USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold",
                 "glibc.malloc.top_pad", "glibc.malloc.mmap_max")

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Set glibc's thresholds once per process; True if they are set (now or before). False on
    a C library other than glibc (macOS, musl), on 32-bit, or where the user set their own."""
    global _applied
    if _applied is None:
        _applied = _set_thresholds()
    return _applied


def _set_thresholds() -> bool:
    if platform.libc_ver()[0] != "glibc" or ctypes.sizeof(ctypes.c_void_p) < 8:
        return False
    if any(name in os.environ for name in USER_SETTINGS) or user_tunables():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # this process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; glibc up to 2.34 refuses an mmap threshold above 32 MB:
    # set it first, so that a refusal leaves nothing half set
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


def user_tunables() -> bool:
    """Whether GLIBC_TUNABLES (name=value pairs joined by ':') sets one of USER_TUNABLES."""
    pairs = os.environ.get("GLIBC_TUNABLES", "").split(":")
    return any(pair.split("=", 1)[0].strip() in USER_TUNABLES for pair in pairs)
