"""Server optimizers of Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), as pure NumPy.

One optional step applied after any algorithm's aggregation: the aggregate `a` of round t and
the global model `x` it replaces give the server's pseudo-gradient, and the optimizer decides
the new global model. Notation: Delta = a - x (the averaged client change, the paper's
Delta_t), g = x - a = -Delta (pseudo-gradient), eta = `lr`, all operations element-wise.

    none     x' = a                                                  (FedAvg)
    sgd      g = x - a;  b = g in round 1 (or with no buffer yet), else b = mu * b + g;
             x' = x - eta * b                                        (FedAvgM)
             (mu = 0: x' = x - eta * g; eta = 1 and mu = 0: x' = a exactly, as Flower)
    adagrad  m = Delta;  v = v + Delta^2;  x' = x + eta * m / (sqrt(v) + tau)
    yogi     m = b1 m + (1 - b1) Delta;  v = v - (1 - b2) Delta^2 sign(v - Delta^2);
             x' = x + eta * m / (sqrt(v) + tau)
    adam     m = b1 m + (1 - b1) Delta;  v = b2 v + (1 - b2) Delta^2;
             x' = x + eta_r * m / (sqrt(v) + tau),
             eta_r = eta * sqrt(1 - b2^(r+1)) / (1 - b1^(r+1)),  r = server round (1, 2, ...)
    torch-adam  torch.optim.Adam on the pseudo-gradient g (the FedAIoT reference's FedOPT,
             aggregators/base.py: `param.grad = old - average`, then `optimizer.step()`):
             m = b1 m + (1 - b1) Delta;  v = b2 v + (1 - b2) Delta^2;  t = steps taken (1, 2...);
             x' = x + eta / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + tau)
             (torch's defaults: b2 0.999, tau = eps 1e-8, eta 1e-3)

m and v start at zero. These are the update rules of Flower's FedAvgM, FedAdagrad, FedYogi and
FedAdam (flwr 1.41), which the tests compare against. Where they differ from the paper's
Algorithm 2 (x' = x + eta m / (sqrt(v) + tau), one m-update with b1 for all three adaptive
methods), we follow Flower:

* adam: Algorithm 2 has no bias correction; Flower scales eta by Kingma & Ba's
  sqrt(1 - b2^t) / (1 - b1^t) with t = server_round + 1 (so round 1 uses exponent 2, one more
  than Adam's own first step). That is why `step` takes the server round.
* adagrad: Algorithm 2 keeps momentum m = b1 m + (1 - b1) Delta; Flower fixes b1 = 0 (m = Delta),
  so `beta1` is ignored for adagrad.
* Algorithm 2 takes v_{-1} >= tau^2 as an input; Flower (and this module) start from v = 0.
* sgd: Flower's FedAvgM is heavy-ball momentum without dampening (torch.optim.SGD's
  convention), with the buffer reset to g whenever server_round == 1.
* Flower steps every array, integer ones included, turning them into float64 (and its in-place
  FedAvg aggregation first multiplies integer arrays by the client shares cast to int, i.e. 0).
  Here only floating arrays are stepped; integer arrays (e.g. BatchNorm's num_batches_tracked)
  take the aggregate unchanged, in their own dtype.

Everything is computed in float64 and each array is cast back to the aggregate's dtype; m and v
are kept in float64. `state_arrays`/`load_state_arrays` carry m, v and the step count as plain
arrays (np.savez / np.load(allow_pickle=False) round trip).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

NAMES = ("none", "sgd", "adam", "yogi", "adagrad", "torch-adam")

# The `server:` block of conf/defaults.yaml. lr, beta2, tau None -> the optimizer's default.
# step-buffers false: arrays that are not parameters (BatchNorm running statistics) take the
# aggregate instead of a step, as the FedAIoT reference's torch optimizer does.
DEFAULTS: dict[str, Any] = {"optimizer": "none", "lr": None, "momentum": 0.0, "beta1": 0.9,
                            "beta2": None, "tau": None, "step-buffers": True}
# Flower's defaults: FedAvgM server_learning_rate, FedAdam/FedAdagrad/FedYogi eta; torch's Adam.
DEFAULT_LR = {"none": 1.0, "sgd": 1.0, "adam": 0.1, "adagrad": 0.1, "yogi": 0.01,
              "torch-adam": 1e-3}
DEFAULT_BETA2 = {"torch-adam": 0.999}  # else 0.99 (Flower)
DEFAULT_TAU = {"torch-adam": 1e-8}  # else 1e-3

# keys in state_arrays(): no "__" (fedapps.checkpoint splits on it)
STEP_KEY, M_KEY, V_KEY = "server_opt_step", "server_opt_m", "server_opt_v"


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"server.{key}={value!r}: must be a finite number")
    return float(value)


def _check(key: str, value: Any, ok: bool, rule: str) -> None:
    if not ok:
        raise ValueError(f"server.{key}={value!r}: {rule}")


def validate_server_settings(mapping: Mapping[str, Any]) -> None:
    """Check a `server:` mapping (missing keys take DEFAULTS); raises ValueError with a one-line
    message naming the key as `server.<key>`."""
    for key in mapping:
        if key not in DEFAULTS:
            raise ValueError(f"server.{key}: unknown key; allowed: {', '.join(DEFAULTS)}")
    s = {**DEFAULTS, **mapping}
    name = s["optimizer"]
    if name not in NAMES:
        raise ValueError(f"server.optimizer={name!r}: allowed: {', '.join(NAMES)}")
    if s["lr"] is not None:
        _check("lr", s["lr"], _number("lr", s["lr"]) > 0,
               "must be > 0 (or null for the optimizer's default)")
    for key in ("momentum", "beta1", "beta2"):
        if s[key] is not None:
            _check(key, s[key], 0 <= _number(key, s[key]) < 1, "must be in [0, 1) or null")
    if s["tau"] is not None:
        _check("tau", s["tau"], _number("tau", s["tau"]) > 0, "must be > 0 or null")
    _check("step-buffers", s["step-buffers"], isinstance(s["step-buffers"], bool),
           "must be true or false")


def from_settings(mapping: Mapping[str, Any] | None = None,
                  parameter_mask: Sequence[bool] | None = None) -> ServerOptimizer:
    """A ServerOptimizer from a validated-here `server:` mapping (e.g. cfg.server).
    `parameter_mask` (True for a model parameter, False for a buffer, in array order) is used
    only with `step-buffers: false`."""
    mapping = dict(mapping or {})
    validate_server_settings(mapping)
    s = {**DEFAULTS, **mapping}
    stepped = None if s["step-buffers"] else parameter_mask
    if not s["step-buffers"] and parameter_mask is None:
        raise ValueError("server.step-buffers=false: the model's parameter mask is needed")
    return ServerOptimizer(str(s["optimizer"]), lr=s["lr"], momentum=s["momentum"],
                           beta1=s["beta1"], beta2=s["beta2"], tau=s["tau"], stepped=stepped)


class ServerOptimizer:
    """Server-side optimizer state and step (see the module docstring for the rules)."""

    def __init__(self, name: str = "none", lr: float | None = None, momentum: float = 0.0,
                 beta1: float = 0.9, beta2: float | None = None, tau: float | None = None,
                 stepped: Sequence[bool] | None = None) -> None:
        validate_server_settings({"optimizer": name, "lr": lr, "momentum": momentum,
                                  "beta1": beta1, "beta2": beta2, "tau": tau})
        self.name = name
        self.lr = DEFAULT_LR[name] if lr is None else float(lr)
        self.momentum = float(momentum)
        self.beta1 = float(beta1)
        self.beta2 = DEFAULT_BETA2.get(name, 0.99) if beta2 is None else float(beta2)
        self.tau = DEFAULT_TAU.get(name, 1e-3) if tau is None else float(tau)
        # which arrays are stepped (None: every floating one); the others take the aggregate
        self.stepped = None if stepped is None else [bool(b) for b in stepped]
        self.steps = 0  # steps taken (restored by load_state_arrays)
        self.m: list[np.ndarray] | None = None  # first moment / momentum buffer (float64)
        self.v: list[np.ndarray] | None = None  # second moment (float64)

    def __repr__(self) -> str:
        return (f"ServerOptimizer({self.name!r}, lr={self.lr}, momentum={self.momentum}, "
                f"beta1={self.beta1}, beta2={self.beta2}, tau={self.tau})")

    @property
    def is_identity(self) -> bool:
        """True when step() returns the aggregate unchanged (none, or sgd with lr 1, no
        momentum)."""
        return self.name == "none" or (self.name == "sgd" and self.lr == 1.0
                                       and self.momentum == 0.0)

    # ---- the step -----------------------------------------------------------------------------
    def step(self, current: Sequence[np.ndarray], aggregated: Sequence[np.ndarray],
             server_round: int | None = None) -> list[np.ndarray]:
        """The new global arrays from the model `current` the clients started from and the
        round's `aggregated` arrays. `server_round` (1-based, as Flower counts) drives adam's
        bias correction and sgd's round-1 buffer reset; None means `self.steps + 1`."""
        if len(current) != len(aggregated):
            raise ValueError(f"server optimizer: {len(aggregated)} aggregated arrays, "
                             f"{len(current)} current")
        for i, (x, a) in enumerate(zip(current, aggregated, strict=True)):
            if np.shape(x) != np.shape(a):
                raise ValueError(f"server optimizer: array {i} has shape {np.shape(a)}, "
                                 f"current model {np.shape(x)}")
        r = self.steps + 1 if server_round is None else int(server_round)
        if r < 1:
            raise ValueError(f"server optimizer: server_round={server_round!r} must be >= 1")
        self.steps += 1
        if self.is_identity:
            return list(aggregated)
        floating = [np.issubdtype(np.asarray(a).dtype, np.floating) for a in aggregated]
        if self.stepped is not None:
            if len(self.stepped) != len(aggregated):
                raise ValueError(f"server optimizer: parameter mask of {len(self.stepped)} "
                                 f"arrays for {len(aggregated)} aggregated arrays")
            floating = [f and s for f, s in zip(floating, self.stepped, strict=True)]
        x64 = [np.asarray(x, dtype=np.float64) for x in current]
        # integer arrays: zero change, so their m and v stay 0 (their output is the aggregate)
        a64 = [np.asarray(a, dtype=np.float64) if fl else x
               for a, x, fl in zip(aggregated, x64, floating, strict=True)]
        new = self._sgd(x64, a64, r) if self.name == "sgd" else self._adaptive(x64, a64, r)
        return [n.astype(np.asarray(a).dtype) if fl else a
                for n, a, fl in zip(new, aggregated, floating, strict=True)]

    def _zeros_or_state(self, state: list[np.ndarray] | None, like: list[np.ndarray], what: str
                        ) -> list[np.ndarray]:
        if state is None:
            return [np.zeros_like(x) for x in like]
        if len(state) != len(like) or any(s.shape != x.shape for s, x in zip(state, like,
                                                                                 strict=True)):
            raise ValueError(f"server optimizer: saved {what} does not match the model's arrays")
        return state

    def _sgd(self, x: list[np.ndarray], a: list[np.ndarray], r: int) -> list[np.ndarray]:
        """FedAvgM: g = x - a; b = g (round 1) or mu * b + g; x' = x - eta * b."""
        g = [xi - ai for xi, ai in zip(x, a, strict=True)]
        if self.momentum > 0.0:
            if r == 1 or self.m is None:
                self.m = g
            else:
                buf = self._zeros_or_state(self.m, x, "momentum")
                self.m = [self.momentum * b + gi for b, gi in zip(buf, g, strict=True)]
            g = self.m
        return [xi - self.lr * gi for xi, gi in zip(x, g, strict=True)]

    def _adaptive(self, x: list[np.ndarray], a: list[np.ndarray], r: int) -> list[np.ndarray]:
        """FedAdagrad / FedYogi / FedAdam: x' = x + eta * m / (sqrt(v) + tau)."""
        delta = [ai - xi for xi, ai in zip(x, a, strict=True)]
        m = self._zeros_or_state(self.m, x, "first moment")
        v = self._zeros_or_state(self.v, x, "second moment")
        b1 = 0.0 if self.name == "adagrad" else self.beta1
        b2 = self.beta2
        self.m = [b1 * mi + (1.0 - b1) * d for mi, d in zip(m, delta, strict=True)]
        if self.name == "adagrad":
            self.v = [vi + d * d for vi, d in zip(v, delta, strict=True)]
        elif self.name == "yogi":
            self.v = [vi - (1.0 - b2) * d * d * np.sign(vi - d * d)
                      for vi, d in zip(v, delta, strict=True)]
        else:
            self.v = [b2 * vi + (1.0 - b2) * d * d for vi, d in zip(v, delta, strict=True)]
        eta = self.lr
        if self.name == "torch-adam":  # torch.optim.Adam: bias corrections at its own step t
            t = self.steps
            root_bc2 = math.sqrt(1.0 - b2 ** t)
            return [xi + eta / (1.0 - b1 ** t) * mi / (np.sqrt(vi) / root_bc2 + self.tau)
                    for xi, mi, vi in zip(x, self.m, self.v, strict=True)]
        if self.name == "adam":  # Flower's bias-corrected step size, exponent server_round + 1
            eta = self.lr * math.sqrt(1.0 - b2 ** (r + 1)) / (1.0 - self.beta1 ** (r + 1))
        return [xi + eta * mi / (np.sqrt(vi) + self.tau)
                for xi, mi, vi in zip(x, self.m, self.v, strict=True)]

    # ---- checkpoint state ---------------------------------------------------------------------
    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        """Step count (0-d int64), m and v (float64, one per model array) where they exist;
        {} for `none`. Plain arrays only: survives np.savez / np.load(allow_pickle=False)."""
        if self.name == "none":
            return {}
        state = {STEP_KEY: [np.array(self.steps, dtype=np.int64)]}
        if self.m is not None:
            state[M_KEY] = [np.array(m, dtype=np.float64) for m in self.m]
        if self.v is not None:
            state[V_KEY] = [np.array(v, dtype=np.float64) for v in self.v]
        return state

    def load_state_arrays(self, state: Mapping[str, Sequence[np.ndarray]]) -> None:
        """Restore what state_arrays() returned; other keys (the strategy's own) are ignored,
        missing ones start from zero."""
        steps = state.get(STEP_KEY)
        if steps is not None:
            if len(steps) != 1 or np.shape(steps[0]) != ():
                raise ValueError("server optimizer: saved step count must be one 0-d array")
            self.steps = int(steps[0])
        else:
            self.steps = 0
        m, v = state.get(M_KEY), state.get(V_KEY)
        self.m = None if m is None else [np.array(a, dtype=np.float64) for a in m]
        self.v = None if v is None else [np.array(a, dtype=np.float64) for a in v]
