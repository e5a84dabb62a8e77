"""Read and write workloads as JSON lines (one request object per line).

Uses the standard json module plus numpy (no pandas), which keeps `import traces` light and lets
every bad value be reported with its line number.
"""

from __future__ import annotations

import json

import numpy as np

from traces.errors import TraceError
from traces.workload import Workload
from traces.workload_columns import REQUIRED, _build, _require_finite, _whole


def _parse_jsonl(text: str, name: str, source: str) -> Workload:
    arrival: list[float] = []
    prompt: list[float] = []
    output: list[float] = []
    ids: list[float] = []
    prompts: list[str] = []
    categories: list[str] = []
    lines: list[int] = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TraceError(
                f"{name}: line {line}: invalid JSON ({exc.msg}); write one JSON object per line"
            ) from None
        if not isinstance(obj, dict):
            raise TraceError(f"{name}: line {line}: expected a JSON object, got "
                             f"{type(obj).__name__}; write one object per line")
        for key in REQUIRED:
            if key not in obj:
                raise TraceError(
                    f"{name}: line {line}: missing key {key!r} (have: {', '.join(obj)}); each line "
                    f"needs {', '.join(REQUIRED)}"
                )
        arrival.append(_json_number(obj["arrival_s"], "arrival_s", name, line))
        prompt.append(_json_number(obj["prompt_tokens"], "prompt_tokens", name, line))
        output.append(_json_number(obj["output_tokens"], "output_tokens", name, line))
        _optional(obj, "request_id", ids, lines, name, line, _json_number)
        _optional(obj, "prompt", prompts, lines, name, line, _json_string)
        _optional(obj, "category", categories, lines, name, line, _json_string)
        lines.append(line)
    if not lines:
        raise TraceError(f"{name}: empty file; a workload file needs at least one request")
    line_numbers = np.asarray(lines)
    arrival_array = np.asarray(arrival, dtype=np.float64)
    _require_finite(arrival_array, "arrival_s", name, line_numbers)
    return _build(
        name=name,
        source=source,
        arrival=arrival_array,
        prompt=_whole(np.asarray(prompt, dtype=np.float64), "prompt_tokens", name, line_numbers, 1),
        output=_whole(np.asarray(output, dtype=np.float64), "output_tokens", name, line_numbers, 1),
        ids=(_whole(np.asarray(ids, dtype=np.float64), "request_id", name, line_numbers, 0)
             if ids else None),
        prompts=prompts or None,
        categories=categories or None,
        lines=line_numbers,
    )


def _optional(obj: dict, key: str, into: list, seen: list[int], name: str, line: int,
              convert) -> None:
    """Collect an optional key, insisting it is on every line or on none (no silent gaps)."""
    present = key in obj and obj[key] is not None
    if present and len(into) != len(seen):
        raise TraceError(f"{name}: line {line} has {key!r} but earlier lines do not; give every "
                         f"line a {key!r} or none")
    if not present and into:
        raise TraceError(f"{name}: line {line} lacks {key!r} but earlier lines have it; give "
                         f"every line a {key!r} or none")
    if present:
        into.append(convert(obj[key], key, name, line))


def _json_number(value: object, key: str, name: str, line: int) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(
            f"{name}: line {line}: {key!r} has non-numeric value {value!r}; write a JSON number"
        )
    if isinstance(value, int) and abs(value) >= 2**53:
        raise TraceError(f"{name}: line {line}: {key!r} = {value} is too large")
    return float(value)


def _json_string(value: object, key: str, name: str, line: int) -> str:
    if not isinstance(value, str):
        raise TraceError(f"{name}: line {line}: {key!r} must be a string (got {value!r})")
    return value


def _jsonl_text(workload: Workload) -> str:
    lines = []
    for request in workload:
        obj: dict[str, object] = {
            "request_id": request.request_id,
            "arrival_s": request.arrival_s,
            "prompt_tokens": request.prompt_tokens,
            "output_tokens": request.output_tokens,
        }
        if request.prompt is not None:
            obj["prompt"] = request.prompt
        if request.category is not None:
            obj["category"] = request.category
        lines.append(json.dumps(obj, ensure_ascii=False))
    return "\n".join(lines) + "\n"
