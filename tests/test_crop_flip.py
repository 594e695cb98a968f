"""The `crop-flip` transform (seed 004's CIFAR RandomCrop(32, 4) + horizontal flip): the batch
computation against a per-sample torchvision computation, seeding, training only."""

import pytest
import torch
from torch import nn
from torchvision.transforms.v2 import functional as TF

from clients.arrays import get_arrays
from clients.base import BaseClient, TrainSettings
from fedapps.config import ConfigError
from fedapps.data import apply_transforms, federated_data
from fedapps.data.crop_flip import CropFlip, crop_flip, draw
from fedapps.validation import resolve_config

FILL = torch.tensor([-1.5, 0.25, 2.0])  # per channel, as the normalized value of black


def per_sample(images, top, left, flips, padding, fill):
    """Independent computation: one image at a time, torchvision's pad, crop and flip."""
    out = []
    for img, t, lft, f in zip(images, top.tolist(), left.tolist(), flips.tolist(), strict=True):
        padded = torch.stack([TF.pad(ch[None], [padding], fill=float(v))[0]
                              for ch, v in zip(img, fill, strict=True)])
        crop = TF.crop(padded, t, lft, img.shape[1], img.shape[2])
        out.append(TF.horizontal_flip(crop) if f else crop)
    return torch.stack(out)


@pytest.mark.parametrize("padding", [4, 1, 0])
def test_batch_crop_flip_equals_torchvision_per_sample(padding):
    images = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    top, left, flips = draw(64, padding, True, torch.Generator().manual_seed(2))
    assert int(top.min()) >= 0 and int(top.max()) <= 2 * padding
    if padding == 4:  # the draws reach both ends and both flip states
        assert {int(top.min()), int(top.max())} == {0, 8} and 0 < int(flips.sum()) < 64
    got = crop_flip(images, top, left, flips, padding, FILL)
    assert torch.equal(got, per_sample(images, top, left, flips, padding, FILL))


def test_crop_flip_is_seeded_by_the_clients_generator():
    x = torch.randn(20, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    idx = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    aug = CropFlip(4, True, FILL)
    a = aug(x, idx, torch.Generator().manual_seed(7))
    b = aug(x, idx, torch.Generator().manual_seed(7))
    c = aug(x, idx, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    no_flip = CropFlip(0, False, FILL)(x, idx, torch.Generator().manual_seed(7))
    assert torch.equal(no_flip, x[idx])  # padding 0, no flip: the identity


class Recorder(nn.Module):
    """A linear model on 8x8 digits that records every input batch it sees."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(64, 10)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        return self.fc(x.flatten(1))


def _client(data):
    return BaseClient(Recorder(), data, TrainSettings(1, 16, 0.05, 0.9, 0.0, 0), 0)


def test_crop_flip_augments_training_batches_only_and_repeats_per_seed():
    cfg = resolve_config("quickstart", ["data.transforms=[crop-flip]",
                                        "data.crop-flip.padding=2"], check_data=False)
    fd = federated_data(cfg)
    plain, data = fd.client(0), apply_transforms(cfg, fd, 0)
    assert torch.equal(data.x_train, plain.x_train) and torch.equal(data.x_test, plain.x_test)
    client = _client(data)
    arrays = get_arrays(client.model)
    trained, _, _ = client.fit(arrays, {"server-round": 1})
    rows = {tuple(r.flatten().tolist()) for r in plain.x_train}
    batches = torch.cat(client.model.seen)
    assert len(batches) == len(plain.y_train)
    augmented = sum(tuple(r.flatten().tolist()) not in rows for r in batches)
    assert augmented > len(batches) // 2  # most rows shifted or flipped
    client.model.seen.clear()
    client.evaluate(arrays, {"server-round": 1})
    assert torch.equal(torch.cat(client.model.seen), plain.x_test)  # evaluation: untouched
    again = _client(apply_transforms(cfg, fd, 0)).fit(arrays, {"server-round": 1})[0]
    assert all(torch.equal(torch.as_tensor(a), torch.as_tensor(b))
               for a, b in zip(trained, again, strict=True))  # same seed, same numbers
    unaugmented = _client(plain).fit(arrays, {"server-round": 1})[0]
    assert not all(torch.equal(torch.as_tensor(a), torch.as_tensor(b))
                   for a, b in zip(trained, unaugmented, strict=True))


def test_crop_flip_needs_images():
    with pytest.raises(ConfigError, match="crop-flip does not fit dataset diabetes"):
        resolve_config("regression-quick", ["data.transforms=[crop-flip]"], check_data=False)
