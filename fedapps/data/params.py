"""Typed settings of partitioners and transforms, read and validated from one declaration.

A `Param` names the config key it reads, its type, range or choices and default, so the same
table entry drives validation (one-line ConfigError naming the key), the values handed to the
function and the partition/transform cache keys. Nothing here imports Flower or torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from fedapps.errors import ConfigError

_MISSING = object()


@dataclass(frozen=True)
class Param:
    """One setting: the function receives `name`, read from the dotted config `key`."""

    name: str  # keyword argument of the partitioner / transform function
    key: str  # dotted config key, e.g. "data.alpha"
    type: type  # int | float | str | bool
    default: Any
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low < v (else low <= v)
    high_open: bool = False  # v < high (else v <= high)
    choices: tuple[str, ...] | None = None
    doc: str = ""
    nullable: bool = False  # null (None) is a valid value, e.g. "not set, use the others"

    def check(self, value: Any) -> Any:
        """The value converted to `type`, or a one-line ConfigError naming the key."""
        if value is None and self.nullable:
            return None
        if self.choices is not None:
            if value not in self.choices:
                self._fail(value, f"allowed: {', '.join(self.choices)}")
            return str(value)
        if self.type is bool:
            if not isinstance(value, bool):
                self._fail(value, "must be true or false")
            return value
        if self.type is int:
            if isinstance(value, bool) or not isinstance(value, int):
                self._fail(value, "must be an integer")
        elif self.type is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                self._fail(value, "must be a number")
        elif self.type is str:
            if not isinstance(value, str):
                self._fail(value, "must be a string")
            return value
        converted = self.type(value)
        self._check_range(converted, value)
        return converted

    def _check_range(self, value: float, shown: Any) -> None:
        lo, hi = self.low, self.high
        ok_lo = lo is None or (value > lo if self.low_open else value >= lo)
        ok_hi = hi is None or (value < hi if self.high_open else value <= hi)
        if ok_lo and ok_hi:
            return
        if lo is not None and hi is not None:
            rule = (f"must be in {'(' if self.low_open else '['}{lo:g}, "
                    f"{hi:g}{')' if self.high_open else ']'}")
        elif lo is not None:
            rule = f"must be {'>' if self.low_open else '>='} {lo:g}"
        else:
            rule = f"must be {'<' if self.high_open else '<='} {hi:g}"
        self._fail(shown, rule)

    def _fail(self, value: Any, rule: str) -> None:
        raise ConfigError(f"{self.key}={_plain(value)!r}: {rule}")

    def read(self, cfg: DictConfig) -> Any:
        """The checked value from `cfg`; a declared key that is absent is an error."""
        value = OmegaConf.select(cfg, self.key, default=_MISSING)
        if value is _MISSING:
            raise ConfigError(f"{self.key}: not set (needed here)")
        return self.check(value)


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value)
    return value


def read_params(cfg: DictConfig, params: Sequence[Param]) -> dict[str, Any]:
    """{param.name: checked value} of every parameter, in declaration order."""
    return {p.name: p.read(cfg) for p in params}


def present(cfg: DictConfig, key: str) -> bool:
    """Whether the dotted key exists in `cfg` (its value may be null)."""
    return OmegaConf.select(cfg, key, default=_MISSING) is not _MISSING
