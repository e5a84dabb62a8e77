"""Sample runs for the report: one simulation kept whole, with the k each request got per step."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pandas as pd

from policies import Policy, make_policy
from simulator import simulate
from spectune.evaluate import Task, seeded_inputs


def recording(policy: Policy, log: list) -> Policy:
    """The same policy (same class attributes, same state), also logging (time, request, k).
    The log lives in the method's closure, so the engine's deep copies (one per replica) all
    append to it."""
    base = type(policy)

    class Recording(base):  # type: ignore[misc, valid-type]
        def choose(self, ctx):
            ks = super().choose(ctx)
            log.extend((ctx.now_s, r.request_id, int(k)) for r, k in zip(ctx.requests, ks))
            return ks

    Recording.__name__ = Recording.__qualname__ = base.__name__
    wrapped = copy.copy(policy)
    wrapped.__class__ = Recording
    return wrapped


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_")[:80]


def write_sample(task: Task, folder: Path) -> dict[str, str]:
    """Simulate `task` step by step (no fast path: every choice is logged) and write
    requests.csv and k_trace.csv under `folder`; return their paths."""
    from spectune.files import write_csv

    workload, latency, acceptance, kv, _ = seeded_inputs(task)
    log: list[tuple[float, int, int]] = []
    policy = recording(make_policy(task.candidate.policy, task.candidate.params_dict), log)
    result = simulate(workload, latency, acceptance, policy, kv, task.scheduler, fast_path=False)
    write_csv(folder / "requests.csv", result.requests)
    write_csv(folder / "k_trace.csv", pd.DataFrame(list(log), columns=["time_s", "request_id",
                                                                        "k"]))
    return {"requests_csv": str(folder / "requests.csv"),
            "k_trace_csv": str(folder / "k_trace.csv")}
