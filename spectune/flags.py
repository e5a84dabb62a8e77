"""Command-line flags derived from dataclass fields, so each default and help text has one home."""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import MISSING, fields
from typing import Any


def _inner(tp: Any) -> tuple[Any, bool]:
    """(base type, optional?) of `T` or `T | None`."""
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if (origin is typing.Union or origin is types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, title: str,
                        skip: tuple[str, ...] = (), shown: dict[str, str] | None = None) -> None:
    """One `--field-name` flag per dataclass field, typed and documented from the field.

    The help shows the default the job really uses: `shown[name]` where the job has its own
    (tune drafts by n-gram lookup where simulate drafts with Llama-68M), else the field's
    `unset` metadata (what None stands for), else the field's default."""
    group = parser.add_argument_group(title)
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.name in skip or not f.init:
            continue
        base, _ = _inner(hints[f.name])
        default = f.default if f.default is not MISSING else None
        flag = "--" + f.name.replace("_", "-")
        help_text = _escape(f.metadata.get("help", ""))
        text = (shown or {}).get(f.name, f.metadata.get("unset", default))
        suffix = "" if text is None else f" (default: {_escape(str(text))})"
        if base is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                               default=default, help=f"{help_text}{suffix}")
        else:
            group.add_argument(flag, dest=f.name, type=base, default=default,
                               metavar=base.__name__.upper(), help=f"{help_text}{suffix}")


def _escape(text: str) -> str:
    """argparse formats help with %: a literal % must be doubled."""
    return text.replace("%", "%%")


def dataclass_from_args(cls: type, args: argparse.Namespace, **extra: Any) -> Any:
    """Build `cls` from the parsed flags (only the fields it has)."""
    values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    values.update(extra)
    return cls(**values)


def _top_level_split(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def parse_policy_list(text: str, flag: str = "--policies") -> list[tuple[str, str, dict[str, str]]]:
    """(label, name, params) per comma-separated NAME[:KEY=VALUE...]:
    "fixed:k=4" -> ("fixed:k=4", "fixed", {"k": "4"}). Values stay text (make_policy types them);
    commas inside brackets belong to the value (batch_adaptive:schedule=[[1,4,4],[5,128,0]])."""
    out = []
    for label in (p.strip() for p in _top_level_split(text) if p.strip()):
        name, *pairs = label.split(":")
        params = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep:
                raise ValueError(f"{flag}: {label!r}: write NAME:KEY=VALUE")
            params[key] = value
        out.append((label, name, params))
    return out
