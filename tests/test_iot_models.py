"""FedAIoT models (seed 004 Table 2.2): parameter counts by hand or against torchvision's
ResNet-18, the stems' shapes, and the split into base and head."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from fedapps.iot_models import IOT_MODELS
from fedapps.models import build_model


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def lstm_params(d_in: int, hidden: int) -> int:
    """One direction of one LSTM layer: 4 gates x (input weights, hidden weights, 2 biases)."""
    return 4 * (d_in * hidden + hidden * hidden + 2 * hidden)


def linear(d_in: int, d_out: int) -> int:
    return d_in * d_out + d_out


def test_parameter_counts_of_the_recurrent_and_mlp_models_by_hand() -> None:
    assert count(build_model("wisdm-lstm", (200, 6), 12, 1)) == \
        lstm_params(6, 6) + linear(1200, 128) + linear(128, 12) == 155_612
    assert count(build_model("casas-bilstm", (2000,), 12, 1, vocab_size=1000)) == \
        1000 * 64 + 2 * lstm_params(64, 64) + linear(128, 12)
    dims = [18, 210, 420, 840, 420, 210, 1]
    assert count(build_model("aep-mlp", (18,), 1, 1)) == \
        sum(linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True)) == 888_091


def group_norm_resnet18(num_classes: int) -> int:
    """torchvision's ResNet-18 with GroupNorm(2): the same parameters as the reference's
    UT-HAR/Widar trunk except the three 1x1 shortcuts, which have a bias there."""
    tv = torchvision.models.resnet18(num_classes=num_classes,
                                     norm_layer=lambda c: nn.GroupNorm(2, c))
    return count(tv) + 128 + 256 + 512


def test_resnet18_counts_against_torchvision() -> None:
    uthar_stem = (3 * 1 * 7 * 7 + 3) + (3 * 3 * 10 * 11 + 3)
    assert count(build_model("uthar-resnet18", (3, 30, 250), 7, 1)) == \
        group_norm_resnet18(7) + uthar_stem
    widar_stem = (22 * 3 * 7 * 7 + 3) + (3 * 3 * 7 * 7 + 3)
    assert count(build_model("widar-resnet18", (22, 20, 20), 9, 1)) == \
        group_norm_resnet18(9) + widar_stem


def torchvision_epic_resnet18() -> nn.Module:
    """The reference's EPIC-SOUNDS ResNet-18 written with torchvision parts: a 1-channel stem of
    128 filters and a first block that narrows 128 -> 64 through a 1x1 shortcut."""
    tv = torchvision.models.resnet18(num_classes=44)
    tv.conv1 = nn.Conv2d(1, 128, 7, stride=2, padding=3, bias=False)
    tv.bn1 = nn.BatchNorm2d(128)
    shortcut = nn.Sequential(nn.Conv2d(128, 64, 1, bias=False), nn.BatchNorm2d(64))
    tv.layer1[0] = torchvision.models.resnet.BasicBlock(128, 64, downsample=shortcut)
    return tv


def test_epic_resnet18_computes_what_torchvision_computes_with_the_same_weights() -> None:
    torch.manual_seed(0)
    ours = build_model("epic-resnet18", (1, 400, 128), 44, 1).eval()
    ref = torchvision_epic_resnet18().eval()
    ours_state, ref_state = ours.state_dict(), ref.state_dict()
    assert [v.shape for v in ours_state.values()] == [v.shape for v in ref_state.values()]
    ref.load_state_dict(dict(zip(ref_state, ours_state.values(), strict=True)))
    x = torch.randn(2, 1, 400, 128)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-4, atol=1e-5)


def test_stems_reshape_to_three_channels_of_32x32() -> None:
    uthar = build_model("uthar-resnet18", (3, 30, 250), 7, 1)
    widar = build_model("widar-resnet18", (22, 20, 20), 9, 1)
    assert uthar.base[0][0](torch.zeros(2, 3, 30, 250)).shape == (2, 3, 32, 32)
    assert widar.base[0][0](torch.zeros(2, 22, 20, 20)).shape == (2, 3, 32, 32)


def test_uthar_layout_puts_packets_on_rows_and_antenna_major_subcarriers_on_columns() -> None:
    """[antenna a, subcarrier s, packet t] -> [1, t, 30 a + s], SenseFi's [1, 250, 90]."""
    layout = build_model("uthar-resnet18", (3, 30, 250), 7, 1).base[0][0][0]
    x = torch.arange(3 * 30 * 250, dtype=torch.float32).view(1, 3, 30, 250)
    out = layout(x)
    assert out.shape == (1, 1, 250, 90)
    for a, s, t in [(0, 0, 0), (2, 29, 249), (1, 4, 17)]:
        assert out[0, 0, t, 30 * a + s] == x[0, a, s, t]


@pytest.mark.parametrize("name,shape,classes", [
    ("wisdm-lstm", (200, 6), 12), ("uthar-resnet18", (3, 30, 250), 7),
    ("widar-resnet18", (22, 20, 20), 9), ("aep-mlp", (18,), 1),
    ("epic-resnet18", (1, 64, 32), 44)])
def test_head_is_the_last_fc_layer_and_training_moves_every_parameter(
        name: str, shape: tuple[int, ...], classes: int) -> None:
    torch.manual_seed(1)
    model = build_model(name, shape, classes, 1)
    head = list(model.head.modules())
    assert sum(isinstance(m, nn.Linear) for m in head) == 1
    before = [p.detach().clone() for p in model.parameters()]
    out = model(torch.randn(4, *shape))
    assert out.shape == (4, classes)
    out.square().mean().backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_token_model_needs_a_vocabulary() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        build_model("casas-bilstm", (2000,), 12, 1)
    model = build_model("casas-bilstm", (30,), 12, 1, vocab_size=20)
    assert model(torch.randint(0, 20, (3, 30))).shape == (3, 12)
    assert model.base[0].embedding.padding_idx == 0


def test_every_iot_model_is_registered_with_its_fc_depth() -> None:
    assert build_model("aep-mlp", (18,), 1, IOT_MODELS["aep-mlp"][1]).base[1:] is not None
    with pytest.raises(ValueError, match="head depth"):
        build_model("wisdm-lstm", (200, 6), 12, 3)


def test_validation_refuses_a_model_written_for_another_input_rank() -> None:
    from fedapps.config import load_config
    from fedapps.errors import ConfigError
    from fedapps.validation import validate

    with pytest.raises(ConfigError, match="model.name='wisdm-lstm': takes 2-d samples; "
                                          r"digits gives \[1, 8, 8\]"):
        validate(load_config("quickstart", ["model.name=wisdm-lstm"]), check_data=False)
    with pytest.raises(ConfigError, match="casas-bilstm.*embeds token ids; diabetes has no"):
        validate(load_config("regression-quick", ["model.name=casas-bilstm"]), check_data=False)
