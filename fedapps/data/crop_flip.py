"""The `crop-flip` transform: the FedRolex/HeteroFL code's CIFAR training augmentation (seed 004
A10: RandomCrop(32, padding=4) + RandomHorizontalFlip), redrawn for every training batch.

Tensor ops on the whole batch (no per-sample Python, no PIL): each image is padded by
`padding` pixels of black (0 in pixel space, i.e. the normalized value of 0, since the reference
pads the image before ToTensor/Normalize), cut at a random offset in [0, 2 * padding] per axis
(torchvision's RandomCrop on the padded image) and flipped left-right with probability 1/2.
The draws come from the client's batch generator, so a round's batches depend only on (seed,
round, client). Only training batches of the train split are augmented (`augment_rows`, read
by `BaseClient.sgd_epochs`); evaluation never sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedapps.data.params import Param

if TYPE_CHECKING:
    from fedapps.data import ClientData
    from fedapps.data.transforms import TransformContext

Augment = Callable[[torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]

PARAMS = (
    Param("padding", "data.crop-flip.padding", int, 4, low=0,
          doc="pixels of black padding before the random crop back to the image size"),
    Param("flip", "data.crop-flip.flip", bool, True,
          doc="also flip left-right with probability 1/2"),
)


def draw(batch: int, padding: int, flip: bool, generator: torch.Generator
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per image: the crop's top and left offsets in the padded image, and whether to flip."""
    top = torch.randint(0, 2 * padding + 1, (batch,), generator=generator)
    left = torch.randint(0, 2 * padding + 1, (batch,), generator=generator)
    flips = torch.rand(batch, generator=generator) < 0.5 if flip else \
        torch.zeros(batch, dtype=torch.bool)
    return top, left, flips


def crop_flip(images: torch.Tensor, top: torch.Tensor, left: torch.Tensor, flips: torch.Tensor,
              padding: int, fill: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] images padded with the per-channel `fill`, cropped at (top, left) to H x W
    and flipped where `flips`: one gather over the batch."""
    b, c, h, w = images.shape
    dev = images.device
    padded = fill.to(dev, images.dtype).reshape(1, c, 1, 1).expand(
        b, c, h + 2 * padding, w + 2 * padding).clone()
    padded[:, :, padding:padding + h, padding:padding + w] = images
    rows = top.to(dev)[:, None] + torch.arange(h, device=dev)  # [B, H]
    cols = left.to(dev)[:, None] + torch.arange(w, device=dev)  # [B, W]
    cols = torch.where(flips.to(dev)[:, None], cols.flip(1), cols)
    return padded[torch.arange(b, device=dev)[:, None, None, None],
                  torch.arange(c, device=dev)[None, :, None, None],
                  rows[:, None, :, None], cols[:, None, None, :]]


@dataclass(frozen=True)
class CropFlip:
    """`augment_rows` for the client loop: the batch (after an earlier transform's own
    augmentation, e.g. FedAug's copies) randomly cropped and flipped."""

    padding: int
    flip: bool
    fill: torch.Tensor  # per channel: the normalized value of a black pixel
    before: Augment | None = None

    def __call__(self, x: torch.Tensor, idx: torch.Tensor,
                 generator: torch.Generator) -> torch.Tensor:
        batch = x[idx] if self.before is None else self.before(x, idx, generator)
        top, left, flips = draw(len(batch), self.padding, self.flip, generator)
        return crop_flip(batch, top, left, flips, self.padding, self.fill)


def transform(ctx: TransformContext, data: ClientData) -> ClientData:
    """The `crop-flip` transform: adds (or wraps) the `augment_rows` extra; no data changes."""
    channels = int(data.x_train.shape[1])
    black = torch.zeros((1, channels, 1, 1), dtype=torch.uint8)
    fill = ctx.fd.normalize(black).reshape(channels).float()
    before = data.extras.get("augment_rows")
    return data.replace(extras={"augment_rows": CropFlip(int(ctx.params["padding"]),
                                                         bool(ctx.params["flip"]), fill,
                                                         before)})
