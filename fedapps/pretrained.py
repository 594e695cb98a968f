"""ImageNet weights for the VGG-19 transfer model (seed 003), from the local torch cache only.

Machines here are offline and CI never downloads: the weights are read from torchvision's
usual file, `$TORCH_HOME/hub/checkpoints/vgg19-dcbb9e9d.pth` (torch.hub.get_dir(); put it
there with `torchvision.models.vgg19(weights="IMAGENET1K_V1")` on a machine with internet).
When it is absent the model keeps its seeded random initialization and one warning says so.
The file is read with torch.load(weights_only=True): tensors only, no arbitrary objects.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

VGG19_FILE = "vgg19-dcbb9e9d.pth"  # torchvision's VGG19_Weights.IMAGENET1K_V1
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # the normalization the ImageNet weights expect
IMAGENET_STD = (0.229, 0.224, 0.225)


def vgg19_weights_path() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / VGG19_FILE


def load_vgg19_features(features: nn.Module) -> bool:
    """Load the conv layers' ImageNet weights into `features` (torchvision's layer indices);
    False, with one warning, when the file is not there."""
    path = vgg19_weights_path()
    if not path.is_file():
        warnings.warn(f"model.pretrained=true: no ImageNet weights at {path} (offline); "
                      "VGG-19 starts from random initialization", stacklevel=2)
        return False
    state = torch.load(path, map_location="cpu", weights_only=True)
    features.load_state_dict({k[len("features."):]: v for k, v in state.items()
                              if k.startswith("features.")})
    return True
