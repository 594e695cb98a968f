"""Checks of this machine before a run starts.

Why: a config can be valid and still fail on the machine that runs it: an output folder that
cannot be written, `device=cuda` without a GPU, a truncated checkpoint to resume from. Inside
Flower these surfaced 20-40 s later as a ServerApp traceback; checked here first they are one
line and exit code 2 (ConfigError), before any process starts. fedapps.validation checks the
values themselves (and runs on every node too); these checks are for the launching machine.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from fedapps import checkpoint
from fedapps.errors import ConfigError


def check_output_dir(path: Path, key: str = "output.output-dir") -> None:
    """`path` exists as a folder (made here if missing) and a file can be written in it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".fedapps-write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ConfigError(f"{key}={str(path)!r}: cannot write there ({reason})") from None


def check_device(device: str, precision: str = "fp32") -> None:
    """`device=cuda` needs a CUDA GPU on this machine (`auto` falls back to the CPU), and
    `train.precision` must run on the device (bf16 on a GPU without bfloat16)."""
    if device != "cuda" and precision == "fp32":
        return
    import torch  # only when a GPU or a low precision is asked for

    from fedapps.precision import check_supported

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda': no CUDA GPU on this machine "
                          "(torch.cuda.is_available() is False); use device=auto or cpu")
    resolved = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    check_supported(precision, resolved)


def check_run(cfg: DictConfig, run_dir: Path) -> None:
    """Everything a run of `cfg` into `run_dir` needs from this machine: a writable output
    folder, the device, and for a resume a checkpoint that loads."""
    check_output_dir(run_dir.parent)
    check_device(str(cfg.device), str(cfg.train.get("precision", "fp32")))
    # checkpoint.load raises a one-line ConfigError for a damaged file
    if cfg.output.get("resume") and checkpoint.load(run_dir) is None:
        raise ConfigError(f"output.resume=true: no {checkpoint.FILE} in {run_dir}")
