"""Models split into `base` (feature extractor) and `head` (the last `head_depth` FC layers).

Every model is a convolutional or flat feature stage followed by a stack of fully connected
layers; the head depth says how many of those FC layers form the head (seed 000 section 2).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from clients.arrays import get_arrays, set_arrays
from fedapps.iot_models import DETECTION_MODELS, IOT_INPUT_RANKS, IOT_MODELS, TOKEN_MODELS
from fedapps.pretrained import load_vgg19_features, vgg19_features
from fedapps.splitnet import SplitNet, layered

__all__ = ["DETECTION_MODELS", "IMAGE_MODELS", "IOT_INPUT_RANKS", "MODELS", "PRETRAINED_MODELS",
           "SplitNet", "build_model", "fc_depth", "frozen_names", "get_arrays", "set_arrays"]


def _fc_stack(dims: list[int], final_relu: bool) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        layers.append(nn.Linear(d_in, d_out))
        if final_relu or i < len(dims) - 2:
            layers.append(nn.ReLU())
    return layers


def _split(features: nn.Module, in_shape: tuple[int, ...], hidden: list[int], num_classes: int,
           head_depth: int) -> SplitNet:
    with torch.no_grad():
        flat = int(np.prod(features(torch.zeros(1, *in_shape)).shape[1:]))
    dims = [flat, *hidden, num_classes]
    n_fc = len(dims) - 1
    if not 1 <= head_depth <= n_fc:
        raise ValueError(f"head depth {head_depth} outside 1..{n_fc}")
    cut = n_fc - head_depth  # FC layers that stay in the base
    base = nn.Sequential(features, nn.Flatten(), *_fc_stack(dims[: cut + 1], final_relu=True))
    head = nn.Sequential(*_fc_stack(dims[cut:], final_relu=False))
    return SplitNet(base, head)


def convnet(in_shape: tuple[int, int, int], num_classes: int, head_depth: int) -> SplitNet:
    """FedDyn ConvNet: Conv5x5(64)-ReLU-Pool x2, FC 384, FC 192, FC C (seed 000 section 8)."""
    features = nn.Sequential(
        nn.Conv2d(in_shape[0], 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 5), nn.ReLU(), nn.MaxPool2d(2))
    return _split(features, in_shape, [384, 192], num_classes, head_depth)


def mlp(in_shape: tuple[int, int, int], num_classes: int, head_depth: int) -> SplitNet:
    """The seeds' DNN: input - 100 - C (3072-100-10 on CIFAR)."""
    return _split(nn.Identity(), in_shape, [100], num_classes, head_depth)


def digits_cnn(in_shape: tuple[int, int, int], num_classes: int, head_depth: int) -> SplitNet:
    """A small CNN for 8x8 digits, with the same three-FC layout as the ConvNet."""
    features = nn.Sequential(nn.Conv2d(in_shape[0], 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
    return _split(features, in_shape, [128, 64], num_classes, head_depth)


def _flat_size(features: nn.Module, in_shape: tuple[int, ...]) -> int:
    """Features per sample, probed in eval mode so BatchNorm's running statistics stay at
    their initial values."""
    features.eval()
    with torch.no_grad():
        flat = int(np.prod(features(torch.zeros(1, *in_shape)).shape[1:]))
    features.train()
    return flat


def thesis_mnist_cnn(in_shape: tuple[int, int, int], num_classes: int,
                     head_depth: int) -> SplitNet:
    """Seed 002 Appendix A MNIST_CNN (21,840 parameters on 28x28) with FLTK's forward: conv5(10)
    - pool - ReLU, conv5(20) - Dropout2d - pool - ReLU, FC 50 - ReLU - dropout, FC C. FLTK's final
    log_softmax is left out: the cross-entropy loss applies it, and log_softmax is idempotent, so
    loss and predictions are the same."""
    features = nn.Sequential(
        nn.Conv2d(in_shape[0], 10, 5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(10, 20, 5), nn.Dropout2d(), nn.MaxPool2d(2), nn.ReLU())
    flat = _flat_size(features, in_shape)
    return layered(features, [nn.Sequential(nn.Linear(flat, 50), nn.ReLU(), nn.Dropout()),
                               nn.Linear(50, num_classes)], head_depth)


def thesis_fmnist_cnn(in_shape: tuple[int, int, int], num_classes: int,
                      head_depth: int) -> SplitNet:
    """Seed 002 Appendix A FashionMNISTCNN (29,034 parameters on 28x28): two blocks of conv5
    (pad 2) - BatchNorm - ReLU - pool (the listing's repeated ReLUs are one: ReLU is idempotent),
    one FC layer; BatchNorm running statistics travel with the model (FLTK averages the whole
    state_dict)."""
    features = nn.Sequential(
        nn.Conv2d(in_shape[0], 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
    return layered(features, [nn.Linear(_flat_size(features, in_shape), num_classes)],
                    head_depth)


def thesis_cifar10_cnn(in_shape: tuple[int, int, int], num_classes: int,
                       head_depth: int) -> SplitNet:
    """Seed 002 Appendix A Cifar10CNN (551,466 parameters on 32x32) with FLTK's forward, quirks
    kept as section 7 reads them: conv3 - ReLU - BatchNorm (ReLU before BN) in three pairs, each
    pair followed by a pool; FC 128 with no activation; FC C; softmax on the output (the
    cross-entropy then applies log-softmax to probabilities, as FLTK trained it)."""
    layers: list[nn.Module] = []
    prev = in_shape[0]
    for width in (32, 64, 128):
        for _ in range(2):
            layers += [nn.Conv2d(prev, width, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(width)]
            prev = width
        layers.append(nn.MaxPool2d(2))
    features = nn.Sequential(*layers)
    flat = _flat_size(features, in_shape)
    return layered(features, [nn.Linear(flat, 128),
                               nn.Sequential(nn.Linear(128, num_classes), nn.Softmax(dim=1))],
                    head_depth)


def _vgg19_transfer(in_shape: tuple[int, int, int], num_classes: int, head_depth: int,
                    hidden: list[int], dropout: float, pretrained: bool,
                    freeze_features: bool) -> SplitNet:
    """VGG-19 conv layers (ImageNet weights when `pretrained` and the file is present) and a
    new FC stack; torchvision's 7x7 average pool is left out (the identity on 224x224, and on
    32x32 the thesis's 512-d features). Frozen features have requires_grad False: SGD skips
    them and `frozen_names` lists them, so they need not travel."""
    if in_shape[0] != 3 or in_shape[1] < 32 or in_shape[2] < 32:
        raise ValueError(f"VGG-19 needs [3, >=32, >=32] inputs, got {list(in_shape)}")
    features = vgg19_features()
    if pretrained:
        load_vgg19_features(features)
    features.requires_grad_(not freeze_features)
    dims = [512 * (in_shape[1] // 32) * (in_shape[2] // 32), *hidden, num_classes]
    n_fc = len(dims) - 1
    if not 1 <= head_depth <= n_fc:
        raise ValueError(f"head depth {head_depth} outside 1..{n_fc}")
    fc: list[list[nn.Module]] = []
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        block: list[nn.Module] = [nn.Linear(d_in, d_out)]
        if i < n_fc - 1:
            block.append(nn.ReLU())
            if dropout:
                block.append(nn.Dropout(dropout))
        fc.append(block)
    cut = n_fc - head_depth
    base = nn.Sequential(features, nn.Flatten(), *[m for b in fc[:cut] for m in b])
    head = nn.Sequential(*[m for b in fc[cut:] for m in b])
    return SplitNet(base, head)


def vgg19(in_shape: tuple[int, int, int], num_classes: int, head_depth: int,
          pretrained: bool = False, freeze_features: bool = True) -> SplitNet:
    """Seed 003 s.4.1 (domain shift): VGG-19 conv layers frozen, head FC 1024 - 256 - C with
    ReLU and dropout 0.5 after the first two (25088 features on 224x224 inputs)."""
    return _vgg19_transfer(in_shape, num_classes, head_depth, [1024, 256], 0.5, pretrained,
                           freeze_features)


def vgg19_cifar(in_shape: tuple[int, int, int], num_classes: int, head_depth: int,
                pretrained: bool = False, freeze_features: bool = True) -> SplitNet:
    """Seed 003 s.4.2 (CIFAR-10): VGG-19 conv layers, head FC 512 - 512 - C with ReLU and no
    dropout (none is mentioned); 512 features on 32x32 inputs."""
    return _vgg19_transfer(in_shape, num_classes, head_depth, [512, 512], 0.0, pretrained,
                           freeze_features)


MODELS: dict[str, tuple[Callable[..., SplitNet], int]] = {
    # name: (builder, number of FC layers = the largest head depth)
    "convnet": (convnet, 3),
    "mlp": (mlp, 2),
    "digits-cnn": (digits_cnn, 3),
    # seed 002 Appendix A (Cornelis 2022): the thesis's MNIST, Fashion-MNIST and CIFAR-10 CNNs
    "thesis-mnist-cnn": (thesis_mnist_cnn, 2),
    "thesis-fmnist-cnn": (thesis_fmnist_cnn, 1),
    "thesis-cifar10-cnn": (thesis_cifar10_cnn, 2),
    "vgg19": (vgg19, 3),
    "vgg19-cifar": (vgg19_cifar, 3),
    **IOT_MODELS,  # seed 004 FedAIoT (fedapps/iot_models.py)
}


# convolutions over [C, H, W] inputs
IMAGE_MODELS = ("convnet", "digits-cnn", "thesis-mnist-cnn", "thesis-fmnist-cnn",
                "thesis-cifar10-cnn", "vgg19", "vgg19-cifar")
PRETRAINED_MODELS = ("vgg19", "vgg19-cifar")  # take model.pretrained / model.freeze-features


def fc_depth(name: str) -> int:
    return MODELS[name][1]


def build_model(name: str, in_shape: tuple[int, ...], num_classes: int,
                head_depth: int, pretrained: bool = False,
                freeze_features: bool = True, vocab_size: int | None = None) -> SplitNet:
    if name in TOKEN_MODELS:
        if vocab_size is None:
            raise ValueError(f"model {name} embeds token ids: it needs the dataset's vocab_size")
        return MODELS[name][0](in_shape, num_classes, head_depth, vocab_size=vocab_size)
    if name in PRETRAINED_MODELS:
        return MODELS[name][0](in_shape, num_classes, head_depth, pretrained=pretrained,
                               freeze_features=freeze_features)
    if pretrained:
        raise ValueError(f"model {name} has no pretrained weights")
    return MODELS[name][0](in_shape, num_classes, head_depth)


def frozen_names(model: nn.Module) -> set[str]:
    """State entries that never change in training (parameters with requires_grad False):
    identical on every process, so an algorithm may leave them out of its traffic."""
    return {name for name, p in model.named_parameters() if not p.requires_grad}


class GpflNet(nn.Module):
    """A SplitNet plus GPFL's Global Category Embedding (GCE) and Conditional Valve (CoV)
    (Zhang et al. 2023): CoV(z, c) = ReLU(z * (gamma(c) + 1) + beta(c)), gamma and beta each
    Linear-ReLU-LayerNorm of the conditional input c. The conditional inputs are buffers so
    the server can aggregate them into the global model (seed 001 section 1.5)."""

    def __init__(self, net: SplitNet, num_classes: int) -> None:
        super().__init__()
        self.base = net.base
        self.head = net.head
        dim = next(m for m in net.head.modules() if isinstance(m, nn.Linear)).in_features
        self.gce = nn.Embedding(num_classes, dim)
        self.gamma = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm(dim))
        self.beta = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm(dim))
        self.register_buffer("generic_input", torch.zeros(dim))
        self.register_buffer("personal_input", torch.zeros(dim))

    def cov(self, z: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        return torch.relu(z * (self.gamma(condition) + 1) + self.beta(condition))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The global model: aggregated head on features valved by the aggregated input."""
        return self.head(self.cov(self.base(x), self.personal_input))


class Scaler(nn.Module):
    """HeteroFL's scaler: divide by the capacity beta in training, identity in evaluation, so a
    sub-model's activations match the full model's scale."""

    def __init__(self, beta: float) -> None:
        super().__init__()
        self.beta = beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.beta if self.training else x


class WidthCNN(nn.Module):
    """HeteroFL-style CNN whose every hidden layer has floor(beta * width) channels: blocks of
    Conv3x3 - Scaler - static BatchNorm (no running statistics) - ReLU - MaxPool, then global
    average pooling and a classifier that keeps all outputs (seed 004, DECISIONS)."""

    def __init__(self, in_channels: int, num_classes: int, hidden: tuple[int, ...],
                 beta: float = 1.0) -> None:
        super().__init__()
        widths = [max(1, int(np.floor(beta * h + 1e-9))) for h in hidden]
        layers: list[nn.Module] = []
        prev = in_channels
        for i, w in enumerate(widths):
            layers += [nn.Conv2d(prev, w, 3, padding=1), Scaler(beta),
                       nn.BatchNorm2d(w, momentum=None, track_running_stats=False), nn.ReLU()]
            if i < len(widths) - 1:
                layers.append(nn.MaxPool2d(2))
            prev = w
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(prev, num_classes)
        self.hidden = tuple(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    def param_groups(self) -> list[tuple[str | None, ...]]:
        return width_groups(self)

    def group_widths(self) -> dict[str, int]:
        return {f"w{h}": h for h in self.hidden}

    def layer_groups(self) -> tuple[list[tuple[str | None, ...]], dict[str, int]]:
        return layer_groups(self)


def _norm(channels: int) -> nn.Module:
    """Static BatchNorm (HeteroFL's sBN): no running statistics, batch statistics always."""
    return nn.BatchNorm2d(channels, momentum=None, track_running_stats=False)


class _PreActBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, beta: float) -> None:
        super().__init__()
        self.scale1, self.bn1 = Scaler(beta), _norm(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.scale2, self.bn2 = Scaler(beta), _norm(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.shortcut = (nn.Conv2d(c_in, c_out, 1, stride, bias=False)
                         if stride != 1 or c_in != c_out else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.scale1(x)))
        skip = self.shortcut(out) if self.shortcut is not None else x
        out = self.conv1(out)
        out = self.conv2(torch.relu(self.bn2(self.scale2(out))))
        return out + skip


class PreResNet18(nn.Module):
    """Pre-activation ResNet18 with width multiplier beta, a Scaler before every static
    BatchNorm (seed 004, DECISIONS); the classifier keeps all outputs."""

    def __init__(self, in_channels: int, num_classes: int,
                 hidden: tuple[int, ...] = (64, 128, 256, 512), beta: float = 1.0) -> None:
        super().__init__()
        w = [max(1, int(np.floor(beta * h + 1e-9))) for h in hidden]
        self.conv1 = nn.Conv2d(in_channels, w[0], 3, 1, 1, bias=False)
        blocks: list[nn.Module] = []
        prev = w[0]
        for i, c in enumerate(w):
            for j in range(2):
                blocks.append(_PreActBlock(prev, c, 2 if (i > 0 and j == 0) else 1, beta))
                prev = c
        self.layers = nn.Sequential(*blocks)
        self.scale_out, self.bn_out = Scaler(beta), _norm(prev)
        self.classifier = nn.Linear(prev, num_classes)
        self.hidden = tuple(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.conv1(x))
        out = torch.relu(self.bn_out(self.scale_out(out)))
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1))

    def param_groups(self) -> list[tuple[str | None, ...]]:
        return width_groups(self)

    def group_widths(self) -> dict[str, int]:
        return {f"w{h}": h for h in self.hidden}

    def layer_groups(self) -> tuple[list[tuple[str | None, ...]], dict[str, int]]:
        return layer_groups(self)


def width_groups(model: nn.Module) -> list[tuple[str | None, ...]]:
    """Width group of every dimension of every state entry of a full-width model: a layer with
    K channels is group 'wK' (so layers of equal width, joined by residual additions, share
    index sets); the first convolution keeps all input channels, the classifier all outputs."""
    kinds: dict[str, tuple[str, nn.Module]] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d | nn.BatchNorm2d | nn.Linear):
            kinds[name] = (type(module).__name__, module)
    first_conv = next(n for n, m in model.named_modules() if isinstance(m, nn.Conv2d))
    groups: list[tuple[str | None, ...]] = []
    for key, value in model.state_dict().items():
        owner, _, param = key.rpartition(".")
        kind, module = kinds[owner]
        if kind == "Linear":
            groups.append((None, f"w{module.in_features}") if param == "weight" else (None,))
        elif kind == "Conv2d" and param == "weight":
            inputs = None if owner == first_conv else f"w{module.in_channels}"
            groups.append((f"w{module.out_channels}", inputs, None, None))
        else:  # conv bias, norm weight and bias
            groups.append((f"w{value.shape[0]}",))
    return groups


def layer_groups(model: nn.Module) -> tuple[list[tuple[str | None, ...]], dict[str, int]]:
    """Per-layer groups (Federated Dropout's independent draws, as the FedRolex/HeteroFL code
    draws a subset per conv): every convolution's output channels are a group of their own,
    named by the layer, and what follows it in state order (its bias, the next norm, the next
    layer's input channels, the classifier's inputs) uses that group. A projection shortcut
    takes its block's input group (its sibling conv1's) and the block's output group, as the
    reference; an identity shortcut then adds two different groups. Returns (the group of
    every dimension of every state entry, as `width_groups`; each group's full width)."""
    kinds = {name: module for name, module in model.named_modules()
             if isinstance(module, nn.Conv2d | nn.BatchNorm2d | nn.Linear)}
    groups: list[tuple[str | None, ...]] = []
    widths: dict[str, int] = {}
    inputs_of: dict[str, str | None] = {}  # conv -> the group of its input channels
    current: str | None = None  # the group of the channels flowing at this point (None: input)
    for key in model.state_dict():
        owner, _, param = key.rpartition(".")
        module = kinds[owner]
        if isinstance(module, nn.Linear):
            groups.append((None, current) if param == "weight" else (None,))
        elif isinstance(module, nn.Conv2d) and param == "weight":
            if owner.endswith("shortcut"):
                sibling = owner[: -len("shortcut")] + "conv1"
                groups.append((current, inputs_of[sibling], None, None))
                continue
            inputs_of[owner], current = current, owner
            widths[owner] = module.out_channels
            groups.append((owner, inputs_of[owner], None, None))
        else:  # conv bias, norm weight and bias
            groups.append((current,))
    return groups, widths
