"""YOLOv8 for seed 004's VisDrone row (Table 2.2: YOLOv8n, Ultralytics' default, depth 0.33,
width 0.25), built from Ultralytics' model definition and trained with its detection loss.

Ultralytics (AGPL-3.0) is an optional dependency (`pip install -e ".[detection]"`), imported
only when a detector is built. We use three of its pieces: the network (`DetectionModel`
from `yolov8n.yaml`, random initialization: no pretrained weights are fetched), the loss
(`v8DetectionLoss`: box, class and DFL terms with the reference's gains 7.5 / 0.5 / 1.5) and,
in tests only, its AP function as the independent check of fedapps/detection.py. Training
loop, NMS, matching and mAP are ours.

Loss scale: Ultralytics' loss is the per-image loss times the batch size (the reference
trains on that with client lr 0.1); `Detection.loss` takes the mean over images, as every other
task here, so train.lr means the same across tasks (x batch size for the reference's step).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from fedapps.errors import ConfigError
from fedapps.splitnet import SplitNet

LOSS_GAINS = SimpleNamespace(box=7.5, cls=0.5, dfl=1.5)  # the reference's YOLO_HYPERPARAMETERS


@dataclass
class DetectorOutput:
    """What a detector returns: its raw head output (what the loss reads), in eval mode the
    decoded boxes [B, 4 + C, anchors] (centre-size, pixels; class probabilities), the loss
    bound to the model and the input side in pixels (targets are fractions of it)."""

    raw: Any
    decoded: torch.Tensor | None
    criterion: Any
    image_side: float

    def float(self) -> DetectorOutput:
        """float32 decoded boxes (evaluation in a half precision sums in float32)."""
        decoded = self.decoded.float() if self.decoded is not None else None
        return DetectorOutput(self.raw, decoded, self.criterion, self.image_side)


INSTALL = "pip install -e \".[detection]\" (or pip install 'ultralytics>=8.3,<9')"


def ultralytics_installed() -> bool:
    """Whether Ultralytics can be imported here (checked before a run starts)."""
    return importlib.util.find_spec("ultralytics") is not None


def _ultralytics() -> Any:
    try:
        os.environ.setdefault("YOLO_VERBOSE", "False")
        from ultralytics.nn import tasks
        from ultralytics.utils import loss
    except ImportError:
        raise ConfigError(f"model.name=yolov8n needs Ultralytics: {INSTALL}") from None
    return tasks, loss


class YoloV8(nn.Module):
    """An Ultralytics YOLOv8 detector whose forward returns a DetectorOutput."""

    def __init__(self, num_classes: int, scale: str = "n") -> None:
        super().__init__()
        tasks, _ = _ultralytics()
        self.net = tasks.DetectionModel(f"yolov8{scale}.yaml", ch=3, nc=num_classes,
                                        verbose=False)
        self.net.args = LOSS_GAINS
        self._criterion: Any = None
        self._criterion_device: torch.device | None = None

    def criterion(self) -> Any:
        """The detection loss bound to this model, rebuilt when the model changes device."""
        device = next(self.parameters()).device
        if self._criterion is None or self._criterion_device != device:
            _, loss = _ultralytics()
            self._criterion = loss.v8DetectionLoss(self.net)
            self._criterion_device = device
        return self._criterion

    def forward(self, x: torch.Tensor) -> DetectorOutput:  # type: ignore[override]
        raw = self.net(x)
        decoded = raw[0] if isinstance(raw, tuple) else None
        return DetectorOutput(raw, decoded, self.criterion(), float(x.shape[-1]))


def yolov8n(in_shape: tuple[int, ...], num_classes: int, head_depth: int) -> SplitNet:
    """YOLOv8n for square RGB images whose side is a multiple of 32. One piece (its layers
    route skip connections between stages), so the SplitNet's base is empty and algorithms
    that split base and head do not take it (registry: tasks)."""
    if len(in_shape) != 3 or in_shape[0] != 3 or in_shape[1] % 32 or in_shape[2] % 32:
        raise ConfigError(f"model.name=yolov8n: needs [3, H, W] images with H and W multiples "
                          f"of 32 (this dataset's are {list(in_shape)})")
    return SplitNet(nn.Identity(), YoloV8(num_classes))
