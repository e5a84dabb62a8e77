"""One model replica: an iteration-level scheduler with speculative decoding, as a SimPy process.

Each iteration: admit waiting requests FCFS while the batch cap, KV cache and token budget allow;
prefill them (whole, or in chunks beside the decode requests); ask the policy for every running
request's k; charge the iteration's time from the latency model; then apply the accepted drafts
replayed from the speculation trace and finish the requests that reached their length.

Fast path: when the running set cannot change before the next arrival or finish, and the policy's
k depends only on the running set (`stateless_per_batch`), the replica costs all iterations up to
that event at once with numpy. It produces the same records as iterating one step at a time
(a test checks that), and is what lets 10k requests simulate in about a second.

A scheduler that `plans_whole_step` (vllm-v1, simulator/scheduler_vllm.py) is run instead as
vLLM's engine step: `_planned_iteration` (docs/vllm-v1-scheduler.md sections 2 and "What
spectune models"). Its plain decode steps take the fast path too (`_planned_segment`), up to
the step where its token budget or free KV blocks would change what it plans.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from heapq import heappop, heappush
from itertools import count

import numpy as np
import simpy

from policies import DraftOutcome, HeldSteps, Policy, StepCost, StepOutcomes
from simulator.acceptance import (
    UNCAPPED,
    AcceptanceReplay,
    Lookahead,
    signals_needed,
    stop_lengths,
)
from simulator.batch_columns import BatchColumns
from simulator.config import SchedulerConfig
from simulator.draft_feed import chain_feed, next_feed
from simulator.errors import ConfigError
from simulator.kernels import compiled
from simulator.logs import STEP_INDEX, RequestLog, StepLog
from simulator.request import WALKED, RequestState, walk_alone, walk_chain
from simulator.run_records import ACCEPTED, CLOCK, DRAFTED, DURATION, EMITTED, KV, MAX_K
from simulator.scheduler import make_scheduler, scheduler_class
from simulator.step_cost import StepCostModel, verify_sums
from simulator.stepped import (
    choose_once,
    chooses_once,
    prefers_runs,
    propose_once,
    proposes_once,
    run_steps,
    steps_at_once,
    trace_store,
    verify_once,
)

_NO_DRAFTS = np.zeros(0, dtype=np.int64)  # the compiled feeds' drafts where k every step


class Replica:
    """The scheduler and step loop of one replica; `serve` is its SimPy process."""

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        scheduler: SchedulerConfig,
        kv_capacity_tokens: int,
        cost: StepCostModel,
        policy: Policy,
        acceptance: AcceptanceReplay,
        steps: StepLog,
        requests: RequestLog,
        next_arrival_s: Callable[[int], float],
        fast_path: bool = True,
        policy_cost: StepCost | None = None,
    ) -> None:
        self.env = env
        self.index = index
        self.config = scheduler
        self.cost = cost
        # the rule book: queues, KV reservations, admission, chunks, k, finishing
        seen_cost = policy_cost if policy_cost is not None else cost  # what the policy prices
        self.scheduler = make_scheduler(scheduler, kv_capacity_tokens, policy, requests,
                                        seen_cost, index)
        self.catch_up = cost.latency.draft_catch_up
        self.feeds = cost.latency.has_draft_model  # a model-free drafter catches up for free
        self.policy = policy
        self.acceptance = acceptance
        self.steps = steps
        self.requests = requests
        self.next_arrival_s = next_arrival_s
        # a drafter that can run out of proposals (n-gram) drafts min(k, proposable) each step:
        # the fast path walks those steps too (walk_chain's cap), and a draft model's catch-up
        # after them (_varied_feeds), where the latency model's arrays give its scalars'
        # numbers (such runs were recorded step by step)
        kind = type(policy)
        # a stop rule that reads only each drafted token's signals (Policy.stop_positions) is
        # folded into that cap, once per request: the chains it cuts are the capped ones
        self.folds_stop = (kind.uses_draft_stop
                           and kind.replaces("stop_positions", "stop_drafting", "stop_chains"))
        self.capped = acceptance.limits_proposals or self.folds_stop
        # a policy that holds its k for some steps (Policy.hold) runs those steps as a segment
        # (its runs were recorded step by step: its segments keep their floats to the bit,
        # which needs a latency model whose arrays give its scalars' numbers)
        self.planned = type(self.scheduler).plans_whole_step
        # a policy whose runs of steps cost less than its fast path (goodput's holds, the
        # oracle's checked walks: docs/speed.md) takes them instead (`steps_at_once` below)
        runs_first = (fast_path and prefers_runs(policy)
                      and getattr(self.scheduler, "max_model_len", None) is None
                      and steps_at_once(policy, cost, policy_cost, self.planned, fast_path,
                                        scheduler.k_max, acceptance.available))
        self.holds = (kind.hold is not Policy.hold and not kind.signals
                      and not kind.uses_draft_stop and not kind.simulation_only
                      and cost.latency.arrays_match_scalars and not runs_first)
        # a policy that decides each request's k from its own outcomes alone walks each
        # request's whole decode at once (request.walk_alone); its steps' drafts vary per
        # request as capped ones do, and a step with prompt chunks (chunked prefill) drafts
        # what the walks draft there (`_chunked_head`, or `_walked_ks` where no sums are
        # kept). As for holds, only where the latency
        # model's arrays give its scalars' numbers (such runs were recorded step by step); not
        # under vLLM's scheduler, whose budget and blocks may trim, skip or preempt a request's
        # step after its walker's state moved to its end (docs/speed.md)
        # (its walker stands for choose and observe, and for a draft stop not folded)
        asked = (("stop_drafting", "stop_chains") if kind.uses_draft_stop and not self.folds_stop
                 else ())
        # (a policy whose batch may overrule its walks, the oracle's cap, has each segment's
        # steps checked: the first it overrules is taken one at a time, `_step_unwalked`, and
        # every request walked anew; so only one that learns nothing from outcomes walks)
        overruled = kind.walks_agree is not Policy.walks_agree
        self.walks = (fast_path
                      and kind.replaces("walker", "choose", "observe", "observe_columns", *asked)
                      and (not asked or kind.walker_stops)
                      and not self.planned and cost.latency.arrays_match_scalars
                      and not (overruled and kind.observes())
                      and policy.walks_with(seen_cost) and not runs_first)
        self.checks_walks = self.walks and overruled
        self._overruled = False  # the last step was taken through choose (`_step_unwalked`)
        #: each request's drafts vary from step to step in a segment (chain_ks)
        self.varied = self.capped or self.walks
        # (a draft stop asked token by token reads each step's positions: never in a segment)
        self.fast_path = (fast_path and (kind.stateless_per_batch or self.holds or self.walks)
                          and (not kind.uses_draft_stop or self.folds_stop or self.walks)
                          and not (self.capped and self.feeds
                                   and not cost.latency.arrays_match_scalars))
        # a policy that learns from every step (auto, kld_variance), and where the fast path
        # does not take them (`runs_first`, vLLM's scheduler) goodput, the oracle and the walked
        # policies: a fixed batch's decode
        # steps in compiled runs (simulator/stepped.py), to the step path's records to the bit
        # (under chunked prefill, those with no prompt to chunk, as `chunk_segments`; under
        # vLLM's scheduler, a steady batch's, never near a max_model_len: vLLM's cut at it and
        # its zero drafts are the step path's)
        self.steps_at_once = (not self.fast_path and steps_at_once(
            policy, cost, policy_cost, self.planned, fast_path, scheduler.k_max,
            acceptance.available) and getattr(self.scheduler, "max_model_len", None) is None)
        self.traces = trace_store(policy, self.capped) if self.steps_at_once else None
        #: ... and its steps taken one at a time (with prompt chunks) have their ks, and their
        #: verification and fit, compiled
        self.chooses_once = self.steps_at_once and chooses_once(policy)
        #: ... and under vLLM's scheduler its engine steps taken one at a time have their
        #: choice, fit and proposals compiled
        self.proposes_once = self.steps_at_once and self.planned and proposes_once(policy)
        # every decode step is a fast-path segment's (none read a position at a time but a
        # step where the batch overrules the walks, `_step_unwalked`)
        self.segments_only = self.fast_path and not scheduler.chunked_prefill and not self.planned
        # chunked prefill: a step with no prompt to chunk (none being prefilled, none waiting
        # that fits) is a decode step like any, so such steps run as segments too, on the step
        # path's clock to the bit (chunked runs were recorded step by step), where the latency
        # model's arrays give its scalars' numbers
        self.chunk_segments = (self.fast_path and scheduler.chunked_prefill and not self.planned
                               and cost.latency.arrays_match_scalars)
        # vllm-v1: a stretch of plain decode steps (the scheduler `steady`, each request's
        # proposal the drafts its walk takes there) runs as a segment too, up to the step where
        # the budget or the free blocks would change what schedule() plans, on the step path's
        # clock to the bit, for a policy whose k depends on the running set alone, or one that
        # holds its ks (asked at the segment's first step, the segment ending where its hold
        # does) (not near a max_model_len: vLLM's cut at it and its zero drafts are stepped)
        asked_per_set = (kind.stateless_per_batch and not kind.observes()
                         and not kind.simulation_only
                         and (not kind.uses_draft_stop or self.folds_stop))
        self.plan_segments = (self.planned and fast_path and (asked_per_set or self.holds)
                              and cost.latency.arrays_match_scalars
                              and getattr(self.scheduler, "max_model_len", None) is None)
        self._stepping_for: tuple[int, ...] | None = None  # see _planned_segment, _runs_fit
        # where segments are priced from the batch's sums alone, the sums are kept across
        # segments (simulator/batch_columns.py): every decode step is a segment's, so every
        # running request advances with each of them (under vllm-v1, `plan_sums` below, the
        # steps taken one at a time keep them too)
        # (and, where step records are kept of capped drafts, each step's most drafts); a
        # draft model drafting a chain has its passes priced from sums too, where walks are
        # replaced only as requests come and go (a policy that holds its ks re-plans them
        # every few steps, and a walk's share of the draft sums costs several times a
        # segment's share of the matrices: measured in docs/speed.md), and where the latency
        # model's arrays give its scalars' numbers (the passes' sums reach it as arrays)
        sums = cost.prices_chain_sums or (cost.draft_tree is None and not self.holds
                                          and cost.latency.arrays_match_scalars)
        by_drafts = self.feeds or (self.varied and steps.records_rows)
        self.columns = (BatchColumns(k_max=scheduler.k_max if by_drafts else 0,
                                     draft=self.feeds)
                        if self.segments_only and sums else None)
        # vllm-v1: the sums are kept too, with the KV blocks the batch holds at each step,
        # where its segments are priced from the verify pass's sums (a model-free chain) and
        # no policy holds its ks: the steps taken one at a time keep them (every request that
        # took its walk's step stays in them, the others leave, and are walked anew)
        self.plan_sums = self.plan_segments and not self.holds and cost.prices_chain_sums
        # chunked prefill: the same, where the policy is asked per running set or walks each
        # request, and the drafter has no model; a step with prompt chunks takes the decodes'
        # share from the sums where every running request is walked, at the set's k or by its
        # own walker (`_chunked_head`)
        self.chunk_sums = (self.chunk_segments and (asked_per_set or self.walks)
                           and not self.holds and cost.prices_chain_sums)
        if self.plan_sums or self.chunk_sums:
            self.columns = BatchColumns(
                k_max=scheduler.k_max if self.varied and steps.records_rows else 0,
                blocks=self.plan_sums)
        #: plan_sums: how many running requests, first in admission order, are in the kept sums
        #: and read nowhere but from their walks (after a segment), the rest being current in
        #: the scheduler and not in the sums; None: every running request is current in the
        #: scheduler (after a step that read them all)
        self._head: int | None = None
        # where the replica keeps the batch's sums and no policy reads a request's progress
        # between segments (its k from the running set alone, or walked), a segment's commit
        # is the count of its steps: each request's progress is read from its walk where
        # something needs it (`_sync`: its walk is replaced, it finishes)
        self.lazy = self.columns is not None and not self.holds
        # lazy: the running requests' walk ends, a heap of (chain_end, tiebreak, request) with
        # stale entries (walks replaced, requests gone) dropped where read; the requests that
        # started decoding since the last pricing; the k every other running request's walk
        # was found current at then, or walked at since (`_extend_head`, `_chunked_head`)
        # (None: some other, or several)
        self._ends: list[tuple[int, int, RequestState]] = []
        self._pushes = count()
        self._fresh: list[RequestState] = []
        self._walked_k: int | None = None
        if self.planned and cost.draft_tree is not None:
            raise ConfigError(f"scheduler {scheduler.scheduler!r} models a chain of drafts, "
                              "not a draft tree: use a chain drafter's trace")
        # (a walked policy is told nothing: its walker was told each step as it walked)
        self.observes = kind.observes() and not self.walks
        # a policy whose fit reads a step's outcomes as columns is handed them so
        self.observes_columns = kind.reads_columns()
        # _stop_chains' signal rows for the step it cut: (ids, positions, rows by name)
        self._stop_rows: tuple[list[int], list[int], dict[str, np.ndarray]] | None = None
        self._policy_signals = tuple(type(policy).signals)
        #: the trace's signals a step reads per request: the policy's, and its stop rule's
        self._signal_names = tuple(sorted(kind.signals if self.folds_stop
                                          else signals_needed(policy)))
        if self.traces is not None and self.traces.signal not in ("", *self._signal_names):
            self._signal_names += (self.traces.signal,)  # (what the runs read: its store's)
        self._idle: simpy.Event | None = None
        self._ks_for: tuple[int, ...] | None = None  # _planned_segment: the ids `_ks` is for
        self._ks_at = -1  # _decode_segment: the scheduler's `changes` that `_ks` was asked at
        self._ks: list[int] = []

    @property
    def takes_segments(self) -> bool:
        """Whether decode steps run as fast-path segments (all of them, or those that
        chunked prefill or vLLM's plan leave plain)."""
        return self.segments_only or self.chunk_segments or self.plan_segments

    @property
    def load(self) -> int:
        """Requests this replica holds (queued, prefilling, decoding): what a router balances."""
        return self.scheduler.load

    @property
    def idle(self) -> bool:
        """Waiting for a request (its next iteration starts no earlier than the next submit)."""
        return self._idle is not None

    def submit(self, request: RequestState) -> None:
        request.run = self.acceptance.run(request.index)
        if self._signal_names:  # read per step: looked up once, not per step
            request.signals = {name: self.acceptance.signal(request.index, name)
                               for name in self._signal_names}
        if self.capped:
            cap = self._caps(request.index)
            # a list where steps read one position at a time (numpy scalars are slow), an
            # array where only the fast path's chains read it (in slices; and a step where
            # the batch overrules the walks, rarely: `_cut_to_cap` takes its int)
            request.cap = cap if self.segments_only or self.steps_at_once else cap.tolist()
        if self.traces is not None:  # (what runs of steps read of it)
            self.traces.add(request)
        self.requests.replica[request.index] = self.index
        # the clock's value: never after admission
        self.requests.arrival_s[request.index] = self.env.now
        self.scheduler.add(request)
        if self._idle is not None:
            idle, self._idle = self._idle, None
            idle.succeed()

    def _caps(self, index: int) -> np.ndarray:
        """Per position, the most drafts a step there takes: what the drafter can propose (an
        n-gram lookup's match), and where a chain from there stops (`folds_stop`)."""
        acceptance = self.acceptance
        cap = (np.asarray(acceptance.proposable(index), dtype=np.int64)
               if acceptance.limits_proposals else None)
        if self.folds_stop:
            signals = {name: np.asarray(acceptance.signal(index, name), dtype=np.float64)
                       for name in type(self.policy).stop_signals}
            stops = self.policy.stop_positions(signals)
            loops = compiled()  # (the same integers, in a pass instead of five array operations)
            lengths = (stop_lengths(stops) if loops is None
                       else loops.stop_lengths(np.asarray(stops, dtype=np.bool_), UNCAPPED))
            cap = lengths if cap is None else np.minimum(cap, lengths)
        return cap

    # -- the process -------------------------------------------------------------------------

    def serve(self):
        env, scheduler = self.env, self.scheduler
        while True:
            if not scheduler.load:
                self._idle = env.event()
                yield self._idle
                continue
            if self.planned:
                if self.plan_segments and scheduler.steady():
                    yield from self._planned_segment()
                elif self.steps_at_once and scheduler.steady() and self._runs_fit():
                    yield from self._compiled_steps()
                else:
                    yield from self._planned_iteration()
                continue
            if self.config.chunked_prefill:
                plain = scheduler.running and not scheduler.prefill_pending()  # no prompt chunk
                if self.chunk_segments and plain:
                    yield from self._decode_segment()
                elif self.steps_at_once and plain:
                    yield from self._compiled_steps()
                else:
                    yield from self._mixed_iteration()
                continue
            admitted = scheduler.admit_whole(env.now)
            if admitted:
                yield from self._prefill_iteration(admitted)
            elif not scheduler.running:
                raise RuntimeError("replica holds requests it can neither admit nor run")
            elif self.fast_path:
                yield from self._decode_segment()
            elif self.steps_at_once:
                yield from self._compiled_steps()
            else:
                yield from self._mixed_iteration()

    # -- iterations ----------------------------------------------------------------------------

    def _prefill_iteration(self, admitted: list[RequestState]):
        prompts = [request.prompt_tokens for request in admitted]
        duration = self.cost.prefill_s(prompts)
        start, (waiting, held, kv) = self.env.now, self.scheduler.snapshot()
        yield self.env.timeout(duration)
        self.scheduler.step_index += 1
        self.steps.add(self.index, start, duration, 0, len(admitted), sum(prompts), 0, 0, 0, 0,
                       waiting, held, kv)
        self.scheduler.start_decoding(admitted, self.env.now)
        self._finish_done(admitted)
        if self.lazy:  # walked at the next pricing (those that finished here, never)
            self._fresh += [request for request in admitted
                            if request.generated < request.output_tokens]

    def _mixed_iteration(self, every: bool = False, walked: bool = True):
        """One iteration: decode requests first, then prompt chunks in the budget; request by
        request, or (`chunk_sums`) the decodes from the kept sums (`_chunked_step`); where
        requests are walked, their ks from their walks (`walked` False: through `choose`).
        `every`: any running request may finish in it (none is in the kept sums:
        `_step_unwalked`)."""
        scheduler = self.scheduler
        decode = scheduler.running
        summed = None
        overruled = False  # the walks' head was refused: the batch overrules them here
        if self.chunk_sums and decode:
            head = self._chunked_head(decode) if walked else None
            if head is not None:
                yield from self._chunked_step(head)
                return
            summed = self._sync_running()  # every request read up to date, stepped as below
            overruled = self.walks
            self._overruled = self.checks_walks  # (the next segment checks before walking)
        if not decode:
            ks = []
        elif self.walks and walked and not overruled:
            ks = self._walked_ks(decode)
        else:
            ks = self._choose(decode)
        chunked = self.config.chunked_prefill
        chunks = scheduler.plan_chunks(self._verify_tokens(ks), self.env.now) if chunked else []
        start, (waiting, held, kv) = self.env.now, scheduler.snapshot()
        cached = [request.prompt_tokens + request.generated - 1 for request in decode]
        chunk_sums = _chunk_sums(chunks)
        chunk_tokens = chunk_sums[1]
        duration = self.cost.iteration_s(
            ks, cached, *chunk_sums,
            [request.draft_feed for request in decode] if self.feeds else None,
        )
        yield self.env.timeout(duration)
        scheduler.step_index += 1
        accepted, emitted = self._apply_decode(decode, ks) if decode else (0, 0)
        if summed is not None:
            self._keep_sums(summed)
        self.steps.add(self.index, start, duration, len(decode), len(chunks), chunk_tokens,
                       sum(ks), max(ks, default=0), accepted, emitted, waiting, held, kv)
        self._start_whole(chunks)
        self._finish_done(every=every or self.chunk_sums)

    def _start_whole(self, chunks: list) -> list[RequestState]:
        """The prompt chunks' progress; the prompts now whole start decoding (returned)."""
        whole = []
        for request, n, _ in chunks:
            request.prefilled += n
            if request.prefilled == request.prompt_tokens:
                whole.append(request)
        self.scheduler.start_decoding(whole, self.env.now)
        return whole

    def _chunked_head(self, decode: list[RequestState]) -> _HeadSums | None:
        """`chunk_sums`: where the policy gives the running set one k, every running request
        is walked at it and in the kept sums (those walked at another k read up to date and
        walked anew, as `_Stretch.priced` does), and the decodes' share of this step is read
        from them; None where the policy's ks differ (the step reads every request). Where
        requests are walked, each not in the sums is walked and added, unless the policy's
        batch overrules the walks at this step (None: taken through `choose`)."""
        if self.walks:
            if self.checks_walks and not self._walks_agree_now(decode):
                return None
            for request in decode:
                if not request.summed:  # its first decode step, or it left the sums
                    self._walk_alone(request)
                    self._add_walk(request, WALKED)
            self._walked_k = WALKED
            return self._sums_step(len(decode))
        ks = self._set_ks(decode)
        k = ks[0]
        if ks.count(k) != len(ks):
            return None
        if k != self._walked_k:  # walks at another k leave the sums
            columns = self.columns
            for request in decode:
                if request.summed and request.chain_k != k:
                    self._sync(request)
                    columns.remove(request)
                    request.summed = False
        for request in decode:
            if not request.summed:
                walk_chain(request, k)
                self._add_walk(request, k)
        self._walked_k = k
        return self._sums_step(len(decode))

    def _set_ks(self, batch: list[RequestState]) -> list[int]:
        """The policy's ks for the running set, asked once per set (`Scheduler.changes`): a
        policy asked per running set gives the same ks for it every time."""
        if self.scheduler.changes != self._ks_at:
            self._ks, self._ks_at = self._choose_uncapped(batch), self.scheduler.changes
        return self._ks

    def _sums_step(self, size: int) -> _HeadSums:
        """The next step's share of the `size` requests in the kept sums: their verify
        pass's sums, the tokens they emit, and the most drafts any of them verifies (where
        only totals are kept of capped drafts, where this is not read: 0)."""
        cached, drafted, pairs, _, by_drafts = self.columns.window(1)
        if len(by_drafts):  # the most drafts of any (rows d = 0..k_max, one row per request)
            max_k = len(by_drafts) - 1 - int((by_drafts[::-1, 0] > 0).argmax())
        else:  # every request at the walks' k
            max_k = 0 if self.varied else self._walked_k
        return _HeadSums(size, 0, int(drafted[0]), int(cached[0]), int(pairs[0]),
                         int(cached[1]) - int(cached[0]), max_k)

    def _chunked_step(self, head: _HeadSums):
        """`_mixed_iteration` where every running request's step is its walk's
        (`_chunked_head`): the decodes priced from the kept sums beside the prompt chunks
        (the same integers), and committed as a count."""
        scheduler, size = self.scheduler, head.size
        chunks = scheduler.plan_chunks(size + head.drafted, self.env.now)
        start, (waiting, held, kv) = self.env.now, scheduler.snapshot()
        chunk_sums = _chunk_sums(chunks)
        chunk_tokens = chunk_sums[1]
        duration = self.cost.chain_mixed_s(size, head.drafted, head.cached, head.pairs,
                                           *chunk_sums)
        yield self.env.timeout(duration)
        scheduler.step_index += 1
        self.columns.now += 1
        self.steps.add(self.index, start, duration, size, len(chunks), chunk_tokens,
                       head.drafted, head.max_k, head.emitted - size, head.emitted, waiting,
                       held, kv)
        self._finish_done(self._start_whole(chunks))

    def _verify_tokens(self, ks: list[int]) -> int:
        """Tokens the decode requests' verify pass feeds: k + 1 each, or a draft tree's nodes
        to depth k + 1."""
        tree = self.cost.draft_tree
        return sum((k if tree is None else tree.draft_tokens(k)) + 1 for k in ks)

    def _choose(self, batch: list[RequestState]) -> list[int]:
        if self.chooses_once:  # (the same ks, compiled: simulator/stepped.py)
            self._stop_rows = None
            return choose_once(self.policy, batch, self.traces, self.config.k_max, self.cost,
                               self.scheduler.kv_tokens)
        return self._cut_to_cap(batch, self._choose_uncapped(batch))

    def _cut_to_cap(self, batch: list[RequestState], ks: list[int]) -> list[int]:
        """The drafter proposes no more than it has at each request's next position."""
        if not self.capped:
            return ks
        return [k if k <= (cap := request.cap[request.generated]) else int(cap)  # min(k, cap)
                for request, k in zip(batch, ks)]

    def _choose_uncapped(self, batch: list[RequestState]) -> list[int]:
        """The policy's k per request (a draft stop rule applied), before the drafter's cap."""
        lookahead = (Lookahead(batch, self.acceptance) if type(self.policy).simulation_only
                     else None)
        ks = self.scheduler.choose(batch, self.env.now, lookahead)
        if type(self.policy).uses_draft_stop and not self.folds_stop:
            ks = self._draft_stop(batch, ks)
        return ks

    def _draft_stop(self, batch: list[RequestState], ks: list[int]) -> list[int]:
        """Cut each chain after the draft token where the policy's stop rule fires.

        The rule sees each token's signals from the trace (teacher-forced: exact while the
        chain matches the target, an approximation past its first mismatch). A policy with an
        array form of its rule (`Policy.stop_chains`) gets the batch's signals at once."""
        if type(self.policy).stop_chains is not Policy.stop_chains:
            return self._stop_chains(batch, ks)
        out = []
        for request, k in zip(batch, ks):
            top1, ent = request.signals["draft_top1"], request.signals["draft_entropy"]
            last = request.output_tokens - 1
            for d in range(k):
                t = min(request.generated + d, last)
                if self.policy.stop_drafting(request, d, float(top1[t]), float(ent[t])):
                    k = d + 1
                    break
            out.append(k)
        return out

    def _stop_chains(self, batch: list[RequestState], ks: list[int]) -> list[int]:
        """`_draft_stop` through `Policy.stop_chains`: each request's signals at the positions
        its chain drafts (the last position repeated past its end), as (requests x max k)."""
        width = max(ks, default=0)
        self._stop_rows = None
        if width == 0:
            return list(ks)
        depth = np.arange(width)
        wanted = type(self.policy).stop_signals
        rows: dict[str, list] = {name: [] for name in ("draft_top1", "draft_entropy")
                                 if name in wanted}
        for request in batch:
            g, signals = request.generated, request.signals
            # a slice where the chain ends inside the request, else the last position repeated
            at = (slice(g, g + width) if g + width <= request.output_tokens
                  else np.minimum(g + depth, request.output_tokens - 1))
            for name, row in rows.items():
                row.append(signals[name][at])
        arrays = {name: np.array(row, dtype=np.float64) for name, row in rows.items()}
        if self.observes_columns:  # the outcomes' signals, where this step is verified
            self._stop_rows = ([request.request_id for request in batch],
                               [request.generated for request in batch], arrays)
        unread = np.empty((len(batch), 0))
        return self.policy.stop_chains(batch, ks, arrays.get("draft_top1", unread),
                                       arrays.get("draft_entropy", unread))

    def _apply_decode(self, batch: list[RequestState], ks: list[int]) -> tuple[int, int]:
        """Verification: accept min(k, run[t]) drafts per request; tell the policy."""
        if self.chooses_once:  # (the same, compiled: simulator/stepped.py)
            return self._verify_once(batch, ks)
        total_acc = total_emit = 0
        outcomes = [] if self.observes else None
        feeds, catch_up = self.feeds, self.catch_up
        follow = self.chunk_segments  # segments resume the walks these steps move along
        for request, k in zip(batch, ks):  # (comparisons, not min: once per request and step)
            g = request.generated
            if k:
                run = int(request.run[g])
                acc = k if k <= run else run  # min(k, run[g])
            else:
                acc = 0
            left = request.output_tokens - g
            emit = acc + 1 if acc < left else left  # min(acc + 1, left)
            request.generated = g + emit
            if follow and request.chain_g == g:
                self._follow_walk(request, k, g + emit)
            request.steps += 1
            request.drafted += k
            if feeds:
                request.draft_feed = next_feed(catch_up, request.draft_feed, k, emit)
            request.accepted += emit - 1
            total_acc += emit - 1
            total_emit += emit
            if outcomes is None:
                continue
            # accepted drafts past the request's end do not count
            outcomes.append((request, g, k, emit - 1, emit))
        if outcomes is not None:
            self._report(batch, outcomes)
        return total_acc, total_emit

    def _verify_once(self, batch: list[RequestState], ks: list[int]) -> tuple[int, int]:
        """`_apply_decode` where the policy's fit of a step runs compiled (`verify_once`: the
        tokens each request emits, the policy told)."""
        total_acc = total_emit = 0
        feeds, catch_up = self.feeds, self.catch_up
        emitted = verify_once(self.policy, batch, self.traces, ks, self.config.k_max, self.cost)
        for request, k, emit in zip(batch, ks, emitted):
            request.generated += emit
            request.steps += 1
            request.drafted += k
            if feeds:
                request.draft_feed = next_feed(catch_up, request.draft_feed, k, emit)
            request.accepted += emit - 1
            total_acc += emit - 1
            total_emit += emit
        return total_acc, total_emit

    @staticmethod
    def _follow_walk(request: RequestState, k: int, after: int) -> None:
        """A step taken one at a time that drafted what the request's walk drafts there moved
        along the walk: the next segment resumes it instead of walking the rest again."""
        at = request.chain_at
        walked = request.chain_k if request.chain_ks is None else int(request.chain_ks[at])
        if walked == k:  # the same drafts, so the same tokens (chain[at + 1] == after)
            request.chain_at, request.chain_g = at + 1, after

    def _report(self, batch: list[RequestState],
                steps: list[tuple[RequestState, int, int, int, int]]) -> None:
        """Tell the policy what verification revealed (`steps`: (request, position, k,
        accepted, emitted) each; `batch`: the step's requests, its context's)."""
        ctx = self.scheduler.context(batch, self.env.now)
        if self.observes_columns:
            self.policy.observe_columns(ctx, self._outcome_columns(steps))
        else:
            self.policy.observe(ctx, self._outcomes(steps))

    def _outcome_columns(self, steps: list[tuple[RequestState, int, int, int, int]]
                         ) -> StepOutcomes:
        """`_outcomes` as columns: each signal's rows from this step's draft stop where it read
        them (the same positions), else gathered, with as many revealed as `_outcomes` has."""
        requests, positions, ks, accepted, emitted = zip(*steps)
        ids = [request.request_id for request in requests]
        names = self._policy_signals
        if not names:
            at, k, hits, emit = np.array((positions, ks, accepted, emitted), dtype=np.int64)
            return StepOutcomes(ids, k, hits, emit, at)
        seen = [min(acc + 1, k, request.output_tokens - g) for request, g, k, acc, _ in steps]
        at, k, hits, emit, revealed = np.array((positions, ks, accepted, emitted, seen),
                                               dtype=np.int64)
        signals: dict[str, np.ndarray] = {}
        cut = self._stop_rows
        width = max(seen)
        if cut is not None and cut[0] == ids and cut[1] == list(positions):
            signals = {name: rows for name, rows in cut[2].items()
                       if name in names and rows.shape[1] >= width}
        for name in names:
            if name not in signals:
                rows = np.full((len(ids), width), np.nan)
                for r, (request, g, n) in enumerate(zip(requests, positions, seen)):
                    rows[r, :n] = request.signals[name][g:g + n]
                signals[name] = rows
        return StepOutcomes(ids, k, hits, emit, at, signals, dict.fromkeys(signals, revealed))

    def _outcomes(self, steps: Iterable[tuple[RequestState, int, int, int, int]]
                  ) -> list[DraftOutcome]:
        """What verification revealed, one outcome per (request, position, k, accepted,
        emitted): signals only for positions a real engine observed (accepted drafts and the
        first rejection), and none where the policy reads none."""
        names = self._policy_signals
        if not names:
            return [DraftOutcome(request.request_id, k, acc, emit, g)
                    for request, g, k, acc, emit in steps]
        out = []
        for request, g, k, acc, emit in steps:
            seen = min(acc + 1, k, request.output_tokens - g)
            signals = {name: request.signals[name][g:g + seen] for name in names}
            out.append(DraftOutcome(request.request_id, k, acc, emit, g, signals))
        return out

    # -- a scheduler that plans whole steps (vllm-v1) ----------------------------------------

    def _planned_iteration(self, chosen: list[int] | None = None):
        """One vLLM V1 engine step (doc section 2): schedule() plans it; the policy picks the k
        of the drafts proposed at its end, from the requests it schedules (doc 5.4); the step is
        charged for every token it runs (verify tokens with drafts, prompt and re-prefill
        chunks); then the outcomes are committed, the next step's drafts proposed and finished
        requests retired (their blocks free for the next step). `chosen`: the policy's ks,
        where `_planned_segment` asked it for this step already (from the same context)."""
        env, scheduler = self.env, self.scheduler
        head = self._head_step() if self.plan_sums and chosen is None else None
        summed = None
        if head is not None:  # the head's share from the kept sums, the rest as schedule() runs it
            plan = scheduler.schedule_after(head.size, head.blocks, head.size + head.drafted,
                                            env.now)
            batch = scheduler.running[:head.size] + plan.requests
        else:
            summed = self._sync_running() if self.plan_sums else None
            plan = scheduler.schedule(env.now)
            batch = plan.requests
        if not batch:
            raise RuntimeError("replica holds requests it can neither admit nor run")
        lookahead = (Lookahead(batch, self.acceptance) if type(self.policy).simulation_only
                     else None)
        # (proposes_once: the choice is made after the step, compiled, from the policy's state
        # before it, with its fit and the proposals; never asked before it: `_planned_segment`
        # runs for policies that take no runs of steps)
        assert chosen is None or not self.proposes_once
        ks = (None if self.proposes_once
              else scheduler.choose(batch, env.now, lookahead) if chosen is None else chosen)
        decodes, chunks, drafts, computed = [], [], [], []
        for entry in plan.scheduled:  # one pass: this runs once per request and step
            if entry.prefill:
                chunks.append(entry)
            else:
                decodes.append(entry)
                drafts.append(entry.drafts)
                computed.append(entry.computed)
        feeds = [entry.request.draft_feed for entry in decodes] if self.feeds else None
        start, (waiting, held, kv) = env.now, scheduler.snapshot()
        chunk_tokens = sum(entry.tokens for entry in chunks)
        chunk_sums = (len(chunks), chunk_tokens, sum(entry.computed for entry in chunks),
                      sum(e.tokens * e.computed + e.tokens * (e.tokens + 1) // 2 for e in chunks))
        if head is None:
            duration = self.cost.iteration_s(drafts, computed, *chunk_sums, feeds)
        else:  # the head's verify sums and the rest's, added (integers: the same sums)
            n, rest_drafted, rest_cached, rest_pairs = verify_sums(drafts, computed)
            duration = self.cost.chain_mixed_s(head.size + n, head.drafted + rest_drafted,
                                               head.cached + rest_cached,
                                               head.pairs + rest_pairs, *chunk_sums)
        yield env.timeout(duration)
        scheduler.step_index += 1
        if head is not None:  # the head took its walks' step: committed as a count
            self.columns.now += 1
        before, accepted = [], []
        for entry in plan.scheduled:  # min(drafts, run[g]) of each verified chain
            g = entry.request.generated
            before.append(g)
            if entry.drafts and not entry.placeholder:
                run = int(entry.request.run[g])
                accepted.append(entry.drafts if entry.drafts <= run else run)
            else:
                accepted.append(0)
        emitted = scheduler.update_from_output(plan, accepted, env.now)
        decode_emit = [(entry, g, emit) for entry, g, emit in zip(plan.scheduled, before, emitted)
                       if not entry.prefill]
        if self.plan_segments:  # segments resume the walks these steps move along
            for entry, g, emit in decode_emit:
                if entry.request.chain_g == g and not entry.placeholder:
                    self._follow_walk(entry.request, entry.drafts, g + emit)
        if summed is not None:
            self._keep_sums(summed)
        if self.feeds:
            for entry, _, emit in decode_emit:
                entry.request.draft_feed = next_feed(self.catch_up, entry.request.draft_feed,
                                                     entry.drafts, emit)
        size = 0 if head is None else head.size
        if self.proposes_once:
            self._propose_once(plan, before, emitted)
        else:
            if self.observes and decode_emit:
                self._report([entry.request for entry in decodes],
                             [(entry.request, g, entry.drafts, emit - 1, emit)
                              for entry, g, emit in decode_emit])
            self._propose(plan, ks[size:], emitted)
        implicit = head is not None and ks[:size].count(self._walked_k) == size
        if head is not None and not implicit:  # the head proposes drafts at other ks than
            self._propose_head(size, ks[:size])  # its walks': as the step path proposes them
        emit_total = sum(emit for _, _, emit in decode_emit)
        n_decodes, drafted, max_k = len(decodes), sum(drafts), max(drafts, default=0)
        if head is not None:
            emit_total, n_decodes = emit_total + head.emitted, n_decodes + size
            drafted, max_k = drafted + head.drafted, max_k if max_k >= head.max_k else head.max_k
        self.steps.add(self.index, start, duration, n_decodes, len(chunks), chunk_tokens,
                       drafted, max_k, emit_total - n_decodes, emit_total, waiting, held, kv)
        if implicit:  # candidates: the head's walks that end here, and the rest
            left = self._finish_done(scheduler.running[size:])
            self._head = self._extend_head(ks, size - left)
        else:
            self._finish_done(every=self.plan_sums)
            if self.plan_sums:  # the requests that stayed in the sums, where they come first
                self._head = self._extend_head(ks, self._summed_head())

    def _propose_once(self, plan, before: list[int], emitted: list[int]) -> None:
        """`proposes_once`: the policy's choice, its fit of the step and the drafts proposed
        at its end, compiled (simulator/stepped.py), each request that sampled and goes on
        proposing its own."""
        batch = plan.requests
        scheduled = plan.scheduled
        proposals = propose_once(self.policy, batch, self.traces, self.config.k_max, self.cost,
                                 before, [entry.drafts for entry in scheduled], emitted,
                                 [not entry.prefill for entry in scheduled],
                                 self.scheduler.kv_tokens)
        finished = self.scheduler.finished
        going = [(request, k) for request, k, emit in zip(batch, proposals, emitted)
                 if emit and not finished(request)]
        self.scheduler.propose_all([request for request, _ in going], [k for _, k in going])

    def _summed_head(self) -> int | None:
        """After a step that read every running request: how many of those in the kept sums
        come first in admission order, where every one of them proposed its walk's next
        drafts (so they can be read from their walks alone from here, as after a segment);
        None where they do not come first or one proposed other drafts."""
        running = self.scheduler.running
        size = 0
        for request in running:
            if not request.summed:
                break
            size += 1
        for request in running[size:]:
            if request.summed:
                return None
        head = running[:size]
        if self.scheduler.proposals(head) != self._walks_next(head):
            return None
        return size

    def _walks_next(self, requests: list[RequestState]) -> list[int]:
        """The drafts each request's walk takes at its next step (read up to date)."""
        return [request.chain_k if request.chain_ks is None
                else int(request.chain_ks[request.chain_at]) for request in requests]

    def _head_step(self) -> _HeadSums | None:
        """`plan_sums`: where the running requests first in admission order are read from
        their walks alone (`_head`, after a segment), and `schedule()` would run their
        proposals (their walks' next drafts) whole, their share of the next step from the
        kept sums: their verify pass's sums, the tokens they emit, and the blocks they
        allocate. None where it would not (a step taken one at a time reads them all)."""
        size = self._head
        if not size or self._walked_k is None:
            return None
        scheduler = self.scheduler
        head = self._sums_step(size)
        held = self.columns.blocks_window(1)
        head.blocks = int(held[1]) - int(held[0])
        if head.blocks > scheduler.free_blocks or size + head.drafted > scheduler.budget:
            return None  # (decode_room_sums of this one step: it would preempt or trim)
        return head

    def _propose_head(self, size: int, ks: list[int]) -> None:
        """The head's drafts for the next step where the policy's ks differ from its walks':
        each request read up to date, then proposed as `_propose` proposes (none where it
        finished), so the scheduler holds every request's state (`_head` None)."""
        head = self.scheduler.running[:size]
        for request in head:
            self._sync(request)
        going = [(request, k) for request, k in zip(head, ks)
                 if not self.scheduler.finished(request)]
        self.scheduler.propose_all([r for r, _ in going],
                                   self._cut_to_cap([r for r, _ in going], [k for _, k in going]))

    def _add_walk(self, request: RequestState, k: int) -> None:
        """A request's new walk (at its start) into the kept sums, with what reading it back
        needs: its draft feeds or blocks before each step, its end (in the heap, `lazy`), and
        its entries and drafts as lists."""
        columns = self.columns
        assert request.chain_at == 0, "a walk joins the kept sums from its start"
        if self.feeds:  # its draft feed before each step of its walk
            request.chain_feeds = self._walk_feeds(request)
        if self.plan_sums:  # the blocks it holds before each step of its walk
            request.chain_blocks = self.scheduler.walk_blocks(
                request, request.chain, k if request.chain_ks is None else request.chain_ks)
        columns.add(request, k)
        request.summed = True
        request.chain_origin = columns.now  # its chain_at is 0
        request.chain_end = columns.now + len(request.chain) - 1
        if self.lazy:
            heappush(self._ends, (request.chain_end, next(self._pushes), request))
        request.chain_list = request.chain.tolist()
        if request.chain_ks is not None:
            request.chain_drafted = np.concatenate(([0], request.chain_ks.cumsum())).tolist()

    def _extend_head(self, ks: list[int], size: int | None) -> int | None:
        """`plan_sums`, after a step taken one at a time whose first `size` running requests
        are read from their walks (None: none is): where the step's policy chose one k for
        every request (`ks`), the walks' k if there are any, the decoding requests after them
        that proposed it (capped as the drafter caps it) are walked at it and added to the
        kept sums, in admission order up to the first that did not (prefilling, or holding an
        older proposal: not scheduled in this step), so the next steps take their share from
        the sums too (`_head_step`). Returns the head's size then."""
        if size is None or not ks:
            return size
        scheduler = self.scheduler
        rest = scheduler.running[size:]
        k = ks[0]
        if (not rest or not scheduler.decoding(rest[0]) or ks.count(k) != len(ks)
                or (size and k != self._walked_k)):
            return size
        for request, drafts, cut in zip(rest, scheduler.proposals(rest),
                                        self._cut_to_cap(rest, [k] * len(rest))):
            if not scheduler.decoding(request) or drafts != cut:
                break
            walk_chain(request, k)
            self._add_walk(request, k)
            size += 1
        if size:
            self._walked_k = k
        return size

    def _sync_running(self) -> list[tuple[RequestState, int]]:
        """`plan_sums` or `chunk_sums`, before a step that reads every request: every running
        request in the kept sums read up to now (`_sync`: its progress, and under vLLM's
        scheduler its scheduler state), and where each is on its walk."""
        self._head = None
        summed = []
        for request in self.scheduler.running:
            if request.summed:
                self._sync(request)
                summed.append((request, request.chain_at))
        return summed

    def _keep_sums(self, summed: list[tuple[RequestState, int]]) -> None:
        """`plan_sums` or `chunk_sums`, after a step that read every request: the requests
        that took their walk's step (`_follow_walk`) stay in the kept sums, which move on a
        step; the others (not scheduled, preempted, or drafting other than their walk) leave
        them from where they were, and are walked anew later."""
        columns = self.columns
        for request, at in summed:
            if request.chain_at != at + 1:
                columns.remove(request)
                request.summed = False
                request.chain_k = -1  # (its walk is stale even where it did not move)
        columns.now += 1

    def _planned_segment(self):
        """vLLM steps that are plain decodes of the running requests, costed at once, as
        `_decode_segment` costs them: up to the next arrival or finish, or to the step where
        the budget or the free blocks would change what `schedule()` plans
        (`decode_room`). One step at a time where the drafts proposed for the next step are
        not what the requests' walks draft there (the running set changed since). A policy
        that holds its ks is asked at the first step and observed at the last, the segment
        ending where its hold does (`Policy.hold`, `observe_held`)."""
        scheduler = self.scheduler
        batch = scheduler.running
        key = tuple(request.request_id for request in batch)
        if key == self._stepping_for:  # its first step did not fit: until the set changes
            yield from self._planned_iteration()
            return
        hold = None
        if self.holds:  # asked at the segment's first step, once that step is known to run
            # every proposal whole, from the context the step path gives it there (the blocks
            # the step allocates taken, the requests a list of their own as a plan's are)
            allocating = scheduler.next_decode_blocks()
            if allocating is None:
                yield from self._planned_iteration()
                return
            ks = scheduler.choose(batch, self.env.now, ctx=scheduler.context(
                list(batch), self.env.now, allocating=allocating))
            hold = self.policy.hold()
            if not hold:  # nothing held: this step alone, as the step path runs it
                yield from self._planned_iteration(ks)
                return
        else:
            if key != self._ks_for:
                self._ks, self._ks_for = self._choose_uncapped(batch), key
            ks = self._ks
        checked = batch  # the requests whose proposals are read from the scheduler
        if self.plan_sums:
            size = self._head
            if size is not None and not (ks and ks.count(ks[0]) == len(ks)
                                         and ks[0] == self._walked_k):
                self._sync_running()  # (else the head proposed its walks' next drafts)
                size = None
            # the requests to walk: those that left the sums or joined since
            fresh = ([request for request in batch if not request.summed] if size is None
                     else batch[size:])
            if size is not None:  # the head is read from its walks
                checked = fresh
        if (checked and scheduler.proposals(checked)
                != self._cut_to_cap(checked, ks[len(batch) - len(checked):])):
            yield from self._planned_iteration(ks if hold is not None else None)
            return
        if self.plan_sums:
            self._fresh = fresh
        start = self.env.now
        stretch = _Stretch.priced(self, batch, ks)
        if self.plan_sums:  # every running request in the sums, at its walk's start or on it
            self._head = len(batch)
        # the step path's clock to the bit (such runs were recorded one step at a time)
        clock = np.concatenate(([start], stretch.durations)).cumsum()
        horizon = self.next_arrival_s(self.index)
        n = min(int(clock[1:].searchsorted(horizon, side="left")) + 1, stretch.steps)
        if hold is not None:  # its held steps, then it is asked again
            n = min(n, hold + 1)
        if self.plan_sums:  # the blocks each step allocates, from the kept sums
            held = self.columns.blocks_window(n)
            allocated = held[1:] - held[0]
            n, kv = scheduler.decode_room_sums(
                len(batch), allocated,
                stretch.drafted[:n] if stretch.capped else int(stretch.k_arr.sum()))
        else:
            prompt = np.fromiter((request.prompt_tokens for request in batch), np.int64,
                                 len(batch))
            drafts = (stretch.drafts[:, :n] if stretch.capped
                      else np.repeat(stretch.k_arr[:, None], n, axis=1))
            n, kv, blocks = scheduler.decode_room(prompt, stretch.gen[:, :n], drafts)
        if n == 0:  # its first step trims drafts or preempts: stepped, and (a budget that
            # trims the same ks every step) so are the next, until the running set changes
            # (never where the policy holds: next_decode_blocks found that step whole)
            self._stepping_for = key
            yield from self._planned_iteration(ks if hold is not None else None)
            return
        self._commit(batch, stretch, 0, n)
        self._record(batch, start, n, clock[1:n], stretch, kv)
        if self.plan_sums:  # each request's blocks and next drafts read from its walk (_sync)
            scheduler.take_blocks(int(allocated[n - 1]))
        else:  # the drafts each request proposes at the end of the last step, for the next
            scheduler.decoded(blocks, [
                k if request.cap is None else min(k, request.cap[request.generated])
                if request.generated < request.output_tokens else 0
                for request, k in zip(batch, ks)])
        yield _At(self.env, float(clock[n]))
        if hold is not None:  # the n steps' observes (and the n - 1 held asks) at once, at
            # the end of the last, as the step path observes it (arrivals during it waiting)
            self.policy.observe_held(scheduler.context(list(batch), self.env.now),
                                     self._held_steps(stretch, 0, n, self._held_sums(
                                         batch, stretch, n)))
        if n == stretch.steps:  # else no request reached its length: nothing to retire
            left = self._finish_done()
            if self._head is not None:
                self._head -= left

    def _propose(self, plan, ks: list[int], emitted: list[int]) -> None:
        """The drafts proposed at the end of the step for the next (doc 5.2): by every request
        that sampled and goes on, at most its k; a draft stop rule and the n-gram lookup's
        limit are read at the position the drafts start from (its new `generated`)."""
        batch, chosen = [], []
        finished = self.scheduler.finished
        for entry, k, emit in zip(plan.scheduled, ks, emitted):
            if emit and not finished(entry.request):
                batch.append(entry.request)
                chosen.append(k)
        if not self.scheduler.drafter_runs(plan):  # vLLM's zero drafts, K of them (doc 5.3)
            for request in batch:
                self.scheduler.propose(request, self.scheduler.config.k_max, placeholder=True)
            return
        if type(self.policy).uses_draft_stop and not self.folds_stop:
            chosen = self._draft_stop(batch, chosen)
        self.scheduler.propose_all(batch, self._cut_to_cap(batch, chosen))

    # -- the fast path -----------------------------------------------------------------------

    def _decode_segment(self):
        """All decode iterations up to the next arrival or finish, costed at once.

        A policy that holds its ks (`Policy.hold`) is asked again where its hold ends, inside
        the segment: the held steps are committed and observed first, as if each hold were a
        segment of its own. While it repeats its ks the segment goes on on the same arrays;
        when they change it is priced afresh from there. Nothing else can happen at those
        boundaries (no arrival before the segment's last iteration, no finish, so no admission)."""
        scheduler = self.scheduler
        batch = scheduler.running
        start = self.env.now
        if self._overruled and not self._walks_agree_now(batch):  # (before walking anew)
            yield from self._step_unwalked(batch)
            return
        if self.walks:  # each request's steps decided by its walk (_Stretch.priced)
            ks, hold = [WALKED] * len(batch), None
        elif self.holds:  # asked here, and again where each hold ends (_walk_holds)
            ks = self._choose_uncapped(batch)
            hold = self.policy.hold()
        else:  # asked once per running set
            ks, hold = self._set_ks(batch), None
        if self.chunk_sums:  # the requests not in the sums yet (started, or left them)
            self._fresh = [request for request in batch if not request.summed]
        last_hold = None
        while True:
            stretch = _Stretch.priced(self, batch, ks)
            if not stretch.capped and hold is None and not self.chunk_segments:
                ends = stretch.durations.cumsum()
                # run through the first iteration that ends at or after the next arrival: the
                # arrival waits for that boundary anyway, and nothing a router reads (the
                # replica's load) changes before the segment's last iteration, where the first
                # finish can be.
                horizon = self.next_arrival_s(self.index) - start
                n = min(int(ends.searchsorted(horizon, side="left")) + 1, stretch.steps)
                starts = ends[: n - 1] + start
                end = self.env.timeout(float(ends[n - 1]))
                self._record(batch, start, n, starts, stretch)
                self._commit(batch, stretch, 0, n)
                break
            # the step path's clock to the bit (it replaces step-by-step runs, of capped drafts
            # and of policies that hold): np.cumsum adds one iteration at a time, as the clock
            # does, and the segment ends at that sum
            clock = np.concatenate(([start], stretch.durations)).cumsum()
            horizon = self.next_arrival_s(self.index)
            n = min(int(clock[1:].searchsorted(horizon, side="left")) + 1, stretch.steps)
            if self.checks_walks:  # up to the first step the batch overrules the walks in
                self._overruled = False
                n = min(n, self.policy.walks_agree(self._foreseen(batch, start),
                                                   stretch.positions(n)))
                if not n:
                    yield from self._step_unwalked(batch)
                    return
            replanned = None
            if hold is not None:
                n, replanned, last_hold = self._walk_holds(batch, ks, hold, n, clock, stretch)
            else:
                self._commit(batch, stretch, 0, n)
            self._record(batch, start, n, clock[1:n], stretch)
            if replanned is None:
                end = _At(self.env, float(clock[n]))
                break
            start, (ks, hold) = float(clock[n]), replanned
        yield end
        if last_hold is not None:  # at the end of its last step, as the step path observes
            # it (the requests that arrived during that step waiting)
            self.policy.observe_held(scheduler.context(batch, self.env.now), last_hold)
        if n == stretch.steps:  # else no request reached its length: nothing to retire
            self._finish_done()

    def _compiled_steps(self):
        """`_mixed_iteration`s of the running batch with no prompt to chunk, as many as one
        compiled run takes (simulator/stepped.py: up to the first finish, or the step that
        ends at or after the next arrival; nothing else changes what a step admits or chunks),
        committed and recorded at once. Under vLLM's scheduler, `_planned_iteration`s of a
        steady batch, up to the first whose proposals schedule() would not run whole (the
        budget trims them, or the free blocks cannot hold them: that one is stepped)."""
        scheduler = self.scheduler
        batch, start = scheduler.running, self.env.now
        snapshot = scheduler.snapshot()  # (no arrival, admission or finish before the last)
        room = scheduler.room() if self.planned else None
        done = run_steps(self.policy, batch, self.traces, self.config.k_max, self.cost, start,
                         self.next_arrival_s(self.index), room, scheduler.kv_tokens)
        n = done.steps
        if not n:  # vLLM's first step would trim drafts or preempt: stepped, and so are the
            # next (a budget that trims them every step) until the running set changes
            self._stepping_for = tuple(request.request_id for request in batch)
            yield from self._planned_iteration()
            return
        scheduler.step_index += n
        for request, after, drafted in zip(batch, done.generated.tolist(),
                                           done.drafts.tolist()):
            before = request.generated
            request.generated = after
            request.steps += n
            request.drafted += drafted
            request.accepted += after - before - n
        if self.steps.records_rows:
            block = np.empty((len(STEP_INDEX), n))
            block[:] = np.array((self.index, 0.0, 0.0, len(batch), 0, 0, 0, 0, 0, 0,
                                 *snapshot))[:, None]
            records = done.records[:, :n]  # (the clock's before each step)
            for name, row in _RUN_RECORDS:
                block[STEP_INDEX[name]] = records[row]
            if room is not None:  # (vLLM's blocks, allocated step by step)
                block[STEP_INDEX["kv_used_tokens"]] = records[KV]
            self.steps.add_block(block)
        else:
            self.steps.add_totals(n, len(batch) * n, n, int(done.record(EMITTED).sum()),
                                  int(done.record(DRAFTED).sum()))
        if room is not None:  # each request's KV entries, blocks and drafts for its next step
            scheduler.decoded(done.blocks, done.proposals.tolist())
        yield _At(self.env, float(done.records[CLOCK, n]))
        self._finish_done()

    def _runs_fit(self) -> bool:
        """vLLM's scheduler: whether runs of steps are tried (not while the running set is
        the one whose first step did not fit, `_compiled_steps`)."""
        if self._stepping_for is None:
            return True
        if self._stepping_for == tuple(request.request_id for request in self.scheduler.running):
            return False
        self._stepping_for = None
        return True

    def _step_unwalked(self, batch: list[RequestState]):
        """A step where the policy's batch overrules its walks (`Policy.walks_agree`), taken
        one at a time through `choose`: every request read from its walk first and taken out
        of the kept sums, its walk marked stale, so the next segment walks each anew (under
        chunked prefill the step itself reads them, and keeps in the sums those whose step
        followed their walk: `_mixed_iteration`, `_keep_sums`)."""
        if not self.chunk_sums:
            columns = self.columns
            for request in batch:
                if request.summed:
                    if self.lazy:
                        self._sync(request)
                    columns.remove(request)
                    request.summed = False
                request.chain_k = -1  # (walk_alone walks it again from where it is)
        self._walked_k = None  # the next pricing checks every request's walk
        self._overruled = True  # the next step checked where each request is, before walking
        yield from self._mixed_iteration(every=True, walked=False)

    def _foreseen(self, batch: list[RequestState], now: float):
        """The step's context with the requests' futures (`StepContext.lookahead`): what a
        policy whose batch can overrule its walks checks them with."""
        return self.scheduler.context(batch, now, Lookahead(batch, self.acceptance))

    def _walks_agree_now(self, batch: list[RequestState]) -> bool:
        """Whether the policy's batch leaves this step to the walks (`Policy.walks_agree` of
        one step, from where each request is: its walk says where, in the kept sums)."""
        ctx = self._foreseen(batch, self.env.now)
        now = self.columns.now if self.lazy else 0
        positions = np.array([[request.chain_list[now - request.chain_origin]
                               if request.summed else request.generated] for request in batch],
                             dtype=np.int64)
        return self.policy.walks_agree(ctx, positions) > 0

    def _walked_ks(self, batch: list[RequestState]) -> list[int]:
        """A step taken one at a time (with prompt chunks) where requests are walked and no
        sums are kept (a draft model, a tree; else `_chunked_head`): each
        request's drafts there from its walk, which is what `choose`, the draft stop and the
        drafter's cap give it (a request without one walked first: its first decode step, or
        its walk overruled); where the policy's batch overrules the walks at this step
        (`Policy.walks_agree`), `choose`'s, and every walk marked stale."""
        if self.checks_walks and not self._walks_agree_now(batch):  # (checked before walking)
            for request in batch:
                request.chain_k = -1
            return self._choose(batch)
        for request in batch:
            if request.chain_k != WALKED or request.chain_g != request.generated:
                self._walk_alone(request)
        return [int(request.chain_ks[request.chain_at]) for request in batch]

    def _walk_alone(self, request: RequestState) -> None:
        """`walk_alone` of a request by the policy's walker (`Policy.walker`; a
        simulation-only policy's given the request's accepted runs), from where it is: once
        (a walker's state moves as it walks), or again only where its walk was marked stale
        (`chain_k` -1, the oracle's overruled steps)."""
        if request.chain_k != -1:
            raise RuntimeError(f"request {request.request_id} walked twice")
        policy, k_max = self.policy, self.config.k_max
        extra = {"run": request.run} if type(policy).simulation_only else {}
        walker = policy.walker(request.request_id, k_max, request.signals or {}, **extra)
        walk_alone(request, walker, k_max, policy.name)

    def _walk_holds(self, batch, ks: list[int], hold: int, n: int, clock: np.ndarray,
                    stretch: _Stretch
                    ) -> tuple[int, tuple[list[int], int] | None, HeldSteps | None]:
        """Commit a held stretch's first n steps hold by hold: each hold's steps, then
        `observe_held`, then the policy asked again at its end (at that step's time; a policy
        that holds reads no lookahead and stops no chain). Returns the steps committed, the
        new (ks, hold) where the policy changed its ks first, and where it did not, the last
        hold's steps, which the caller reports at the segment's end (before it, no request
        can arrive: the segment ends at the first step that ends after an arrival)."""
        scheduler = self.scheduler
        sums = self._held_sums(batch, stretch, n)  # for the n steps at once
        done = 0
        while True:
            last = min(done + hold + 1, n)
            self._commit(batch, stretch, done, last)
            if last == n:
                return n, None, self._held_steps(stretch, done, last, sums)
            ctx = scheduler.context(batch, float(clock[last]))
            self.policy.observe_held(ctx, self._held_steps(stretch, done, last, sums))
            done = last
            again = scheduler.choose(batch, ctx.now_s, ctx=ctx)
            hold = self.policy.hold()
            if again != ks:
                return done, (again, hold), None

    @staticmethod
    def _held_sums(batch, stretch: _Stretch, n: int) -> tuple[list[int], tuple]:
        """The requests' ids, and a stretch's first n steps' sums over them
        (HeldSteps.column_sums), for `_held_steps`."""
        tokens = stretch.tokens
        return ([request.request_id for request in batch],
                ((tokens[1: n + 1] - tokens[:n] - len(batch)).tolist(),
                 ([int(stretch.k_arr.sum())] * n if stretch.drafted is None
                  else stretch.drafted[:n].tolist()),
                 stretch.rejected_sums(n)))

    @staticmethod
    def _held_steps(stretch: _Stretch, first: int, last: int,
                    held: tuple[list[int], tuple]) -> HeldSteps:
        """Steps first..last - 1 of a stretch as `observe_held` reads them (`held`: the
        stretch's `_held_sums`, through last at least)."""
        ids, sums = held
        return HeldSteps(ids, last - first, partial(stretch.held_arrays, first, last),
                         tuple(column[first:last] for column in sums))

    def _record(self, batch, start: float, n: int, starts, stretch: _Stretch,
                kv: np.ndarray | None = None) -> None:
        """The stretch's first n iterations into the step log (rows, or their totals; `kv`:
        each step's KV tokens in use where they change within it)."""
        if self.steps.records_rows:
            self._log_segment(batch, start, n, starts, stretch, kv)
        else:  # a run that keeps totals only: the block's sums, without the block
            tokens = stretch.tokens
            drafted = (int(stretch.k_arr.sum()) * n if stretch.drafted is None
                       else int(stretch.drafted[:n].sum()))
            self.steps.add_totals(n, len(batch) * n, n, int(tokens[n] - tokens[0]), drafted)

    def _commit(self, batch, stretch: _Stretch, first: int, last: int) -> None:
        """Steps first..last - 1 of a stretch, applied to its requests (and the step count)."""
        n = last - first
        self.scheduler.step_index += n
        if self.columns is not None:  # every running request took these steps
            self.columns.now += n
            if not self.lazy:
                self._commit_walks(batch, stretch.k_arr.tolist(), n)
            return
        gen, feeds = stretch.gen, stretch.feeds
        befores, afters = gen[:, first].tolist(), gen[:, last].tolist()
        drafted = ([k * n for k in stretch.k_arr.tolist()] if not stretch.capped
                   else stretch.drafts[:, first:last].sum(axis=1).tolist())
        feeds_after = None if feeds is None else feeds[:, last].tolist()
        for i, (request, before, after) in enumerate(zip(batch, befores, afters)):
            request.generated = after
            request.steps += n
            request.drafted += drafted[i]
            request.accepted += after - before - n
            request.chain_at += n
            request.chain_g = after
            if feeds_after is not None:
                request.draft_feed = feeds_after[i]
            elif self.feeds:  # no chain: the committed tokens pile up for the next (_feeds)
                request.draft_feed = 1 if self.catch_up == "one" else (
                    request.draft_feed + after - before)

    def _commit_walks(self, batch, ks: list[int], n: int) -> None:
        """`_commit` where the replica keeps the batch's sums and a policy holds its ks: n
        steps read from each request's walk lists (no draft model: with one, such a policy
        keeps no sums, so no feeds)."""
        for request, k in zip(batch, ks):
            at, before = request.chain_at, request.generated
            after = request.chain_list[at + n]
            request.generated = after
            request.steps += n
            drafted = request.chain_drafted
            request.drafted += k * n if drafted is None else drafted[at + n] - drafted[at]
            request.accepted += after - before - n
            request.chain_at = at + n
            request.chain_g = after

    def _sync(self, request: RequestState) -> None:
        """`_commit_walks` of one request (`lazy`): its progress through every step committed
        since it was last read, from its walk (the same integers, added at once)."""
        at = self.columns.now - request.chain_origin
        n = at - request.chain_at
        if not n:
            return
        before, after = request.generated, request.chain_list[at]
        drafted = request.chain_drafted
        request.generated = after
        request.steps += n
        request.drafted += (request.chain_k * n if drafted is None
                            else drafted[at] - drafted[request.chain_at])
        request.accepted += after - before - n
        request.chain_at = at
        request.chain_g = after
        if self.feeds:
            request.draft_feed = int(request.chain_feeds[at])
        if self.plan_sums:  # its blocks, and the drafts it proposed for its next step
            ks = request.chain_ks
            spec = (0 if at == len(request.chain_list) - 1
                    else request.chain_k if ks is None else int(ks[at]))
            self.scheduler.sync(request, int(request.chain_blocks[at]), spec)

    def _log_segment(self, batch, start, n, starts, stretch: _Stretch,
                     kv: np.ndarray | None = None) -> None:
        """The stretch's first n iterations, one block of step records."""
        tokens = stretch.tokens[: n + 1]  # the batch's tokens before each step, and after
        emitted = tokens[1:] - tokens[:-1]
        k_arr, capped = stretch.k_arr, stretch.capped
        block = np.empty((len(STEP_INDEX), n))
        drafted, max_k = (0, 0) if capped else (int(k_arr.sum()), int(k_arr.max()))
        block[:] = np.array((self.index, start, 0.0, len(batch), 0, 0, drafted, max_k, 0, 0,
                             *self.scheduler.snapshot()))[:, None]
        block[STEP_INDEX["start_s"], 1:] = starts
        block[STEP_INDEX["duration_s"]] = stretch.durations[:n]
        if capped:
            block[STEP_INDEX["drafted"]] = stretch.drafted[:n]
            block[STEP_INDEX["max_k"]] = stretch.max_drafts(n)
        block[STEP_INDEX["accepted"]] = emitted - len(batch)
        block[STEP_INDEX["emitted"]] = emitted
        if kv is not None:
            block[STEP_INDEX["kv_used_tokens"]] = kv
        self.steps.add_block(block)

    def _feeds(self, batch: list[RequestState], ks: np.ndarray, gen: np.ndarray,
               drafts: np.ndarray | None = None) -> np.ndarray:
        """Each request's first-pass draft feed before each step of the segment, and after its
        last (requests x steps + 1); `gen`: tokens generated before each step; `drafts`: each
        step's drafts where they vary (else `ks` every step)."""
        start = np.fromiter((request.draft_feed for request in batch), np.int64, len(batch))
        feeds = np.empty(gen.shape, dtype=np.int64)
        feeds[:, 0] = start
        if drafts is not None:
            return self._varied_feeds(feeds, drafts, gen)
        feeds[:, 1:] = chain_feed(self.catch_up, ks[:, None], gen[:, 1:] - gen[:, :-1])
        idle = ks == 0  # no chain: the committed tokens pile up for the next one
        if idle.any() and self.catch_up != "one":
            feeds[idle] = start[idle, None] + (gen[idle] - gen[idle, :1])
        return feeds

    def _walk_feeds(self, request: RequestState) -> np.ndarray:
        """`_feeds` of one request's whole walk, from its draft feed now (where it starts):
        after a step that drafts, its chain's feed; after one that does not, the feed before
        it plus what it committed (one row of `_varied_feeds`, in 1-D)."""
        gen, drafts = request.chain, request.chain_ks
        loops = compiled()
        if loops is not None:  # `next_feed` step by step, compiled (simulator/compiled.py)
            return loops.feeds(gen, _NO_DRAFTS if drafts is None else drafts,
                               drafts is not None, request.chain_k, request.draft_feed,
                               loops.RULES[self.catch_up])
        feeds = np.empty(len(gen), dtype=np.int64)
        feeds[0] = request.draft_feed
        if drafts is None:
            drafts = request.chain_k
            if drafts == 0 and self.catch_up != "one":  # no chain: the backlog grows
                feeds[1:] = gen[1:] + (request.draft_feed - gen[0])
                return feeds
        after = chain_feed(self.catch_up, drafts, gen[1:] - gen[:-1])
        if self.catch_up == "one" or np.ndim(drafts) == 0 or drafts.all():
            feeds[1:] = after
            return feeds
        drafted = drafts > 0  # from the last step that drafted (or the walk's start), the
        # feed grows by every token committed since
        last = np.maximum.accumulate(np.where(drafted, np.arange(len(drafts)), -1))
        at = np.maximum(last, 0)
        feeds[1:] = (np.where(last >= 0, after[at] - gen[at + 1], feeds[0] - gen[0])
                     + gen[1:])
        return feeds

    def _varied_feeds(self, feeds: np.ndarray, drafts: np.ndarray, gen: np.ndarray
                      ) -> np.ndarray:
        """`_feeds` where each step's drafts vary (`next_feed` step by step, at once): after
        a step that drafts, its chain's feed; after one that does not, the feed before it
        plus what it committed, so from the last step that drafted (or the segment's start)
        the feed grows by every token committed since."""
        after = chain_feed(self.catch_up, drafts, gen[:, 1:] - gen[:, :-1])
        idle = drafts == 0
        if self.catch_up == "one" or not idle.any():
            feeds[:, 1:] = after
            return feeds
        steps = np.arange(drafts.shape[1])
        last = np.maximum.accumulate(np.where(idle, -1, steps), axis=1)  # last that drafted
        at = np.maximum(last, 0)
        drafted = last >= 0
        base = np.where(drafted, np.take_along_axis(after, at, axis=1), feeds[:, :1])
        since = np.where(drafted, np.take_along_axis(gen, at + 1, axis=1), gen[:, :1])
        feeds[:, 1:] = base + gen[:, 1:] - since
        return feeds

    # -- bookkeeping -------------------------------------------------------------------------

    def _finish_done(self, started: list[RequestState] | None = None, every: bool = False
                     ) -> int:
        """Retire the requests that reached their length (`started`: those a prefill just
        started decoding, or a step read one at a time, which may have; `every`: any running
        request may have, and is read: a step that read every request, where the replica
        keeps the sums). Returns how many of them were in the kept sums."""
        candidates, left = None, 0
        if self.lazy and not every:  # the requests whose walks end here: their progress,
            # for their records; with those just started, the only ones that can have finished
            candidates = self._walks_ending(self.columns.now) + (started or [])
        for request in self.scheduler.finish_done(self.env.now, candidates):  # KV freed
            if request.summed:  # its walk's last entry, out of the batch's sums
                self.columns.remove(request)
                request.summed = False
                left += 1
            if self.traces is not None:
                self.traces.drop(request)
            request.run = request.cap = request.chain = request.chain_ks = request.signals = None
            request.chain_list = request.chain_drafted = request.chain_feeds = None
            request.chain_blocks = None
            request.chain_k = -1
        return left

    def _walks_ending(self, now: int) -> list[RequestState]:
        """`lazy`: the running requests whose walks end at step `now`, synced (`_sync`; one
        walked anew to the same end comes twice, the second sync a no-op)."""
        ends, ending = self._ends, []
        while ends and ends[0][0] <= now:  # a live walk ends no earlier than now
            end, _, request = heappop(ends)
            if request.summed and request.chain_end == end:
                self._sync(request)
                ending.append(request)
        return ending

    def _first_end(self) -> int:
        """`lazy`: the first step a running request's walk ends at."""
        ends = self._ends
        while True:
            assert ends, "a lazy segment priced with no walk in the batch's sums"
            end, _, request = ends[0]
            if request.summed and request.chain_end == end:
                return end
            heappop(ends)  # stale: its walk was replaced, or it finished

    def _take_walks_to_check(self, batch: list[RequestState], ks: list[int]
                             ) -> Iterable[tuple[RequestState, int]]:
        """The (request, k) whose walks `_Stretch.priced` checks: every running request, or
        (`lazy`, every k the same as at the last pricing, whose walks were all found current
        then) those started since (and, under chunked prefill, those that left the sums): only
        steps along their walks moved the others. Takes
        `_fresh` (emptied) and notes the ks' k for the next pricing."""
        if not self.lazy:
            return zip(batch, ks)
        fresh, self._fresh = self._fresh, []
        k = ks[0] if ks and ks.count(ks[0]) == len(ks) else None
        if k is not None and k == self._walked_k:
            return [(request, k) for request in fresh]
        self._walked_k = k
        return zip(batch, ks)


class _Stretch:
    """A running set's next decode steps at fixed ks, priced at once: the batch's tokens
    generated before each step and after the last (`tokens`; read as differences only, so
    the batch's cached tokens serve too), its drafts per step where the drafter caps them
    (`drafted`; else None: k_arr every step), the draft feeds (or None), and each step's
    seconds. `steps`: how many, up to the first request's finish.

    Per request (requests x steps): `gen` (tokens generated before each step and after the
    last) and `drafts` (capped drafts), built from the walks only where something reads
    them; priced from the replica's kept sums (BatchColumns) nothing else does."""

    __slots__ = (
        "_by_drafts",
        "_drafts",
        "_gen",
        "_origins",
        "_rejected",
        "ats",
        "capped",
        "chain_ks",
        "chains",
        "drafted",
        "durations",
        "feeds",
        "k_arr",
        "steps",
        "tokens",
    )

    @classmethod
    def priced(cls, replica: Replica, batch: list[RequestState], ks: list[int]) -> _Stretch:
        self = cls()
        columns, lazy = replica.columns, replica.lazy
        for request, k in replica._take_walks_to_check(batch, ks):
            if request.chain_k != k or request.chain_g != request.generated:  # chain_is_current
                if request.summed:
                    if lazy:  # its progress first: the walk is replaced from there
                        replica._sync(request)
                    columns.remove(request)
                if k == WALKED:  # once, from its first decode step (chain_k is -1 until then)
                    replica._walk_alone(request)
                else:
                    walk_chain(request, k)
                if columns is not None:
                    replica._add_walk(request, k)
        # the walks as they are now (a walk is replaced, never changed, so `gen` and `drafts`
        # can be built from these at any time, even after the requests moved on or left)
        self.capped = replica.varied
        if lazy:  # chain_at is where each request was last read: its walk says where it is
            # (the walks' lists, read only where a step record needs them: `_at_walks`)
            self.chains = self.ats = self.chain_ks = None
            self._origins = (list(batch), columns.now)
            self.steps = replica._first_end() - columns.now
        else:
            self.chains = [request.chain for request in batch]
            self.ats = [request.chain_at for request in batch]
            self.steps = min(len(request.chain) - request.chain_at for request in batch) - 1
            self.chain_ks = [request.chain_ks for request in batch] if self.capped else None
        k_arr = self.k_arr = np.asarray(ks, dtype=np.int64)
        self._gen = self._drafts = self._rejected = self._by_drafts = None
        if columns is not None:
            return self._from_columns(replica, columns, batch)
        gen = self.gen
        prompt = np.fromiter((request.prompt_tokens for request in batch), np.int64, len(batch))
        drafts = self.drafts  # what the drafter could propose (requests x steps)
        # the draft feeds: what a chain's first pass feeds, and (k = 0) the backlog that grows
        # for the next chain, which a later segment's k > 0 pays; a segment where nothing
        # drafts only grows the backlog, and its end is enough (_commit)
        feeds = self.feeds = (replica._feeds(batch, k_arr, gen, drafts)
                              if replica.feeds and k_arr.any() else None)
        cost = replica.cost
        # the batch's tokens before each step and after the last, and (capped) its drafts
        tokens = self.tokens = gen.sum(axis=0)
        self.drafted = None if drafts is None else drafts.sum(axis=0)
        durations = cost.chain_segment_s(k_arr if drafts is None else drafts, prompt,
                                         gen[:, :-1], tokens[:-1], self.drafted)
        if durations is None:
            durations = np.atleast_1d(cost.iteration_s(
                k_arr if drafts is None else drafts, prompt[:, None] + gen[:, :-1] - 1,
                feeds=feeds[:, :-1] if feeds is not None else None,
                in_step_order=replica.holds or replica.varied or replica.chunk_segments
                or replica.plan_segments))
        self.durations = durations
        return self

    def _from_columns(self, replica: Replica, columns: BatchColumns,
                      batch: list[RequestState]) -> _Stretch:
        """Priced from the batch's sums (and a draft model's passes from theirs: the feeds
        are in them). `tokens` is the batch's cached tokens: a constant more than its tokens
        generated, the same steps."""
        cached, drafted, pairs, self._rejected, by_drafts = columns.window(self.steps)
        self._by_drafts = by_drafts if len(by_drafts) else None
        self.tokens, self.feeds = cached, None
        self.drafted = drafted if self.capped else None
        cost = replica.cost
        durations = cost.chain_steps_s(len(batch), drafted, cached[:-1], pairs)
        passes = columns.draft_passes(self.steps) if replica.feeds else None
        if passes is not None:  # + its draft passes, as iteration_s adds them (in the order
            # `priced` asks for: with a draft model the sums are kept only where every decode
            # step is a segment's, so neither chunk_segments nor plan_segments)
            durations = durations + cost.chain_passes_s(
                *passes, in_step_order=replica.holds or replica.varied)
        self.durations = durations
        return self

    def _at_walks(self) -> None:
        """The walks and where the stretch starts on each, from the requests (`lazy`: their
        walks are not replaced before the stretch is done with)."""
        if self.chains is None:
            batch, now = self._origins
            self.chains = [request.chain for request in batch]
            self.ats = [now - request.chain_origin for request in batch]
            self.chain_ks = [request.chain_ks for request in batch] if self.capped else None

    def positions(self, n: int) -> np.ndarray:
        """Each request's output position before each of the first n steps (requests x n):
        `gen`'s first n columns, read from the walks alone."""
        if self._gen is not None:
            return self._gen[:, :n]
        self._at_walks()
        return np.array([chain[at: at + n] for chain, at in zip(self.chains, self.ats)])

    @property
    def gen(self) -> np.ndarray:
        if self._gen is None:  # np.array of equal rows: a quarter of np.stack's time
            self._at_walks()
            n = self.steps
            self._gen = np.array([chain[at: at + n + 1]
                                  for chain, at in zip(self.chains, self.ats)])
        return self._gen

    @property
    def drafts(self) -> np.ndarray | None:
        if self._drafts is None and self.capped:
            self._at_walks()
            n = self.steps
            self._drafts = np.array([chain_ks[at: at + n]
                                     for chain_ks, at in zip(self.chain_ks, self.ats)])
        return self._drafts

    def max_drafts(self, n: int) -> np.ndarray:
        """The most drafts a request proposes at each of the first n steps (capped)."""
        if self._by_drafts is not None:  # the largest d some request drafts (rows d =
            # 0..k_max: every request is in one, so each step has one, and argmax finds the
            # first from the top)
            by_drafts = self._by_drafts
            return len(by_drafts) - 1 - (by_drafts[::-1, :n] > 0).argmax(axis=0)
        return self.drafts[:, :n].max(axis=0)

    def rejected_sums(self, n: int) -> list[int]:
        """Per step of the first n, the requests that saw a first rejection (accepted fewer
        than they drafted: emitted <= k)."""
        if self._rejected is not None:
            return self._rejected[:n].tolist()
        gen = self.gen
        k = self.k_arr[:, None] if not self.capped else self.drafts[:, :n]
        return (gen[:, 1: n + 1] - gen[:, :n] <= k).sum(axis=0).tolist()

    def held_arrays(self, first: int, last: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Steps first..last - 1 per request, as HeldSteps holds them: (k, accepted, emitted,
        position)."""
        gen = self.gen
        emitted = gen[:, first + 1: last + 1] - gen[:, first:last]
        k = (np.repeat(self.k_arr[:, None], last - first, axis=1) if not self.capped
             else self.drafts[:, first:last])
        return k, emitted - 1, emitted, gen[:, first:last]


@dataclass(slots=True)
class _HeadSums:
    """The share of a step of the running requests read from their walks alone
    (`Replica._sums_step`, for vLLM's `_head_step` and chunked prefill's `_chunked_head`):
    how many, the blocks they allocate (vLLM's; 0 elsewhere), their verify pass's sums, the
    tokens they emit, and the most drafts any of them verifies."""

    size: int
    blocks: int
    drafted: int
    cached: int
    pairs: int
    emitted: int
    max_k: int


def _chunk_sums(chunks: list) -> tuple[int, int, int, int]:
    """Prompt chunks (request, tokens n, cached c) as a step prices them: how many, their
    tokens, their cached tokens and their causal pairs (n c + n (n + 1) / 2 each)."""
    return (len(chunks), sum(n for _, n, _ in chunks), sum(c for _, _, c in chunks),
            sum(n * c + n * (n + 1) // 2 for _, n, c in chunks))


class _At(simpy.events.Event):
    """A timeout that ends at the absolute time `at`, exactly: a delay of at - now could round
    to another float once SimPy adds it back to now."""

    def __init__(self, env: simpy.Environment, at: float) -> None:
        super().__init__(env)
        self._ok, self._value = True, None
        heappush(env._queue, (at, simpy.events.NORMAL, next(env._eid), self))


#: a run of steps' records (simulator/compiled_steps.py) as step columns
_RUN_RECORDS = (("start_s", CLOCK), ("duration_s", DURATION), ("drafted", DRAFTED),
                ("max_k", MAX_K), ("accepted", ACCEPTED), ("emitted", EMITTED))


def check_fits(request_ids, prompt_tokens, output_tokens, scheduler: SchedulerConfig,
               kv_capacity_tokens: int) -> None:
    """Refuse up front a workload with a request no replica could ever admit.

    The output length stands in for the max_tokens a real request declares. Each scheduler
    class holds its own rule (`check_fits`): fcfs-reserve's reservation of prompt + output +
    k_max and its token budget, vllm-v1's blocks.
    """
    scheduler_class(scheduler.scheduler).check_fits(request_ids, prompt_tokens, output_tokens,
                                                    scheduler, kv_capacity_tokens)
