"""FedAIoT models (seed 004 Table 2.2), as SplitNets whose head is the last FC layer(s).

Where Table 2.2 is silent (stem widths, which convolutions have a bias, initialization) the
layers follow the FedAIoT reference code (AIoT-MLSys-Lab/FedAIoT, models/*.py at 400cd56); each
builder's docstring says which. Inputs are the shapes the IoT loaders give (fedapps/data/iot).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedapps.splitnet import SplitNet, layered
from fedapps.yolo import yolov8n


class _Recurrent(nn.Module):
    """An LSTM's per-step outputs [B, T, H] (optionally after an embedding of token ids), or
    only the last step's [B, H] (the reference reads `x[:, -1, :]`, for both directions)."""

    def __init__(self, lstm: nn.LSTM, embedding: nn.Embedding | None = None,
                 last_step: bool = False) -> None:
        super().__init__()
        self.embedding = embedding
        self.lstm = lstm
        self.last_step = last_step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x.long())
        out, _ = self.lstm(x)
        return out[:, -1, :] if self.last_step else out


def wisdm_lstm(in_shape: tuple[int, ...], num_classes: int, head_depth: int) -> SplitNet:
    """WISDM [T=200, 6]: LSTM(6, hidden 6) -> flatten (1,200) -> Dropout 0.2 -> FC 128 -> ReLU
    -> Dropout 0.2 -> FC C (Table 2.2; reference models/wisdm.py LSTM_NET)."""
    steps, channels = in_shape
    lstm = nn.LSTM(channels, 6, batch_first=True)
    return layered(_Recurrent(lstm), [
        nn.Sequential(nn.Dropout(0.2), nn.Linear(steps * 6, 128), nn.ReLU()),
        nn.Sequential(nn.Dropout(0.2), nn.Linear(128, num_classes)),
    ], head_depth)


def casas_bilstm(in_shape: tuple[int, ...], num_classes: int, head_depth: int,
                 vocab_size: int) -> SplitNet:
    """CASAS token ids [2000]: Embedding(vocab, 64, padding 0) -> BiLSTM(64, 64) -> the last
    step's 128 outputs -> FC C (Table 2.2; reference models/casas.py BiLSTMModel)."""
    embedding = nn.Embedding(vocab_size, 64, padding_idx=0)
    lstm = nn.LSTM(64, 64, batch_first=True, bidirectional=True)
    return layered(_Recurrent(lstm, embedding, last_step=True), [nn.Linear(128, num_classes)],
                   head_depth)


def aep_mlp(in_shape: tuple[int, ...], num_classes: int, head_depth: int) -> SplitNet:
    """AEP [18]: 18 - 210 - 420 - 840 - 420 - 210 - 1, each hidden layer Linear, ReLU,
    Dropout 0.3 (Table 2.2; reference models/energy.py MLP)."""
    dims = [in_shape[0], 210, 420, 840, 420, 210]
    hidden = [nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Dropout(0.3))
              for a, b in zip(dims[:-1], dims[1:], strict=True)]
    return layered(nn.Identity(), [*hidden, nn.Linear(dims[-1], num_classes)], head_depth)


# ---- ResNet-18 -------------------------------------------------------------------------------

def _group_norm(channels: int) -> nn.Module:
    """The reference's GroupNorm with 2 groups (models/ut_har.py, models/widar.py)."""
    return nn.GroupNorm(2, channels)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions (no bias) with norms; stride on the first (torchvision, EPIC
    reference) or on the second convolution (UT-HAR/Widar reference `Block`)."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: Callable[[int], nn.Module],
                 stride_first: bool, shortcut_bias: bool) -> None:
        super().__init__()
        s1, s2 = (stride, 1) if stride_first else (1, stride)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=s1, padding=1, bias=False)
        self.n1 = norm(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=s2, padding=1, bias=False)
        self.n2 = norm(c_out)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=shortcut_bias), norm(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.n1(self.conv1(x)))
        out = self.n2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def _resnet18_trunk(stem: nn.Module, c_in: int, stem_width: int,
                    norm: Callable[[int], nn.Module], stride_first: bool,
                    shortcut_bias: bool) -> nn.Sequential:
    """Stem (a dataset-specific reshape) -> 7x7/2 conv -> norm -> ReLU -> 3x3/2 max-pool -> four
    stages of two BasicBlocks (64/128/256/512; stride 2 from stage 2) -> global average pool."""
    layers: list[nn.Module] = [
        stem, nn.Conv2d(c_in, stem_width, 7, stride=2, padding=3, bias=False),
        norm(stem_width), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1)]
    width = stem_width
    for stage, planes in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(BasicBlock(width, planes, stride, norm, stride_first, shortcut_bias))
            width = planes
    layers.append(nn.AdaptiveAvgPool2d(1))
    return nn.Sequential(*layers)


class _UtHarLayout(nn.Module):
    """[3 antenna pairs, 30 subcarriers, 250 packets] -> [1, 250 packets, 90] (antenna-major
    columns), the layout the reference's UT-HAR stem convolves (SenseFi's [1, 250, 90])."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, a, s, t = x.shape
        return x.permute(0, 3, 1, 2).reshape(b, 1, t, a * s)


def uthar_resnet18(in_shape: tuple[int, ...], num_classes: int, head_depth: int) -> SplitNet:
    """UT-HAR: a stem that reshapes the CSI window to 3 channels (conv 7x7 stride (3, 1), ReLU,
    max-pool 2, conv (10, 11), ReLU: [1, 250, 90] -> [3, 32, 32]), then ResNet-18 with
    GroupNorm(2) (Table 2.2; reference models/ut_har.py UT_HAR_ResNet18: bias-free 3x3
    convolutions, biased 1x1 shortcuts, stride on a block's second convolution)."""
    stem = nn.Sequential(_UtHarLayout(), nn.Conv2d(1, 3, 7, stride=(3, 1)), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(3, 3, (10, 11)), nn.ReLU())
    trunk = _resnet18_trunk(stem, 3, 64, _group_norm, stride_first=False, shortcut_bias=True)
    return layered(trunk, [nn.Linear(512, num_classes)], head_depth)


def widar_resnet18(in_shape: tuple[int, ...], num_classes: int, head_depth: int) -> SplitNet:
    """Widar BVP [22, 20, 20]: two 7x7 ConvTranspose layers (22 -> 3 -> 3 channels, each with a
    ReLU: [3, 32, 32]), then the same GroupNorm ResNet-18 as UT-HAR (Table 2.2; reference
    models/widar.py Widar_ResNet18)."""
    stem = nn.Sequential(nn.ConvTranspose2d(in_shape[0], 3, 7), nn.ReLU(),
                         nn.ConvTranspose2d(3, 3, 7), nn.ReLU())
    trunk = _resnet18_trunk(stem, 3, 64, _group_norm, stride_first=False, shortcut_bias=True)
    return layered(trunk, [nn.Linear(512, num_classes)], head_depth)


def epic_resnet18(in_shape: tuple[int, ...], num_classes: int, head_depth: int) -> SplitNet:
    """EPIC-SOUNDS log-mel [1, 400, 128]: ResNet-18 with BatchNorm (Table 2.2); the stem width
    (128 channels, so stage 1 opens with a 1x1 shortcut) and the initialization (Kaiming
    normal, fan-out, for convolutions; norm weights N(1, 0.02)) follow the reference
    models/epic_sounds.py resnet18."""
    trunk = _resnet18_trunk(nn.Identity(), in_shape[0], 128, nn.BatchNorm2d, stride_first=True,
                            shortcut_bias=False)
    for m in trunk.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, mean=1.0, std=0.02)
            nn.init.zeros_(m.bias)
    return layered(trunk, [nn.Linear(512, num_classes)], head_depth)


# name: (builder, number of FC layers = the largest head depth)
IOT_MODELS: dict[str, tuple[Callable[..., SplitNet], int]] = {
    "wisdm-lstm": (wisdm_lstm, 2),
    "uthar-resnet18": (uthar_resnet18, 1),
    "widar-resnet18": (widar_resnet18, 1),
    "casas-bilstm": (casas_bilstm, 1),
    "aep-mlp": (aep_mlp, 6),
    "epic-resnet18": (epic_resnet18, 1),
    "yolov8n": (yolov8n, 1),  # VisDrone (fedapps/yolo.py; needs the `detection` extra)
}
TOKEN_MODELS = ("casas-bilstm",)  # take `vocab_size` (DatasetInfo.vocab_size)
DETECTION_MODELS = ("yolov8n",)  # output DetectorOutput (fedapps/yolo.py): detection data
# the input shape each model is written for (validation checks the dataset's shape against it)
IOT_INPUT_RANKS = {"wisdm-lstm": 2, "uthar-resnet18": 3, "widar-resnet18": 3,
                   "casas-bilstm": 1, "aep-mlp": 1, "epic-resnet18": 3, "yolov8n": 3}
