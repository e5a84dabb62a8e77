"""Export a tuned draft length by batch size schedule as vLLM, TensorRT-LLM and SGLang configs.

Why: spectune finds the best k per load, and each engine can switch k by batch size at run time
in its own format. Every config is checked against its engine's rules before it is written, so a
bad table fails here with a clear message instead of at server start, or silently. A schedule
is only worth its drafter: each config names the drafter that was tuned (`Drafter`), or is not
written, with the reason, where the engine cannot switch that drafter's k by batch size. The
engine facts behind each check, with their sources: docs/engine-exports.md.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from spectune.export_drafter import (  # noqa: F401  (re-exported: the export API)
    DRAFTER_KINDS,
    Drafter,
    drafter_from,
    scenario_drafter,
)
from spectune.export_schedule import (  # noqa: F401  (re-exported: the export API)
    BatchSchedule,
    ExportError,
    is_int,
    schedule_from_points,
)
from spectune.files import write_json

# SGLang adaptive config keys that are not batch sizes: the documented globals, `strategy`
# (read by adaptive_spec_params.py), and the note that this module adds.
_SGLANG_GLOBALS = ("ema_alpha", "update_interval", "warmup_batches", "strategy", "_spectune")


# -- each engine's name for the drafter -----------------------------------------------------------

#: Why no engine can switch these drafters' k by batch size, and what to do instead.
_NO_ENGINE = {
    "eagle-tree": ("its k is the depth of a static tree, and the engines' per-batch-size draft "
                   "lengths set a chain's length (SGLang's adaptive steps need "
                   "--speculative-eagle-topk 1; TensorRT-LLM's static trees, eagle_choices, are "
                   "deprecated and fix their depth)",
                   "Tune an EAGLE chain (a recording of spectune record --drafter eagle), or set "
                   "the tree by hand"),
    "eagle-ngram": ("no engine drafts EAGLE taking an n-gram lookup's token on a suffix match "
                    "(the nearest, TensorRT-LLM's Eagle3 with sa_config, matches otherwise and "
                    "was not tuned)",
                    "Tune an EAGLE chain (spectune record --drafter eagle) or the lookup alone "
                    "(--acceptance smollm2-ngram --draft none)"),
    "early-exit": ("no engine drafts with the target's own first layers",
                   "Save those layers and the head as a draft checkpoint and tune it as a draft "
                   "model (--draft or --profile)"),
}
_SGLANG_NAMES = {"ngram": "NGRAM", "draft-model": "STANDALONE"}


def _unsupported(engine: str, drafter: Drafter, why: str, todo: str) -> ExportError:
    return ExportError(f"{engine}: the tune drafted with {drafter.describe()}; {why}. {todo}")


def _no_engine(engine: str, drafter: Drafter) -> ExportError:
    return _unsupported(engine, drafter, *_NO_ENGINE[drafter.kind])


def _vllm_method(drafter: Drafter) -> dict:
    """speculative_config's method fields (vllm/config/speculative.py SpeculativeMethod)."""
    if drafter.kind == "ngram":
        lo, hi = drafter.ngram
        return {"method": "ngram", "prompt_lookup_min": lo, "prompt_lookup_max": hi}
    if drafter.kind == "draft-model":
        return {"method": "draft_model",
                **({"model": drafter.checkpoint} if drafter.checkpoint else {})}
    if drafter.kind == "eagle":
        return {"method": "eagle3"}  # spectune's head fuses layers, as EAGLE-3 does
    raise _no_engine("vllm", drafter)


def _trtllm_method(drafter: Drafter) -> dict:
    """speculative_config's decoding_type fields (llm_args.py *DecodingConfig)."""
    if drafter.kind == "ngram":
        return {"decoding_type": "NGram", "max_matching_ngram_size": drafter.ngram[1]}
    if drafter.kind == "draft-model":
        return {"decoding_type": "DraftTarget",
                **({"speculative_model": drafter.checkpoint} if drafter.checkpoint else {})}
    if drafter.kind == "eagle":
        return {"decoding_type": "Eagle3"}
    raise _no_engine("trtllm", drafter)


def _sglang_algorithm(drafter: Drafter) -> str:
    """--speculative-algorithm, where the adaptive config can run it (EAGLE/EAGLE3 only)."""
    if drafter.kind == "eagle":
        return "EAGLE3"
    if drafter.kind in _NO_ENGINE:
        raise _no_engine("sglang", drafter)
    name = _SGLANG_NAMES[drafter.kind]
    raise _unsupported(
        "sglang", drafter, f"SGLang runs it as --speculative-algorithm {name}, but its "
        "per-batch-size steps (--speculative-adaptive-config) run only with EAGLE/EAGLE3 at "
        "topk 1 (adaptive_spec_params.py adaptive_unsupported_reason)",
        f"Use the vLLM or TensorRT-LLM config, or run SGLang {name} at one fixed draft length")


def _missing_model(drafter: Drafter) -> str | None:
    """What the user must add as the draft weights, where the export cannot name them."""
    if drafter.kind == "eagle":
        return "<EAGLE-3 head trained for <model>>"
    if drafter.kind == "draft-model" and not drafter.checkpoint:
        return f"<checkpoint of {drafter.model}>"
    return None


# -- engine configs -------------------------------------------------------------------------------

def to_vllm(schedule: BatchSchedule, drafter: Drafter | None = None) -> dict:
    """vLLM's speculative_config: the drafter's method (none given: the table alone), the
    maximum draft window and the table."""
    if schedule.k_max < 1:
        raise ExportError(f"vllm: num_speculative_tokens = k_max = {schedule.k_max}: vLLM needs "
                          ">= 1; give the engine's maximum draft length as k_max")
    method = _vllm_method(drafter) if drafter is not None else {}
    return {"speculative_config": {**method, "num_speculative_tokens": schedule.k_max,
                                   "num_speculative_tokens_per_batch_size": schedule.ranges()}}


def to_trtllm(schedule: BatchSchedule, drafter: Drafter | None = None) -> dict:
    """TensorRT-LLM's speculative_config: decoding_type (none given: the table alone),
    max_draft_len and draft_len_schedule."""
    method = _trtllm_method(drafter) if drafter is not None else {}
    first, top = schedule.steps[0][1], max(k for _, k in schedule.steps)
    if first < top or top == 0:
        raise ExportError(f"trtllm: k is {first} at batch size 1 and at most {top}; TensorRT-LLM "
                          "needs the k at its smallest key to be max_draft_len >= 1, the largest"
                          " k. Smooth the schedule so k never rises, or export other engines")
    table = {str(bs): k for bs, k in schedule.steps}  # JSON keys are strings
    return {"speculative_config": {**method, "max_draft_len": first,
                                   "draft_len_schedule": table}}


def to_sglang(schedule: BatchSchedule, drafter: Drafter | None = None) -> dict:
    """SGLang's adaptive config, one candidate step per range. It has no algorithm key: the
    drafter is checked here and named on the launch command (`how_to_use`)."""
    if drafter is not None:
        _sglang_algorithm(drafter)
    return {str(lo): {"candidate_steps": [k]} for lo, _, k in schedule.ranges()}


def _section(config: Any, engine: str, name: str) -> Mapping:
    spec = config.get(name) if isinstance(config, Mapping) else None
    if not isinstance(spec, Mapping):
        raise ExportError(f"{engine}: config has no {name!r} object; export with to_{engine}()")
    return spec


def _key_bs(key: Any, at: str) -> int:
    if not (is_int(key) or (isinstance(key, str) and key.isascii() and key.isdigit())):
        raise ExportError(f"{at}: key is not a batch size (an integer >= 1, e.g. \"8\")")
    if int(key) < 1:
        raise ExportError(f"{at}: batch size {int(key)} < 1; every key must be >= 1, so that "
                          "the table covers batch sizes from 1")
    return int(key)


def _check_k(k: Any, at: str, cap: int | None, cap_name: str) -> None:
    if not is_int(k):
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
    if not is_int(n) or n < 1:
        raise ExportError(f"vllm: speculative_config.num_speculative_tokens = {n!r}: must be an "
                          "integer >= 1 (vLLM's maximum draft window)")
    where = "vllm: speculative_config.num_speculative_tokens_per_batch_size"
    table = spec.get("num_speculative_tokens_per_batch_size")
    if not isinstance(table, list) or not table:
        raise ExportError(f"{where} must be a non-empty list of [start_bs, end_bs, K] ranges")
    for i, row in enumerate(table):
        at, prev = f"{where}[{i}] = {row!r}", (table[i - 1] if i else None)
        if not (isinstance(row, (list, tuple)) and len(row) == 3 and all(map(is_int, row))):
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
    if not is_int(m) or m < 1:
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


def _how_vllm(schedule: BatchSchedule, config: Mapping, drafter: Drafter) -> str:
    (last, last_k), missing = schedule.steps[-1], _missing_model(drafter)
    spec = json.dumps({**config["speculative_config"], **({"model": missing} if missing else {})},
                      separators=(",", ":"))
    return (f"vllm serve <model> --speculative-config '{spec}'. Batch sizes above {last} keep "
            f"K={last_k}. vLLM ignores the table when --data-parallel-size > 1."
            + (" An EAGLE-1 head takes method eagle." if drafter.kind == "eagle" else
               " vLLM's docs list the table as tested with EAGLE, EAGLE-3 and DFlash: check in "
               "its log that K follows the batch size."))


def _how_trtllm(schedule: BatchSchedule, config: Mapping, drafter: Drafter) -> str:
    (last, last_k), missing = schedule.steps[-1], _missing_model(drafter)
    return ("Copy speculative_config into the YAML for trtllm-serve/trtllm-bench --config"
            + (f", adding speculative_model: {missing}" if missing else "")
            + "; no max_concurrency."
            + (" Set disable_overlap_scheduler: true, as the docs' NGram and DraftTarget examples"
               " do." if drafter.kind != "eagle" else "")
            + " Needs TensorRT-LLM with upper-bound keys (main since PR #10860)."
            + (f" Batches above {last} get 0 (no speculation): keep max_batch_size <= "
               f"{last} to match the schedule." if last_k else ""))


def _how_sglang(schedule: BatchSchedule, config: Mapping, drafter: Drafter) -> str:
    ks = [k for _, k in schedule.steps]
    ends, top = [bs for bs, _ in schedule.steps[:-1]], max(1, *ks)
    pad = (f" SGLang pads a batch to the next CUDA-graph batch size before picking its range: "
           f"put {ends} in --cuda-graph-bs for an exact match." if ends else "")
    return (f"python -m sglang.launch_server --model-path <model> --speculative-algorithm "
            f"{_sglang_algorithm(drafter)} --speculative-draft-model-path "
            f"{_missing_model(drafter)} --speculative-eagle-topk 1 "
            f"--speculative-num-steps {top} --speculative-num-draft-tokens {top + 1} "
            "--speculative-adaptive --speculative-adaptive-config <this file> (SGLang with "
            "batch-size keys, PR #24055; an EAGLE-1 head takes EAGLE). No attention DP."
            + pad + (" Step 0 needs an SGLang that accepts 0 steps." if 0 in ks else ""))


def _engine_method(engine: str, config: Mapping, drafter: Drafter) -> str:
    """The drafter's method as `engine` spells it."""
    if engine == "vllm":
        return config["speculative_config"]["method"]
    if engine == "trtllm":
        return config["speculative_config"]["decoding_type"]
    return _sglang_algorithm(drafter)


def _note(engine: str, schedule: BatchSchedule, config: Mapping, drafter: Drafter) -> dict:
    """The "_spectune" note: where the schedule came from, the drafter tuned, how to use it."""
    how = {"vllm": _how_vllm, "trtllm": _how_trtllm, "sglang": _how_sglang}[engine]
    named = {"kind": drafter.kind, "model": drafter.model, "checkpoint": drafter.checkpoint,
             "method": _engine_method(engine, config, drafter), "tuned": drafter.tuned,
             **({"caveat": drafter.caveat} if drafter.caveat else {})}
    return {"source": schedule.source, "schedule": [list(s) for s in schedule.steps],
            "k_max": schedule.k_max, "drafter": named,
            "how_to_use": how(schedule, config, drafter)}


EXPORTERS: dict[str, tuple[Callable[..., dict], Callable[..., None], str]] = {
    "vllm": (to_vllm, validate_vllm, "vllm_speculative_config.json"),
    "trtllm": (to_trtllm, validate_trtllm, "trtllm_speculative_config.json"),
    "sglang": (to_sglang, validate_sglang, "sglang_adaptive_config.json"),
}


def write_exports(folder: Path, schedule: BatchSchedule, drafter: Drafter,
                  engines: Sequence[str] | None = None) -> dict[str, str]:
    """Write every engine's config for `drafter` (validated first) as JSON under folder, each
    with a "_spectune" note {source, schedule, k_max, drafter, how_to_use}; return {engine:
    relative filename}. All or nothing: if any engine cannot express the schedule or the
    drafter, nothing is written."""
    names = list(EXPORTERS) if engines is None else list(engines)
    if set(names) - set(EXPORTERS):
        raise ExportError(f"unknown engine in {names}; choose from {sorted(EXPORTERS)}")
    configs, problems = {}, []
    for name in names:
        to_fn, validate, _ = EXPORTERS[name]
        try:
            config = to_fn(schedule, drafter)
            validate(config)
        except ExportError as exc:
            problems.append(str(exc))
            continue
        configs[name] = {**config, "_spectune": _note(name, schedule, config, drafter)}
    if len(problems) == len(names) == 1:
        raise ExportError(problems[0])  # nothing else was held back
    if problems:
        raise ExportError("nothing written: " + " | ".join(problems)
                          + ". Fix it, or pass engines= without those engines")
    for name, config in configs.items():
        write_json(Path(folder) / EXPORTERS[name][2], config)
    return {name: EXPORTERS[name][2] for name in configs}
