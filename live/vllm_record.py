"""An n-gram acceptance recording made on vLLM (`spectune record --engine vllm`).

vLLM serves each prompt greedily without speculation; the n-gram trace then follows from its
prompt and vLLM's own output (live/vllm_acceptance.py), so the simulator replays what vLLM's
n-gram proposer would accept on vLLM's outputs, at any k. All prompts are sent at once: this run
is not timed, only its outputs are kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from live.vllm_acceptance import ngram_trace
from live.vllm_client import serve_workload, warm_up
from live.vllm_server import VllmServer, VllmSettings
from traces import SpeculationTrace, Workload


def record_on_vllm(settings: VllmSettings, venv: Path, prompts: Sequence[Sequence[int]],
                   keys: Sequence[str], categories: Sequence[str], output_tokens: int,
                   max_run: int, meta: dict, out: Path) -> SpeculationTrace:
    """Serve every prompt for `output_tokens` greedy tokens on one vLLM server (no speculation),
    write out/outputs.json, out/server.log and out/trace.npz, and return the trace."""
    out.mkdir(parents=True, exist_ok=True)
    n = len(prompts)
    workload = Workload(arrival_s=np.zeros(n), prompt_tokens=np.array([len(p) for p in prompts]),
                        output_tokens=np.full(n, output_tokens), request_ids=np.arange(n),
                        source="vLLM recording (all at once)")
    with VllmServer(settings, venv, out / "server.log") as server:
        warm_up(server.url, str(settings.model_dir), prompts)
        served = serve_workload(server.url, str(settings.model_dir), workload, prompts)
    errors = [s.error for s in served if s.error]
    if errors:
        raise RuntimeError(f"{len(errors)} of {n} requests failed; the first: {errors[0]} "
                           f"(server log: {out / 'server.log'})")
    outputs = [s.token_ids for s in served]
    (out / "outputs.json").write_text(json.dumps(dict(zip(keys, outputs))))
    trace = ngram_trace(prompts, outputs, max_run, meta, keys=keys, categories=categories)
    trace.save(out / "trace.npz")
    return trace
