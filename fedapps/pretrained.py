"""VGG-19's conv layers and their ImageNet weights (seed 003 transfer models, seed 004 feature
clusters), the weights from the local torch cache only.

Machines here are offline and CI never downloads: the weights are read from torchvision's
usual file, `$TORCH_HOME/hub/checkpoints/vgg19-dcbb9e9d.pth` (torch.hub.get_dir(); put it
there with `torchvision.models.vgg19(weights="IMAGENET1K_V1")` on a machine with internet).
A missing file, or one whose SHA-256 does not start with the prefix in its name (torch.hub's
convention: `vgg19-dcbb9e9d.pth` is the file torchvision published), is a one-line ConfigError,
checked by validation before anything starts: `model.pretrained=true` (or the FedAIoT
`data.fedaiot.cluster-features=vgg19`) never runs silently from a random initialization or from
a file that is not the published one. Only then is it read, with torch.load(weights_only=True):
tensors only, no arbitrary objects. Leaf module (torch only), so the data layer may use it.
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


VGG19_LAYERS = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
                512, 512, 512, 512, "M", 512, 512, 512, 512, "M")  # torchvision's cfg "E"
# torchvision's ImageNet input statistics (on the [0, 1] scale), for inputs fed to these weights
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def vgg19_features() -> nn.Sequential:
    """VGG-19's 16 conv layers (3x3, ReLU) and 5 max-pools, with torchvision's layer indices
    (so ImageNet weights load by name) and torchvision's random initialization."""
    layers: list[nn.Module] = []
    channels = 3
    for v in VGG19_LAYERS:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
            continue
        conv = nn.Conv2d(channels, int(v), 3, padding=1)
        nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(conv.bias)
        layers += [conv, nn.ReLU(inplace=True)]
        channels = int(v)
    return nn.Sequential(*layers)


def check_vgg19_weights(path: Path | None = None, setting: str = "model.pretrained=true",
                        instead: str = "set model.pretrained=false") -> Path:
    """The weights file, present and with the SHA-256 its name promises; else a one-line
    ConfigError naming the `setting` that needs it, where to put it, or what to set `instead`."""
    path = path or vgg19_weights_path()
    fix = ("put torchvision's file there (torchvision.models.vgg19(weights='IMAGENET1K_V1') on a "
           f"machine with internet) or {instead}")
    if not path.is_file():
        raise ConfigError(f"{setting}: no ImageNet weights at {path}; {fix}")
    expected = path.stem.rsplit("-", 1)[-1]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if not digest.startswith(expected):
        raise ConfigError(f"{setting}: {path} has SHA-256 {digest[:16]}..., not the "
                          f"published {expected}...; {fix}")
    return path


def load_vgg19_features(features: nn.Module, setting: str = "model.pretrained=true",
                        instead: str = "set model.pretrained=false") -> None:
    """Load the conv layers' ImageNet weights into `features` (torchvision's layer indices)."""
    state = torch.load(check_vgg19_weights(None, setting, instead), map_location="cpu",
                       weights_only=True)
    features.load_state_dict({k[len("features."):]: v for k, v in state.items()
                              if k.startswith("features.")})
