"""The `simulate` job: build every input from a `SimulationSpec`, run the engine, summarise.

The one builder of each input: tune and plan (evaluate.py) and validate take their workloads
(load_trace, trace_window, build_workload), latency, acceptance and SLOs (build_slo) from here.
Its command line is simulate_cli.py.
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simulator import (
    ClusterConfig,
    ConfigError,
    GpuSpec,
    LatencyModel,
    RooflineLatency,
    SchedulerConfig,
    get_gpu,
    get_model,
    kv_capacity_tokens,
)
from simulator.tensor_parallel import TP_DEGREES, group_kv_capacity_tokens
from traces import (
    SpeculationTrace,
    TraceError,
    UserNote,
    Workload,
    builtin_names,
    builtin_workload,
    load_workload,
    parametric_trace,
    parse_acceptance,
    parse_lengths,
    rescale_to_rate,
    synthetic_workload,
)
from traces.builtin import speculation_names

if TYPE_CHECKING:  # the engine (SimPy, pandas) and the policies load when a simulation runs
    from policies import Policy
    from simulator import SimulationResult, Slo

SYNTHETIC = ("poisson", "gamma")


@dataclass(frozen=True)
class SimulationSpec:
    """What to simulate. The CLI's flags are these fields; their defaults are the embedded run."""

    workload: str = field(default="azure-conv", metadata={
        "help": "azure-conv, azure-code, poisson, gamma, or a workload file (.csv/.jsonl)"})
    rate: float | None = field(default=None, metadata={
        "help": "requests/s: rescales a trace's arrivals (unset: the trace's own), or the "
                "rate of poisson/gamma", "unset": "the trace's own; 2 for poisson/gamma"})
    cv: float | None = field(default=None, metadata={
        "help": "gamma arrivals only: burstiness, the CV of the gaps", "unset": "2"})
    lengths: str | None = field(default=None, metadata={
        "help": "poisson/gamma only: azure-conv, azure-code, fixed:PROMPT,OUTPUT, or a "
                "workload file to draw (prompt, output) pairs from", "unset": "azure-conv"})
    requests: int | None = field(default=None, metadata={
        "help": "the first N requests of a trace, or N synthetic ones",
        "unset": "1000, unless --duration is set"})
    duration: float | None = field(default=None, metadata={
        "help": "keep requests arriving in the first S seconds"})
    target: str | None = field(default=None, metadata={
        "help": "target model shape (a --profile brings its own)", "unset": "Llama-3.1-8B"})
    draft: str | None = field(default=None, metadata={
        "help": "draft model shape, or 'none' for a model-free drafter (n-gram lookup) "
                "(a --profile brings its own)", "unset": "Llama-68M"})
    hardware: str | None = field(default=None, metadata={
        "help": "GPU of each replica, for the roofline", "unset": "H100-SXM"})
    tp: int = field(default=1, metadata={
        "help": "tensor-parallel degree: GPUs per replica (1, 2, 4 or 8), the target's weights, "
                "KV heads and FLOPs split over them, two all-reduces per layer over the GPU's "
                "interconnect (docs/tensor-parallel.md)"})
    draft_tp: str | None = field(default=None, metadata={
        "help": "the draft model's tensor-parallel degree: 1 (on one GPU of the replica), "
                "'same' (the target's --tp), or 2/4/8 up to --tp", "unset": "1"})
    profile: str | None = field(default=None, metadata={
        "help": "latency from a profile instead of the roofline: a folder written by "
                "`spectune profile`, or a shipped one (cpu-smollm2-135m)"})
    acceptance: str = field(default="beta:7,3", metadata={
        "help": "iid:ALPHA, beta:A,B, markov:A1,A2@L (each optionally ~C: per-token "
                "variation around alpha), a speculation trace (.npz), or a shipped recording: "
                + ", ".join(speculation_names())})
    policy: str = field(default="fixed", metadata={
        "help": "speculation-length policy (`spectune policies` lists them)"})
    seed: int = field(default=0, metadata={"help": "seed of every random draw"})
    slo_ttft: float | None = field(default=None, metadata={"help": "TTFT objective, seconds"})
    slo_tpot: float | None = field(default=None, metadata={"help": "TPOT objective, seconds"})

    def __post_init__(self) -> None:
        if self.rate is not None and not (self.rate > 0 and np.isfinite(self.rate)):
            raise ConfigError(f"--rate must be a positive number of requests/s, got {self.rate}")
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"--requests must be >= 1, got {self.requests}")
        if self.duration is not None and not self.duration > 0:
            raise ConfigError(f"--duration must be > 0 seconds, got {self.duration}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"--seed must be a non-negative integer, got {self.seed}")
        if self.cv is not None and not self.cv > 0:
            raise ConfigError(f"--cv must be > 0, got {self.cv}")
        if self.cv is not None and self.workload != "gamma":
            raise ConfigError(f"--cv applies to --workload gamma only, not {self.workload!r}")
        if self.profile is not None and (self.target or self.draft or self.hardware):
            raise ConfigError("--profile brings its own models and device; drop --target, "
                              "--draft and --hardware (or profile the models you want)")
        if isinstance(self.tp, bool) or self.tp not in TP_DEGREES:
            raise ConfigError(f"--tp must be one of {', '.join(map(str, TP_DEGREES))} (GPUs per "
                              f"replica), got {self.tp!r}")
        if self.profile is not None and (self.tp != 1 or self.draft_tp is not None):
            raise ConfigError("--tp and --draft-tp price the roofline's passes on a GPU group; "
                              "a profile was timed on one device and is not scaled to a group: "
                              "drop --tp/--draft-tp, or profile on the group itself")
        self.draft_degree()  # a clear error for a malformed --draft-tp
        if self.lengths is not None and self.workload not in SYNTHETIC:
            raise ConfigError(f"--lengths applies to --workload poisson/gamma only; "
                              f"{self.workload!r} brings its own lengths")

    def draft_degree(self) -> int:
        """The draft model's tensor-parallel degree: --draft-tp resolved ('same': --tp)."""
        text = (self.draft_tp or "1").strip().lower()
        if text == "same":
            return self.tp
        try:
            degree = int(text)
        except ValueError:
            degree = 0
        if degree not in TP_DEGREES:
            raise ConfigError(f"--draft-tp must be 1, 2, 4, 8 or 'same', got {self.draft_tp!r}")
        if degree > self.tp:
            raise ConfigError(f"--draft-tp {degree} is more GPUs than the replica's --tp "
                              f"{self.tp}: use at most {self.tp}, or 'same'")
        return degree

    def as_record(self) -> dict:
        """The spec as summaries and tune/plan files record it: every field, but --tp and
        --draft-tp only where set (a one-GPU spec reads as it did before they existed)."""
        record = asdict(self)
        for name in ("tp", "draft_tp"):
            if record[name] == SimulationSpec.__dataclass_fields__[name].default:
                del record[name]
        return record


@dataclass(frozen=True)
class SimulationInputs:
    """Everything the engine needs, built and validated."""

    workload: Workload
    latency: LatencyModel
    acceptance: SpeculationTrace
    policy: Policy
    kv_capacity_tokens: int
    slo: Slo | None


def build_workload(spec: SimulationSpec, rng: np.random.Generator) -> Workload:
    """The spec's workload: synthetic arrivals drawn from `rng`, or a trace's first requests."""
    default_n = 1000 if spec.duration is None else None
    if spec.workload in SYNTHETIC:
        rate = spec.rate if spec.rate is not None else 2.0
        n = spec.requests or default_n or int(np.ceil(rate * spec.duration * 1.5)) + 10
        lengths = parse_lengths(spec.lengths or "azure-conv")
        cv = (spec.cv or 2.0) if spec.workload == "gamma" else 1.0
        wl = synthetic_workload(spec.workload, rate, n, lengths, rng, cv=cv)
    else:
        if spec.workload not in builtin_names() and not (Path(spec.workload).suffix or
                                                          Path(spec.workload).exists()):
            known = ", ".join([*builtin_names(), *SYNTHETIC])
            raise TraceError(f"unknown workload {spec.workload!r}; use one of {known}, "
                             "or a path to a .csv/.jsonl workload file")
        n = spec.requests or default_n
        wl = load_trace(spec.workload, n)  # a file: only as far as its first n requests
        note_short_trace(spec, wl)
        wl = trace_window(wl, n, spec.rate)
    if spec.duration is not None:
        wl = wl.within(spec.duration)
    return wl


def load_trace(name: str, limit: int | None = None) -> Workload:
    """A trace workload: a shipped trace by name, else a .csv/.jsonl workload file (only its
    first `limit` requests read, where given)."""
    return builtin_workload(name) if name in builtin_names() else load_workload(name, limit)


def trace_window(trace: Workload, n: int | None, rate: float | None,
                 start: int | None = None) -> Workload:
    """`n` consecutive requests of `trace` (None: all of them), the first n or those from
    request `start` on (wrapping around the end: Workload.window), rescaled to `rate` req/s
    (None: the trace's own arrivals). simulate takes a trace's first requests, a tune's or a
    plan's seed i its i-th window, validate the first requests at each rate."""
    if n is not None:
        trace = trace.head(n) if start is None else trace.window(start, n)
    return trace if rate is None else rescale_to_rate(trace, rate)


def note_short_trace(spec: SimulationSpec, trace: Workload, per_seed: bool = False) -> None:
    """A user who asks for more requests than a trace holds hears so (a UserNote); `trace` is
    what `spec` made of its trace workload (synthetic workloads are drawn to size)."""
    requested = spec.requests
    if requested is not None and spec.workload not in SYNTHETIC and requested > len(trace):
        what = ("every seed serves the whole trace, so the seeds differ only in acceptance "
                "order" if per_seed else f"all {len(trace):,} are simulated")
        warnings.warn(f"--requests {requested:,} is more than the {len(trace):,} requests of "
                      f"the trace: {what}", UserNote, stacklevel=2)


def build_acceptance(spec: str, workload: Workload, rng: np.random.Generator) -> SpeculationTrace:
    from traces.builtin import builtin_speculation_path, speculation_names

    if spec in speculation_names():
        with resources.as_file(builtin_speculation_path(spec)) as path:
            return SpeculationTrace.load(path)
    if spec.endswith(".npz") or Path(spec).exists():
        return SpeculationTrace.load(spec)
    if ":" not in spec:  # not a parametric spec: a misspelt name or a missing file
        close = difflib.get_close_matches(spec, speculation_names(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise TraceError(f"--acceptance {spec!r}: no such shipped recording or file; {hint}"
                         f"shipped recordings: {', '.join(speculation_names())}; or a "
                         "speculation trace (.npz), or iid:ALPHA, beta:A,B, markov:A1,A2@L")
    parse_acceptance(spec)  # a clear error for a malformed spec before any work
    return parametric_trace(spec, workload.output_tokens, rng)


def build_inputs(spec: SimulationSpec, policy_params: dict[str, str],
                 scheduler: SchedulerConfig) -> SimulationInputs:
    from policies import make_policy

    seeds = np.random.SeedSequence(spec.seed).spawn(2)
    workload = build_workload(spec, np.random.default_rng(seeds[0]))
    latency, kv = build_latency(spec, scheduler)
    acceptance = build_acceptance(spec.acceptance, workload, np.random.default_rng(seeds[1]))
    policy = make_policy(spec.policy, policy_params)
    return SimulationInputs(workload, latency, acceptance, policy, kv, build_slo(spec))


#: memory per request of a run (workload columns, request records, the frame and summary built
#: from them): 10M Poisson requests peaked at ~3 GB (docs/design.md, "Memory")
REQUEST_BYTES = 320
#: per kept step row (the log's 13 float64 columns and the frame built from them), and the most
#: rows a request can add: one per output token
STEP_ROW_BYTES = 2 * 13 * 8


def check_memory(workload: Workload, keep_steps: bool) -> None:
    """Refuse, in one line with the estimate, a run whose records cannot fit in the memory
    available; note one whose step records may not (their number depends on the batching: up
    to one row per output token)."""
    from traces import UserNote
    from traces.parametric import available_memory_bytes

    have = available_memory_bytes()
    if have is None:
        return
    records = len(workload) * REQUEST_BYTES
    if records > have:
        raise ConfigError(f"{len(workload):,} requests need about {records / 2**30:.1f} GiB, "
                          f"and this machine has {have / 2**30:.1f} GiB available; simulate "
                          f"fewer requests")
    steps = int(workload.output_tokens.sum()) * STEP_ROW_BYTES if keep_steps else 0
    if records + steps > have:
        warnings.warn(UserNote(
            f"the step records of {len(workload):,} requests, kept in memory, may need up to "
            f"{steps / 2**30:.1f} GiB, and this machine has {have / 2**30:.1f} GiB available"),
            stacklevel=2)


def build_slo(spec: SimulationSpec) -> Slo | None:
    """The spec's SLOs (--slo-ttft, --slo-tpot), or None when it sets neither."""
    if spec.slo_ttft is None and spec.slo_tpot is None:
        return None
    from simulator import Slo

    return Slo(ttft_s=spec.slo_ttft, tpot_s=spec.slo_tpot)


def build_latency(spec: SimulationSpec, scheduler: SchedulerConfig) -> tuple[LatencyModel, int]:
    """The latency model (a profile, or the roofline of target/draft/hardware on a replica of
    --tp GPUs) and the KV capacity per replica (the scheduler's, or what the replica's memory
    leaves; a model that does not fit says which --tp would hold it)."""
    if spec.profile is not None:
        return _profiled(spec.profile, scheduler)
    target = get_model(spec.target or "Llama-3.1-8B")
    draft_name = spec.draft or "Llama-68M"
    draft = None if draft_name.lower() in ("none", "ngram", "") else get_model(draft_name)
    gpu = get_gpu(spec.hardware or "H100-SXM")
    draft_tp = spec.draft_degree()
    latency = RooflineLatency(target, draft, gpu, tp=spec.tp, draft_tp=draft_tp)
    if scheduler.kv_capacity_tokens:
        return latency, scheduler.kv_capacity_tokens
    try:
        return latency, group_kv_capacity_tokens(gpu, target, draft, spec.tp, draft_tp)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; {_fitting_tp(spec, gpu, target, draft)}") from None


def _fitting_tp(spec: SimulationSpec, gpu: GpuSpec, target, draft) -> str:
    """What to do when the weights leave no room for KV: the smallest --tp that holds them."""
    for degree in (d for d in TP_DEGREES if d > spec.tp):
        try:
            again = replace(spec, tp=degree)
            group_kv_capacity_tokens(gpu, target, draft, degree, again.draft_degree())
        except ConfigError:
            continue
        return f"split it over more GPUs: it fits with --tp {degree}"
    return (f"no group of up to {TP_DEGREES[-1]} {gpu.name} holds it (--tp): pick a GPU with "
            "more memory")


def _profiled(folder: str, scheduler: SchedulerConfig) -> tuple[LatencyModel, int]:
    """The profiled latency model of `folder` (with the host time between iterations its meta
    records: ProfiledLatency.with_host_time), and a KV capacity from the profiled device."""
    from simulator.builtin_profiles import resolve_profile
    from simulator.latency_table import LatencyTable
    from simulator.profiled import ProfiledLatency

    table = LatencyTable.load(resolve_profile(folder))
    latency = ProfiledLatency.with_host_time(table)
    if scheduler.kv_capacity_tokens:
        return latency, scheduler.kv_capacity_tokens
    memory = table.meta.get("memory_bytes")
    if not isinstance(memory, int):
        raise ConfigError(f"{folder}: the profile does not record the device's memory; "
                          "give --kv-capacity-tokens")
    device = GpuSpec(name=table.meta["device"], memory_bytes=memory, bandwidth_bytes_per_s=1.0,
                     bf16_flops_per_s=1.0, source="profile")
    size = {"fp32": 4, "bf16": 2, "fp16": 2}.get(table.meta["dtype"], 2)
    return latency, kv_capacity_tokens(device, table.target, table.draft, dtype_bytes=size)


def run(spec: SimulationSpec, policy_params: dict[str, str], scheduler: SchedulerConfig,
        cluster: ClusterConfig, fast_path: bool = True, keep_steps: bool = True,
        steps_sink=None) -> tuple[SimulationResult, dict]:
    """Simulate and summarise; the summary carries where each input came from. `keep_steps`
    False: the step records are not kept (only what the summary needs of them); `steps_sink`:
    they are streamed to it (simulator.simulate)."""
    from simulator import simulate, summarize

    inputs = build_inputs(spec, policy_params, scheduler)
    check_memory(inputs.workload, keep_steps and steps_sink is None)
    result = simulate(inputs.workload, inputs.latency, inputs.acceptance, inputs.policy,
                      inputs.kv_capacity_tokens, scheduler, cluster, fast_path=fast_path,
                      keep_steps=keep_steps, steps_sink=steps_sink)
    summary = summarize(result.requests, result.totals, inputs.slo)
    summary["inputs"] = {"spec": spec.as_record(), **result.meta}
    return result, summary
