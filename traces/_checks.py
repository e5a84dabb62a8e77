"""Small argument checks shared by the modules, so every message has the same shape."""

from __future__ import annotations

import math
import numbers

from traces.errors import TraceError


def positive_finite(name: str, value: object) -> float:
    """Return `value` as a float, or raise TraceError unless it is a finite number > 0."""
    number = _real(name, value)
    if not (math.isfinite(number) and number > 0):
        raise TraceError(f"{name} must be a finite number > 0 (got {value!r})")
    return number


def unit_interval(name: str, value: object) -> float:
    """Return `value` as a float, or raise TraceError unless 0 <= value <= 1."""
    number = _real(name, value)
    if not 0.0 <= number <= 1.0:
        raise TraceError(f"{name} must be between 0 and 1 inclusive (got {value!r})")
    return number


def count(name: str, value: object, minimum: int = 1) -> int:
    """Return `value` as an int, or raise TraceError unless it is an integer >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TraceError(f"{name} must be an integer >= {minimum} (got {value!r})")
    if value < minimum:
        raise TraceError(f"{name} must be an integer >= {minimum} (got {value!r})")
    return int(value)


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TraceError(f"{name} must be a number (got {value!r})")
    return float(value)
