"""Decode steps of a policy that learns from every step, run many at a time in one compiled
loop: `auto` and `kld_variance` (simulator/compiled_steps.py); and those of the policies the
plain scheduler walks a request at a time, under vLLM's scheduler, and of goodput and the
oracle, under every scheduler (simulator/compiled_walked.py, one loop for all of them).

Such a policy cannot be walked request by request (each step's ks depend on what the whole
batch's last steps revealed), so the fast path's segments skip it and it stepped one iteration
at a time through `Replica._mixed_iteration`. Here the steps of a fixed batch (no prompt to
chunk, no arrival, no finish before the last) run in one call that does what that method and
the policy's `choose`, draft stop and fit of the outcomes do, in the same order and to the bit;
under vLLM's scheduler, what `Replica._planned_iteration` does for a steady batch (`Room`), up
to the first step its schedule() would plan otherwise. Where it cannot (`steps_at_once`: a
subclass, no fast path, a draft tree, a latency model other than the roofline, an idle
proposer, numba not loaded, no depth to draft to; for auto, goodput and the oracle a policy
cost model of its own; for kld_variance a draft model or a history over 128; for the oracle
that knows outcomes a draft model; goodput with an estimate other than the censored one) the
replica steps as before. `RUNNERS` says which policies have such a loop; each runner gathers
the batch's numbers and the policy's state for it, the requests' traces being kept in a
`TraceStore` from submit to finish. The steps taken one at a time have the policy's part
compiled too: auto's, goodput's and the oracle's with prompt chunks under chunked prefill
(`choose_once`, `verify_once`), and every runner's engine steps with prompt chunks under
vLLM's scheduler (`propose_once`).

The loops write their records into buffers kept here (`_buffers`), one set for the process:
each call's are read before the next call of the loops (simulations run one at a time in a
process, never in threads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from policies.adaedl import AdaEDL
from policies.auto import (
    ALPHA_MAX,
    BIN_TABLE,
    COLD,
    FRESH,
    MAX_STREAK,
    NEW,
    THRESHOLDS,
    TOTALS_TRIED,
    Auto,
    geometric_totals,
)
from policies.gammatune import GammaTune, GammaTunePlus
from policies.goodput import Goodput
from policies.heuristic import Heuristic
from policies.kld_variance import (
    COMPILED_HISTORY,
    KL_CEILING,
    RATIO_IF_FLAT,
    KldVariance,
    history_weights,
)
from policies.oracle import Oracle
from simulator import kernels
from simulator.run_records import CLOCK, RECORDS

if TYPE_CHECKING:
    from policies.base import RequestStates
    from simulator.scheduler_vllm import Room

#: the most steps one run takes (its records' arrays are this long)
MAX_STEPS = 4096

#: a `TraceStore`'s first length, in output positions
STORE_TOKENS = 1 << 15


class TraceStore:
    """Every request's trace a run of steps reads (accepted runs, the drafter's caps, the
    policy's signal), from submit to finish, in three flat arrays: a run is handed where each
    of its requests starts (`RequestState.trace_at`), with nothing copied per run. A finished
    request's space is reclaimed when the arrays fill: the live traces are copied to the front
    of arrays at least twice their length (so each token is copied a bounded number of times on
    average), and memory follows the requests in flight."""

    def __init__(self, signal: str, capped: bool) -> None:
        self.signal, self.capped = signal, capped
        size = STORE_TOKENS
        self.run = np.zeros(size, dtype=np.int64)
        self.cap = np.zeros(size if capped else 0, dtype=np.int64)
        self.values = np.zeros(size if signal else 0)  # (no signal read: none kept)
        self.used = 0
        self._live: dict[int, object] = {}  # id(request) -> request

    def add(self, request) -> None:
        """Copy a request's trace in (its `run`, `cap` and signal, one entry per output
        position)."""
        n = len(request.run)
        if self.used + n > len(self.run):
            self._make_room(n)
        at, end = self.used, self.used + n
        self.run[at:end] = request.run
        if self.capped:
            self.cap[at:end] = request.cap
        if self.signal:
            self.values[at:end] = request.signals[self.signal]
        request.trace_at, self.used = at, end
        self._live[id(request)] = request

    def drop(self, request) -> None:
        """A finished request's trace is no longer read (its space is taken back later)."""
        self._live.pop(id(request), None)

    def _make_room(self, n: int) -> None:
        live = list(self._live.values())
        need = sum(len(request.run) for request in live) + n
        size = max(len(self.run), 2 * need)
        run, values = np.zeros(size, dtype=np.int64), np.zeros(size if self.signal else 0)
        cap = np.zeros(size if self.capped else 0, dtype=np.int64)
        used = 0
        for request in live:
            at, m = request.trace_at, len(request.run)
            run[used:used + m] = self.run[at:at + m]
            if self.signal:
                values[used:used + m] = self.values[at:at + m]
            if self.capped:
                cap[used:used + m] = self.cap[at:at + m]
            request.trace_at = used
            used += m
        self.run, self.cap, self.values, self.used = run, cap, values, used


@dataclass
class StepsRun:
    """What a run of steps did: how many, its records (`compiled_steps._records`: the clock
    before each step and after the last, each step's time, drafts, most drafts, accepted and
    emitted tokens, KV tokens in allocated blocks), and each request's tokens generated and
    drafts after it; `finished`: its last step finished a request. The records and drafts are
    views of the runners' buffers (`_buffers`): read before the loops' next call."""

    steps: int
    records: np.ndarray
    generated: np.ndarray
    drafts: np.ndarray
    finished: bool
    #: under vLLM's scheduler (`Room`): the drafts each request proposed at the last step's
    #: end, and the blocks each holds after it
    proposals: np.ndarray | None = None
    blocks: np.ndarray | None = None

    def record(self, row: int) -> np.ndarray:
        """One row of the records (`run_records.CLOCK` .. `KV`), one entry per step (the clock's one
        more)."""
        return self.records[row, : self.steps + (row == CLOCK)]


@dataclass(frozen=True)
class Runner:
    """A policy's runs of steps: whether they stand for this policy's steps under the engine's
    k_max, a run (`run_steps`' arguments), and the signal of the trace it reads."""

    applies: Callable[[object, int], bool]
    run: Callable[..., StepsRun]
    signal: str | Callable[[object], str]  # (or the policy's: a function of it)
    draft_model: bool | Callable[[object], bool] = False  # it runs with a draft model's chain too
    planned: bool = False  # it runs vLLM V1's engine steps too (`Room`)
    planned_only: bool = False  # ... and those alone
    #: where it stands for the policy, a replica takes its runs rather than the fast path's
    #: segments (they cost less than held segments or checked walks)
    preferred: bool = False
    reads_cost: bool = True  # it prices steps (so its policy cost model must be the engine's)
    #: one step's ks, and its verification and fit, compiled, for a step taken one at a time
    #: (`choose_once`, `verify_once`), or None
    choose: Callable[..., list[int]] | None = None
    verify: Callable[..., list[int]] | None = None
    #: under vLLM's scheduler, an engine step taken one at a time (with prompt chunks): its
    #: choice, fit and proposals compiled (`propose_once`), or None
    propose: Callable[..., list[int]] | None = None


def _batch(batch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The batch's prompt and output tokens, tokens generated, and where each request's trace
    starts in the store."""
    b = len(batch)
    return (np.fromiter((request.prompt_tokens for request in batch), np.int64, b),
            np.fromiter((request.output_tokens for request in batch), np.int64, b),
            np.fromiter((request.generated for request in batch), np.int64, b),
            np.fromiter((request.trace_at for request in batch), np.int64, b))


def _pricing(cost, b: int) -> tuple:
    """The roofline's verify-pass numbers, and the host's overhead of a step of b requests."""
    return cost._roofline["target"], float(cost.latency.step_overhead_s(b))


def _draft_numbers(cost) -> tuple[bool, tuple]:
    """Whether the drafter is a model, and its passes' numbers (the target's where it is none:
    a placeholder the loop does not read)."""
    numbers = cost._roofline["draft"]
    return (False, cost._roofline["target"]) if numbers is None else (True, numbers)


def _draft_model(cost, batch) -> tuple:
    """`_draft_numbers`, each request's first-pass feed, and the catch-up rule
    (simulator.compiled.RULES)."""
    from simulator.compiled import RULES

    draft_model, numbers = _draft_numbers(cost)
    if not draft_model:
        return False, numbers, np.zeros(len(batch), dtype=np.int64), 0
    feeds = np.fromiter((request.draft_feed for request in batch), np.int64, len(batch))
    return True, numbers, feeds, RULES[cost.latency.draft_catch_up]


_geometric = np.zeros((0, TOTALS_TRIED), dtype=np.int64)
_NOT_PLANNED = (False, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 0, 0, 0, 1)


def _geometric_table(n: int) -> np.ndarray:
    """Row m: auto's `geometric_totals(m)`, for m up to n at least (grown as asked)."""
    global _geometric
    if len(_geometric) <= n:
        size = max(n + 1, 2 * len(_geometric), 64)
        _geometric = np.array([geometric_totals(m) for m in range(size)], dtype=np.int64)
    return _geometric


_records = np.zeros((0, 0))
_drafted = np.zeros(0, dtype=np.int64)


def _buffers(b: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The loops' record buffer (for up to `steps` steps) and drafts buffer (for b requests),
    grown as asked: one for the process, each call's read before the loops' next."""
    global _records, _drafted
    if _records.shape[1] < steps + 1:
        _records = np.zeros((RECORDS, steps + 1))
    if len(_drafted) < b:
        _drafted = np.zeros(max(b, 2 * len(_drafted), 64), dtype=np.int64)
    return _records, _drafted


def _finished(why: int, n: int, generated: np.ndarray, records: np.ndarray,
              drafted: np.ndarray) -> StepsRun:
    from simulator import compiled_steps

    return StepsRun(n, records, generated, drafted[: len(generated)],
                    why == compiled_steps.FINISHED)


def _auto_steps(policy: Auto, batch, store: TraceStore, k_max: int, cost, start: float,
                horizon: float, steps: int, mode: int, ks: np.ndarray,
                planned: tuple = _NOT_PLANNED, before: list[int] | None = None) -> tuple:
    """`compiled_steps.auto_steps` of these requests under `policy` (`mode`: RUNS of up to
    `steps` steps, or one step's CHOOSE, or its VERIFY with `ks`, or under vLLM's scheduler its
    PROPOSE with `ks` the tokens each sampled; `planned`: vLLM's engine steps, `_planned`;
    `before`: the tokens each had generated before the step, where they moved since): the
    tokens each request has generated after, its result, the policy's counts as handed to it
    (moved in place; each request's row moves in place too, where it verified), and the draft
    feeds (None where the drafter is no model: moved in place too). The records and drafts go
    in `_buffers`."""
    from simulator import compiled_steps  # (numba's: loaded with the compiled loops)

    depth = min(policy.k_max, k_max)
    prompt, output, generated, at = _batch(batch)
    if before is not None:
        generated = np.array(before, dtype=np.int64)
    rows, rows_of = policy.request_rows([request.request_id for request in batch])
    counts = policy.counts()
    draft_model, draft, feeds, rule = _draft_model(cost, batch)
    result = compiled_steps.auto_steps(
        prompt, output, generated, at, store.run, store.cap, store.values, store.capped,
        *counts, rows.state, rows.observed, rows.expected, rows.known, rows_of,
        float(policy.prior_weight),
        float(policy.k0_bonus), float(policy.stop_slack), depth, BIN_TABLE,
        *_pricing(cost, len(batch)), start, horizon, steps, NEW, FRESH, COLD, MAX_STREAK,
        ALPHA_MAX, draft_model, draft, feeds, rule, _THRESHOLDS,
        _geometric_table(len(batch) * depth if draft_model else 0), mode, ks, *planned,
        *_buffers(len(batch), steps))
    return generated, result, counts, feeds if draft_model else None


def _run_auto(policy: Auto, batch, store: TraceStore, k_max: int, cost, start: float,
              horizon: float, room: Room | None = None, kv_capacity_tokens: int = 0
              ) -> StepsRun:
    from simulator import compiled_steps

    generated, (why, n, _), counts, feeds = _auto_steps(
        policy, batch, store, k_max, cost, start, horizon, MAX_STEPS, compiled_steps.RUNS,
        _NO_KS, _NOT_PLANNED if room is None else _planned(room))
    done = _finished(why, n, generated, *_buffers(0, 0))
    if room is not None:
        done.proposals, done.blocks = room.proposals, room.blocks
    policy.took_steps(done.steps, counts)
    if feeds is not None:
        for request, feed in zip(batch, feeds.tolist()):
            request.draft_feed = feed
    return done


def _choose_auto(policy: Auto, batch, store: TraceStore, k_max: int, cost,
                 kv_capacity_tokens: int = 0) -> list[int]:
    """One step's ks under auto, compiled (`auto_steps`' CHOOSE): what `choose`, its draft
    stop and the drafter's cap give a step taken one at a time (one with prompt chunks); the
    policy's state is unchanged, and its last plan forgotten."""
    from simulator import compiled_steps

    _, result, _, _ = _auto_steps(policy, batch, store, k_max, cost, 0.0, np.inf, 1,
                                  compiled_steps.CHOOSE, _NO_KS)
    policy.forget_plan()
    return result[-1].tolist()


def _verify_auto(policy: Auto, batch, store: TraceStore, ks: list[int], k_max: int, cost
                 ) -> list[int]:
    """One step's verification and auto's fit of it, compiled (`auto_steps`' VERIFY): each
    request's tokens emitted, the policy's state moved as `observe_columns` moves it."""
    from simulator import compiled_steps

    drafts = np.array(ks, dtype=np.int64)
    after, _, counts, _ = _auto_steps(policy, batch, store, k_max, cost, 0.0, np.inf, 1,
                                      compiled_steps.VERIFY, drafts)
    policy.took_steps(1, counts)
    return [g - request.generated for request, g in zip(batch, after.tolist())]  # (emitted)


def _propose_auto(policy: Auto, batch, store: TraceStore, k_max: int, cost, before: list[int],
                  drafts: list[int], emitted: list[int], decoding: list[bool],
                  kv_capacity_tokens: int) -> list[int]:
    """One vLLM engine step's choice, auto's fit of its outcomes and the drafts proposed at its
    end, compiled (`auto_steps`' PROPOSE), after the scheduler committed it: `batch` its
    requests, `before` the tokens each had generated, `drafts` those it verified (0 for a
    prompt chunk, so auto's fit skips it: `decoding` is not read), `emitted` those it sampled.
    Returns the drafts each proposes (read where it sampled and goes on), as `choose` before
    the step, `observe_columns` and `_propose` (its draft stop and the drafter's cap) give
    them."""
    from simulator import compiled_steps

    proposals = np.array(drafts, dtype=np.int64)  # (in: those verified; out: those proposed)
    _, _, counts, _ = _auto_steps(
        policy, batch, store, k_max, cost, 0.0, np.inf, 1, compiled_steps.PROPOSE,
        np.array(emitted, dtype=np.int64), (True, proposals, _NO_KS, 0, 0, 0, 1), before)
    policy.took_steps(1, counts)
    return proposals.tolist()


def _planned(room: Room) -> tuple:
    """`auto_steps`' arguments of vLLM's engine steps from the scheduler's `Room`."""
    return (True, room.proposals, room.blocks, room.free, room.budget, room.total_blocks,
            room.block_size)


_NO_KS = np.zeros(0, dtype=np.int64)  # (an argument a call does not read: no ks, no blocks)
_NO_FLAGS = np.zeros(0, dtype=np.bool_)
_THRESHOLDS = np.array(THRESHOLDS)


def _kld_steps(policy: KldVariance, batch, store: TraceStore, k_max: int, cost, start: float,
               horizon: float, steps: int, mode: int, emitted: np.ndarray,
               decoding: np.ndarray, planned: tuple = _NOT_PLANNED,
               before: list[int] | None = None) -> tuple:
    """`compiled_steps.kld_steps` of these requests under `policy` (`mode`, `planned` and
    `before` as `_auto_steps`'; under PROPOSE, `emitted` and `decoding` its outcomes): the
    tokens each request has generated after, and its result (the records and drafts in
    `_buffers`, the policy's rows moved in place)."""
    from simulator import compiled_steps  # (numba's: loaded with the compiled loops)

    prompt, output, generated, at = _batch(batch)
    if before is not None:
        generated = np.array(before, dtype=np.int64)
    rows, row_of = policy.request_rows([request.request_id for request in batch])
    weights, totals = _weight_table(policy.decay, policy.activation_tokens)
    result = compiled_steps.kld_steps(
        prompt, output, generated, at, store.run, store.cap, store.values, store.capped,
        row_of, rows.k, rows.ready, rows.k_min, rows.k_max, rows.history, rows.history_len,
        rows.warm_kl, rows.warm_kl_len, rows.warm_count, rows.warm_most, policy.k_init,
        policy.k_min_cfg, policy.k_max_cfg, k_max, weights, totals, float(policy.alpha),
        float(policy.temperature), policy.cap, RATIO_IF_FLAT, KL_CEILING,
        *_pricing(cost, len(batch)), start, horizon, steps, *_buffers(len(batch), steps), mode,
        emitted, decoding, *planned)
    return generated, result


def _run_kld(policy: KldVariance, batch, store: TraceStore, k_max: int, cost, start: float,
             horizon: float, room: Room | None = None, kv_capacity_tokens: int = 0
             ) -> StepsRun:
    from simulator import compiled_steps

    generated, (why, n) = _kld_steps(policy, batch, store, k_max, cost, start, horizon,
                                     MAX_STEPS, compiled_steps.RUNS, _NO_KS, _NO_FLAGS,
                                     _NOT_PLANNED if room is None else _planned(room))
    done = _finished(why, n, generated, *_buffers(0, 0))
    if room is not None:
        done.proposals, done.blocks = room.proposals, room.blocks
    return done


def _propose_kld(policy: KldVariance, batch, store: TraceStore, k_max: int, cost,
                 before: list[int], drafts: list[int], emitted: list[int],
                 decoding: list[bool],
                 kv_capacity_tokens: int) -> list[int]:
    """`_propose_auto` for kld_variance (`decoding`: the requests that verified a step, the
    others prefilled a chunk: not observed)."""
    from simulator import compiled_steps

    proposals = np.array(drafts, dtype=np.int64)  # (in: those verified; out: those proposed)
    _kld_steps(policy, batch, store, k_max, cost, 0.0, np.inf, 1, compiled_steps.PROPOSE,
               np.array(emitted, dtype=np.int64), np.array(decoding, dtype=np.bool_),
               (True, proposals, _NO_KS, 0, 0, 0, 1), before)
    return proposals.tolist()


def _walked_states(policy, batch, k_max: int) -> tuple[list[int], RequestStates, int]:
    """The batch's ids, the policy's state of them as arrays (`request_states`), and the
    walked loop's kind of it."""
    from simulator import compiled_walked

    ids = [request.request_id for request in batch]
    states = policy.request_states(ids, k_max)
    return ids, states, compiled_walked.KINDS[states.kind]


def _run_walked(policy, batch, store: TraceStore, k_max: int, cost, start: float,
                horizon: float, room: Room | None = None, kv_capacity_tokens: int = 0
                ) -> StepsRun:
    """`compiled_walked.walked_steps` of these requests under a walked policy or goodput
    (vLLM's engine steps where `room` is given, else the plain scheduler's decode steps), the
    policy's state handed to it as arrays (`request_states`) and taken back (`keep_states`)."""
    from simulator import compiled_walked

    b = len(batch)
    prompt, output, generated, at = _batch(batch)
    ids, states, kind = _walked_states(policy, batch, k_max)
    draft_model, draft, feeds, rule = _draft_model(cost, batch)
    records, drafted = _buffers(b, MAX_STEPS)
    touched = np.zeros(b, dtype=np.int64)
    planned = (True, room.proposals, room.blocks, room.free, room.budget, room.total_blocks,
               room.block_size) if room is not None else (
                   False, np.zeros(b, dtype=np.int64), _NO_KS, 0, 0, 0, 1)
    why, n = compiled_walked.walked_steps(
        kind, prompt, output, generated, at, store.run, store.cap,
        store.values, store.capped, states.state, states.level, states.rate, states.knobs,
        states.weights, k_max, kv_capacity_tokens, *_pricing(cost, b), start, horizon,
        MAX_STEPS, draft_model, draft, feeds, rule, *planned, records, drafted, touched)
    if n:  # (each step chose for every request: none where the first did not fit)
        policy.keep_states(ids, states, touched)
    if draft_model:
        for request, feed in zip(batch, feeds.tolist()):
            request.draft_feed = feed
    done = _finished(why, n, generated, records, drafted)
    if room is not None:
        done.proposals, done.blocks = room.proposals, room.blocks
    return done


def _propose_walked(policy, batch, store: TraceStore, k_max: int, cost, before: list[int],
                    drafts: list[int], emitted: list[int], decoding: list[bool],
                    kv_capacity_tokens: int) -> list[int]:
    """`_propose_auto` for a walked policy, goodput or the oracle
    (`compiled_walked.walked_propose`): the choice before the step, `observe` of what its
    decodes verified, the drafts proposed at its end."""
    from simulator import compiled_walked

    ids, states, kind = _walked_states(policy, batch, k_max)
    prompt, output, _, at = _batch(batch)
    draft_model, draft = _draft_numbers(cost)
    proposals = np.array(drafts, dtype=np.int64)  # (in: those verified; out: those proposed)
    touched = np.zeros(len(batch), dtype=np.int64)
    compiled_walked.walked_propose(
        kind, prompt, output, np.array(before, dtype=np.int64),
        at, store.run, store.cap, store.values, store.capped, states.state, states.level,
        states.rate, states.knobs, states.weights, k_max, kv_capacity_tokens,
        *_pricing(cost, len(batch)), draft_model, draft, proposals,
        np.array(emitted, dtype=np.int64),
        np.array(decoding, dtype=np.bool_), touched)
    policy.keep_states(ids, states, touched)
    return proposals.tolist()


def _choose_walked(policy, batch, store: TraceStore, k_max: int, cost,
                   kv_capacity_tokens: int) -> list[int]:
    """`_choose_auto` for goodput or the oracle (`compiled_walked.walked_choose`): the ks of a
    step taken one at a time under the plain scheduler, the policy's state moved as `choose`
    moves it (goodput's calls and plans)."""
    from simulator import compiled_walked

    ids, states, kind = _walked_states(policy, batch, k_max)
    prompt, output, generated, at = _batch(batch)
    draft_model, draft = _draft_numbers(cost)
    ks = np.empty(len(batch), dtype=np.int64)
    compiled_walked.walked_choose(
        kind, prompt, output, generated, at, store.run,
        store.cap, store.values, store.capped, states.state, states.level, states.knobs,
        states.weights, k_max, kv_capacity_tokens, *_pricing(cost, len(batch)), draft_model,
        draft, ks)
    policy.keep_states(ids, states, np.zeros(len(batch), dtype=np.int64))
    return ks.tolist()


def _verify_walked(policy, batch, store: TraceStore, ks: list[int], k_max: int, cost
                   ) -> list[int]:
    """`_verify_auto` for goodput or the oracle (`compiled_walked.walked_verify`): each
    request's tokens emitted, the policy's `observe` of them made."""
    from simulator import compiled_walked

    ids, states, kind = _walked_states(policy, batch, k_max)
    _, output, generated, at = _batch(batch)
    emits = np.empty(len(batch), dtype=np.int64)
    touched = np.zeros(len(batch), dtype=np.int64)
    compiled_walked.walked_verify(
        kind, output, generated, at, store.run,
        np.array(ks, dtype=np.int64), states.state, states.level, states.rate, states.knobs,
        states.weights, emits, touched)
    policy.keep_states(ids, states, touched)
    return emits.tolist()


_tables: dict[tuple[float, int], tuple[np.ndarray, np.ndarray]] = {}


def _weight_table(decay: float, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Row n: kld_variance's weights of a history of n values (`_weights`), and their sums."""
    key = (decay, width)
    if key not in _tables:
        weights, totals = np.zeros((width + 1, width)), np.zeros(width + 1)
        for n in range(1, width + 1):
            weights[n, :n], totals[n] = history_weights(decay, n)
        _tables[key] = weights, totals
    return _tables[key]


#: the policies whose steps run at once, by class (a subclass may change what a step does):
#: auto with a depth to draft to (its own k_max and the engine's: with none, its `choose`
#: plans nothing), model-free or with a draft model; kld_variance model-free,
#: with a history its compiled variances sum (under chunked prefill its steps with prompt
#: chunks, taken one at a time, move each request's state out of its row and back); the walked
#: policies under vLLM's scheduler alone (the plain scheduler's fast path walks them), with or
#: without a draft model (adaedl's stop reads the draft entropies; gammatune_plus's is folded
#: into the drafter's caps); goodput (batch-uniform, its censored estimate; with or without a
#: draft model, or per request) and the oracle (knows=outcomes model-free; knows=probabilities
#: with or without a draft model, its trace's chances of acceptance kept in the store) under
#: every scheduler (a replica then takes their runs, not held segments or checked walks:
#: `preferred`)
RUNNERS: dict[type, Runner] = {
    Auto: Runner(lambda policy, k_max: min(policy.k_max, k_max) > 0, _run_auto, "draft_top1",
                 draft_model=True, planned=True, choose=_choose_auto, verify=_verify_auto,
                 propose=_propose_auto),
    KldVariance: Runner(lambda policy, k_max: policy.activation_tokens <= COMPILED_HISTORY,
                        _run_kld, "kl", planned=True, reads_cost=False, propose=_propose_kld),
    **{kind: Runner(lambda policy, k_max: True, _run_walked, signal, draft_model=True,
                    planned=True, planned_only=True, reads_cost=False,
                    propose=_propose_walked)
       for kind, signal in ((Heuristic, ""), (GammaTune, ""), (GammaTunePlus, ""),
                            (AdaEDL, "draft_entropy"))},
    Oracle: Runner(lambda policy, k_max: True, _run_walked,
                   lambda policy: "" if policy.knows == "outcomes" else "accept_prob",
                   draft_model=lambda policy: policy.knows == "probabilities", planned=True,
                   preferred=True, choose=_choose_walked, verify=_verify_walked,
                   propose=_propose_walked),
    Goodput: Runner(lambda policy, k_max: policy.ema_input == "censored", _run_walked, "",
                    draft_model=True, planned=True, preferred=True, choose=_choose_walked,
                    verify=_verify_walked, propose=_propose_walked),
}


def steps_at_once(policy, cost, policy_cost, planned: bool, fast_path: bool,
                  k_max: int, available: frozenset[str] | None = None) -> bool:
    """Whether a replica runs this policy's decode steps in compiled runs: one `RUNNERS`
    stands for here (under the engine's `k_max`), under the plain scheduler (with chunked
    prefill, its steps with no prompt to chunk) or, where it runs them (`planned`), vLLM's
    (its steady batch's steps), a chain on the roofline with no idle proposer
    (the steps' prices are the roofline's passes), the policy reading the engine's cost model
    where it prices steps, the trace having the signal its runs read (`available`: the
    trace's signals, where known; else the step path says what it lacks, as it always did),
    and the compiled loops loaded for this run."""
    runner = RUNNERS.get(type(policy))
    if available is not None and runner is not None and trace_signal(policy) not in (
            "", *available):
        return False
    roofline = getattr(cost, "_roofline", None)
    if not (fast_path and runner is not None and runner.applies(policy, k_max)
            and (not planned or runner.planned) and (planned or not runner.planned_only)
            and (policy_cost is None or not runner.reads_cost) and roofline is not None
            and roofline["target"] is not None and not cost.idle_s
            and kernels.compiled() is not None):
        return False
    if cost.prices_alternatives_at_once:  # a model-free chain, priced from its sums
        return True
    # a draft model's chain, each step and each alternative priced by its passes (auto's
    # alternatives as `StepCostModel.steps_s` prices them with the compiled loops)
    latency = cost.latency
    draft_model = (runner.draft_model(policy) if callable(runner.draft_model)
                   else runner.draft_model)
    return (draft_model and cost.draft_tree is None and roofline["draft"] is not None
            and latency.arrays_match_scalars and latency.batch_pricing)


#: under vLLM's scheduler, the requests from which a run of a policy that the plain scheduler
#: walks (`Runner.planned_only`: its engine steps run compiled there, else one at a time in
#: Python) repays loading the compiled loops: a 1,000-request `spectune simulate` of heuristic
#: took 1.25-1.28 s with them, 1.29-1.31 s without (1.15 against 0.90 at 500)
PLANNED_REPAYS_FROM = 1_000


def repays_loading(policy, planned: bool) -> int:
    """The requests from which a run of this policy repays loading the compiled loops (0: none
    shorter than any policy's, `simulator/kernels.py`): its own (`Policy.runs_repay_from`),
    or fewer under vLLM's scheduler (`planned`) for one whose engine steps only the loops take
    at once there."""
    own = policy.runs_repay_from()
    runner = RUNNERS.get(type(policy))
    if planned and runner is not None and runner.planned_only:
        return min(own, PLANNED_REPAYS_FROM) if own else PLANNED_REPAYS_FROM
    return own


def prefers_runs(policy) -> bool:
    """Whether a replica takes this policy's runs of steps, where they stand for it, rather
    than the fast path's segments (`Runner.preferred`)."""
    runner = RUNNERS.get(type(policy))
    return runner is not None and runner.preferred


def trace_signal(policy) -> str:
    """The trace's signal this policy's runs read ("" for none)."""
    signal = RUNNERS[type(policy)].signal
    return signal(policy) if callable(signal) else signal


def trace_store(policy, capped: bool) -> TraceStore:
    """The store a replica keeps its requests' traces in for this policy's runs (`capped`: the
    drafter's caps bind)."""
    return TraceStore(trace_signal(policy), capped)


def run_steps(policy, batch, store: TraceStore, k_max: int, cost, start: float,
              horizon: float, room: Room | None = None, kv_capacity_tokens: int = 0
              ) -> StepsRun:
    """Up to the step that finishes a request, or the first that ends at or after `horizon`
    (the next arrival), or `MAX_STEPS`, of these running requests under `policy` (their
    traces in `store`; `k_max`: the engine's); the policy's state and the requests' move with
    them. `room`: vLLM V1's engine steps of a steady batch, up to the first its scheduler
    would plan otherwise (the run's KV records, `proposals` and `blocks` then given).
    `kv_capacity_tokens`: the KV cache the policy's context reads (goodput's plan)."""
    return RUNNERS[type(policy)].run(policy, batch, store, k_max, cost, start, horizon, room,
                                     kv_capacity_tokens)


def chooses_once(policy) -> bool:
    """Whether a replica whose steps run at once also has this policy's ks of a step taken one
    at a time, and its verification and fit, compiled (`choose_once`, `verify_once`)."""
    runner = RUNNERS[type(policy)]
    return runner.choose is not None and runner.verify is not None


def choose_once(policy, batch, store: TraceStore, k_max: int, cost,
                kv_capacity_tokens: int) -> list[int]:
    """The ks of one step taken one at a time (a step with prompt chunks), compiled, as the
    policy's `choose`, its draft stop and the drafter's cap give them (`chooses_once`;
    `kv_capacity_tokens`: the KV cache its context reads)."""
    return RUNNERS[type(policy)].choose(policy, batch, store, k_max, cost, kv_capacity_tokens)


def verify_once(policy, batch, store: TraceStore, ks: list[int], k_max: int,
                cost) -> list[int]:
    """One step taken one at a time with these ks: each request's tokens emitted, the policy
    told what its verification revealed, compiled (`chooses_once`)."""
    return RUNNERS[type(policy)].verify(policy, batch, store, ks, k_max, cost)


def proposes_once(policy) -> bool:
    """Whether a replica whose steps run at once under vLLM's scheduler also has this
    policy's engine steps taken one at a time compiled (`propose_once`)."""
    return RUNNERS[type(policy)].propose is not None


def propose_once(policy, batch, store: TraceStore, k_max: int, cost, before: list[int],
                 drafts: list[int], emitted: list[int], decoding: list[bool],
                 kv_capacity_tokens: int) -> list[int]:
    """Under vLLM's scheduler, an engine step taken one at a time, after its outcomes were
    committed: the policy's choice (from its state before the step, and the KV cache's size
    its context gives), its fit of what the step's decodes (`decoding`) verified, and the
    drafts each request proposes at its end, compiled (`proposes_once`)."""
    return RUNNERS[type(policy)].propose(policy, batch, store, k_max, cost, before, drafts,
                                         emitted, decoding, kv_capacity_tokens)
