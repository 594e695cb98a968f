"""The VGG-19 transfer models of seed 003 (s.4.1, s.4.2): parameter counts against hand-computed
values, frozen conv layers (not trained, listed as frozen), ImageNet weights read from the local
file and the offline fallback (one warning, random initialization)."""

import pytest
import torch

import fedapps.pretrained as pretrained
from fedapps.errors import ConfigError
from fedapps.models import build_model, frozen_names, vgg19_features

# sum over VGG-19's 16 conv layers of (9 c_in + 1) c_out, written out layer by layer
CONV = ((9 * 3 + 1) * 64 + (9 * 64 + 1) * 64 + (9 * 64 + 1) * 128 + (9 * 128 + 1) * 128
        + (9 * 128 + 1) * 256 + 3 * (9 * 256 + 1) * 256
        + (9 * 256 + 1) * 512 + 3 * (9 * 512 + 1) * 512 + 4 * (9 * 512 + 1) * 512)
HEAD_224 = (512 * 7 * 7 * 1024 + 1024) + (1024 * 256 + 256) + (256 * 31 + 31)
HEAD_CIFAR = (512 * 512 + 512) + (512 * 512 + 512) + (512 * 10 + 10)


def count(model, trainable=None):
    return sum(p.numel() for p in model.parameters()
               if trainable is None or p.requires_grad == trainable)


def test_vgg19_on_224_has_the_thesis_head_and_frozen_convs():
    assert CONV == 20_024_384 and HEAD_224 == 25_961_503  # the spec's "about 25.96 M"
    model = build_model("vgg19", (3, 224, 224), 31, head_depth=3)
    assert count(model) == CONV + HEAD_224
    assert count(model, trainable=True) == HEAD_224
    assert count(model, trainable=False) == CONV
    assert len(frozen_names(model)) == 32  # 16 conv layers: weight and bias
    dropouts = [m.p for m in model.head if isinstance(m, torch.nn.Dropout)]
    assert dropouts == [0.5, 0.5]  # after the first two FC layers, none after the last


def test_vgg19_cifar_head_trains_and_the_convs_do_not_move():
    model = build_model("vgg19-cifar", (3, 32, 32), 10, head_depth=2)
    assert count(model) == CONV + HEAD_CIFAR and count(model, True) == HEAD_CIFAR
    assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
    conv, fc = model.base[0][0].weight, model.head[0].weight
    before = conv.detach().clone(), fc.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    features = torch.randn(1, 512, 1, 1)  # what the conv layers give on 32x32
    torch.nn.functional.cross_entropy(model.head(model.base[1:](features)),
                                      torch.tensor([1])).backward()
    opt.step()
    assert torch.equal(conv, before[0]) and conv.grad is None
    assert not torch.equal(fc, before[1])
    assert "base.0.0.weight" in frozen_names(model)
    assert not any(k.startswith(("base.2.", "head.")) for k in frozen_names(model))


def test_imagenet_weights_come_from_the_local_file_and_must_be_the_published_one(
        tmp_path, monkeypatch):
    """Missing, or not the file its name's SHA-256 prefix promises: one-line ConfigError (a
    pretrained run never starts from random or foreign weights); the right file loads."""
    import hashlib

    missing = tmp_path / pretrained.VGG19_FILE
    with pytest.raises(ConfigError, match="no ImageNet weights at .*model.pretrained=false"):
        pretrained.check_vgg19_weights(missing)
    source = vgg19_features()
    blob = tmp_path / "blob.pth"
    torch.save({**{f"features.{k}": v for k, v in source.state_dict().items()},
                "classifier.0.weight": torch.zeros(2, 2)}, blob)
    blob.rename(missing)  # named vgg19-dcbb9e9d.pth, but not torchvision's bytes
    with pytest.raises(ConfigError, match="has SHA-256 .* not the published dcbb9e9d") as err:
        pretrained.check_vgg19_weights(missing)
    assert "\n" not in str(err.value)
    good = tmp_path / f"vgg19-{hashlib.sha256(missing.read_bytes()).hexdigest()[:8]}.pth"
    missing.rename(good)
    monkeypatch.setattr(pretrained, "vgg19_weights_path", lambda: good)
    model = build_model("vgg19-cifar", (3, 32, 32), 10, 3, pretrained=True)
    for k, v in source.state_dict().items():
        assert torch.equal(model.base[0].state_dict()[k], v)


def test_pretrained_is_refused_for_models_without_weights():
    from fedapps.config import load_config
    from fedapps.validation import validate

    with pytest.raises(ConfigError, match="model.pretrained=True: only vgg19, vgg19-cifar"):
        validate(load_config("quickstart", ["model.pretrained=true"]), check_data=False)
    with pytest.raises(ConfigError, match="VGG-19 needs"):
        validate(load_config("quickstart", ["model.name=vgg19"]), check_data=False)


def test_pretrained_runs_normalize_with_imagenet_statistics():
    """ImageNet weights expect ImageNet's channel statistics, not the pool's (issue 14 item 7);
    the partition itself is the same file as without pretraining."""
    import numpy as np

    from fedapps.config import load_config
    from fedapps.data import Pool, make_federated, partition_key

    plain = partition_key(load_config("seed3-office31", ["model.pretrained=false"]))
    pre = partition_key(load_config("seed3-office31", ["model.pretrained=true"]))
    assert "normalization" not in plain and pre == {**plain, "normalization": "imagenet"}
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.integers(0, 256, size=(40, 3, 4, 4), dtype=np.uint8))
    pool = Pool(x, torch.arange(40) % 2, 40, 2)
    k = {"dataset": "rgb", "pool": "merged", "partitioner": "iid", "params": {},
         "test_fraction": 0.25, "num_clients": 2, "seed": 0, "version": 2}
    own = make_federated(pool, k, cache=False)
    imagenet = make_federated(pool, {**k, "normalization": "imagenet"}, cache=False)
    assert [t.tolist() for t in own.train_idx] == [t.tolist() for t in imagenet.train_idx]
    white = torch.full((1, 3, 1, 1), 255, dtype=torch.uint8)
    expected = [(1 - m) / s for m, s in zip((0.485, 0.456, 0.406), (0.229, 0.224, 0.225),
                                            strict=True)]
    assert torch.allclose(imagenet.norm.inputs(white).flatten(), torch.tensor(expected))
    assert not torch.allclose(own.norm.inputs(white).flatten(), torch.tensor(expected))
