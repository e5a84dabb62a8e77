"""`spectune validate --engine vllm`: serve a workload on a real vLLM, simulate the same workload
with vLLM's own profile, its scheduler (`--scheduler vllm-v1`) and the acceptance it saw, and
compare metric by metric.

Per policy (fixed:k=0 serves without speculation, fixed:k=K with vLLM's n-gram drafter of K
tokens: one server each) and rate: the measured run (live/vllm_run.py), the n-gram trace
rebuilt from what vLLM wrote (live/vllm_acceptance.py, checked against vLLM's per-step counts),
and the simulation. The simulator's inputs are measured apart from the runs it is compared
with: the profile (`spectune profile --engine vllm`) times controlled batches on another server.
With `--calibrate` each run also gets a calibrated simulation, scaled to how fast its own
server ran the windows before it: a calibration window of the same shapes just before it, and
the earlier rates' (docs/vllm.md, "Validation").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulator import ConfigError
from spectune.vllm_speed import (
    ServedTimes,
    busy_ratio,
    iteration_agreement,
    pooled,
    step_host_s,
)

#: a calibrated run pools the windows its server ran before it, each earlier one weighing this
#: much of the next: a server's speed drifts over minutes, and one window's estimate is noisy
#: (docs/vllm.md, "Calibrated per phase")
POOL_KEEP = 0.5
#: vLLM's log line with the KV cache it allocated, in tokens
KV_LINE = re.compile(r"KV cache size: ([0-9,]+) tokens")


@dataclass(frozen=True)
class VllmValidation:
    """What one `--engine vllm` validation runs."""

    profile: str  # a folder, a table prefix or a shipped name (vllm-cpu-smollm2)
    venv: Path
    model_dir: Path
    rates: tuple[float, ...]
    configs: tuple[VllmConfig, ...]
    requests: int
    output_tokens: int
    seed: int = 0
    scheduler: str = "vllm-v1"
    workload: str | None = None  # a trace's lengths (azure-conv, a file); None: Spec-Bench's
    max_model_len: int = 2048
    #: before each measured window, the same server serves its calibration window (the same
    #: arrivals and lengths, training-split text), and a calibrated simulation scales its
    #: passes and host time by how fast that server ran it and its earlier windows
    #: (`calibration_times`, pooled in `run_vllm_validation`)
    calibrate: bool = False


@dataclass(frozen=True)
class VllmConfig:
    """One server's speculation: fixed:k=K (K = 0: none), or vLLM's per-batch-size table
    (batch_adaptive:schedule=[[lo, hi, k], ...], served with K = its largest k)."""

    label: str
    k: int  # num_speculative_tokens
    table: tuple[tuple[int, int, int], ...] = ()

    @property
    def folder(self) -> str:
        if not self.table:
            return f"k{self.k}"
        return "table-" + "_".join(f"{lo}-{hi}x{k}" for lo, hi, k in self.table)

    def policy(self):
        from policies import make_policy

        if self.table:
            return make_policy("batch_adaptive", {"schedule": json.dumps(
                [list(row) for row in self.table])})
        return make_policy("fixed", {"k": str(self.k)})

    def describe(self) -> str:
        if self.table:
            return f"n-gram, k by batch size {json.dumps([list(r) for r in self.table])}"
        return "no speculation" if self.k == 0 else f"n-gram k={self.k}"


def configs_of(policy_specs: list[tuple[str, str, dict[str, str]]]) -> tuple[VllmConfig, ...]:
    """What a vLLM server runs (k fixed when it starts): fixed:k=K, or batch_adaptive with
    only a `schedule` (vLLM's num_speculative_tokens_per_batch_size)."""
    out = []
    for label, name, params in policy_specs:
        if name == "fixed" and not set(params) - {"k"}:
            out.append(VllmConfig(label, int(params.get("k", "4"))))
        elif name == "batch_adaptive" and set(params) == {"schedule"}:
            table = tuple(tuple(int(x) for x in row) for row in json.loads(params["schedule"]))
            if max(k for _, _, k in table) == 0:
                raise ConfigError(f"{label!r}: a table of k = 0 only is fixed:k=0")
            out.append(VllmConfig(label, max(k for _, _, k in table), table))
        else:
            raise ConfigError(f"--engine vllm serves fixed:k=K or batch_adaptive:schedule="
                              f"[[LO,HI,K],...] (one server each), not {label!r}")
    return tuple(out)


def ks_of(policy_specs: list[tuple[str, str, dict[str, str]]]) -> tuple[int, ...]:
    """The K each configuration's server is started with."""
    return tuple(c.k for c in configs_of(policy_specs))


def spec_bench_workload(n: int, rate: float, output_tokens: int, seed: int,
                        split: str = "eval", lengths: np.ndarray | None = None):
    """(workload, prompt token ids): n held-out Spec-Bench questions in SmolLM2's chat template,
    Poisson arrivals at `rate`, `output_tokens` each (`split` "train": training questions, on
    the same arrivals: a calibration window). `lengths`: each prompt that many tokens long
    instead, the chat template around a run of the split's question text (a calibration
    window of the measured one's lengths, so that its passes have the same shapes)."""
    from models.gguf import load_smollm2_tokenizer
    from models.tokenizer import chat_prompt, user_turn_frame
    from traces import Workload, poisson_arrivals
    from traces.prompts import DEFAULT_PROMPTS, in_split, load_prompts

    tok = load_smollm2_tokenizer()
    prompts = [p for p in load_prompts(DEFAULT_PROMPTS) if in_split(p.key, split)]
    picked = [prompts[i] for i in np.random.default_rng(seed).permutation(len(prompts))]
    if lengths is None:
        ids = [tok.encode(chat_prompt(p.text)) for p in picked[:n]]
        source = f"Spec-Bench {split} questions x{n}"
    else:
        if len(lengths) != n:
            raise ConfigError(f"{len(lengths)} prompt lengths for a window of {n} requests")
        before, after = user_turn_frame(tok)
        stream = [t for p in picked for t in tok.encode(p.text + "\n\n")]
        ids, at = [], 0
        for length in lengths:
            m = int(length) - len(before) - len(after)
            if m < 1 or m > len(stream):
                raise ConfigError(f"a calibration prompt of {int(length)} tokens: the chat "
                                  f"template takes {len(before) + len(after)} and the "
                                  f"{split} text holds {len(stream)}; serve without "
                                  "--calibrate, or a workload whose prompts fit")
            at = at if at + m <= len(stream) else 0
            ids.append(before + stream[at:at + m] + after)
            at += m
        source = f"Spec-Bench {split} text, prompts of the measured window's lengths x{n}"
    arrivals = poisson_arrivals(rate, n, np.random.default_rng([seed, int(rate * 1000)]))
    wl = Workload(arrival_s=arrivals, prompt_tokens=np.array([len(x) for x in ids]),
                  output_tokens=np.full(n, output_tokens), request_ids=np.arange(n),
                  source=f"{source}, Poisson {rate:g}/s")
    return wl, ids


def trace_workload(name: str, n: int, rate: float, seed: int, max_model_len: int,
                   split: str = "eval"):
    """(workload, prompt token ids): a trace's first n requests rescaled to `rate`, each prompt
    real text of its length (a window of the held-out Spec-Bench questions, run together; of
    the training ones with `split` "train"), as an n-gram drafter meets in use. Lengths are cut
    so prompt + output fits max_model_len: an output to max_model_len // 2, then the prompt to
    the rest."""
    from models.gguf import load_smollm2_tokenizer
    from spectune.simulate import load_trace, trace_window
    from traces import Workload
    from traces.prompts import DEFAULT_PROMPTS, in_split, load_prompts

    tok = load_smollm2_tokenizer()
    wl = trace_window(load_trace(name), n, rate)
    texts = [p.text for p in load_prompts(DEFAULT_PROMPTS) if in_split(p.key, split)]
    stream = [t for text in texts for t in tok.encode(text + "\n\n")]
    output = np.minimum(wl.output_tokens, max_model_len // 2)
    prompt = np.minimum(wl.prompt_tokens, max_model_len - 1 - output)
    starts = np.random.default_rng([seed, n]).integers(0, len(stream) - int(prompt.max()), n)
    ids = [stream[s:s + int(p)] for s, p in zip(starts, prompt)]
    cut = int((prompt < wl.prompt_tokens).sum() + (output < wl.output_tokens).sum())
    out = Workload(arrival_s=wl.arrival_s, prompt_tokens=prompt.astype(np.int64),
                   output_tokens=output.astype(np.int64), request_ids=wl.request_ids,
                   source=f"{wl.source}; prompts: Spec-Bench {split} text of each length "
                          f"({cut} lengths cut to max_model_len {max_model_len})")
    return out, ids


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
    for the same shapes (median ratio; nan without probes). Reported, not applied: on a shared
    CPU whose speed drifts within a minute, short probes misjudged the run they surround by up to
    ±20% (docs/vllm.md), more than the profile's own error."""
    from simulator.latency import attention_pairs

    ratios = []
    for row in probe_rows:
        b, q, c = row["num_seqs"], row["query_tokens_per_seq"], row["cached_tokens_per_seq"]
        predicted = latency.forward_s("target", b, b * q, b * c, b * attention_pairs(q, c))
        ratios.append(row["seconds"] / predicted)
    return float(np.median(ratios)) if ratios else float("nan")


def load_profile(v: VllmValidation):
    """vLLM's latency table, read once per validation."""
    from simulator.builtin_profiles import resolve_profile
    from simulator.latency_table import LatencyTable

    return LatencyTable.load(resolve_profile(v.profile))


def simulate_run(v: VllmValidation, config: VllmConfig, workload, trace, kv_capacity: int,
                 table, pass_scale: float = 1.0, host_scale: float = 1.0,
                 phase_scales: dict[str, float] | None = None):
    """The simulator's run of one measured one: vLLM's profile `table` (passes times
    `pass_scale` and their phase's `phase_scales`, the host time between iterations its meta
    records times `host_scale`), its scheduler and capacity, and the acceptance vLLM saw; and
    the latency model it used."""
    from simulator import simulate
    from simulator.config import ServedSchedulerConfig
    from simulator.profiled import ProfiledLatency

    latency = ProfiledLatency.with_host_time(table, pass_scale, host_scale, phase_scales)
    settings = ServedSchedulerConfig(max_num_seqs=128, max_batched_tokens=2048, k_max=config.k,
                                     chunked_prefill=True, scheduler=v.scheduler,
                                     kv_capacity_tokens=kv_capacity,
                                     max_model_len=v.max_model_len)
    result = simulate(workload, latency, trace, config.policy(), kv_capacity, settings)
    return result, latency


def measured_runs(v: VllmValidation, config: VllmConfig, workloads: dict, folder: Path,
                  measured: Path | None, say):
    """Serve the workloads on a fresh vLLM with this configuration, or, given `measured` (an
    earlier validation's folder), read its runs back after checking they served the same
    workloads."""
    from live.vllm_run import load_run, run_vllm
    from live.vllm_server import VllmSettings

    if measured is None:
        say(f"vLLM with {config.describe()}: serving {len(workloads)} window(s)")
        settings = VllmSettings(v.model_dir, speculative_tokens=config.k,
                                k_by_batch=config.table, seed=v.seed,
                                max_model_len=v.max_model_len)
        return run_vllm(settings, v.venv, workloads, folder), folder / "server.log"
    source = measured / config.folder
    runs = {}
    for label, (wl, _) in workloads.items():
        try:
            run = load_run(source / label)
        except FileNotFoundError as exc:
            raise ConfigError(f"--measured: {exc}; measure it with the same --policies, "
                              "--rates and --calibrate") from None
        served = run.requests.prompt_tokens.to_numpy()
        if len(served) != len(wl) or (served != wl.prompt_tokens).any():
            older = (" (or it was measured before calibration windows took the measured "
                     "window's prompt lengths: benchmarks/vllm_calibration.py "
                     "--unmatched-calibration reads those)"
                     if label.endswith(calibration_label("")) else "")
            raise ConfigError(f"--measured: {source / label} served another workload than "
                              "this one: give the --requests, --output-tokens, --workload and "
                              f"--seed it was measured with{older}")
        runs[label] = run
    say(f"vLLM with {config.describe()}: read back from {source}")
    return runs, source / "server.log"


def calibration_label(label: str) -> str:
    """The calibration window served just before the measured window `label` (--calibrate)."""
    return f"{label}-calibration"


def validation_workloads(v: VllmValidation) -> dict[str, tuple]:
    """Each rate's measured window, by label, in serving order; with `v.calibrate`, each
    preceded by its calibration window (the same arrivals and lengths, training-split text:
    the same shapes of pass to time, none of the held-out text)."""
    def window(rate: float, split: str, lengths=None):
        if v.workload is None:
            return spec_bench_workload(v.requests, rate, v.output_tokens, v.seed, split,
                                       lengths)
        return trace_workload(v.workload, v.requests, rate, v.seed, v.max_model_len, split)

    out = {}
    for rate in v.rates:
        label = f"rate{rate:g}"
        measured = window(rate, "eval")
        if v.calibrate:  # a trace's windows share their lengths already
            out[calibration_label(label)] = window(rate, "train", measured[0].prompt_tokens)
        out[label] = measured
    return out


def run_vllm_validation(v: VllmValidation, out: Path, say=print, measured: Path | None = None
                        ) -> dict[str, list[dict]]:
    """Every configuration and rate: measured, simulated, compared (validate_report rows) as
    "validate"; the same rows for the speed-matched simulation ("speed-matched"), scaled to the
    run's own speed (`WindowSpeed`: passes per phase, host time): a diagnostic that takes the
    machine's drift out (it reads the measured run's iteration times, so it is not a
    prediction); and with `v.calibrate`, "calibrated": scaled to the speed of the windows the
    same server ran before the run (its calibration window, just before it, and the earlier
    rates' windows, pooled with the older ones weighing less: `POOL_KEEP`; a prediction)."""
    from live.vllm_acceptance import ngram_trace, per_step_check
    from live.vllm_server import vllm_python
    from spectune.validate_report import compare, metrics

    if measured is None:
        vllm_python(v.venv)  # a missing environment says what to run before any work
    workloads = validation_workloads(v)
    table = load_profile(v)
    tables: dict[str, list[dict]] = {"validate": [], "speed-matched": []}
    if v.calibrate:
        tables["calibrated"] = []
    for config in v.configs:
        folder = out / config.folder
        runs, log = measured_runs(v, config, workloads, folder, measured, say)
        capacity = kv_tokens(log)
        served_before: ServedTimes | None = None  # this server's windows so far, pooled
        for rate in v.rates:
            label = f"rate{rate:g}"
            (wl, ids), run = workloads[label], runs[label]
            trace = ngram_trace(ids, run.outputs, 16, {"source": f"vLLM outputs, {config.label}"})
            # the replay of vLLM's proposals assumes one k: a table's k moves with the batch
            check = per_step_check(trace, config.k, run.per_step, wl.prompt_tokens,
                                   v.max_model_len) if config.k and not config.table else None
            sim, latency = simulate_run(v, config, wl, trace, capacity, table)
            probes = speed_scale(latency, run.meta["probe_rows"])
            host = step_host_s(latency, sim.steps)
            busy = busy_ratio(run.iterations, sim.steps, host)
            agree = iteration_agreement(run.iterations, sim.steps, host)
            say(f"  rate {rate:g}: vLLM's iterations took {busy:.3f}x the simulated passes "
                f"(speed probes around the run: {probes:.3f}x the profile); "
                f"{agree['matched']} of {agree['of']} iterations step for step, their time "
                f"off by {agree['median_abs_error_pct']:.1f}% (median)")
            observed = measured_metrics(run.requests, run.iterations)
            simulated = metrics(sim.requests, sim.steps)
            tables["validate"] += compare(config.label, rate, simulated, observed, simulated)
            own_times = ServedTimes.of(run, sim.steps, latency)
            own = own_times.speed()
            matched, _ = simulate_run(v, config, wl, trace, capacity, table,
                                      host_scale=own.host, phase_scales=own.phases)
            tables["speed-matched"] += compare(config.label, rate, metrics(
                matched.requests, matched.steps), observed, simulated)
            calibration = None
            if v.calibrate:
                window = calibration_times(v, config, workloads, runs, label, capacity, table)
                served_before = pooled(served_before, window, POOL_KEEP)
                calibration = served_before.speed()
                # served before the next rate's windows
                served_before = pooled(served_before, own_times, POOL_KEEP)
                calibrated, _ = simulate_run(v, config, wl, trace, capacity, table,
                                             host_scale=calibration.host,
                                             phase_scales=calibration.phases)
                tables["calibrated"] += compare(config.label, rate, metrics(
                    calibrated.requests, calibrated.steps), observed, simulated)
                speeds = ", ".join(f"{p} {x:.3f}x" for p, x in calibration.phases.items())
                say(f"  rate {rate:g}: the server's {calibration.windows} window(s) before "
                    f"it (its calibration window last, weighing most) ran the profile's "
                    f"passes at {speeds} "
                    f"and its host time between them at {calibration.host:.3f}x (the "
                    "calibrated simulation's scales)")
            (folder / label).mkdir(parents=True, exist_ok=True)
            (folder / label / "check.json").write_text(json.dumps(
                {"per_step": None if check is None else check.__dict__,
                 "probe_scale": probes, "busy_ratio": busy, "own_speed": own.to_json(),
                 "calibration_speed": None if calibration is None else calibration.to_json(),
                 "iteration_agreement": agree,
                 "iterations": {"vllm": len(run.iterations), "simulated": int(
                     ((sim.steps.decode_seqs + sim.steps.prefill_seqs) > 0).sum())}}))
            sim.requests.to_csv(folder / label / "sim_requests.csv", index=False)
            sim.steps.to_csv(folder / label / "sim_steps.csv", index=False)
    return tables


def calibration_times(v: VllmValidation, config: VllmConfig, workloads: dict, runs: dict,
                      label: str, capacity: int, table) -> ServedTimes:
    """The calibration window the server served just before `label`, beside its simulation
    with the profile unscaled (its own acceptance replayed): how fast it ran, as sums that
    pool with the server's earlier windows."""
    from live.vllm_acceptance import ngram_trace

    (wl, ids), run = workloads[calibration_label(label)], runs[calibration_label(label)]
    trace = ngram_trace(ids, run.outputs, 16, {"source": f"vLLM outputs, {config.label}"})
    sim, latency = simulate_run(v, config, wl, trace, capacity, table)
    return ServedTimes.of(run, sim.steps, latency)
