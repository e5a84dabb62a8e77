"""vLLM's own latency table: its iteration times under controlled batches, in the profiled
latency format the simulator reads (simulator/latency_table.py).

B identical requests arrive at once, so every step of a batch has one shape: the prompts'
prefill, then decode steps of B requests that each feed 1 + d tokens over the same cached
context. The prompt repeats a short cycle of tokens, so the n-gram lookup proposes the full k at
every step and a server with speculation times verify passes of k + 1 tokens. A step's time is
the engine's own `iteration elapsed time` (forward pass, sampling, n-gram proposal); the time
between iterations (scheduling, output processing) goes to the meta as `iteration_gap_s`, the
per-iteration overhead the simulator adds. One server per k (vLLM fixes k when it starts).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from live.vllm_client import serve_workload, warm_up
from live.vllm_log import read_iterations
from live.vllm_server import VllmServer, VllmSettings
from traces import Workload

CYCLE = tuple(range(1000, 1016))  # 16 token ids, repeated: a prompt the lookup always matches
CACHED_BIN = 8  # decode rows are the median over steps whose context falls in one bin
IDLE_FIRST_ID = 2000  # distinct_prompt's first token id (past CYCLE's)


def cyclic_prompt(tokens: int) -> list[int]:
    return [CYCLE[i % len(CYCLE)] for i in range(tokens)]


def distinct_prompt(tokens: int) -> list[int]:
    """No token twice: the lookup finds no match until the model's output repeats one, so a
    server with speculation runs its proposer and verifies nothing (`idle_proposer_s`)."""
    return list(range(IDLE_FIRST_ID, IDLE_FIRST_ID + tokens))


def batch_rows(iterations: pd.DataFrame, batch: int, prompt: int, k: int,
               drafted: Sequence[int], accepted: Sequence[int]) -> list[dict]:
    """The uniform steps of one batch as table rows (seconds per step, before binning)."""
    rows = []
    prefill = iterations[(iterations.generation_requests == 0)
                         & (iterations.context_tokens == iterations.context_requests * prompt)]
    for it in prefill.itertuples():
        rows.append({"phase": "prefill", "num_seqs": it.context_requests,
                     "query_tokens_per_seq": prompt, "cached_tokens_per_seq": 0,
                     "seconds": it.elapsed_ms / 1000})
    decode = iterations[(iterations.context_requests == 0)
                        & (iterations.generation_requests == batch)]
    emitted, step = 1, 0  # tokens emitted before the first decode step: the prefill's one
    for it in decode.itertuples():
        d = drafted[step] if k and step < len(drafted) else 0
        if it.generation_tokens == batch * (1 + d):
            rows.append({"phase": "verify" if d else "decode", "num_seqs": batch,
                         "query_tokens_per_seq": 1 + d,
                         "cached_tokens_per_seq": prompt + emitted - 1,
                         "seconds": it.elapsed_ms / 1000})
        emitted += 1 + (accepted[step] if k and step < len(accepted) else 0)
        step += 1 if k else 0
    return rows


def table_rows(raw: pd.DataFrame) -> pd.DataFrame:
    """Median seconds per (phase, batch, query, cached bin): the latency table's rows."""
    raw = raw[~idle_rows(raw)].copy()  # a speculating server's decodes: idle_proposer_s
    decoding = raw.phase != "prefill"
    base = raw.cached_tokens_per_seq
    raw.loc[decoding, "cached_tokens_per_seq"] = (base[decoding] // CACHED_BIN) * CACHED_BIN
    keys = ["phase", "num_seqs", "query_tokens_per_seq", "cached_tokens_per_seq"]
    grouped = raw.groupby(keys).seconds
    table = pd.DataFrame({"median_s": grouped.median(), "p10_s": grouped.quantile(0.1),
                          "p90_s": grouped.quantile(0.9), "repeats": grouped.size()})
    table = table.reset_index()
    table.insert(0, "role", "target")
    return _product_grid(table)


def idle_rows(raw: pd.DataFrame) -> pd.Series:
    """Decode steps of a server with speculation (k > 0): its proposer ran, found nothing."""
    k = raw["k"] if "k" in raw.columns else pd.Series(0, index=raw.index)
    return (raw.phase == "decode") & (k > 0)


def idle_proposer_s(raw: pd.DataFrame) -> tuple[float, int] | None:
    """What a step that verifies no drafts costs more on a server with speculation than the same
    decode on one without (vLLM still runs its proposer, and a speculating runner's step): the
    median over shapes (batch, context bin) timed on both of the difference of their medians;
    and how many shapes that is. None without such pairs (no k = 0 server, or no idle steps)."""
    binned = raw[raw.phase == "decode"].assign(
        bin=lambda d: d.cached_tokens_per_seq // CACHED_BIN * CACHED_BIN)
    idle = idle_rows(binned)
    keys = ["num_seqs", "bin"]
    plain = binned[~idle].groupby(keys).seconds.median()
    spec = binned[idle].groupby(keys).seconds.median()
    both = plain.index.intersection(spec.index)
    if not len(both):
        return None
    return float((spec[both] - plain[both]).median()), len(both)


def _product_grid(table: pd.DataFrame) -> pd.DataFrame:
    """Keep the prompt lengths every prefill batch size has and, per decode/verify phase and
    query width, the context bins every batch size has: the profiled model interpolates on a
    full product grid only (simulator/fit.py)."""
    keep = pd.Series(True, index=table.index)
    prefill = table[table.phase == "prefill"]
    counts = prefill.groupby("query_tokens_per_seq").num_seqs.nunique()
    full = counts[counts == prefill.num_seqs.nunique()].index
    keep[prefill.index] = prefill.query_tokens_per_seq.isin(full)
    for (phase, _), group in table.groupby(["phase", "query_tokens_per_seq"]):
        if phase == "prefill":
            continue
        batches = group.num_seqs.nunique()
        counts = group.groupby("cached_tokens_per_seq").num_seqs.nunique()
        full = counts[counts == batches].index
        keep[group.index] = group.cached_tokens_per_seq.isin(full)
    return table[keep].reset_index(drop=True)


def profile_server(settings: VllmSettings, venv: Path, batches: Sequence[int],
                   prompts: Sequence[int], output_tokens: int, out: Path,
                   progress: Callable[[str], None] | None = None,
                   prefill_prompts: Sequence[int] = (), rounds: int = 2,
                   seed: int = 0, idle_batches: Sequence[int] = ()) -> tuple[pd.DataFrame, list]:
    """Every (prompt, batch) on one server, and 1 and 2 requests of each of `prefill_prompts`
    (writing 2 tokens: their prefill is what they time), in `rounds` rounds, each in its own
    shuffled order (so the machine's drift spreads over every shape instead of biasing some):
    raw step rows and (busy wall s, iterations, sum of elapsed s) per batch for the gap
    between iterations. A server with speculation also serves `idle_batches` of a
    `distinct_prompt` of the shortest prompt's length: its steps until a draft appears are
    decodes that ran the proposer (`idle_proposer_s`)."""
    k = settings.speculative_tokens
    raw, busy = [], []
    log = out / f"server-k{k}.log"
    with VllmServer(settings, venv, log) as server:
        model = str(settings.model_dir)
        warm_up(server.url, model, [cyclic_prompt(min(prompts))])
        shapes = [(p, b, output_tokens, cyclic_prompt) for p in prompts for b in batches]
        shapes += [(p, b, 2, cyclic_prompt) for p in prefill_prompts for b in (1, 2)]
        if k:
            shapes += [(min(prompts), b, output_tokens, distinct_prompt) for b in idle_batches]
        rng = np.random.default_rng(seed)
        order = [shapes[i] for r in range(rounds) for i in rng.permutation(len(shapes))]
        for prompt, batch, tokens, make in order:
            ids = [make(prompt)] * batch
            wl = Workload(arrival_s=np.zeros(batch), prompt_tokens=np.full(batch, prompt),
                          output_tokens=np.full(batch, tokens),
                          request_ids=np.arange(batch), source="vLLM profile batch")
            first = len(read_iterations(log))
            served = serve_workload(server.url, model, wl, ids)
            errors = [s.error for s in served if s.error]
            if errors:
                raise RuntimeError(f"profile batch {batch}x{prompt}: {errors[0]}")
            its = _settled(log, first)
            s0 = served[0]
            rows = batch_rows(its, batch, prompt, k, s0.per_step_drafted,
                              s0.per_step_accepted)
            if tokens == 2:  # a prefill shape: its one decode step would break the decode grid
                rows = [r for r in rows if r["phase"] == "prefill"]
            if make is distinct_prompt:  # its idle decodes only (drafts come late, unplanned)
                rows = [r for r in rows if r["phase"] == "decode"]
            raw += [{**r, "k": k, "batch": batch, "prompt": prompt} for r in rows]
            wall = max(s.finish_s for s in served) - min(s.sent_s for s in served)
            busy.append((wall, len(its), float(its.elapsed_ms.sum()) / 1000))
            if progress is not None:
                progress(f"k={k} prompt {prompt} batch {batch}: {len(its)} iterations, "
                         f"{len(rows)} uniform")
    return pd.DataFrame(raw), busy


def _settled(log: Path, first: int, wait_s: float = 0.5, tries: int = 20) -> pd.DataFrame:
    """The iteration lines after `first`, once the log has stopped growing."""
    seen = -1
    for _ in range(tries):
        its = read_iterations(log).iloc[first:]
        if len(its) == seen:
            return its.reset_index(drop=True)
        seen = len(its)
        time.sleep(wait_s)
    return read_iterations(log).iloc[first:].reset_index(drop=True)


def profile_vllm(base: VllmSettings, venv: Path, out: Path, ks: Sequence[int] = (0, 2, 4, 6),
                 batches: Sequence[int] = (1, 2, 4, 8, 16),
                 prompts: Sequence[int] = (128, 512, 1024), output_tokens: int = 32,
                 prefill_prompts: Sequence[int] = (64, 256, 768, 1024),
                 rounds: int = 2,
                 progress: Callable[[str], None] | None = None,
                 idle_batches: Sequence[int] = (1, 2, 4, 8)) -> tuple[pd.DataFrame, dict]:
    """The table's rows and what the meta adds (the gap between iterations, the idle proposer's
    time where k = 0 and a k > 0 are both profiled, the raw steps' count); raw steps go to
    out/steps.csv."""
    out.mkdir(parents=True, exist_ok=True)
    raws, busy = [], []
    for k in ks:
        raw, b = profile_server(replace(base, speculative_tokens=k), venv, batches, prompts,
                                output_tokens, out, progress,
                                prefill_prompts if k == ks[0] else (), rounds,
                                idle_batches=idle_batches)
        raws.append(raw)
        busy += b
    raw = pd.concat(raws, ignore_index=True)
    raw.to_csv(out / "steps.csv", index=False)
    gaps = [(wall - elapsed) / n for wall, n, elapsed in busy if n]
    extra = {"iteration_gap_s": float(np.median(gaps)), "raw_steps": len(raw),
             "speculative_tokens": list(ks)}
    idle = idle_proposer_s(raw)
    if idle is not None:
        extra["idle_proposer_s"], extra["idle_proposer_shapes"] = idle
    return table_rows(raw), extra


def probe(url: str, model: str, log: Path, k: int, prompt: int = 128, tokens: int = 64
          ) -> list[dict]:
    """One request of a cyclic prompt: its uniform steps as profile rows (shape and seconds).
    Run around each measured workload, they say how fast the machine is then, against the
    profile's prediction for the same shapes (`pass_scale`: the drift of a shared CPU)."""
    wl = Workload(arrival_s=np.zeros(1), prompt_tokens=np.array([prompt]),
                  output_tokens=np.array([tokens]), request_ids=np.arange(1),
                  source="vLLM speed probe")
    time.sleep(1.0)
    first = len(read_iterations(log))
    (served,) = serve_workload(url, model, wl, [cyclic_prompt(prompt)])
    if served.error:
        raise RuntimeError(f"vLLM speed probe failed: {served.error}")
    time.sleep(1.0)
    its = read_iterations(log).iloc[first:].reset_index(drop=True)
    return batch_rows(its, 1, prompt, k, served.per_step_drafted, served.per_step_accepted)
