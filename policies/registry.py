"""Policies registered by name; parameters come from each policy's dataclass fields."""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any

from policies.base import Policy, PolicyError

_REGISTRY: dict[str, type[Policy]] = {}


@dataclass(frozen=True)
class ParamInfo:
    """One policy parameter as users see it in `spectune policies` and `--set`, and what the
    tuner searches: a `grid` of values, or continuous `bounds` (lo, hi); neither: left at its
    default (a field's metadata declares them next to its help)."""

    name: str
    type_name: str
    default: Any
    help: str
    grid: tuple[Any, ...] | None = None
    bounds: tuple[float, float] | None = None
    #: values past the grid's top, tried in order while the best sits on the top (the last is
    #: the hard cap): a grid is a guess at where the optimum lies, not a limit of the policy
    extend: tuple[Any, ...] | None = None

    @property
    def searched(self) -> bool:
        return self.grid is not None or self.bounds is not None


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its `name`."""
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} has no `name`")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise TypeError(f"policy name {cls.name!r} is already registered")
    if not is_dataclass(cls):
        raise TypeError(f"policy {cls.name!r} must be a dataclass of its parameters")
    _check_search_metadata(cls)
    _REGISTRY[cls.name] = cls
    return cls


def _check_search_metadata(cls: type[Policy]) -> None:
    """A policy's declared grids and bounds must be usable: caught when it registers."""
    for f in fields(cls):
        grid, bounds = f.metadata.get("grid"), f.metadata.get("bounds")
        where = f"policy {cls.name!r} parameter {f.name!r}"
        if grid is not None and bounds is not None:
            raise TypeError(f"{where}: declare a grid or bounds, not both")
        if grid is not None and (not isinstance(grid, tuple) or not grid):
            raise TypeError(f"{where}: grid must be a non-empty tuple")
        if bounds is not None and not (len(bounds) == 2 and bounds[0] < bounds[1]):
            raise TypeError(f"{where}: bounds must be (lo, hi) with lo < hi")
        extend = f.metadata.get("extend")
        if extend is not None and (grid is None or not isinstance(extend, tuple) or not extend
                                   or list(extend) != sorted(set(extend))
                                   or extend[0] <= max(grid)):
            raise TypeError(f"{where}: extend must be a tuple of increasing values above the "
                            "grid's top")


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PolicyError(
            f"unknown policy {name!r}; known policies: {', '.join(policy_names())}"
        ) from None


def parameters(name: str) -> list[ParamInfo]:
    cls = policy_class(name)
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        if not f.init:
            continue
        default = f.default if f.default is not MISSING else None
        if f.default_factory is not MISSING:
            default = f.default_factory()
        help_text = f.metadata.get("help", "")
        out.append(ParamInfo(f.name, _type_name(hints[f.name]), default, help_text,
                             f.metadata.get("grid"), f.metadata.get("bounds"),
                             f.metadata.get("extend")))
    return out


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """Build a policy; string values (from `--set key=value`) are converted to the field's type."""
    cls = policy_class(name)
    hints = typing.get_type_hints(cls)
    known = {p.name for p in parameters(name)}
    kwargs = {}
    for key, value in (params or {}).items():
        if key not in known:
            listed = ", ".join(sorted(known)) or "(none)"
            raise PolicyError(f"policy {name!r} has no parameter {key!r}; its parameters: {listed}")
        kwargs[key] = _convert(name, key, value, hints[key]) if isinstance(value, str) else value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"policy {name!r}: {exc}") from None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(policy: str, key: str, text: str, tp: Any) -> Any:
    """Parse `text` as `tp`: int, float, bool, str, or JSON for anything structured."""
    where = f"policy {policy!r} parameter {key!r}"
    try:
        if tp is bool:
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if tp is int:
            return int(text)
        if tp is float:
            return float(text)
        if tp is str:
            return text
        return json.loads(text)
    except ValueError:
        raise PolicyError(f"{where}: cannot read {text!r} as {_type_name(tp)}") from None
