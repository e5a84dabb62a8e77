"""The `validate` job: serve a workload live (real forward passes, real clock), simulate the same
workload, and compare them metric by metric.

For every policy and arrival rate: (1) the live engine serves the workload in real time; (2) the
acceptance it saw is recorded as a speculation trace by teacher forcing on its own outputs (per
request: n-gram lookups, or one draft pass, over prompt + output; DESIGN.md "Speculation
traces"), so the simulator replays acceptance exactly; (3) the simulator serves the same workload
with the profile's latency, the same scheduler settings, KV capacity and policy.

Host overhead: the profile times forward passes only; the live engine also spends host time per
iteration (policy, drafting, bookkeeping). It is measured on the first live run as the median of
(measured iteration time - the profile's prediction for that iteration, rebuilt from the records)
and added to the profile as `step_overhead_s` (unless --no-overhead). From then on the live
policies' cost model and the simulator's latency are the same object; if the first policy reads
the cost model (anything but fixed) it is served again after the calibration. Rows also carry
`simulated_no_overhead`, the prediction without it.

What replays exactly: acceptance (emitted per step) for policies that decide from each
request's own history. What may not: `drafted_per_step` with n-gram lookup (it may propose
fewer than k live; the simulator drafts k and charges their verification), and batch-level
policies (goodput), whose k depends on the batch that real timing shapes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from simulator import ConfigError

DEFAULT_POLICIES = "fixed:k=0,fixed:k=4,goodput,kld_variance,gammatune"
QUICK_POLICIES = "fixed:k=0,fixed:k=4"
ROW_KEYS = ("policy", "rate", "metric", "simulated", "measured", "error_pct",
            "simulated_no_overhead")
PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a short poem about the sea.",
    "Explain what a hash table is, with an example in Python.",
    "List five fruits and their colours.",
    "How do I reverse a list in Python? Show the code.",
    "Summarise the plot of Romeo and Juliet in three sentences.",
    "What is the difference between a process and a thread?",
    "Give me a recipe for pancakes.",
    "Translate 'good morning, how are you?' into Spanish and French.",
    "Why is the sky blue?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What are the planets of the solar system, in order from the sun?",
    "Describe the water cycle for a ten-year-old.",
    "Write an email asking my manager for a day off next Friday.",
    "What is 17 times 23? Show your steps.",
    "Give three tips for a good night's sleep.",
)
TINY_SHAPE = dict(name="tiny-validate", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16,
                  ffn=128, vocab=97, tied_embeddings=False, source="spectune validate --quick")


@dataclass(frozen=True)
class ValidateSpec:
    """What to validate. The CLI's flags are these fields."""

    model: str = field(default="smollm2", metadata={
        "help": "smollm2 (real SmolLM2-135M, real prompts) or tiny (random tiny model, for CI)"})
    profile: str | None = field(default=None, metadata={
        "help": "latency profile (folder or shipped name; default cpu-smollm2-135m for "
                "smollm2, a quick in-process profile for tiny)"})
    reprofile: bool = field(default=False, metadata={
        "help": "profile the model now (quick grid) instead of using --profile"})
    workload: str | None = field(default=None, metadata={
        "help": "a workload file (.csv/.jsonl) to serve; default: Poisson arrivals"})
    requests: int | None = field(default=None, metadata={"help": "requests per run (40; 6 quick)"})
    rates: tuple[float, ...] | None = field(default=None, metadata={
        "help": "arrival rates, req/s (0.5 4; quick 2 50)"})
    output_tokens: int | None = field(default=None, metadata={
        "help": "output tokens per request (64; 24 quick)"})
    policies: str | None = field(default=None, metadata={
        "help": f"comma-separated NAME[:KEY=VALUE...] ({DEFAULT_POLICIES}; quick "
                f"{QUICK_POLICIES})"})
    drafter: str = field(default="ngram", metadata={
        "help": "ngram, ngram:MIN-MAX, early-exit:L or model:<shape>"})
    k_max: int = field(default=8, metadata={"help": "hard cap on k"})
    max_num_seqs: int = field(default=16, metadata={"help": "requests in one batch, at most"})
    kv_capacity_tokens: int = field(default=100_000, metadata={"help": "KV-cache tokens"})
    overhead: bool = field(default=True, metadata={
        "help": "add the measured host overhead per iteration to the profile"})
    quick: bool = field(default=False, metadata={
        "help": "tiny random model, few requests, two policies (CI, ~1 min on CPU)"})
    threads: int = field(default=1, metadata={"help": "CPU threads for torch"})
    seed: int = field(default=0, metadata={"help": "seed of arrivals, prompts and weights"})

    def __post_init__(self) -> None:
        if self.model not in ("smollm2", "tiny"):
            raise ConfigError(f"--model must be smollm2 or tiny, got {self.model!r}")
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"--requests must be >= 1, got {self.requests}")
        if self.rates is not None and not all(r > 0 and np.isfinite(r) for r in self.rates):
            raise ConfigError(f"--rates must be positive req/s, got {self.rates}")
        if self.output_tokens is not None and self.output_tokens < 1:
            raise ConfigError(f"--output-tokens must be >= 1, got {self.output_tokens}")
        if self.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {self.threads}")
        if self.quick and self.model != "tiny":
            object.__setattr__(self, "model", "tiny")

    @property
    def n_requests(self) -> int:
        return self.requests or (6 if self.quick else 40)

    @property
    def rate_list(self) -> tuple[float, ...]:
        return tuple(self.rates) if self.rates else ((2.0, 50.0) if self.quick else (0.5, 4.0))

    @property
    def n_output(self) -> int:
        return self.output_tokens or (24 if self.quick else 64)

    @property
    def policy_specs(self) -> list[tuple[str, str, dict[str, str]]]:
        """(label, name, params) per policy: "fixed:k=4" -> ("fixed:k=4", "fixed", {"k": "4"})."""
        text = self.policies or (QUICK_POLICIES if self.quick else DEFAULT_POLICIES)
        out = []
        for label in (p.strip() for p in text.split(",") if p.strip()):
            name, *pairs = label.split(":")
            params = {}
            for pair in pairs:
                key, sep, value = pair.partition("=")
                if not sep:
                    raise ConfigError(f"--policies: {label!r}: write NAME:KEY=VALUE")
                params[key] = value
            out.append((label, name, params))
        return out


# -- inputs --------------------------------------------------------------------------------------


def build_models(spec: ValidateSpec):
    """(target, tokenizer or None) on CPU, fp32."""
    from profiler.model import LlamaModel, config_for
    from simulator.catalog import ModelShape

    if spec.model == "smollm2":
        from profiler.gguf import load_smollm2

        return load_smollm2()
    return LlamaModel.random(config_for(ModelShape(**TINY_SHAPE)), seed=spec.seed), None


def build_workload(spec: ValidateSpec, rate: float, vocab: int, tokenizer):
    """(workload, prompt token ids): Poisson arrivals at `rate`, or the --workload file."""
    from traces import Workload, load_workload, poisson_arrivals, rescale_to_rate

    rng = np.random.default_rng([spec.seed, int(rate * 1000)])
    if spec.workload is not None:
        wl = load_workload(spec.workload)
        wl = rescale_to_rate(wl.head(min(spec.n_requests, len(wl))), rate)
        prompts = [rng.integers(0, vocab, int(n)).tolist() for n in wl.prompt_tokens]
        return wl, prompts
    n = spec.n_requests
    if tokenizer is not None:
        from profiler.tokenizer import chat_prompt

        texts = [PROMPTS[i] for i in rng.permutation(np.arange(n) % len(PROMPTS))]
        prompts = [tokenizer.encode(chat_prompt(t)) for t in texts]
    else:
        prompts = [rng.integers(0, vocab, int(rng.integers(8, 33))).tolist() for _ in range(n)]
    wl = Workload(arrival_s=poisson_arrivals(rate, n, rng),
                  prompt_tokens=np.asarray([len(p) for p in prompts], dtype=np.int64),
                  output_tokens=np.full(n, spec.n_output, dtype=np.int64),
                  request_ids=np.arange(n, dtype=np.int64),
                  source=f"validate: Poisson {rate:g} req/s, {n} requests, "
                         f"{'real prompts' if tokenizer else 'random prompts'}")
    return wl, prompts


def build_table(spec: ValidateSpec, target, drafter, out: Path):
    """The latency table: --profile, the shipped CPU profile, or one timed now."""
    from simulator.builtin_profiles import resolve_profile
    from simulator.latency_table import LatencyTable

    if spec.profile and not spec.reprofile:
        return LatencyTable.load(resolve_profile(spec.profile))
    if spec.model == "smollm2" and not spec.reprofile:
        return LatencyTable.load(resolve_profile("cpu-smollm2-135m"))
    draft = None if drafter.model_free else drafter.model
    return profile_now(target, draft, out / "profile", quick=spec.model == "tiny")


def profile_now(target, draft, out: Path, quick: bool):
    """Time the target's (and a draft model's) passes on a small grid, in-process."""
    import torch

    from profiler import device as devices
    from profiler.grid import QUICK_GRID, Grid
    from profiler.sweep import Models, run_sweep
    from simulator.latency_table import new_meta

    grid = Grid(batch_sizes=(1, 2, 4), query_tokens=(1, 2, 5), context_tokens=(16, 64),
                prompt_tokens=(8, 32), prefill_batch_sizes=(1, 2)) if quick else QUICK_GRID
    device = target.config.device
    name, driver = devices.describe(device)
    draft_shape = draft.config.shape if draft is not None else None
    meta = new_meta(name, driver, torch.__version__, "fp32", target.config.shape, draft_shape,
                    grid.as_dict(), 3, 1, notes="spectune validate: profiled in-process")
    meta["threads"] = torch.get_num_threads()
    out.mkdir(parents=True, exist_ok=True)
    table, _ = run_sweep(Models(target, draft), grid, device, meta, out, 1, 3)
    return table


def latency_for(table, drafter, overhead_s: float = 0.0):
    """ProfiledLatency of `table`, without its draft rows for a model-free drafter."""
    from simulator.latency_table import LatencyTable
    from simulator.profiled import ProfiledLatency

    if drafter.model_free and table.meta.get("draft") is not None:
        rows = table.rows[table.rows["role"] == "target"].reset_index(drop=True)
        table = LatencyTable(rows, {**table.meta, "draft": None})
    return ProfiledLatency(table, step_overhead_s=overhead_s)


# -- acceptance the live run saw, as a speculation trace -----------------------------------------


def record_trace(target, drafter, prompts, outputs, k_max: int, want_kl: bool):
    """Teacher-forced speculation trace of the live outputs (greedy: acceptance is exact)."""
    from traces import RequestSpeculation, SpeculationTrace

    reqs = []
    for i, (prompt, out) in enumerate(zip(prompts, outputs)):
        prompt, out = [int(t) for t in prompt], [int(t) for t in out]
        run, top1, entropy, kl, proposable = _record_one(target, drafter, prompt, out, k_max,
                                                         want_kl)
        reqs.append(RequestSpeculation(run=run, kl=kl, draft_top1=top1, draft_entropy=entropy,
                                       key=str(i), proposable=proposable))
    meta = {"source": "spectune validate: teacher-forced on the live run's outputs",
            "drafter": drafter.name, "target": target.config.shape.name, "temperature": 0,
            "max_run": int(k_max), "parametric": False}
    return SpeculationTrace(requests=tuple(reqs), meta=meta)


def _record_one(target, drafter, prompt, out, k_max, want_kl):
    """run[t], draft top-1, entropy and KL(target || draft) at every output position t."""
    import torch

    n = len(out)
    p_rows = q_rows = None
    sequence = torch.tensor(prompt + out[:-1], dtype=torch.int64, device=target.config.device)
    with torch.no_grad():
        if want_kl:
            rows = target([sequence], [target.new_cache(len(sequence))], logits="all")[0]
            p_rows = torch.softmax(rows[len(prompt) - 1:].double(), dim=-1)
        if not drafter.model_free:
            model = drafter.model
            rows = model([sequence], [model.new_cache(len(sequence))], logits="all")[0]
            q_rows = torch.softmax(rows[len(prompt) - 1:].double(), dim=-1)
    if q_rows is None:  # n-gram lookup: the chain a live step at t drafts, from the true prefix
        run = np.zeros(n, dtype=np.int32)
        proposable = np.zeros(n, dtype=np.int32)  # the lookup can run out of text
        first = np.asarray(out, dtype=np.int64)
        for t in range(1, n):
            proposal = drafter.lookup(prompt + out[:t], k_max)
            proposable[t] = len(proposal)
            first[t] = proposal[0] if proposal else out[t]
            m = 0
            while m < len(proposal) and m < n - t and proposal[m] == out[t + m]:
                m += 1
            run[t] = m
        top1, entropy = np.ones(n, np.float32), np.zeros(n, np.float32)
        q_rows = None if p_rows is None else torch.nn.functional.one_hot(
            torch.as_tensor(first), p_rows.shape[-1]).to(p_rows)
    else:
        from traces import run_from_matches

        proposable = None  # a model drafter can always propose
        guesses = q_rows.argmax(dim=-1).cpu().numpy()
        run = run_from_matches(guesses == np.asarray(out)).astype(np.int32)
        run = np.minimum(run, k_max).astype(np.int32)
        run[0] = 0
        top1 = q_rows.max(dim=-1).values.float().cpu().numpy()
        entropy = (-(q_rows * q_rows.clamp_min(1e-30).log()).sum(dim=-1)).float().cpu().numpy()
    kl = None
    if p_rows is not None:
        log_ratio = p_rows.clamp_min(1e-8).log() - q_rows.clamp_min(1e-8).log()
        kl = (p_rows * log_ratio).sum(dim=-1).clamp_min(0.0).float().cpu().numpy()
    return run, top1, entropy, kl, proposable


# -- host overhead: measured iteration time minus the profile's prediction ------------------------


def predicted_steps(live, latency) -> np.ndarray:
    """The profile's time for every live iteration, rebuilt from the records: a decode step at
    `start` holds the requests whose first token came at or before it and that finish after it;
    each such request's next decode-log row gives its drafts and position."""
    from simulator.step_cost import StepCostModel

    cost = StepCostModel(latency)
    req, steps = live.requests, live.steps
    logs = {rid: g.sort_values("step").itertuples() for rid, g in
            live.decode_log.groupby("request_id")}
    prompt = dict(zip(req.request_id, req.prompt_tokens))
    out = np.empty(len(steps))
    for i, st in enumerate(steps.itertuples()):
        if st.prefill_seqs > 0:
            admitted = req[np.isclose(req.first_token_s, st.start_s + st.duration_s,
                                      rtol=0, atol=1e-9)]
            out[i] = cost.prefill_s(admitted.prompt_tokens.tolist())
            continue
        held = req[(req.first_token_s <= st.start_s) & (req.finish_s > st.start_s)]
        rows = [next(logs[rid]) for rid in held.request_id]
        if len(rows) != st.decode_seqs:
            raise RuntimeError(f"step {i}: rebuilt {len(rows)} requests, not {st.decode_seqs}")
        drafted = [r.drafted for r in rows]
        cached = [int(prompt[r.request_id]) + r.position - 1 for r in rows]
        out[i] = cost.iteration_s(drafted, cached)
    return out


def measure_overhead(live, latency) -> dict:
    """Per-iteration host time the profile lacks: measured minus predicted, over the run. The
    median is kept (a shared machine's stalls inflate the mean: they are not overhead)."""
    residual = live.steps["duration_s"].to_numpy() - predicted_steps(live, latency)
    decode = (live.steps["decode_seqs"] > 0).to_numpy()
    return {"step_overhead_s": max(0.0, float(np.median(residual))),
            "mean_s": float(residual.mean()), "median_s": float(np.median(residual)),
            "decode_mean_s": float(residual[decode].mean()) if decode.any() else None,
            "prefill_mean_s": float(residual[~decode].mean()) if (~decode).any() else None,
            "iterations": len(residual)}


# -- comparison ---------------------------------------------------------------------------------


def metrics(requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, float]:
    """The compared metrics, flat: ttft/tpot/e2e mean, p50, p99 (s), emitted and drafted per
    decode request-step, throughput. An n-gram lookup may propose fewer than k tokens live; the
    simulator drafts k, so drafted_per_step differs while emitted_per_step replays exactly."""
    from simulator import summarize

    s = summarize(requests, steps)
    out = {}
    for name in ("ttft", "tpot", "e2e"):
        for q in ("mean", "p50", "p99"):
            out[f"{name}_{q}_s"] = s[f"{name}_s"][q]
    out["emitted_per_step"] = s["mean_emitted_per_step"]
    out["drafted_per_step"] = s["mean_k"]  # live: what the drafter proposed; sim: k
    out["throughput_tokens_per_s"] = s["throughput_tokens_per_s"]
    return out


def compare(label: str, rate: float, sim: dict, measured: dict, bare: dict) -> list[dict]:
    rows = []
    for metric, m in measured.items():
        s = sim[metric]
        err = (s - m) / m * 100 if m and np.isfinite(m) and np.isfinite(s) else float("nan")
        rows.append({"policy": label, "rate": rate, "metric": metric, "simulated": s,
                     "measured": m, "error_pct": err, "simulated_no_overhead": bare[metric]})
    return rows


# -- the job ------------------------------------------------------------------------------------


@dataclass
class _Setup:
    target: object
    drafter: object
    table: object
    scheduler: object
    tokenizer: object


def _setup(spec: ValidateSpec, out: Path) -> _Setup:
    import torch

    from profiler.drafters import make_drafter
    from simulator import SchedulerConfig

    torch.set_num_threads(spec.threads)
    target, tokenizer = build_models(spec)
    drafter = make_drafter(spec.drafter, target, seed=spec.seed)
    table = build_table(spec, target, drafter, out)
    sched = SchedulerConfig(max_num_seqs=spec.max_num_seqs, k_max=spec.k_max,
                            kv_capacity_tokens=spec.kv_capacity_tokens)
    return _Setup(target, drafter, table, sched, tokenizer)


def _live(setup: _Setup, policy, latency, wl, prompts):
    from profiler.live_engine import LiveEngine
    from simulator import StepCostModel

    engine = LiveEngine(setup.target, setup.drafter, policy, setup.scheduler,
                        cost=StepCostModel(latency),
                        kv_capacity_tokens=setup.scheduler.kv_capacity_tokens)
    return engine.run(wl, prompts, realtime=True)


def run_validate(spec: ValidateSpec, out: Path | None = None, log=None) -> list[dict]:
    """Live vs simulated for every policy and rate; rows of ROW_KEYS (written to `out`, with
    the records of every run and a meta block). Torch's thread count is restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    try:
        if out is not None:
            return _run(spec, out, out, log)
        with tempfile.TemporaryDirectory(prefix="spectune-validate-") as scratch:
            return _run(spec, None, Path(scratch), log)
    finally:
        torch.set_num_threads(threads)


def _run(spec: ValidateSpec, out: Path | None, scratch: Path, log) -> list[dict]:
    from policies import make_policy
    from simulator import simulate

    started = time.perf_counter()
    setup = _setup(spec, scratch)
    bare = latency_for(setup.table, setup.drafter)
    overhead: dict | None = None
    latency = bare  # the live policies' cost model and the simulator's latency: always the same
    rows, runs = [], []
    for rate in spec.rate_list:
        wl, prompts = build_workload(spec, rate, setup.target.config.shape.vocab, setup.tokenizer)
        for label, name, params in spec.policy_specs:
            policy = make_policy(name, params)
            t0 = time.perf_counter()
            live = _live(setup, policy, latency, wl, prompts)
            if overhead is None:  # calibrate on the first run
                overhead = measure_overhead(live, bare)
                overhead["measured_on"] = f"{label} at {rate:g} req/s"
                if spec.overhead:
                    latency = latency_for(setup.table, setup.drafter,
                                          overhead["step_overhead_s"])
                    if name != "fixed":  # its choices read the cost model: serve it again
                        live = _live(setup, policy, latency, wl, prompts)
            want_kl = "kl" in type(policy).signals
            trace = record_trace(setup.target, setup.drafter, prompts, live.outputs,
                                 spec.k_max, want_kl)
            sims = [simulate(wl, lat, trace, make_policy(name, params),
                             setup.scheduler.kv_capacity_tokens, setup.scheduler)
                    for lat in (latency, bare)]
            measured = metrics(live.requests, live.steps)
            rows += compare(label, rate, metrics(sims[0].requests, sims[0].steps), measured,
                            metrics(sims[1].requests, sims[1].steps))
            runs.append({"policy": label, "rate": rate, "live_wall_s": live.meta["wall_s"],
                         "run_overhead": measure_overhead(live, bare)})
            if out is not None:
                _write_records(out, label, rate, live, sims[0])
            if log is not None:
                print(f"  {label} at {rate:g} req/s: live {live.meta['wall_s']:.1f} s "
                      f"(+{time.perf_counter() - t0 - live.meta['wall_s']:.1f} s record and "
                      "simulate)", file=log, flush=True)
    meta = _meta(spec, setup, overhead, runs, time.perf_counter() - started)
    if out is not None:
        write_results(out, rows, meta)
    return rows


def _meta(spec, setup, overhead, runs, wall_s) -> dict:
    import torch

    return {"spec": asdict(spec), "model": setup.target.config.shape.name,
            "drafter": setup.drafter.name, "profile": latency_for(setup.table,
                                                                  setup.drafter).source,
            "scheduler": setup.scheduler.__dict__, "threads": torch.get_num_threads(),
            "torch_version": torch.__version__, "dtype": "fp32",
            "step_overhead": {**(overhead or {}), "added_to_profile": spec.overhead,
                              "note": "host time per iteration the profile (forward passes "
                                      "only) lacks; added to ProfiledLatency as step_overhead_s"},
            "runs": runs, "wall_s": wall_s}


def _write_records(out: Path, label: str, rate: float, live, sim) -> None:
    from spectune.files import write_csv

    folder = out / "runs" / f"{label.replace(':', '_').replace('=', '')}_rate{rate:g}"
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(folder / "live_requests.csv", live.requests)
    write_csv(folder / "live_steps.csv", live.steps)
    write_csv(folder / "sim_requests.csv", sim.requests)
    write_csv(folder / "sim_steps.csv", sim.steps)


def write_results(out: Path, rows: list[dict], meta: dict) -> None:
    from spectune.files import write_csv, write_json

    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "validate.csv", pd.DataFrame(rows, columns=list(ROW_KEYS)))
    write_json(out / "validate.json", {"rows": rows, "meta": meta})


def format_table(rows: list[dict], meta: dict | None = None) -> str:
    """Side by side per policy and rate: simulated, measured, error."""
    lines = []
    if meta:
        o = meta["step_overhead"]
        lines.append(f"model {meta['model']}   drafter {meta['drafter']}   {meta['profile']}")
        lines.append(f"host overhead per iteration (measured on {o.get('measured_on')}): "
                     f"{o.get('step_overhead_s', 0) * 1e3:.2f} ms"
                     f"{' (added to the profile)' if o.get('added_to_profile') else ''}")
    key = None
    for r in rows:
        if (r["policy"], r["rate"]) != key:
            key = (r["policy"], r["rate"])
            lines += ["", f"{r['policy']} at {r['rate']:g} req/s",
                      f"  {'metric':<24}{'simulated':>12}{'measured':>12}{'error':>9}"
                      f"{'sim no ovh':>12}"]
        lines.append(f"  {r['metric']:<24}{_fmt(r['simulated'], r['metric'])}"
                     f"{_fmt(r['measured'], r['metric'])}{r['error_pct']:>+8.1f}%"
                     f"{_fmt(r['simulated_no_overhead'], r['metric'])}")
    return "\n".join(lines)


def _fmt(v: float, metric: str) -> str:
    if v is None or not np.isfinite(v):
        return f"{'-':>12}"
    if metric.endswith("_s") and not metric.endswith("_per_s"):
        return f"{v * 1e3:>9.1f} ms"
    return f"{v:>12.3f}"


# -- CLI ----------------------------------------------------------------------------------------


def add_validate_parser(sub) -> argparse.ArgumentParser:
    """Register `spectune validate` on the CLI's subparsers."""
    from spectune.flags import add_dataclass_flags

    p = sub.add_parser("validate", help="serve live and simulate the same workload; compare",
                       description="Serve a workload live (real forward passes, real clock) "
                       "and simulate the same workload with the profile's latency, the same "
                       "scheduler and policy, and the acceptance the live run saw; print "
                       "simulated vs measured TTFT, TPOT, E2E and tokens per step. Needs torch.")
    add_dataclass_flags(p, ValidateSpec, "what to validate", skip=("rates",))
    p.add_argument("--rates", nargs="+", type=float, default=None, metavar="REQ_PER_S",
                   help="arrival rates (default: 0.5 4; quick: 2 50)")
    p.add_argument("--out", type=Path, default=Path("runs/validate"),
                   help="folder for validate.csv, validate.json and the records")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(handler=cmd_validate)
    return p


def cmd_validate(args: argparse.Namespace) -> int:
    import json

    from spectune.console import require_torch
    from spectune.files import prepare_out, to_json
    from spectune.flags import dataclass_from_args

    require_torch("validate")
    rates = tuple(args.rates) if args.rates else None
    spec = dataclass_from_args(ValidateSpec, args, rates=rates)
    prepare_out(args.out)
    rows = run_validate(spec, args.out, log=sys.stderr)
    if args.format == "json":
        print(to_json(rows))
        return 0
    meta = json.loads((args.out / "validate.json").read_text())["meta"]
    print(format_table(rows, meta))
    print(f"\nwritten to {args.out}/validate.csv and validate.json")
    return 0
