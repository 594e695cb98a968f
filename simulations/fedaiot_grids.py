"""The FedAIoT presets and grids (seed 004 Tables 2.3-2.6), written from one table.

Every dataset's settings (section 2.3) and the thesis's numbers (Tables 2.3-2.6) live here once;
`python -m simulations.fedaiot_grids` writes conf/experiment/fedaiot-<dataset>.yaml and
conf/grid/fedaiot-table2.<n>-<dataset>.yaml from them (tests/test_fedaiot.py checks the files
on disk are what this writes). Decisions are in docs/FEDAIOT.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedapps.paths import CONF_DIR

METRIC_NAMES = {"accuracy": "accuracy (%)", "r2": "R2", "map50": "mAP-50 (%)"}
HEADER = "# Written by `python -m simulations.fedaiot_grids` (edit that file, not this one).\n"


@dataclass(frozen=True)
class IoTSetting:
    """One dataset's FedAIoT setting (seed 004 section 2.3) and the thesis's numbers."""

    dataset: str
    title: str
    clients: int
    rounds: int  # Table 2.3 (section 2.3's text; B5)
    rounds_table24: int  # Table 2.4's "Training Rounds" column
    lr: float  # FedAvg client lr
    fedopt_client_lr: float
    fedopt_server_lr: float
    batch: int
    central_lr: float
    central_epochs: int
    central_batch: int
    partitioner: str = "fedaiot-dirichlet"
    metric: str = "accuracy"
    eval_every: int = 5  # the reference's test_frequency
    # Table 2.3: centralized, (low FedAvg, low FedOPT, high FedAvg, high FedOPT)
    table23: tuple[str, ...] = ()
    table24: tuple[str, ...] = ()  # 10%: 50/80/100 %, 30%: 50/80/100 %
    table25: tuple[str, ...] = ()  # 0 %, 10 %, 30 % erroneous labels
    table26: tuple[str, ...] = ()  # FP32 metric, FP32 memory, FP16 metric, FP16 memory
    lr_30pct: float | None = None  # Table 2.4 note: CASAS lr 0.15 at 30 % sampling
    data_extra: str = ""  # further data.* lines of the preset (indented two spaces)


SETTINGS = (
    IoTSetting("wisdm-w", "WISDM-W", 80, 400, 400, 0.01, 0.01, 0.01, 32, 0.01, 200, 64,
               table23=("74.05 ± 2.47", "70.03 ± 0.13", "71.50 ± 1.52", "68.51 ± 2.21",
                        "65.76 ± 2.42"),
               table24=("58.81 ± 1.43", "63.82 ± 1.53", "68.51 ± 2.21", "65.57 ± 2.10",
                        "67.23 ± 0.77", "69.21 ± 1.13"),
               table25=("68.51 ± 2.21", "50.63 ± 4.19", "47.90 ± 3.05"),
               table26=("68.51 ± 2.21", "1444 MB", "60.31 ± 5.38", "564 MB")),
    IoTSetting("wisdm-p", "WISDM-P", 80, 400, 400, 0.008, 0.01, 0.01, 32, 0.01, 200, 128,
               table23=("36.88 ± 1.08", "36.21 ± 0.19", "34.32 ± 0.84", "34.28 ± 3.28",
                        "32.99 ± 0.55"),
               table24=("29.49 ± 3.65", "31.65 ± 1.42", "34.28 ± 3.28", "33.73 ± 2.77",
                        "34.01 ± 2.27", "36.01 ± 2.23"),
               table25=("34.28 ± 3.28", "28.85 ± 1.44", "27.68 ± 0.39"),
               table26=("34.28 ± 3.28", "1444 MB", "30.22 ± 2.05", "564 MB")),
    IoTSetting("ut-har", "UT-HAR", 20, 1200, 2000, 0.01, 0.01, 0.01, 32, 0.001, 500, 32,
               table23=("95.24 ± 0.75", "94.03 ± 0.63", "94.10 ± 0.84", "74.24 ± 3.87",
                        "87.78 ± 5.48"),
               table24=("61.81 ± 7.01", "70.76 ± 2.23", "74.24 ± 3.87", "86.46 ± 10.90",
                        "90.84 ± 4.42", "92.51 ± 2.65"),
               table25=("74.24 ± 3.87", "73.75 ± 5.67", "70.55 ± 3.27"),
               table26=("74.24 ± 3.87", "1716 MB", "72.86 ± 4.49", "639 MB")),
    IoTSetting("widar", "Widar", 40, 900, 1500, 0.01, 0.01, 0.01, 32, 0.001, 200, 32,
               table23=("61.24 ± 0.56", "59.21 ± 1.79", "56.26 ± 3.11", "54.76 ± 0.42",
                        "47.99 ± 3.99"),
               table24=("47.55 ± 1.20", "50.65 ± 0.24", "54.76 ± 0.42", "53.93 ± 2.90",
                        "55.74 ± 2.15", "57.39 ± 3.14"),
               table25=("54.76 ± 0.42", "34.03 ± 0.33", "27.20 ± 0.56"),
               table26=("54.76 ± 0.42", "1734 MB", "34.03 ± 0.33", "636 MB")),
    # VisDrone: rounds not stated in section 2.3, Table 2.4's 600 (B5); centralized with
    # cosine restarts (T0 10, Tmult 2) in the thesis, plain SGD here (docs/FEDAIOT.md)
    IoTSetting("visdrone", "VisDrone", 30, 600, 600, 0.1, 0.1, 0.1, 12, 0.1, 200, 12,
               partitioner="fedaiot-clusters", metric="map50",
               data_extra="  fedaiot:\n    cluster-features: vgg19  # B2: KMeans on VGG-19 "
                          "features\n",
               table23=("34.26 ± 1.56", "32.70 ± 1.19", "32.21 ± 0.28", "31.23 ± 0.70",
                        "31.51 ± 2.18"),
               table24=("27.07 ± 3.09", "31.05 ± 1.55", "31.23 ± 0.70", "30.56 ± 2.71",
                        "33.52 ± 2.90", "34.85 ± 0.83"),
               table26=("31.23 ± 0.70", "8369 MB", "29.17 ± 4.70", "3515 MB")),
    IoTSetting("casas", "CASAS", 60, 400, 400, 0.005, 0.005, 0.01, 32, 0.1, 250, 128,
               table23=("83.70 ± 2.21", "75.93 ± 2.82", "76.40 ± 2.20", "74.72 ± 1.32",
                        "75.36 ± 2.40"),
               table24=("71.68 ± 1.96", "74.19 ± 1.26", "74.72 ± 1.32", "73.89 ± 1.16",
                        "74.68 ± 1.50", "76.12 ± 2.03"),
               table25=("74.72 ± 1.32", "65.01 ± 2.98", "63.16 ± 1.34"),
               table26=("74.72 ± 1.32", "1834 MB", "72.86 ± 4.49", "732 MB"),
               lr_30pct=0.15),
    IoTSetting("aep", "AEP", 80, 3000, 3000, 0.01, 0.01, 0.1, 32, 0.001, 1200, 32,
               partitioner="fedaiot-quantiles", metric="r2",
               table23=("0.586 ± 0.006", "0.502 ± 0.024", "0.503 ± 0.011", "0.407 ± 0.003",
                        "0.475 ± 0.016"),
               table24=("0.325 ± 0.013", "0.371 ± 0.017", "0.407 ± 0.003", "0.502 ± 0.006",
                        "0.523 ± 0.014", "0.538 ± 0.005"),
               table26=("0.407 ± 0.003", "1201 MB", "0.469 ± 0.044", "500 MB")),
    IoTSetting("epic-sounds", "EPIC-SOUNDS", 210, 300, 300, 0.1, 0.1, 0.01, 32, 0.1, 120, 512,
               eval_every=20,
               table23=("45.67 ± 0.12", "45.51 ± 1.07", "42.39 ± 2.01", "33.02 ± 5.62",
                        "37.21 ± 2.68"),
               table24=("20.99 ± 5.19", "25.73 ± 1.99", "28.89 ± 2.82", "23.70 ± 6.25",
                        "31.74 ± 7.83", "35.11 ± 1.99"),
               table25=("28.89 ± 2.82", "21.43 ± 3.86", "13.30 ± 0.42"),
               table26=("33.02 ± 5.62", "2176 MB", "35.43 ± 6.61", "936 MB")),
)


def per_round(s: IoTSetting, share: float) -> int:
    """Clients per round at a sampling share (10 % default, 30 % in Table 2.4), at least 1."""
    return max(1, round(share * s.clients))


def experiment(s: IoTSetting) -> str:
    """Table 2.3's high-heterogeneity FedAvg cell; the grids vary it."""
    return f"""{HEADER}# FedAIoT {s.title} (seed 004 chapter 2): FedAvg, high heterogeneity (alpha 0.1), 10% of the
# {s.clients} clients per round, {s.rounds} rounds, the settings of section 2.3; the reference trainer's unstated
# values (B12): SGD without momentum, weight decay 5e-4, one local epoch. Centralized test (B13):
# clients train on all their data, the server evaluates the official test split every
# {s.eval_every} rounds. FedOPT: --set server.optimizer=torch-adam --set server.lr={s.fedopt_server_lr}
# --set train.lr={s.fedopt_client_lr}. Centralized: fedapps centralized fedaiot-{s.dataset}.
dataset: {s.dataset}
algorithm: fedavg
rounds: {s.rounds}
data:
  pool: official
  partitioner: {s.partitioner}
  alpha: 0.1
  test-fraction: 0.0
{s.data_extra}federation:
  num-clients: {s.clients}
  clients-per-round: {per_round(s, 0.1)}
train:
  local-epochs: 1
  batch-size: {s.batch}
  lr: {s.lr}
  momentum: 0.0
  weight-decay: 0.0005
eval:
  eval-every: {s.eval_every}
  official-test: true
server:
  step-buffers: false
centralized:
  epochs: {s.central_epochs}
  lr: {s.central_lr}
  batch-size: {s.central_batch}
"""


def _values(pairs: list[tuple[str, dict[str, str]]]) -> str:
    lines = [f'    "{label}": {{{", ".join(f"{k}: {v}" for k, v in vals.items())}}}'
             for label, vals in pairs]
    return "\n".join(lines)


def _num(v: str) -> str:
    """The mean of a "mean ± std" entry (the table prints only the mean beside ours)."""
    return v.split(" ")[0]


def table23(s: IoTSetting) -> str:
    c, lf, lo, hf, ho = s.table23
    fedopt = (f'["server.optimizer=torch-adam", "server.lr={s.fedopt_server_lr}", '
              f'"train.lr={s.fedopt_client_lr}"]')
    return f"""{HEADER}# Seed 004 Table 2.3, {s.title}: FedAvg and FedOPT at low (alpha 0.5) and high (alpha 0.1)
# heterogeneity, 10% sampling, 3 seeds; the Centralized column comes from
# `fedapps centralized fedaiot-{s.dataset}` (paper: {c}).
experiment: fedaiot-{s.dataset}
seeds: [0, 1, 2]
grid:
  data.alpha: [0.5, 0.1]
  variant: [fedavg, fedopt]
variants:
  fedavg: []
  fedopt: {fedopt}
reference:
  source: "seed 004 Table 2.3, {s.title}, {METRIC_NAMES[s.metric]} on the official test split (compare with best official test); Centralized {c}"
  values:
{_values([("data.alpha=0.5,variant=fedavg", {"G": _num(lf)}),
          ("data.alpha=0.5,variant=fedopt", {"G": _num(lo)}),
          ("data.alpha=0.1,variant=fedavg", {"G": _num(hf)}),
          ("data.alpha=0.1,variant=fedopt", {"G": _num(ho)})])}
"""


def table24(s: IoTSetting) -> str:
    a, b, c, d, e, f = (_num(v) for v in s.table24)
    k10, k30 = per_round(s, 0.1), per_round(s, 0.3)
    overrides = ""
    if s.lr_30pct is not None:
        overrides = (f'cell-overrides:\n  "federation.clients-per-round={k30}": '
                     f'["train.lr={s.lr_30pct}"]\n')
    return f"""{HEADER}# Seed 004 Table 2.4, {s.title}: client sampling 10% against 30% at high heterogeneity, {s.rounds_table24}
# rounds (Table 2.4's column, B5); the best metric within 50 / 80 / 100% of the rounds.
experiment: fedaiot-{s.dataset}
seeds: [0, 1, 2]
overrides: ["rounds={s.rounds_table24}"]
grid:
  federation.clients-per-round: [{k10}, {k30}]
budgets: [0.5, 0.8, 1.0]
{overrides}reference:
  source: "seed 004 Table 2.4, {s.title}: best within 50/80/100% of {s.rounds_table24} rounds"
  values:
{_values([(f"federation.clients-per-round={k10}", {"50%": a, "80%": b, "100%": c}),
          (f"federation.clients-per-round={k30}", {"50%": d, "80%": e, "100%": f})])}
"""


def table25(s: IoTSetting) -> str:
    z, one, three = (_num(v) for v in s.table25)
    return f"""{HEADER}# Seed 004 Table 2.5, {s.title}: erroneous labels drawn from the confusion matrix of a centrally
# trained model, 10% sampling, high heterogeneity. First train it:
#   fedapps centralized fedaiot-{s.dataset} --set output.run-name=fedaiot-central-{s.dataset}
# (writes outputs/fedaiot-central-{s.dataset}/confusion.csv, the matrix used below).
experiment: fedaiot-{s.dataset}
seeds: [0, 1, 2]
overrides: ["data.transforms=[label-noise]",
            "data.label-noise.matrix=outputs/fedaiot-central-{s.dataset}/confusion.csv"]
grid:
  data.label-noise.ratio: [0.0, 0.1, 0.3]
reference:
  source: "seed 004 Table 2.5, {s.title}, accuracy (%) with 0 / 10 / 30% erroneous labels"
  values:
{_values([("data.label-noise.ratio=0.0", {"G": z}), ("data.label-noise.ratio=0.1", {"G": one}),
          ("data.label-noise.ratio=0.3", {"G": three})])}
"""


def table26(s: IoTSetting) -> str:
    m32, mem32, m16, mem16 = s.table26
    return f"""{HEADER}# Seed 004 Table 2.6, {s.title}: training in FP32 against FP16 (pure half precision, B11), 10%
# sampling, high heterogeneity. The memory columns come from
#   fedapps memory fedaiot-{s.dataset} --precisions fp32,fp16 --set device=cuda
# (paper: FP32 {mem32}, FP16 {mem16}, centrally trained on a GPU).
experiment: fedaiot-{s.dataset}
seeds: [0, 1, 2]
grid:
  train.precision: [fp32, fp16]
reference:
  source: "seed 004 Table 2.6, {s.title}: FP32 {m32} ({mem32}), FP16 {m16} ({mem16})"
  values:
{_values([("train.precision=fp32", {"G": _num(m32)}),
          ("train.precision=fp16", {"G": _num(m16)})])}
"""


def files() -> dict[Path, str]:
    """Every generated file (path -> text)."""
    out: dict[Path, str] = {}
    for s in SETTINGS:
        out[CONF_DIR / "experiment" / f"fedaiot-{s.dataset}.yaml"] = experiment(s)
        out[CONF_DIR / "grid" / f"fedaiot-table2.3-{s.dataset}.yaml"] = table23(s)
        out[CONF_DIR / "grid" / f"fedaiot-table2.4-{s.dataset}.yaml"] = table24(s)
        if s.table25:  # classification only (not AEP)
            out[CONF_DIR / "grid" / f"fedaiot-table2.5-{s.dataset}.yaml"] = table25(s)
        out[CONF_DIR / "grid" / f"fedaiot-table2.6-{s.dataset}.yaml"] = table26(s)
    return out


def main() -> None:
    for path, text in files().items():
        path.write_text(text)
        print(path)


if __name__ == "__main__":
    main()
