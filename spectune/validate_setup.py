"""What `validate` serves and with what: the models, the drafter and scheduler settings, the
workloads (Poisson arrivals or a trace's lengths, over real prompts or random tokens) and the
teacher-forced trace of a live run's acceptance."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from simulator import ConfigError
from spectune.validate_spec import ValidateSpec

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


# -- inputs --------------------------------------------------------------------------------------


def build_models(spec: ValidateSpec):
    """(target, tokenizer or None) on the spec's device and dtype."""
    from models.llama import LlamaModel, config_for
    from models.runtime import dtype_named
    from profiler import device as devices
    from simulator.catalog import ModelShape, get_model

    try:
        device = devices.resolve(spec.device)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    dtype = dtype_named(spec.torch_dtype_name)
    if spec.model == "smollm2":
        from models.gguf import load_smollm2

        return load_smollm2(dtype, device=device)
    shape = ModelShape(**TINY_SHAPE) if spec.model == "tiny" else get_model(spec.model)
    return LlamaModel.random(config_for(shape, dtype=dtype, device=device), seed=spec.seed), None


def build_workload(spec: ValidateSpec, rate: float, vocab: int, tokenizer):
    """(workload, prompt token ids): Poisson arrivals at `rate`, or the --workload trace's first
    requests rescaled to it (random prompts of its lengths)."""
    from traces import Workload, poisson_arrivals

    rng = np.random.default_rng([spec.seed, int(rate * 1000)])
    if spec.workload is not None:
        from spectune.simulate import load_trace, trace_window

        wl = trace_window(load_trace(spec.workload), spec.n_requests, rate)
        prompts = [rng.integers(0, vocab, int(n)).tolist() for n in wl.prompt_tokens]
        return wl, prompts
    n = spec.n_requests
    if tokenizer is not None:
        from models.tokenizer import chat_prompt

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


def record_trace(target, drafter, prompts, outputs, k_max: int, want_kl: bool,
                 temperature: float = 0.0):
    """Teacher-forced speculation trace of the live outputs. Acceptance is exact, greedy or
    sampled (the drafts are deterministic: a draft was accepted iff the output holds it)."""
    from live.recorder import record_outputs
    from traces import SpeculationTrace

    reqs = tuple(record_outputs(target, drafter, prompt, out, k_max, want_kl, key=str(i),
                                temperature=temperature)
                 for i, (prompt, out) in enumerate(zip(prompts, outputs)))
    meta = {"source": "spectune validate: teacher-forced on the live run's outputs",
            "drafter": drafter.name, "target": target.config.shape.name,
            "temperature": float(temperature), "max_run": int(k_max), "parametric": False}
    return SpeculationTrace(requests=reqs, meta=meta)


@dataclass
class Setup:
    target: object
    drafter: object
    scheduler: object
    tokenizer: object
    temperature: float = 0.0
    seed: int = 0
    acceptance: str | None = None  # replay mode: what build_acceptance makes the trace from

    @property
    def vocab(self) -> int:
        """Token ids every model here embeds (a replayed draft model's may be smaller)."""
        vocab = self.target.config.shape.vocab
        draft = None if self.drafter.model_free else self.drafter.model
        return min(vocab, draft.config.shape.vocab) if draft is not None else vocab

    def replay_trace(self, workload):
        """Replay mode's speculation trace for this workload (None: the real model's)."""
        if self.acceptance is None:
            return None
        from spectune.simulate import build_acceptance

        return build_acceptance(self.acceptance, workload,
                                np.random.default_rng([self.seed, len(workload)]))


def setup_models(spec: ValidateSpec) -> Setup:
    from drafters import make_drafter
    from models.runtime import set_threads
    from simulator import SchedulerConfig
    from spectune.record import lens_fit_text

    set_threads(spec.threads)
    target, tokenizer = build_models(spec)
    try:
        drafter = make_drafter(spec.drafter, target, seed=spec.seed,
                               lens_text=lens_fit_text(tokenizer), vocab_check=not spec.replay)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    sched = SchedulerConfig(max_num_seqs=spec.max_num_seqs, k_max=spec.k_max,
                            kv_capacity_tokens=spec.kv_capacity_tokens,
                            max_batched_tokens=spec.max_batched_tokens,
                            chunked_prefill=spec.chunked_prefill, scheduler=spec.scheduler)
    acceptance = (spec.acceptance or "smollm2-ngram") if spec.replay else None
    return Setup(target, drafter, sched, tokenizer, spec.temperature, spec.seed, acceptance)


def calibration_workload(spec: ValidateSpec, vocab: int, tokenizer):
    """The host-time calibration's workload: max_num_seqs requests (its own draw from the prompt
    set, with another seed) arriving at once, with output lengths staggered from a quarter of the
    compared runs' to all of it, so the batch shrinks through every size down to 1."""
    from traces import Workload

    n = spec.max_num_seqs
    other = replace(spec, seed=spec.seed + 7919, requests=n)
    wl, prompts = build_workload(other, 1.0, vocab, tokenizer)
    outputs = np.linspace(max(2, spec.n_output // 4), spec.n_output, n).round().astype(np.int64)
    calib = Workload(arrival_s=np.zeros(n), prompt_tokens=wl.prompt_tokens,
                     output_tokens=outputs, request_ids=wl.request_ids,
                     source="validate: host-time calibration, all arriving at once")
    return calib, prompts
