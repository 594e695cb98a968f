"""ImageNet weights for the VGG-19 transfer model (seed 003), from the local torch cache only.

Machines here are offline and CI never downloads: the weights are read from torchvision's
usual file, `$TORCH_HOME/hub/checkpoints/vgg19-dcbb9e9d.pth` (torch.hub.get_dir(); put it
there with `torchvision.models.vgg19(weights="IMAGENET1K_V1")` on a machine with internet).
A missing file, or one whose SHA-256 does not start with the prefix in its name (torch.hub's
convention: `vgg19-dcbb9e9d.pth` is the file torchvision published), is a one-line ConfigError,
checked by validation before anything starts: `model.pretrained=true` never runs silently from
a random initialization or from a file that is not the published one. Only then is it read,
with torch.load(weights_only=True): tensors only, no arbitrary objects.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from fedapps.errors import ConfigError

VGG19_FILE = "vgg19-dcbb9e9d.pth"  # torchvision's VGG19_Weights.IMAGENET1K_V1


def vgg19_weights_path() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / VGG19_FILE


def check_vgg19_weights(path: Path | None = None) -> Path:
    """The weights file, present and with the SHA-256 its name promises; else a one-line
    ConfigError saying where to put it."""
    path = path or vgg19_weights_path()
    fix = ("put torchvision's file there (torchvision.models.vgg19(weights='IMAGENET1K_V1') on a "
           "machine with internet) or set model.pretrained=false")
    if not path.is_file():
        raise ConfigError(f"model.pretrained=true: no ImageNet weights at {path}; {fix}")
    expected = path.stem.rsplit("-", 1)[-1]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if not digest.startswith(expected):
        raise ConfigError(f"model.pretrained=true: {path} has SHA-256 {digest[:16]}..., not the "
                          f"published {expected}...; {fix}")
    return path


def load_vgg19_features(features: nn.Module) -> None:
    """Load the conv layers' ImageNet weights into `features` (torchvision's layer indices)."""
    state = torch.load(check_vgg19_weights(), map_location="cpu", weights_only=True)
    features.load_state_dict({k[len("features."):]: v for k, v in state.items()
                              if k.startswith("features.")})
