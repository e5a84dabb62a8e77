"""`spectune record --engine vllm`: the n-gram recording of vLLM's own greedy outputs
(live/vllm_record.py), written as `spectune record` writes its own (trace.npz, summary.json)."""

from __future__ import annotations

import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path


def ngram_sizes(drafter: str) -> tuple[int, int]:
    """(min, max) suffix lengths of "ngram" or "ngram:MIN-MAX" (vLLM's prompt_lookup_min/max)."""
    if drafter == "ngram":
        return 1, 3
    lo, _, hi = drafter.removeprefix("ngram:").partition("-")
    valid = drafter.startswith("ngram:") and lo.isdigit() and hi.isdigit()
    if not (valid and 0 < int(lo) <= int(hi)):
        raise ValueError(f"--drafter {drafter!r}: write ngram or ngram:MIN-MAX, e.g. ngram:1-3")
    return int(lo), int(hi)


def run_record_vllm(spec, out: Path, summarize) -> dict:
    """Serve the selected prompts on vLLM, rebuild the n-gram trace; write and return the
    summary (`summarize(requests, k)`: spectune record's acceptance summary)."""
    from live.vllm_record import record_on_vllm
    from live.vllm_server import VllmSettings, resolve_venv, vllm_python
    from models.gguf import load_smollm2_tokenizer
    from models.tokenizer import chat_prompt
    from spectune.files import write_json
    from traces.prompts import first_per_category, in_split, load_prompts

    started = time.perf_counter()
    lo, hi = ngram_sizes(spec.drafter)
    venv = resolve_venv(spec.vllm_venv)
    vllm_python(venv)  # a missing environment says what to run before any work
    path = spec.prompts_path()
    prompts = [p for p in load_prompts(path, None, spec.categories) if in_split(p.key, spec.split)]
    prompts = first_per_category(prompts, spec.limit)
    tokenizer = load_smollm2_tokenizer()
    ids = [tokenizer.encode(chat_prompt(p.text)) for p in prompts]
    target = "SmolLM2-135M-Instruct served by vLLM (bf16; weights dequantised from the GGUF)"
    meta = {"target": target, "engine": "vllm", "max_tokens": spec.max_tokens,
            "split": spec.split, "prompts_file": str(path),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source": "vLLM's greedy outputs (ignore_eos), n-gram lookup replayed on them"}
    settings = VllmSettings(venv / "models" / "SmolLM2-135M-Instruct", prompt_lookup_min=lo,
                            prompt_lookup_max=hi, seed=spec.seed)
    trace = record_on_vllm(settings, venv, ids, [p.key for p in prompts],
                           [p.category for p in prompts], spec.max_tokens,
                           spec.max_run, meta, Path(out))
    summary = {"drafter": spec.drafter, "target": target, "k": spec.k, "engine": "vllm",
               **summarize(trace.requests, spec.k), "trace": str(Path(out) / "trace.npz"),
               "prompts_file": str(path), "resumed": 0, "spec": asdict(spec),
               "wall_s": time.perf_counter() - started}
    write_json(Path(out) / "summary.json", summary)
    return summary
