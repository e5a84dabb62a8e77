"""What `spectune validate` runs: its settings as one dataclass (the CLI's flags are its fields),
checked before any model is built, so a bad flag fails in a second, not after a live run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simulator import ConfigError

DEFAULT_POLICIES = "fixed:k=0,fixed:k=4,goodput,kld_variance,gammatune"
QUICK_POLICIES = "fixed:k=0,fixed:k=4"


@dataclass(frozen=True)
class ValidateSpec:
    """What to validate. The CLI's flags are these fields."""

    model: str = field(default="smollm2", metadata={
        "help": "smollm2 (real SmolLM2-135M, real prompts), tiny (random tiny model, for CI), "
                "or a catalog shape with random weights served in replay mode (e.g. "
                "Llama-3.1-8B on a GPU): real passes, acceptance from --acceptance"})
    acceptance: str | None = field(default=None, metadata={
        "help": "replay mode's acceptance: a shipped speculation trace, a .npz, or a parametric "
                "model (beta:7,3~20); default smollm2-ngram for the ngram drafter"})
    device: str = field(default="cpu", metadata={"help": "cpu, cuda or cuda:N"})
    dtype: str | None = field(default=None, metadata={
        "help": "float32 or bfloat16 (default: float32 on CPU, bfloat16 on CUDA)"})
    profile: str | None = field(default=None, metadata={
        "help": "a latency profile (folder or shipped name) to predict with; default: one "
                "timed now, in rounds between the live runs"})
    workload: str | None = field(default=None, metadata={
        "help": "a workload to serve (its first --requests requests, rescaled to each rate): a "
                ".csv/.jsonl file or a shipped trace (azure-conv, azure-code); default: "
                "Poisson arrivals"})
    requests: int | None = field(default=None, metadata={"help": "requests per run (40; 6 quick)"})
    rates: tuple[float, ...] | None = field(default=None, metadata={
        "help": "arrival rates, req/s (0.5 4; quick 2 50)"})
    output_tokens: int | None = field(default=None, metadata={
        "help": "output tokens per request (64; 24 quick)"})
    policies: str | None = field(default=None, metadata={
        "help": f"comma-separated NAME[:KEY=VALUE...] ({DEFAULT_POLICIES}; quick "
                f"{QUICK_POLICIES})"})
    drafter: str = field(default="ngram", metadata={
        "help": "ngram, ngram:MIN-MAX, early-exit:L[:lens], quant:BITS, eagle[@int8][:PATH], "
                "eagle+ngram[@int8][:PATH] or model:<shape>"})
    k_max: int = field(default=8, metadata={"help": "hard cap on k"})
    max_num_seqs: int = field(default=16, metadata={"help": "requests in one batch, at most"})
    kv_capacity_tokens: int = field(default=100_000, metadata={"help": "KV-cache tokens"})
    max_batched_tokens: int | None = field(default=None, metadata={
        "help": "token budget per iteration (prompt tokens; unset: unlimited)"})
    chunked_prefill: bool = field(default=False, metadata={
        "help": "prefill prompts in chunks beside the decode steps (needs --max-batched-tokens)"})
    scheduler: str = field(default="fcfs-reserve", metadata={
        "help": "the rules the live engine and the simulator both run (simulator/scheduler.py)"})
    overhead: bool = field(default=True, metadata={
        "help": "calibrate the engine's host time per iteration per policy and add it"})
    drift: bool = field(default=True, metadata={
        "help": "scale each run's passes by the device speed measured around it"})
    quick: bool = field(default=False, metadata={
        "help": "tiny random model, few requests, two policies (CI, ~1 min on CPU)"})
    temperature: float = field(default=0.0, metadata={
        "help": "0: greedy; > 0: the live engine samples (rejection sampling) at this "
                "temperature, and the simulator replays what it accepted"})
    threads: int = field(default=1, metadata={"help": "CPU threads for torch"})
    seed: int = field(default=0, metadata={
        "help": "seed of arrivals, prompts, weights and sampling"})
    engine: str = field(default="spectune", metadata={
        "help": "spectune (the live engine) or vllm (a real vLLM server built by "
                "scripts/vllm_env.sh; fixed:k=K policies; needs --profile from `spectune "
                "profile --engine vllm`)"})
    vllm_venv: str = field(default=".venv-vllm", metadata={
        "help": "vLLM's environment (--engine vllm)"})
    calibrate: bool = field(default=False, metadata={
        "help": "--engine vllm: before each measured window, serve a calibration window on the "
                "same server (the same arrivals and lengths, training-split text) and also "
                "simulate each run with its passes (per phase) and host time scaled to how "
                "fast that server ran its windows so far (OUT/calibrated/validate.csv; twice "
                "the serving time)"})
    measured: str | None = field(default=None, metadata={
        "help": "--engine vllm: an earlier validation's --out folder; simulate its measured runs "
                "again (with another --profile, say) instead of serving them"})

    def __post_init__(self) -> None:
        if self.model not in ("smollm2", "tiny"):
            from simulator.catalog import get_model, model_names

            try:
                get_model(self.model)
            except ConfigError:
                raise ConfigError(f"--model must be smollm2, tiny or a catalog shape for "
                                  f"replay mode ({', '.join(model_names())}); got "
                                  f"{self.model!r}") from None
        if self.dtype not in (None, "float32", "bfloat16"):
            raise ConfigError(f"--dtype must be float32 or bfloat16, got {self.dtype!r}")
        if self.acceptance is not None and not self.replay:
            raise ConfigError("--acceptance is replay mode's (a catalog --model): the real and "
                              "tiny models' acceptance is what their drafter achieves live")
        if self.replay and self.acceptance is None and not self.drafter.startswith("ngram"):
            raise ConfigError(f"replay mode with drafter {self.drafter!r}: say which acceptance "
                              "to replay with --acceptance (a recording of that drafter, or "
                              "a parametric model)")
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"--requests must be >= 1, got {self.requests}")
        if self.rates is not None and not all(r > 0 and np.isfinite(r) for r in self.rates):
            raise ConfigError(f"--rates must be positive req/s, got {self.rates}")
        if self.output_tokens is not None and self.output_tokens < 1:
            raise ConfigError(f"--output-tokens must be >= 1, got {self.output_tokens}")
        if self.chunked_prefill and self.max_batched_tokens is None:
            raise ConfigError("--chunked-prefill needs a token budget: set --max-batched-tokens")
        from simulator.scheduler import scheduler_names

        if self.scheduler not in scheduler_names():
            raise ConfigError(f"--scheduler {self.scheduler!r}: known: "
                              f"{', '.join(scheduler_names())}")
        if self.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {self.threads}")
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise ConfigError(f"--temperature must be a finite number >= 0, got "
                              f"{self.temperature!r}")
        if self.engine not in ("spectune", "vllm"):
            raise ConfigError(f"--engine must be spectune or vllm, got {self.engine!r}")
        if self.calibrate and self.engine != "vllm":
            raise ConfigError("--calibrate serves vLLM calibration windows (--engine vllm); "
                              "the spectune engine's runs are scaled by --drift")
        if self.measured is not None and self.engine != "vllm":
            raise ConfigError("--measured reads back runs of --engine vllm; add --engine vllm")
        if self.measured is not None and not Path(self.measured).is_dir():
            raise ConfigError(f"--measured {self.measured}: no such folder (give the --out of "
                              "an earlier `spectune validate --engine vllm`)")
        if self.engine == "vllm" and self.profile is None:
            raise ConfigError("--engine vllm compares with vLLM's own profile: make one with "
                              "`spectune profile --engine vllm --out profiles/vllm` and pass "
                              "--profile profiles/vllm/latency")
        if self.quick and self.model != "tiny":
            object.__setattr__(self, "model", "tiny")

    @property
    def replay(self) -> bool:
        """Random weights of a catalog shape: acceptance replayed from a trace."""
        return self.model not in ("smollm2", "tiny")

    @property
    def torch_dtype_name(self) -> str:
        return self.dtype or ("bfloat16" if self.device.startswith("cuda") else "float32")

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
        from spectune.flags import parse_policy_list

        text = self.policies or (QUICK_POLICIES if self.quick else DEFAULT_POLICIES)
        try:
            return parse_policy_list(text)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
