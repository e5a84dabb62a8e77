"""Replay a workload against a vLLM server: each request sent at its arrival time, streamed, and
timed token by token on the client's clock, with vLLM's own per-step speculation counts.

Requests go to `/v1/completions` as token ids (no tokenizer in between), greedy, with
`ignore_eos` and `min_tokens` = `max_tokens` = the workload's output length, so every request
writes exactly the tokens the simulator charges for. One thread per request, standard library
only (spectune does not depend on an HTTP client).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from traces import Workload


@dataclass
class Served:
    """One request as the client saw it; times in seconds since the run started."""

    index: int
    request_id: int
    arrival_s: float
    sent_s: float = float("nan")
    first_token_s: float = float("nan")
    finish_s: float = float("nan")
    token_times: list[float] = field(default_factory=list)  # one entry per token received
    token_ids: list[int] = field(default_factory=list)
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)
    error: str | None = None


def request_body(model: str, prompt: Sequence[int], output_tokens: int) -> dict:
    return {"model": model, "prompt": [int(t) for t in prompt], "max_tokens": int(output_tokens),
            "min_tokens": int(output_tokens), "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}


def _stream(url: str, body: dict, served: Served, start: float, timeout_s: float) -> None:
    """POST one request and read its server-sent events until [DONE]."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        payload = json.dumps(body)
        served.sent_s = time.perf_counter() - start
        conn.request("POST", "/v1/completions", payload, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        if reply.status != 200:
            served.error = f"HTTP {reply.status}: {reply.read(500).decode(errors='replace')}"
            return
        for raw in reply:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            _take(json.loads(data), served, time.perf_counter() - start)
        served.finish_s = served.token_times[-1] if served.token_times else float("nan")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        served.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


def _take(event: dict, served: Served, now: float) -> None:
    for choice in event.get("choices") or []:
        ids = choice.get("token_ids") or []
        if ids and not served.token_ids:
            served.first_token_s = now
        served.token_ids.extend(int(t) for t in ids)
        served.token_times.extend([now] * len(ids))
    spec = (event.get("metrics") or {}).get("speculative_decoding") or {}
    served.per_step_accepted = list(spec.get("per_step_accepted", served.per_step_accepted))
    served.per_step_drafted = list(spec.get("per_step_drafted", served.per_step_drafted))


def serve_workload(url: str, model: str, workload: Workload, prompts: Sequence[Sequence[int]],
                   timeout_s: float = 900.0) -> list[Served]:
    """Send every request at its arrival (relative to the first) and wait for all of them."""
    if len(prompts) != len(workload):
        raise ValueError(f"{len(prompts)} prompts for a workload of {len(workload)} requests")
    arrivals = workload.arrival_s - workload.arrival_s[0]
    served = [Served(i, int(workload.request_ids[i]), float(arrivals[i]))
              for i in range(len(workload))]
    start = time.perf_counter()
    threads = []
    for i, request in enumerate(served):
        wait = start + request.arrival_s - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        body = request_body(model, prompts[i], int(workload.output_tokens[i]))
        thread = threading.Thread(target=_stream, args=(url, body, request, start, timeout_s),
                                  daemon=True, name=f"vllm-request-{i}")
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return served


def served_frame(served: Sequence[Served], workload: Workload) -> pd.DataFrame:
    """Per request: the simulator's metrics' inputs (arrival, first token, finish) and the
    speculation counts, as the simulator's request log names them."""
    rows = []
    for s in served:
        n = len(s.token_ids)
        rows.append({
            "request_id": s.request_id, "arrival_s": s.arrival_s, "sent_s": s.sent_s,
            "first_token_s": s.first_token_s, "finish_s": s.finish_s,
            "prompt_tokens": int(workload.prompt_tokens[s.index]),
            "output_tokens": n, "asked_tokens": int(workload.output_tokens[s.index]),
            "ttft_s": s.first_token_s - s.arrival_s, "e2e_s": s.finish_s - s.arrival_s,
            "tpot_s": (s.finish_s - s.first_token_s) / (n - 1) if n > 1 else np.nan,
            "verify_steps": len(s.per_step_drafted), "drafted": sum(s.per_step_drafted),
            "accepted": sum(s.per_step_accepted), "error": s.error or "",
        })  # fmt: skip
    return pd.DataFrame(rows)


def warm_up(url: str, model: str, prompts: Sequence[Sequence[int]], batches=(1, 4)) -> None:
    """Batches of short requests, each batch at once, so the first shapes compile now."""
    for size in batches:
        picked = [prompts[i % len(prompts)] for i in range(size)]
        wl = Workload(arrival_s=np.zeros(size), prompt_tokens=np.array([len(p) for p in picked]),
                      output_tokens=np.full(size, 8), request_ids=np.arange(size),
                      source="vLLM warm-up")
        errors = [s.error for s in serve_workload(url, model, wl, picked) if s.error]
        if errors:
            raise RuntimeError(f"vLLM warm-up failed: {errors[0]}")
