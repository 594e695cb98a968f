"""Training precision (`train.precision`, fedapps/precision.py; seed 004 Table 2.6, B11): each
mode against a hand-run step, what is sent, evaluation, errors, and `fedapps memory`."""

import json

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord
from torch import nn
from torch.nn import functional as F

from clients.arrays import get_arrays
from clients.base import BaseClient, TrainSettings
from clients.fedavg import FedAvgClient
from fedapps.data import ClientData
from fedapps.errors import ConfigError
from fedapps.models import build_model
from fedapps.precision import Precision

N, LR = 24, 0.05
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


def local_data() -> ClientData:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N + 8, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (N + 8,), generator=g)
    return ClientData(x[:N], y[:N], x[N:], y[N:])


def model(name: str = "digits-cnn") -> nn.Module:
    torch.manual_seed(0)
    return build_model(name, (1, 8, 8), 10, 1)


def client(precision: str, name: str = "digits-cnn") -> FedAvgClient:
    """One local epoch of one batch (B = N), plain SGD: one step to compare by hand."""
    return FedAvgClient(model(name), local_data(),
                        TrainSettings(1, N, LR, 0.0, 0.0, 0, precision=precision), 0)


def round_one_batch() -> torch.Tensor:
    """The row order of the client's round-1 batch (its seeded shuffle)."""
    c = client("fp32")
    c.seed_generator({"server-round": 1}, stream=0)
    return next(c.batch_indices(N, 1))


def fit(precision: str, name: str = "digits-cnn") -> list[np.ndarray]:
    c = client(precision, name)
    sent, n, _ = c.fit(get_arrays(model(name)), {"server-round": 1})
    assert n == N
    return sent


def representable(a: np.ndarray, dtype: torch.dtype) -> bool:
    return np.array_equal(torch.from_numpy(a).to(dtype).float().numpy(), a)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_half_local_step_is_a_hand_run_half_sgd_step(precision):
    dtype = HALF[precision]
    sent = fit(precision)
    # by hand: model, batch and loss in half; w <- w - lr * g in half (SGD's add_)
    m = model().to(dtype)
    idx, data = round_one_batch(), local_data()
    F.cross_entropy(m(data.x_train[idx].to(dtype)), data.y_train[idx]).backward()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(p.grad, alpha=-LR)
    expected = [p.detach().float().numpy() for p in m.parameters()]
    assert all(a.dtype == np.float32 for a in sent)  # the server sees float32
    assert all(np.array_equal(a, b) for a, b in zip(sent, expected, strict=True))
    assert all(representable(a, dtype) for a in sent)  # exactly the half values
    plain = fit("fp32")
    assert not all(np.array_equal(a, b) for a, b in zip(sent, plain, strict=True))
    assert not all(representable(a, dtype) for a in plain)


def test_half_training_keeps_batchnorm_in_float32_as_the_reference():
    seen = {}
    c = client("fp16", "thesis-fmnist-cnn")

    def loss(x, y):
        seen.update({n: p.dtype for n, p in c.model.named_parameters()}, x=x.dtype)
        return F.cross_entropy(c.model(x), y)

    c.sgd_epochs(c.model.parameters(), loss, 1)
    assert seen.pop("x") == torch.float16
    conv, bn = "base.0.0.weight", "base.0.1.weight"
    assert seen[conv] == torch.float16 and seen[bn] == torch.float32
    assert {p.dtype for p in c.model.parameters()} == {torch.float32}  # restored after
    names = list(c.model.state_dict())
    sent = dict(zip(names, get_arrays(c.model), strict=True))
    assert representable(sent[conv], torch.float16)
    assert not representable(sent[bn], torch.float16)  # trained in float32


def test_amp_keeps_float32_weights_and_is_a_hand_run_autocast_step():
    c = client("amp")
    dtype = c.precision.autocast_dtype  # float16 where this torch's CPU autocast has it
    if dtype == torch.float16:  # a kept loss scale of 1: no skipped step, exact unscaling
        scaler = torch.amp.GradScaler("cpu", init_scale=1.0).state_dict()
        c.state[c.LOSS_SCALE] = ConfigRecord(scaler)
    logits = []

    def loss(x, y):
        out = c.model(x)
        logits.append((out.dtype, next(c.model.parameters()).dtype))
        return F.cross_entropy(out, y)

    c.seed_generator({"server-round": 1}, stream=0)
    c.sgd_epochs(c.model.parameters(), loss, 1)
    assert logits == [(dtype, torch.float32)]  # half arithmetic, float32 master weights
    # by hand: autocast forward, float32 SGD step
    m, idx, data = model(), round_one_batch(), local_data()
    with torch.autocast("cpu", dtype=dtype):
        out = F.cross_entropy(m(data.x_train[idx]), data.y_train[idx])
    out.backward()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(p.grad, alpha=-LR)
    sent = get_arrays(c.model)
    assert all(a.dtype == np.float32 for a in sent)
    assert all(np.array_equal(a, p.detach().numpy())
               for a, p in zip(sent, m.parameters(), strict=True))
    assert not all(representable(a, torch.float16) for a in sent)  # fp32 master weights


def test_amp_training_inside_an_enclosing_autocast_uses_the_updated_weights():
    """FedBABU fine-tunes inside its evaluation's predict, i.e. inside autocast: the cached
    half weights must not outlive an optimizer step (it scored 26% instead of 96%)."""
    def train(enclosed: bool) -> list[np.ndarray]:
        c = FedAvgClient(model(), local_data(), TrainSettings(3, 8, LR, 0.9, 0.0, 0,
                                                              precision="amp"), 0)
        c.seed_generator({"server-round": 1}, stream=0)
        with c.precision.autocast() if enclosed else torch.enable_grad():
            c.sgd_epochs(c.model.parameters(), c.task_loss(c.model), 3)
        return get_arrays(c.model)

    assert all(np.array_equal(a, b) for a, b in zip(train(True), train(False), strict=True))


@pytest.mark.parametrize("precision", ["fp16", "bf16", "amp"])
def test_evaluation_runs_in_the_training_precision(precision):
    c = client(precision)
    arrays = get_arrays(c.model)
    loss, n, metrics = c.evaluate(arrays, {"server-round": 1})
    data, m = local_data(), model()
    if precision == "amp":
        with torch.no_grad(), torch.autocast("cpu", dtype=c.precision.autocast_dtype):
            out = m(data.x_test)
    else:
        with torch.no_grad():
            out = m.to(HALF[precision])(data.x_test.to(HALF[precision]))
    out = out.float()  # the loss and the sums in float32 from the precision's outputs
    assert n == len(data.y_test)
    assert loss == pytest.approx(float(F.cross_entropy(out, data.y_test, reduction="sum")) / n,
                                 rel=1e-6)
    assert metrics["correct-global"] == int((out.argmax(1) == data.y_test).sum())
    plain, _, _ = client("fp32").evaluate(arrays, {"server-round": 1})
    assert loss != plain


def test_fp32_is_the_identity():
    p = Precision("fp32")
    x = torch.ones(2)

    def predict(t):
        return t, t

    assert p.inputs(x) is x and p.predict(predict) is predict and p.grad_scaler() is None
    assert not p.casts_modules and p.autocast_dtype is None


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_every_layer_type_of_the_models_trains_in_half_on_cpu(precision):
    layers = nn.ModuleDict({
        "conv": nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.GroupNorm(2, 4),
                              nn.ConvTranspose2d(4, 2, 3), nn.MaxPool2d(2),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3),
                              nn.Linear(2, 3)),
        "embed": nn.Embedding(10, 6), "lstm": nn.LSTM(6, 5, batch_first=True,
                                                      bidirectional=True)})
    p = Precision(precision)
    p.cast([layers])
    out = layers["conv"](p.inputs(torch.randn(2, 1, 8, 8))).sum()
    seq, _ = layers["lstm"](layers["embed"](torch.tensor([[1, 2, 3]])))
    (out + seq.sum()).backward()
    assert out.dtype == HALF[precision] == layers["conv"][0].weight.grad.dtype


def test_a_missing_half_kernel_is_one_clear_line():
    p = Precision("fp16")
    with pytest.raises(ConfigError) as err, p.explained():
        raise RuntimeError("\"foo_cpu\" not implemented for 'Half'\nmore lines")
    assert str(err.value) == ("train.precision='fp16': an operation of this model has no fp16 "
                              "kernel on cpu (\"foo_cpu\" not implemented for 'Half'); use amp "
                              "or fp32")


def test_invalid_precision_is_a_one_line_error(capsys):
    from simulations.cli import main

    assert main(["validate", "quickstart", "--set", "train.precision=fp8"]) == 2
    assert capsys.readouterr().err == ("fedapps: config error: train.precision='fp8': allowed: "
                                       "fp32, fp16, amp, bf16\n")


def test_bf16_on_a_gpu_without_bfloat16_is_refused(monkeypatch):
    from fedapps.preflight import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    message = ("train.precision='bf16': this GPU has no bfloat16 support "
               "(torch.cuda.is_bf16_supported() is False); use fp16, amp or fp32")
    for device in ("cuda", "auto"):
        with pytest.raises(ConfigError, match=r"^train\.precision='bf16': this GPU") as err:
            check_device(device, "bf16")
        assert str(err.value) == message
    check_device("cpu", "bf16")  # the CPU computes in bfloat16
    with pytest.raises(ConfigError):
        BaseClient(model(), local_data(), TrainSettings(1, 8, LR, 0, 0, 0, precision="bf16"),
                   0, device="cuda")


def test_memory_reductions_against_fp32():
    from simulations.memory import with_reductions

    rows = with_reductions([{"precision": "fp32", "peak_mb": 1444.0},
                            {"precision": "fp16", "peak_mb": 564.0}])
    assert [r["reduction_pct"] for r in rows] == [None, 60.9]  # Table 2.6's WISDM arrow


def test_memory_command_measures_in_a_fresh_process(tmp_path, capsys):
    from simulations.cli import main

    out = tmp_path / "mem.json"
    assert main(["memory", "quickstart", "--precisions", "fp16", "--batches", "2",
                 "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("measure: cpu: peak RSS growth")
    assert lines[3].split()[0] == "fp16" and lines[3].split()[2] == "-"
    report = json.loads(out.read_text())
    row = report["rows"][0]
    assert (row["precision"], row["batches"], row["rows"], row["device"]) == ("fp16", 2, 32,
                                                                              "cpu")
    assert row["weights_mb"] > 0 and row["peak_mb"] >= 0 and row["seconds_per_batch"] > 0
    # half weights: 2 bytes per parameter of the quickstart model
    params = sum(p.numel() for p in build_model("digits-cnn", (1, 8, 8), 10, 2).parameters())
    assert row["weights_mb"] == round(2 * params / 2**20, 3)
    assert main(["memory", "quickstart", "--precisions", "fp8"]) == 2
    assert capsys.readouterr().err == ("fedapps: config error: --precisions fp8: allowed: "
                                       "fp32, fp16, amp, bf16\n")
