"""Typed algorithm settings: one frozen dataclass per algorithm declares its `algo.*` keys.

Why: the keys, their types, ranges and defaults used to be spread over YAML presets, a
validate function in the registry and `.get(key, default)` calls in clients and strategies.
Now the dataclass (beside the algorithm's client) is the one place; this module turns
`cfg.algo` into an instance and checks it from the field metadata.

    @dataclass(frozen=True)
    class DittoSettings(AlgoSettings):
        lambda_: float = setting(0.1, ge=0)          # YAML key `lambda`
        personal_epochs: int = setting(5, ge=1)      # YAML key `personal-epochs`

YAML keys are the field names with `_` -> `-` and a trailing `_` dropped (for Python keywords).
Supported types: bool, int, float, str, tuple[int, ...] and tuple[float, ...] (YAML lists).
Messages read `algo.<key>=<value>: <rule>`, one line, as every other config error.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from fedapps.errors import ConfigError

S = TypeVar("S", bound="AlgoSettings")


@dataclasses.dataclass(frozen=True)
class AlgoSettings:
    """An algorithm without algo keys (FedAvg, FedRoD); the base of every settings class."""

    @property
    def upload_prefix(self) -> str:
        """State entries a client uploads and the server averages ('' = the whole model)."""
        return ""

    def check_run(self, cfg: Any) -> None:
        """Rules that tie algo keys to the rest of the config (e.g. Fed-Cyclic's chains <=
        clients per round); raise ConfigError. Default: none."""


def setting(default: Any, *, ge: float | None = None, gt: float | None = None,
            le: float | None = None, choices: Sequence[str] | None = None,
            what: str = "items") -> Any:
    """A settings field: its default and the rule it must satisfy.

    ge/gt/le bound numbers (each item of a list); choices lists allowed strings; `what` names
    a list's items in messages ("capacities must be in (0, 1]")."""
    rule = {"ge": ge, "gt": gt, "le": le, "choices": tuple(choices) if choices else None}
    metadata = {k: v for k, v in rule.items() if v is not None}
    metadata["what"] = what
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class SharedPrefixSettings(AlgoSettings):
    """Base + head methods: `shared-prefix` '' uploads the whole model (G = the average of
    full models, seed 000 s.6), 'base.' keeps the heads on the clients."""

    shared_prefix: str = setting("", choices=("", "base."))

    @property
    def upload_prefix(self) -> str:
        return self.shared_prefix


def key_of(f: dataclasses.Field) -> str:
    """YAML key of a field: `personal_epochs` -> `personal-epochs`, `lambda_` -> `lambda`."""
    return f.name.rstrip("_").replace("_", "-")


def allowed_keys(cls: type[AlgoSettings]) -> list[str]:
    """The algo keys an algorithm accepts, sorted (for 'unknown key' messages)."""
    return sorted(key_of(f) for f in dataclasses.fields(cls))


def as_dict(settings: AlgoSettings) -> dict[str, Any]:
    """Hyphenated keys -> plain values (lists for tuples): what config.yaml records."""
    return {key_of(f): _plain(getattr(settings, f.name)) for f in dataclasses.fields(settings)}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _range_text(meta: Mapping[str, Any]) -> str:
    """'>= 1', '> 0', 'in (0, 1]' or '' from a field's bounds."""
    low = ("(", meta["gt"]) if "gt" in meta else ("[", meta["ge"]) if "ge" in meta else None
    if low is not None and "le" in meta:
        return f"in {low[0]}{low[1]:g}, {meta['le']:g}]"
    if low is not None:
        return f"{'>' if low[0] == '(' else '>='} {low[1]:g}"
    return f"<= {meta['le']:g}" if "le" in meta else ""


def _in_range(value: float, meta: Mapping[str, Any]) -> bool:
    return (("gt" not in meta or value > meta["gt"]) and ("ge" not in meta or value >= meta["ge"])
            and ("le" not in meta or value <= meta["le"]))


def _is_number(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind is int else isinstance(value, int | float)


def _rule(kind: type, meta: Mapping[str, Any], plural: bool = False) -> str:
    """The one-line rule of a numeric field, e.g. 'must be an integer >= 1'."""
    names = {int: ("an integer", "integers"), float: ("a number", "numbers")}[kind]
    span = _range_text(meta)
    if span.startswith("in "):
        return span  # an interval says it all: 'in (0, 1]'
    return f"{names[plural]} {span}".rstrip()


def _convert(key: str, hint: Any, meta: Mapping[str, Any], value: Any) -> Any:
    """Check one value against its field's type and rule; return it typed."""

    def fail(rule: str, shown: Any = None) -> ConfigError:
        shown = value if shown is None else shown
        text = f"{shown}" if isinstance(shown, list) else f"{shown!r}"
        return ConfigError(f"algo.{key}={text}: {rule}")

    if hint is bool:
        if not isinstance(value, bool):
            raise fail("must be true or false")
        return value
    if hint is str:
        choices = meta.get("choices")
        if choices is not None and value not in choices:
            raise fail(f"allowed: {', '.join(choices)}")
        if not isinstance(value, str):
            raise fail("must be a string")
        return value
    if hint in (int, float):
        if not _is_number(value, hint) or not _in_range(value, meta):
            raise fail(f"must be {_rule(hint, meta)}")
        return hint(value)
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise fail(f"must be a list of {_rule(item, {}, plural=True)}")
        items = list(value)
        if not items:
            raise fail("must be a non-empty list", items)
        if any(not _is_number(v, item) or not _in_range(v, meta) for v in items):
            raise fail(f"{meta['what']} must be {_rule(item, meta, plural=True)}", items)
        return tuple(item(v) for v in items)
    raise TypeError(f"settings field algo.{key}: unsupported type {hint!r}")


def build_settings(cls: type[S], algo: Mapping[str, Any] | None) -> S:
    """A validated `cls` from a mapping of hyphenated algo keys (missing keys: defaults).

    Raises ConfigError for an unknown key (listing the allowed ones) or a bad value."""
    if algo is None:
        algo = {}
    if not isinstance(algo, Mapping):
        raise ConfigError(f"algo={algo!r}: must be a mapping of algorithm keys")
    fields = {key_of(f): f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in algo:
        if key not in fields:
            allowed = ", ".join(allowed_keys(cls))
            raise ConfigError(f"algo.{key}: unknown key; " + (f"allowed here: {allowed}" if allowed
                              else "this algorithm takes no algo.* keys"))
    values = {f.name: _convert(key, hints[f.name], f.metadata, algo[key])
              for key, f in fields.items() if key in algo}
    return cls(**values)


def check_defaults(cls: type[AlgoSettings]) -> AlgoSettings:
    """The defaults must satisfy their own rules (tests call this for every algorithm)."""
    return build_settings(cls, as_dict(cls()))
