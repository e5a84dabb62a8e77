"""`spectune validate --engine vllm`: serve a workload on a real vLLM, simulate the same workload
with vLLM's own profile, its scheduler (`--scheduler vllm-v1`) and the acceptance it saw, and
compare metric by metric.

Per policy (fixed:k=0 serves without speculation, fixed:k=K with vLLM's n-gram drafter of K
tokens: one server each) and rate: the measured run (live/vllm_run.py), the n-gram trace
rebuilt from what vLLM wrote (live/vllm_acceptance.py, checked against vLLM's per-step counts),
and the simulation. The simulator's inputs are measured apart from the runs it is compared
with: the profile (`spectune profile --engine vllm`) times controlled batches on another server.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulator import ConfigError

#: vLLM's log line with the KV cache it allocated, in tokens
KV_LINE = re.compile(r"KV cache size: ([0-9,]+) tokens")


@dataclass(frozen=True)
class VllmValidation:
    """What one `--engine vllm` validation runs."""

    profile: str  # a folder, a table prefix or a shipped name (vllm-cpu-smollm2)
    venv: Path
    model_dir: Path
    rates: tuple[float, ...]
    ks: tuple[int, ...]
    requests: int
    output_tokens: int
    seed: int = 0
    scheduler: str = "vllm-v1"


def ks_of(policy_specs: list[tuple[str, str, dict[str, str]]]) -> tuple[int, ...]:
    """fixed:k=K policies are what a vLLM server runs (k fixed when it starts)."""
    ks = []
    for label, name, params in policy_specs:
        if name != "fixed" or set(params) - {"k"}:
            raise ConfigError(f"--engine vllm serves fixed:k=K policies (one server each), not "
                              f"{label!r}")
        ks.append(int(params.get("k", "0")))
    return tuple(ks)


def spec_bench_workload(n: int, rate: float, output_tokens: int, seed: int):
    """(workload, prompt token ids): n held-out Spec-Bench questions in SmolLM2's chat template,
    Poisson arrivals at `rate`, `output_tokens` each."""
    from models.gguf import load_smollm2_tokenizer
    from models.tokenizer import chat_prompt
    from traces import Workload, poisson_arrivals
    from traces.prompts import DEFAULT_PROMPTS, in_split, load_prompts

    tok = load_smollm2_tokenizer()
    prompts = [p for p in load_prompts(DEFAULT_PROMPTS) if in_split(p.key, "eval")]
    picked = [prompts[i] for i in np.random.default_rng(seed).permutation(len(prompts))[:n]]
    ids = [tok.encode(chat_prompt(p.text)) for p in picked]
    arrivals = poisson_arrivals(rate, n, np.random.default_rng([seed, int(rate * 1000)]))
    wl = Workload(arrival_s=arrivals, prompt_tokens=np.array([len(x) for x in ids]),
                  output_tokens=np.full(n, output_tokens), request_ids=np.arange(n),
                  source=f"Spec-Bench eval questions x{n}, Poisson {rate:g}/s")
    return wl, ids


def measured_metrics(requests: pd.DataFrame, iterations: pd.DataFrame) -> dict[str, float]:
    """The compared metrics of a vLLM run, named as `validate_report.metrics` names them:
    emitted and drafted per decode request-step come from vLLM's iteration lines."""
    from simulator.metrics import latencies

    lat = latencies(requests)
    decode = float(iterations.generation_requests.sum())
    drafted = float((iterations.generation_tokens - iterations.generation_requests).sum())
    emitted = float(requests.output_tokens.sum() - len(requests))  # less the prefills' tokens
    span = float(requests.finish_s.max() - requests.arrival_s.min())
    out = {}
    for name in ("ttft", "tpot", "e2e"):
        values = lat[f"{name}_s"].dropna().to_numpy()
        out[f"{name}_mean_s"] = float(values.mean())
        out[f"{name}_p50_s"] = float(np.percentile(values, 50))
        out[f"{name}_p99_s"] = float(np.percentile(values, 99))
    out["emitted_per_step"] = emitted / decode if decode else float("nan")
    out["drafted_per_step"] = drafted / decode if decode else float("nan")
    out["throughput_tokens_per_s"] = float(requests.output_tokens.sum()) / span
    return out


def kv_tokens(log: Path) -> int:
    """The KV cache vLLM allocated, from its log (the simulator gets the same capacity)."""
    match = KV_LINE.search(log.read_text(errors="replace"))
    if match is None:
        raise ConfigError(f"{log}: no 'KV cache size' line; is it a vLLM server log?")
    return int(match.group(1).replace(",", ""))


def speed_scale(latency, probe_rows: list[dict]) -> float:
    """How much slower the machine ran the speed probes around a run than the profile predicts
    for the same shapes (median ratio; 1.0 without probes): the drift of a shared CPU."""
    from simulator.latency import attention_pairs

    ratios = []
    for row in probe_rows:
        b, q, c = row["num_seqs"], row["query_tokens_per_seq"], row["cached_tokens_per_seq"]
        predicted = latency.forward_s("target", b, b * q, b * c, b * attention_pairs(q, c))
        ratios.append(row["seconds"] / predicted)
    return float(np.median(ratios)) if ratios else 1.0


def simulate_run(v: VllmValidation, k: int, workload, trace, kv_capacity: int,
                 probe_rows: list[dict]):
    """The simulator's run of one measured one: vLLM's profile (scaled to the machine's speed
    around the run), scheduler, capacity and the acceptance vLLM saw; and the scale."""
    from policies import make_policy
    from simulator import SchedulerConfig, simulate
    from simulator.builtin_profiles import resolve_profile
    from simulator.latency_table import LatencyTable
    from simulator.profiled import ProfiledLatency

    table = LatencyTable.load(resolve_profile(v.profile))
    gap = float(table.meta.get("iteration_gap_s", 0))
    scale = speed_scale(ProfiledLatency(table), probe_rows)
    latency = ProfiledLatency(table, step_overhead_s=gap, pass_scale=scale)
    config = SchedulerConfig(max_num_seqs=128, max_batched_tokens=2048, k_max=max(k, 1),
                             chunked_prefill=True, scheduler=v.scheduler,
                             kv_capacity_tokens=kv_capacity)
    result = simulate(workload, latency, trace, make_policy("fixed", {"k": str(k)}), kv_capacity,
                      config)
    return result, scale


def run_vllm_validation(v: VllmValidation, out: Path, say=print) -> list[dict]:
    """Every k and rate: measured, simulated, compared (rows of validate_report.ROW_KEYS)."""
    from live.vllm_acceptance import ngram_trace, per_step_check
    from live.vllm_run import run_vllm
    from live.vllm_server import VllmSettings, vllm_python
    from spectune.validate_report import compare, metrics

    vllm_python(v.venv)  # a missing environment says what to run before any work
    workloads = {f"rate{r:g}": spec_bench_workload(v.requests, r, v.output_tokens, v.seed)
                 for r in v.rates}
    rows = []
    for k in v.ks:
        folder = out / f"k{k}"
        say(f"vLLM with {'no speculation' if k == 0 else f'n-gram k={k}'}: serving "
            f"{len(workloads)} rate(s)")
        runs = run_vllm(VllmSettings(v.model_dir, speculative_tokens=k, seed=v.seed), v.venv,
                        workloads, folder)
        capacity = kv_tokens(folder / "server.log")
        for rate, (label, run) in zip(v.rates, runs.items()):
            wl, ids = workloads[label]
            trace = ngram_trace(ids, run.outputs, 16, {"source": f"vLLM outputs, k={k}"})
            check = per_step_check(trace, k, run.per_step) if k else None
            sim, scale = simulate_run(v, k, wl, trace, capacity, run.meta["probe_rows"])
            say(f"  rate {rate:g}: pass scale {scale:.3f} (speed probes around the run)")
            measured = measured_metrics(run.requests, run.iterations)
            simulated = metrics(sim.requests, sim.steps)
            rows += compare(f"fixed:k={k}", rate, simulated, measured, simulated)
            (folder / label / "check.json").write_text(json.dumps(
                {"per_step": None if check is None else check.__dict__, "pass_scale": scale,
                 "iterations": {"vllm": len(run.iterations), "simulated": len(sim.steps)}}))
            sim.requests.to_csv(folder / label / "sim_requests.csv", index=False)
            sim.steps.to_csv(folder / label / "sim_steps.csv", index=False)
    return rows
