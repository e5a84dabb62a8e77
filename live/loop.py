"""The live engine's loop for one run: prefill and decode iterations with real passes.

Who is admitted, which prompt chunks run, the check of the policy's k and who finishes are the
simulator's own rules (`simulator.scheduler.Scheduler`, which simulator/replica.py executes
too); this module executes them with real forward passes and a real clock (with chunked
prefill, live/mixed.py's `ChunkedLoop`), and writes the same records with the same values taken
at the same moments.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

import pandas as pd
import torch

from drafters.base import DraftChain, Drafter, StopRule
from live.pass_timer import PassTimer
from live.replay import ReplayScript, verify_replay
from live.requests import EngineClock, LiveRequest
from live.verify import PROB_SIGNALS, FedPass, Verified, verify_greedy, verify_sampling
from models.llama import LlamaModel, greedy_tokens
from policies import DraftOutcome, Policy, StepContext, StepCost
from simulator.config import SchedulerConfig
from simulator.draft_feed import next_feed
from simulator.logs import RequestLog, StepLog
from simulator.scheduler import make_scheduler


class EngineParts(Protocol):
    """What a loop reads of its engine (live/engine.py's `LiveEngine`)."""

    target: LlamaModel
    drafter: Drafter
    scheduler: SchedulerConfig
    kv_capacity_tokens: int
    cost: StepCost
    device: torch.device
    temperature: float
    seed: int


class LiveLoop:
    """One run's state: queues, KV reservations, records. `serve` runs it to completion, one
    `iterate` at a time (whole prompts here; prompt chunks in live/mixed.py's `ChunkedLoop`)."""

    def __init__(
        self, engine: EngineParts, policy: Policy, clock: EngineClock,
        requests: list[LiveRequest],
        drafter: Drafter | None = None, script: ReplayScript | None = None,
    ) -> None:
        self.engine, self.policy, self.clock = engine, policy, clock
        self.drafter = drafter if drafter is not None else engine.drafter
        self.script = script  # replay mode: the trace decides tokens and acceptance
        self.config = engine.scheduler
        self.observes = type(policy).observes()
        self.signals = frozenset(type(policy).signals)
        self.pending = deque(requests)  # not arrived yet
        self.steps = StepLog()
        self.log = RequestLog(len(requests))
        # the rule book: queues, KV reservations, admission, chunks, k, finishing
        self.scheduler = make_scheduler(self.config, engine.kv_capacity_tokens, policy, self.log,
                                        engine.cost)
        self.pass_s: list[float] = []  # per step: seconds inside forward passes (CPU)
        self.generator = torch.Generator(device=engine.device).manual_seed(engine.seed)
        for request in requests:
            self.log.replica[request.index] = 0

    def serve(self) -> pd.DataFrame:
        """Run until every request has finished; the per-step records."""
        models = [self.engine.target, self.drafter.model]
        cuda = self.engine.device.type == "cuda"
        timer = PassTimer((m for m in models if m is not None), cuda=cuda)
        try:
            self._serve(timer)
        finally:
            timer.close()
        return self.steps.frame()

    def _serve(self, timer: PassTimer) -> None:
        scheduler = self.scheduler
        while self.pending or scheduler.load:
            self._arrive()
            if not scheduler.load:
                self.clock.wait_until(self.pending[0].arrival_s)
                continue
            self.iterate(self.clock.now())
            self.pass_s.append(timer.take())

    def iterate(self, start: float) -> None:
        """One iteration: prefill the prompts admitted whole, else one decode step."""
        admitted = self.scheduler.admit_whole(start)
        if admitted:
            self._prefill(admitted, start)
        elif not self.scheduler.running:
            raise RuntimeError("the engine holds requests it can neither admit nor run")
        else:
            self._decode(start)

    def _arrive(self) -> None:
        now = self.clock.now()
        while self.pending and self.pending[0].arrival_s <= now:
            request = self.pending.popleft()
            self.log.arrival_s[request.index] = request.arrival_s
            self.scheduler.add(request)

    # -- iterations ----------------------------------------------------------------------------

    def _prefill(self, admitted: list[LiveRequest], start: float) -> None:
        """Prefill the new prompts (target and model drafter); their first tokens end it."""
        waiting, held, kv = self.scheduler.snapshot()
        target, device = self.engine.target, self.engine.device
        for request in admitted:
            request.cache = target.new_cache(request.reserve + 1)
        prompts = [torch.tensor(request.tokens, dtype=torch.int64, device=device)
                   for request in admitted]
        caches = [request.cache for request in admitted]
        ids, prompt_tokens = [request.request_id for request in admitted], [len(p) for p in prompts]
        drafter = self.drafter
        if drafter.needs_hidden:
            logits, hidden = target(prompts, caches, logits="last", features=True)
        else:
            logits = target(prompts, caches, logits="last")
        drafter.start(ids, [list(request.tokens) for request in admitted])
        if drafter.needs_hidden:
            drafter.observe_hidden(ids, hidden)
        if self.script is not None:
            firsts = [self.script.first_token(rid) for rid in ids]
        else:
            firsts = self.first_tokens(torch.cat(logits))
        for request, token in zip(admitted, firsts):
            request.tokens.append(token)
        end = self.end_iteration(start, lambda: self.engine.cost.prefill_s(prompt_tokens))
        self.scheduler.step_index += 1
        row = (0, start, end - start, 0, len(admitted), sum(prompt_tokens), 0, 0, 0, 0)
        self.steps.add(*row, waiting, held, kv)
        self.scheduler.start_decoding(admitted, end)
        self.finish_done(end)

    def _decode(self, start: float) -> None:
        """One speculative step for every running request; the policy observes the outcomes."""
        batch = list(self.scheduler.running)
        ks = self.choose(batch)
        waiting, held, kv = self.scheduler.snapshot()
        # before the step, as the simulator's
        cached = [request.context_tokens - 1 for request in batch]
        chains = self.draft(batch, ks)
        results = self.verify(batch, chains)
        outcomes = [self.apply(request, k, res) for request, k, res in zip(batch, ks, results)]
        drafted = [res.drafted for res in results]
        feeds = [chain.fed for chain in chains]
        cost = self.engine.cost
        end = self.end_iteration(start, lambda: cost.iteration_s(drafted, cached, feeds=feeds))
        self.scheduler.step_index += 1
        if self.observes:  # after the end, at the end's time, as in the simulator
            self.policy.tell(self.context(batch), outcomes)
        accepted, emitted = sum(o.accepted for o in outcomes), sum(o.emitted for o in outcomes)
        row = (0, start, end - start, len(batch), 0, 0, sum(drafted), max(drafted))
        self.steps.add(*row, accepted, emitted, waiting, held, kv)
        self.finish_done(end)

    def draft(self, batch: list[LiveRequest], ks: list[int]) -> list[DraftChain]:
        """Draft chains (cut by the policy's stop rule); `verify` checks them in one pass."""
        keep_probs = bool(self.signals & PROB_SIGNALS) and not self.drafter.model_free
        ids = [request.request_id for request in batch]
        histories = [request.tokens for request in batch]
        return self.drafter.propose(ids, histories, ks, self._stop_rule(batch), keep_probs)

    def verify(self, batch: list[LiveRequest], chains: list[DraftChain],
                fed: FedPass | None = None) -> list[Verified]:
        """Verify (greedy, sampling or replay) the chains; `fed`: their pass, if already run."""
        drafter, target = self.drafter, self.engine.target
        ids = [request.request_id for request in batch]
        caches = [request.cache for request in batch]
        lasts = [request.tokens[-1] for request in batch]
        room = [request.output_tokens - request.generated for request in batch]
        hidden = drafter.needs_hidden
        if self.script is not None:
            positions = [request.generated for request in batch]
            results = verify_replay(target, caches, lasts, chains, room, self.script, ids,
                                    positions, self.signals, hidden, fed)
        elif self.engine.temperature > 0:
            results = verify_sampling(target, caches, lasts, chains, room,
                                      self.engine.temperature, self.generator, self.signals,
                                      hidden, fed)
        else:
            results = verify_greedy(target, caches, lasts, chains, room, self.signals, hidden,
                                    fed)
        if hidden:
            drafter.observe_hidden(ids, [res.hidden for res in results])
        return results

    def first_tokens(self, logits: torch.Tensor) -> list[int]:
        """The token each prefill emits: argmax, or a sample at the engine's temperature."""
        if self.engine.temperature <= 0:
            return greedy_tokens(logits).tolist()
        p = torch.softmax(logits.double() / self.engine.temperature, dim=-1)
        return torch.multinomial(p, 1, generator=self.generator).flatten().tolist()

    def apply(self, request: LiveRequest, k: int, res: Verified) -> DraftOutcome:
        """Emit a request's tokens and count its step; what the policy is told of it."""
        g = request.generated
        request.tokens.extend(res.emitted)
        request.generated = g + len(res.emitted)
        request.steps += 1
        request.drafted += res.drafted
        request.accepted += res.accepted
        request.draft_feed = next_feed(self.drafter.catch_up, request.draft_feed, res.drafted,
                                  len(res.emitted))
        request.log.append((g, k, res.drafted, res.accepted, len(res.emitted)))
        if request.cache.length > request.reserve:
            raise RuntimeError(f"request {request.request_id} outgrew its KV reservation")
        return DraftOutcome(request.request_id, res.drafted, res.accepted, len(res.emitted), g,
                            res.signals)

    # -- the policy --------------------------------------------------------------------------

    def choose(self, batch: list[LiveRequest]) -> list[int]:
        return self.scheduler.choose(batch, self.clock.now())

    def context(self, batch: list[LiveRequest]) -> StepContext:
        return self.scheduler.context(batch, self.clock.now())

    def _stop_rule(self, batch: list[LiveRequest]) -> StopRule | None:
        if not type(self.policy).uses_draft_stop:
            return None
        policy = self.policy
        return lambda row, depth, top1, ent: policy.stop_drafting(batch[row], depth, top1, ent)

    # -- bookkeeping -------------------------------------------------------------------------

    def end_iteration(self, start: float, cost_s: Callable[[], float]) -> float:
        """The clock once the device has finished this iteration's work (`cost_s`: the
        simulator's price of the iteration, which only a VirtualClock reads)."""
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize(self.engine.device)
        return self.clock.end_iteration(start, cost_s)

    def finish_done(self, now: float) -> None:
        for request in self.scheduler.finish_done(now):
            request.cache = None
            self.drafter.finish(request.request_id)
