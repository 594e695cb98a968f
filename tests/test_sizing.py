"""`fedapps sizing`: the device sizing table (simulations/sizing.py)."""

import json
import math

import pytest

from fedapps.data import DATASETS
from fedapps.errors import ConfigError
from fedapps.models import MODELS
from fedapps.validation import resolve_config
from simulations import cli
from simulations.sizing import CLIENT_SAMPLES, ROWS, WIDTHS, build, random_inputs, select


def configs():
    return [(row, resolve_config(row.experiment, list(row.overrides), check_data=False))
            for row in ROWS]


def test_every_shipped_model_has_a_row_and_every_width_is_measured():
    covered, widths = set(), {}
    for row, cfg in configs():
        covered.add(str(cfg.model.name))
        if row.beta is not None:
            covered.add(str(cfg.algo.model))
            widths.setdefault(str(cfg.algo.model), []).append(row.beta)
    assert set(MODELS) <= covered  # a new model without a row fails here
    assert widths == {"width-cnn": list(WIDTHS), "preresnet18": list(WIDTHS)}
    assert len({row.key for row in ROWS}) == len(ROWS)


def width_cnn_parameters(widths, in_channels, classes):
    """By hand: conv 3x3 weights and biases, the BatchNorm scale and shift, the classifier."""
    total, prev = 0, in_channels
    for w in widths:
        total += prev * w * 9 + w + 2 * w
        prev = w
    return total + prev * classes + classes


def test_width_rows_build_the_clients_sub_models():
    cfg = resolve_config("fedrolex-fmnist", [], check_data=False)
    hidden = list(cfg.algo.hidden)
    for beta in WIDTHS:
        widths = [max(1, math.floor(beta * h + 1e-9)) for h in hidden]
        model = build(cfg, beta)
        assert sum(p.numel() for p in model.parameters()) == width_cnn_parameters(widths, 1, 10)


def test_random_inputs_have_the_datasets_shape_and_label_range():
    cases = {"quickstart": "classification", "regression-quick": "regression",
             "fedaiot-casas": "tokens"}
    for experiment, kind in cases.items():
        cfg = resolve_config(experiment, [], check_data=False)
        info = DATASETS[cfg.dataset]
        x, y = random_inputs(cfg, 50, 0)
        assert tuple(x.shape) == (50, *info.shape) and len(y) == 50
        if kind == "tokens":
            assert x.min() >= 0 and x.max() < info.vocab_size and (x == x.round()).all()
        if kind == "regression":
            assert y.is_floating_point()
        else:
            assert y.min() >= 0 and y.max() < info.num_classes and not y.is_floating_point()
    cfg_d = resolve_config("fedaiot-visdrone", ["data.fedaiot.cluster-features=raw"],
                           check_data=False)
    x, y = random_inputs(cfg_d, 3, 0)  # detection: pixels in [0, 1], boxes inside the image
    assert tuple(x.shape) == (3, 3, 640, 640) and x.min() >= 0 and x.max() <= 1
    assert y.shape == (3, 54, 5) and (y[..., 0] >= 0).all() and (y[..., 0] < 12).all()
    assert (y[..., 1:3] - y[..., 3:5] / 2 > 0).all() and (y[..., 1:3] + y[..., 3:5] / 2 < 1).all()
    a, b = random_inputs(cfg, 5, 3), random_inputs(cfg, 5, 3)
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()  # seeded


def test_only_selects_by_preset_model_or_dataset_and_refuses_unknown_names():
    assert [r.key for r in select("casas-bilstm,quickstart")] == ["quickstart", "fedaiot-casas"]
    assert [r.beta for r in select("preresnet18")] == list(WIDTHS)
    with pytest.raises(ConfigError, match="--only nosuch: no sized model"):
        select("quickstart,nosuch")


def test_command_measures_a_row_in_a_fresh_process(tmp_path, capsys):
    out, md = tmp_path / "sizing.json", tmp_path / "sizing.md"
    assert cli.main(["sizing", "--only", "quickstart", "--batches", "2", "--json", str(out),
                     "--md", str(md)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    cfg = resolve_config("quickstart", [], check_data=False)
    model = build(cfg, None)
    assert row["parameters"] == sum(p.numel() for p in model.parameters())
    assert row["batch_size"] == cfg.train["batch-size"] == 16
    epochs = cfg.train["local-epochs"]
    assert row["round_seconds"] == pytest.approx(
        epochs * math.ceil(CLIENT_SAMPLES / 16) * row["seconds_per_batch"], rel=1e-3, abs=2e-3)
    assert row["data_mb"] == pytest.approx(CLIENT_SAMPLES * (64 * 4 + 8) / 2**20, abs=1e-3)
    assert 0 < row["seconds_per_batch"] < 5
    # the child's own memory: at least PyTorch's import, and training adds to it
    assert 200 < row["baseline_rss_mb"] <= row["peak_rss_mb"] <= row["lifetime_peak_rss_mb"]
    text = md.read_text()
    assert "| quickstart | digits-cnn | - | 1x8x8 | 74,890 | 16 |" in text
    assert text in capsys.readouterr().out
    assert cli.main(["sizing", "--only", "nosuch"]) == 2
