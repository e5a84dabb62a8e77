"""Export a tuned draft length by batch size schedule as vLLM, TensorRT-LLM and SGLang configs.

Why: spectune finds the best k per load, and each engine can switch k by batch size at run time
in its own format. Every config is checked against its engine's rules before it is written, so a
bad table fails here with a clear message instead of at server start, or silently.

vLLM (docs/features/speculative_decoding/dynamic_speculative_decoding.md; vllm/config/
speculative.py; vllm/v1/spec_decode/dynamic/utils.py): `speculative_config.
num_speculative_tokens_per_batch_size`, inclusive [start_bs, end_bs, K] ranges. The first starts
at 1, none overlap, 0 <= K <= num_speculative_tokens (> 0). Past the last range its K holds, and
a gap takes the previous K (as in policies/batch_adaptive.py). The table is off with data
parallel > 1. Stricter here: ranges must also be sorted and contiguous.
TensorRT-LLM (tensorrt_llm/llmapi/llm_args.py `DecodingBaseConfig`; tensorrt_llm/_torch/
speculative/utils.py `get_draft_len_for_batch_size`; docs/source/features/speculative-decoding.md):
`speculative_config.draft_len_schedule` {batch_size: draft_len}. A key is the largest batch size
its value covers, and larger batches get 0. Keys >= 1, 0 <= value <= max_draft_len, value at the
smallest key == max_draft_len, no max_concurrency. So max_draft_len = k at batch size 1, which
must be the largest k. Releases before PR #10860 read keys as lower bounds; not targeted. Choice
made here: a last k > 0 gets key max_batch (TensorRT-LLM cannot hold the last value), and
`how_to_use` says that larger batches will not speculate.
SGLang (docs_new/docs/advanced_features/adaptive_speculative_decoding.mdx; python/sglang/srt/
speculative/adaptive_spec_params.py, adaptive_step_router.py) has no fixed table. The closest is
`--speculative-adaptive-config`: integer-string keys = the smallest batch size of each range,
each with `candidate_steps` (the speculative_num_steps tiers its EMA policy picks from). One
candidate per range fixes the step, and that is what is written here. Other keys are global
settings or are ignored. Limits: EAGLE/EAGLE3, topk 1; batch-size keys need SGLang with PR
#24055 (older releases ignore them). A batch is padded to the next CUDA-graph batch size before
its range is chosen. The code accepts step 0 (its default has a [0] slot),
although the docs say positive.
"""

from __future__ import annotations

import json
import numbers
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise
from math import isfinite
from pathlib import Path
from typing import Any

from spectune.files import write_json

# SGLang adaptive config keys that are not batch sizes: the documented globals, `strategy`
# (read by adaptive_spec_params.py), and the note that this module adds.
_SGLANG_GLOBALS = ("ema_alpha", "update_interval", "warmup_batches", "strategy", "_spectune")


class ExportError(ValueError):
    """A schedule or engine config that an engine would reject or misread. The message says
    what is wrong, where, and what to do."""


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class BatchSchedule:
    """Draft length by batch size: steps[i] = (largest batch size covered, k); sorted by batch
    size; batch sizes above the last step use the last k."""

    steps: tuple[tuple[int, int], ...]
    k_max: int  # the engine's maximum draft length (num_speculative_tokens)
    source: str = ""  # where it came from, e.g. "spectune tune: best fixed k per rate ..."

    def __post_init__(self) -> None:
        if not (_is_int(self.k_max) and self.k_max >= 0 and len(self.steps) > 0 and all(
                isinstance(s, Sequence) and len(s) == 2 and all(map(_is_int, s))
                for s in self.steps)):
            raise ExportError(f"BatchSchedule(steps={self.steps!r}, k_max={self.k_max!r}): need "
                              "(batch size, k) integer pairs, at least one, and k_max >= 0")
        steps = tuple((int(bs), int(k)) for bs, k in self.steps)
        for i, (bs, k) in enumerate(steps):
            if bs < 1 or (i and bs <= steps[i - 1][0]):
                raise ExportError(f"steps[{i}] batch size {bs}: batch sizes must be >= 1 and "
                                  "strictly increasing")
            if not 0 <= k <= self.k_max:
                raise ExportError(f"steps[{i}] k = {k}: must be in 0..k_max={self.k_max}")
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "k_max", int(self.k_max))


def schedule_from_points(points: Sequence[tuple[float, int]], k_max: int, max_batch: int,
                         source: str = "") -> BatchSchedule:
    """From measured (mean batch size, best k) pairs (one per request rate, any order, batch sizes
    may be fractional and may repeat): piecewise-constant k over integer batch sizes 1..max_batch,
    each batch size taking the k of the nearest point (ties -> the larger batch point), adjacent
    equal k merged; the last step covers max_batch. Points at the same batch size that disagree
    give the smaller k, because speculating less is the safe choice."""
    if not (_is_int(max_batch) and max_batch >= 1 and _is_int(k_max) and k_max >= 0):
        raise ExportError(f"need integers max_batch >= 1 and k_max >= 0, got {max_batch!r}, "
                          f"{k_max!r}")
    best: dict[Fraction, int] = {}
    for i, (x, k) in enumerate(points):
        if (not isinstance(x, numbers.Real) or isinstance(x, bool) or not isfinite(x)
                or x <= 0):
            raise ExportError(f"points[{i}]: mean batch size {x!r} must be a finite number > 0")
        if not _is_int(k) or not 0 <= k <= k_max:
            raise ExportError(f"points[{i}]: k = {k!r} must be an integer in 0..k_max={k_max}")
        key = Fraction(float(x))  # exact, so ties are exact
        best[key] = min(best.get(key, int(k)), int(k))
    if not best:
        raise ExportError("no points: give at least one (mean batch size, k) pair")
    xs = sorted(best)
    mids = [(a + b) / 2 for a, b in pairwise(xs)]
    steps: list[tuple[int, int]] = []
    for b in range(1, max_batch + 1):
        k = best[xs[bisect_right(mids, b)]]  # on a midpoint: the larger batch point
        if steps and steps[-1][1] == k:
            steps[-1] = (b, k)
        else:
            steps.append((b, k))
    return BatchSchedule(tuple(steps), k_max, source)


def _ranges(schedule: BatchSchedule) -> list[list[int]]:
    """Inclusive [lo, hi, k] ranges, contiguous from batch size 1."""
    los = [1] + [bs + 1 for bs, _ in schedule.steps[:-1]]
    return [[lo, bs, k] for lo, (bs, k) in zip(los, schedule.steps)]


def to_vllm(schedule: BatchSchedule) -> dict:
    if schedule.k_max < 1:
        raise ExportError(f"vllm: num_speculative_tokens = k_max = {schedule.k_max}: vLLM needs "
                          ">= 1; give the engine's maximum draft length as k_max")
    return {"speculative_config": {"num_speculative_tokens": schedule.k_max,
                                   "num_speculative_tokens_per_batch_size": _ranges(schedule)}}


def to_trtllm(schedule: BatchSchedule) -> dict:
    first, top = schedule.steps[0][1], max(k for _, k in schedule.steps)
    if first < top or top == 0:
        raise ExportError(f"trtllm: k is {first} at batch size 1 and at most {top}; TensorRT-LLM "
                          "needs the k at its smallest key to be max_draft_len >= 1, the largest"
                          " k. Smooth the schedule so k never rises, or export other engines")
    table = {str(bs): k for bs, k in schedule.steps}  # JSON keys are strings
    return {"speculative_config": {"max_draft_len": first, "draft_len_schedule": table}}


def to_sglang(schedule: BatchSchedule) -> dict:
    return {str(lo): {"candidate_steps": [k]} for lo, _, k in _ranges(schedule)}


def _section(config: Any, engine: str, name: str) -> Mapping:
    spec = config.get(name) if isinstance(config, Mapping) else None
    if not isinstance(spec, Mapping):
        raise ExportError(f"{engine}: config has no {name!r} object; export with to_{engine}()")
    return spec


def _key_bs(key: Any, at: str) -> int:
    if not (_is_int(key) or (isinstance(key, str) and key.isascii() and key.isdigit())):
        raise ExportError(f"{at}: key is not a batch size (an integer >= 1, e.g. \"8\")")
    if int(key) < 1:
        raise ExportError(f"{at}: batch size {int(key)} < 1; every key must be >= 1, so that "
                          "the table covers batch sizes from 1")
    return int(key)


def _check_k(k: Any, at: str, cap: int | None, cap_name: str) -> None:
    if not _is_int(k):
        raise ExportError(f"{at} = {k!r}: the draft length must be an integer")
    if k < 0:
        raise ExportError(f"{at} = {k}: negative draft length; use 0 to stop speculating there")
    if cap is not None and k > cap:
        raise ExportError(f"{at} = {k}: exceeds {cap_name} = {cap}; lower it or raise {cap_name}")


def _check_order(bs: int, prev: int | None, at: str) -> None:
    if prev is not None and bs == prev:
        raise ExportError(f"{at}: batch size {bs} appears twice (overlapping ranges); keep one")
    if prev is not None and bs < prev:
        raise ExportError(f"{at}: not sorted, {bs} comes after {prev}; order keys by batch size")


def validate_vllm(config: dict) -> None:
    spec = _section(config, "vllm", "speculative_config")
    n = spec.get("num_speculative_tokens")
    if not _is_int(n) or n < 1:
        raise ExportError(f"vllm: speculative_config.num_speculative_tokens = {n!r}: must be an "
                          "integer >= 1 (vLLM's maximum draft window)")
    where = "vllm: speculative_config.num_speculative_tokens_per_batch_size"
    table = spec.get("num_speculative_tokens_per_batch_size")
    if not isinstance(table, list) or not table:
        raise ExportError(f"{where} must be a non-empty list of [start_bs, end_bs, K] ranges")
    for i, row in enumerate(table):
        at, prev = f"{where}[{i}] = {row!r}", (table[i - 1] if i else None)
        if not (isinstance(row, (list, tuple)) and len(row) == 3 and all(map(_is_int, row))):
            raise ExportError(f"{at}: not [start_bs, end_bs, K], three integers, e.g. [1, 8, 4]")
        lo, hi, k = row
        if lo < 1 or hi < lo:
            raise ExportError(f"{at}: need 1 <= start_bs <= end_bs")
        _check_k(k, f"{at}: K", n, "num_speculative_tokens")
        if prev is not None and lo < prev[0]:
            raise ExportError(f"{at}: not sorted, it comes after {prev}; order by batch size")
        if prev is not None and lo <= prev[1]:
            raise ExportError(f"{at}: overlaps {prev}; start each range at the previous end + 1")
        if prev is not None and lo > prev[1] + 1:
            raise ExportError(f"{at}: gap after {prev} (batch sizes {prev[1] + 1}..{lo - 1}); "
                              "start each range at the previous end + 1")
    if table[0][0] != 1:
        raise ExportError(f"{where}: the first range starts at {table[0][0]}; vLLM requires "
                          "it to start at batch size 1 so every batch size has a K")


def validate_trtllm(config: dict) -> None:
    spec = _section(config, "trtllm", "speculative_config")
    m = spec.get("max_draft_len")
    if not _is_int(m) or m < 1:
        raise ExportError(f"trtllm: speculative_config.max_draft_len = {m!r}: must be an integer"
                          " >= 1 (with 0 nothing is drafted; Eagle3 rejects it)")
    if spec.get("max_concurrency") is not None:
        raise ExportError("trtllm: speculative_config sets both max_concurrency and "
                          "draft_len_schedule, which TensorRT-LLM rejects; remove max_concurrency")
    table = spec.get("draft_len_schedule")
    if not isinstance(table, Mapping) or not table:
        raise ExportError("trtllm: speculative_config.draft_len_schedule must be a non-empty "
                          "object {batch_size: draft_len}")
    prev: int | None = None
    for key, k in table.items():
        at = f"trtllm: speculative_config.draft_len_schedule[{key!r}]"
        bs = _key_bs(key, at)
        _check_order(bs, prev, at)
        _check_k(k, at, m, "max_draft_len")
        prev = bs
    bs, k = min((int(key), k) for key, k in table.items())
    if k != m:
        raise ExportError(f"trtllm: draft_len_schedule at its smallest key ({bs}) is {k}, but "
                          f"max_draft_len is {m}; TensorRT-LLM requires them equal")


def validate_sglang(config: dict, k_max: int | None = None) -> None:
    """SGLang's adaptive config has no cap on steps, so 'K > max' is checked only against a
    given k_max. Each range must have exactly one candidate: spectune writes a fixed table."""
    if not isinstance(config, Mapping):
        raise ExportError("sglang: the adaptive config must be a JSON object")
    keys: list[int] = []
    for key, entry in config.items():
        if key in _SGLANG_GLOBALS:
            continue
        at = f"sglang: [{key!r}]"
        bs = _key_bs(key, f"{at} (SGLang silently ignores keys that are not batch sizes)")
        _check_order(bs, keys[-1] if keys else None, at)
        steps = entry.get("candidate_steps") if isinstance(entry, Mapping) else None
        if not isinstance(steps, list) or len(steps) != 1:
            raise ExportError(f"{at}.candidate_steps = {steps!r}: give exactly one step, e.g. "
                              "[3]; several candidates let SGLang's EMA policy choose among them")
        _check_k(steps[0], f"{at}.candidate_steps[0]", k_max, "k_max")
        keys.append(bs)
    if not keys:
        raise ExportError('sglang: no batch-size key; write e.g. {"1": {"candidate_steps": [4]}}')
    if keys[0] != 1:
        raise ExportError(f"sglang: the smallest batch-size key is {keys[0]}; start at 1 (SGLang "
                          "would send smaller batches to this range anyway)")


def _k_from_config(engine: str, config: Mapping, batch_size: int) -> int:
    """The k that `engine` runs at `batch_size` under `config`, following that engine's lookup
    (SGLang: before its CUDA-graph padding)."""
    if engine == "vllm":
        spec = config["speculative_config"]
        k = 0
        for lo, _, kk in sorted(spec["num_speculative_tokens_per_batch_size"]):
            if lo > batch_size:
                break
            k = kk  # the containing range, or the last one before a gap / past the end
        return min(spec["num_speculative_tokens"], k)
    if engine == "trtllm":
        items = sorted((int(b), k) for b, k in config["speculative_config"]
                       ["draft_len_schedule"].items())
        i = bisect_left([b for b, _ in items], batch_size)
        return items[i][1] if i < len(items) else 0
    slots = sorted((int(b), e["candidate_steps"][0]) for b, e in config.items()
                   if b not in _SGLANG_GLOBALS)
    return slots[max(0, bisect_right([b for b, _ in slots], batch_size) - 1)][1]


def _how_to_use(engine: str, schedule: BatchSchedule, config: Mapping) -> str:
    (last, last_k), ks = schedule.steps[-1], [k for _, k in schedule.steps]
    if engine == "vllm":
        spec = json.dumps({"method": "<eagle3|mtp|...>", "model": "<draft model>",
                           **config["speculative_config"]}, separators=(",", ":"))
        return (f"vllm serve <model> --speculative-config '{spec}'. Batch sizes above {last} "
                f"keep K={last_k}. vLLM ignores the table when --data-parallel-size > 1.")
    if engine == "trtllm":
        return ("Copy speculative_config into the YAML for trtllm-serve/trtllm-bench --config, "
                "adding decoding_type (e.g. Eagle3) and speculative_model; no max_concurrency. "
                "Needs TensorRT-LLM with upper-bound keys (main since PR #10860)."
                + (f" Batches above {last} get 0 (no speculation): keep max_batch_size <= "
                   f"{last} to match the schedule." if last_k else ""))
    ends, top = [bs for bs, _ in schedule.steps[:-1]], max(1, *ks)
    pad = (f" SGLang pads a batch to the next CUDA-graph batch size before picking its range: "
           f"put {ends} in --cuda-graph-bs for an exact match." if ends else "")
    return ("python -m sglang.launch_server --model-path <model> --speculative-algorithm EAGLE3 "
            "--speculative-draft-model-path <draft> --speculative-eagle-topk 1 "
            f"--speculative-num-steps {top} --speculative-num-draft-tokens {top + 1} "
            "--speculative-adaptive --speculative-adaptive-config <this file> (SGLang with "
            "batch-size keys, PR #24055). No attention DP."
            + pad + (" Step 0 needs an SGLang that accepts 0 steps." if 0 in ks else ""))


EXPORTERS: dict[str, tuple[Callable[..., dict], Callable[..., None], str]] = {
    "vllm": (to_vllm, validate_vllm, "vllm_speculative_config.json"),
    "trtllm": (to_trtllm, validate_trtllm, "trtllm_speculative_config.json"),
    "sglang": (to_sglang, validate_sglang, "sglang_adaptive_config.json"),
}


def write_exports(folder: Path, schedule: BatchSchedule,
                  engines: Sequence[str] | None = None) -> dict[str, str]:
    """Write every engine's config (validated first) as JSON under folder, each with a
    "_spectune" note {source, schedule, k_max, how_to_use}; return {engine: relative filename}.
    All or nothing: if any engine cannot express the schedule, nothing is written."""
    names = list(EXPORTERS) if engines is None else list(engines)
    if set(names) - set(EXPORTERS):
        raise ExportError(f"unknown engine in {names}; choose from {sorted(EXPORTERS)}")
    configs, problems = {}, []
    for name in names:
        to_fn, validate, _ = EXPORTERS[name]
        try:
            config = to_fn(schedule)
            validate(config)
        except ExportError as exc:
            problems.append(str(exc))
            continue
        configs[name] = {**config, "_spectune": {
            "source": schedule.source, "schedule": [list(s) for s in schedule.steps],
            "k_max": schedule.k_max, "how_to_use": _how_to_use(name, schedule, config)}}
    if problems:
        raise ExportError("nothing written: " + " | ".join(problems)
                          + ". Fix the schedule, or pass engines= without those engines")
    for name, config in configs.items():
        write_json(Path(folder) / EXPORTERS[name][2], config)
    return {name: EXPORTERS[name][2] for name in configs}
