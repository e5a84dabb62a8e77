"""Sample runs for the report: one simulation kept whole, with the k each request got per step.

Two per-step logs: what the policy chose (k_trace.csv) and what was really drafted and accepted
(drafts.csv). They differ when the drafter runs out of proposals (n-gram lookup drafts at most
what it matched) or a draft-stop rule cuts the chain: a fixed k=10 may draft 6 on average.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pandas as pd

from policies import Policy, make_policy
from simulator import simulate
from spectune.evaluate import Task, seeded_inputs

CHOSEN_COLUMNS = ["time_s", "request_id", "k"]
DRAFTS_COLUMNS = ["time_s", "request_id", "k", "drafted", "accepted"]


def recording(policy: Policy, log: list, outcomes: list | None = None) -> Policy:
    """The same policy (same class attributes, same state), also logging (time, request, k)
    per choice and, with `outcomes`, (request, drafted, accepted) per verification. The logs
    live in the methods' closures, so the engine's deep copies (one per replica) all append
    to them. Observing changes no k: the engine only builds the outcomes it already knows."""
    base = type(policy)

    class Recording(base):  # type: ignore[misc, valid-type]
        def choose(self, ctx):
            ks = super().choose(ctx)
            log.extend((ctx.now_s, r.request_id, int(k)) for r, k in zip(ctx.requests, ks))
            return ks

        if outcomes is not None:
            def observe(self, ctx, outs):
                outcomes.extend((o.request_id, int(o.k), int(o.accepted)) for o in outs)
                super().observe(ctx, outs)

    Recording.__name__ = Recording.__qualname__ = base.__name__
    wrapped = copy.copy(policy)
    wrapped.__class__ = Recording
    return wrapped


def drafts_frame(chosen: list, outcomes: list) -> pd.DataFrame:
    """Each request's n-th choice joined with its n-th verification: one row per request per
    decode step. A request lives on one replica and is verified right after each choice, so
    the n-th of each belong to the same step even when replicas interleave in the logs."""
    asked = pd.DataFrame(chosen, columns=CHOSEN_COLUMNS)
    done = pd.DataFrame(outcomes, columns=["request_id", "drafted", "accepted"])
    for frame in (asked, done):
        frame["step"] = frame.groupby("request_id").cumcount()
    both = asked.merge(done, on=["request_id", "step"], how="inner", validate="one_to_one")
    return both.sort_values(["time_s", "request_id"], kind="stable")[DRAFTS_COLUMNS]


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_")[:80]


def write_sample(task: Task, folder: Path) -> dict[str, str]:
    """Simulate `task` step by step (no fast path: every choice is logged) and write
    requests.csv, k_trace.csv (k chosen) and drafts.csv (k drafted) under `folder`; return
    their paths."""
    from spectune.files import write_csv

    workload, latency, acceptance, kv, _ = seeded_inputs(task)
    chosen: list[tuple[float, int, int]] = []
    outcomes: list[tuple[int, int, int]] = []
    policy = recording(make_policy(task.candidate.policy, task.candidate.params_dict), chosen,
                       outcomes)
    result = simulate(workload, latency, acceptance, policy, kv, task.scheduler, fast_path=False)
    write_csv(folder / "requests.csv", result.requests)
    write_csv(folder / "k_trace.csv", pd.DataFrame(chosen, columns=CHOSEN_COLUMNS))
    write_csv(folder / "drafts.csv", drafts_frame(chosen, outcomes))
    return {name.replace(".", "_"): str(folder / name)
            for name in ("requests.csv", "k_trace.csv", "drafts.csv")}
