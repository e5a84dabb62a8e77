"""Decode steps of a policy that learns from every step, run many at a time in one compiled
loop: `auto` (simulator/compiled_steps.py).

Such a policy cannot be walked request by request (each step's ks depend on what the whole
batch's last steps revealed), so the fast path's segments skip it and it stepped one iteration
at a time through `Replica._mixed_iteration`. Here the steps of a fixed batch (no prompt
to chunk, no arrival, no finish before the last) run in one call that does what that method, the
policy's `choose`, its draft stop and `observe_columns` do, in the same order and to the bit.
Where it cannot (a draft model, a tree, a latency model other than the roofline, numba not
loaded, a policy cost model of its own) the replica steps as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.auto import ALPHA_MAX, BIN_TABLE, COLD, FRESH, MAX_STREAK, NEW, Auto
from simulator import kernels

#: steps of positions each request's window holds, beyond the deepest draft: a run of steps
#: ends where a window does (and goes on in the next), so this bounds what one run copies
WINDOW_STEPS = 16
#: the most steps one run takes (its records' arrays are this long)
MAX_STEPS = 4096


@dataclass
class StepsRun:
    """What a run of steps did: how many, the clock before each and after the last, each
    step's time and records (drafts, most drafts, accepted and emitted tokens), and each request's
    tokens generated and drafts after it; `finished`: its last step finished a request."""

    steps: int
    clock: np.ndarray
    durations: np.ndarray
    drafted: np.ndarray
    max_k: np.ndarray
    accepted: np.ndarray
    emitted: np.ndarray
    generated: np.ndarray
    drafts: np.ndarray
    finished: bool


def steps_at_once(policy, cost, policy_cost, planned: bool, fast_path: bool) -> bool:
    """Whether a replica runs this policy's decode steps in compiled runs: `auto` itself (a
    subclass may change what a step does), with a depth to draft to, under the plain
    scheduler (with chunked prefill, its steps with no prompt to chunk), a model-free chain on
    the roofline priced from its sums and no idle proposer (the steps' prices are the
    roofline's passes), the policy reading the engine's cost model, and the compiled loops
    loaded for this run."""
    roofline = getattr(cost, "_roofline", None)
    return (fast_path and type(policy) is Auto and policy.k_max > 0
            and not planned and policy_cost is None and roofline is not None
            and roofline["target"] is not None and cost.prices_alternatives_at_once
            and not cost.idle_s and kernels.compiled() is not None)


def run_steps(policy: Auto, batch, acceptance_capped: bool, k_max: int, cost,
              start: float, horizon: float) -> StepsRun:
    """Up to the step that finishes a request, or the first that ends at or after `horizon`
    (the next arrival), or the end of a window, of these running requests under `policy`;
    the policy's counts and the requests' states move with them."""
    from simulator import compiled_steps  # (numba's: loaded with the compiled loops)

    b = len(batch)
    depth = min(policy.k_max, k_max)
    window = (depth + 1) * WINDOW_STEPS
    ids = [request.request_id for request in batch]
    generated = np.fromiter((request.generated for request in batch), np.int64, b)
    output = np.fromiter((request.output_tokens for request in batch), np.int64, b)
    prompt = np.fromiter((request.prompt_tokens for request in batch), np.int64, b)
    ends = np.minimum(generated + window, output)
    offsets = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(ends - generated, out=offsets[1:])
    spans = list(zip(generated.tolist(), ends.tolist()))
    run = np.concatenate([request.run[g:e] for request, (g, e) in zip(batch, spans)])
    top1 = np.concatenate([request.signals["draft_top1"][g:e]
                           for request, (g, e) in zip(batch, spans)]).astype(np.float64,
                                                                             copy=False)
    cap = (np.concatenate([request.cap[g:e] for request, (g, e) in zip(batch, spans)])
           if acceptance_capped else run[:0])
    states, observed, expected = policy.request_state(ids)
    counts = policy.counts()
    why, n, clock, durations, drafted, max_k, accepted, emitted, after, drafts = (
        compiled_steps.auto_steps(
            prompt, output, generated, generated, offsets, run, cap, top1, acceptance_capped,
            *counts, states, observed, expected, float(policy.prior_weight),
            float(policy.k0_bonus), float(policy.stop_slack), depth, BIN_TABLE,
            cost._roofline["target"], float(cost.latency.step_overhead_s(b)), start, horizon,
            MAX_STEPS, NEW, FRESH, COLD, MAX_STREAK, ALPHA_MAX))
    policy.took_steps(n, counts, ids, states, observed, expected, drafts)
    return StepsRun(n, clock, durations, drafted, max_k, accepted, emitted, after, drafts,
                    why == compiled_steps.FINISHED)
