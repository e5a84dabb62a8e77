"""vLLM V1's scheduler as served on CPU, for `--scheduler vllm-v1` (docs/vllm-v1-scheduler.md).

Why a second rule book: fcfs-reserve reserves each request's whole output up front and gives
every decode its k + 1 tokens, so it admits fewer requests and never preempts. vLLM V1 hands out
128-token blocks as sequences grow, counts every token (drafts included) against one budget, and
preempts by recompute (doc section 12). This class is the same kind of pure bookkeeping as
`simulator.scheduler.Scheduler` (no clock, no torch), shaped like vLLM's engine step (doc 2):
`schedule()` plans the whole step in one call (doc 3), the executor runs it and replays the
acceptance, `update_from_output()` commits the sampled tokens and rolls back rejected drafts
(doc 5.5, 7), `propose()` stores the drafts proposed at the end of the step for the next one
(doc 5.2), `finish_done()` frees the blocks of finished requests for the next step (doc 8).
`simulator/replica.py` runs it (`plans_whole_step`). What is and is not modelled: the doc's
section "What spectune models".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from policies import Policy, StepContext, StepCost
from simulator.draft_feed import FIRST_FEED
from simulator.errors import ConfigError
from simulator.scheduler import SchedulerSettings, register_scheduler, split_finished

if TYPE_CHECKING:  # pandas: only the engines that write logs load it
    from simulator.logs import RequestLog

#: KV block size of vLLM's CPU platform when none is given (doc 4.1)
BLOCK_SIZE = 128
#: max_num_batched_tokens of vLLM's OpenAI server on CPU (doc 0): the budget when none is set
DEFAULT_MAX_BATCHED_TOKENS = 2048


def blocks_for(tokens: int) -> int:
    """Blocks that hold `tokens` KV entries."""
    return -(-tokens // BLOCK_SIZE)


def usable_blocks(kv_capacity_tokens: int) -> int:
    """Blocks the pool hands out. `kv_capacity_tokens` is read as vLLM's "KV cache size"
    (num_blocks x 128, the null block included, doc 4.1): num_blocks - 1 are usable."""
    return kv_capacity_tokens // BLOCK_SIZE - 1


@dataclass(slots=True)
class Scheduled:
    """One request's share of a step (vLLM's num_scheduled_tokens entry)."""

    request: Any
    tokens: int  # n: prompt-chunk tokens, or 1 + drafts for a decode
    computed: int  # C before the step: KV entries already written
    drafts: int  # drafts verified this step (after trimming); 0 for a chunk
    prefill: bool  # a (re-)prefill chunk, not a verify step
    resumed: bool  # a re-prefill of a preempted request with outputs: vLLM logs it "generation"
    placeholder: bool = False  # the drafts are vLLM's zeros (doc 5.3): all of them rejected


@dataclass
class StepPlan:
    """What `schedule()` decided for one step, in vLLM's scheduling order."""

    scheduled: list[Scheduled] = field(default_factory=list)
    preempted: list = field(default_factory=list)

    @property
    def requests(self) -> list:
        return [entry.request for entry in self.scheduled]


@dataclass
class Room:
    """What vLLM's scheduler holds for a steady batch's runs of steps: each request's drafts
    proposed for its next step and the blocks it holds, the pool's free blocks, the budget,
    the pool's usable blocks and the block size (`VllmV1Scheduler.room`; simulator/stepped.py)."""

    proposals: np.ndarray
    blocks: np.ndarray
    free: int
    budget: int
    total_blocks: int
    block_size: int


class _Seq:
    """vLLM's per-request scheduler state beside the request object (doc 1)."""

    __slots__ = ("blocks", "computed", "placeholder", "prefilling", "spec")

    def __init__(self) -> None:
        self.computed = 0  # C
        self.spec = 0  # |S|: drafts waiting to be verified
        self.placeholder = False  # S holds zeros, not proposals (doc 5.3)
        self.blocks = 0  # blocks held; only grows while running
        self.prefilling = True  # its (re-)prefill has not sampled yet


@register_scheduler
class VllmV1Scheduler:
    """vLLM V1's `Scheduler` for FCFS, n-gram drafts, no prefix caching (doc 0)."""

    name = "vllm-v1"
    #: the replica runs schedule / update_from_output / propose instead of fcfs-reserve's calls
    plans_whole_step = True

    def __init__(self, config: SchedulerSettings, kv_capacity_tokens: int, policy: Policy,
                 log: RequestLog, cost: StepCost, replica: int = 0) -> None:
        self.config = config
        self.policy = policy
        self.log = log
        self.cost = cost
        self.replica = replica
        self.budget = config.max_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS
        #: optional on the settings (SchedulerConfig has no such field): None = unlimited
        self.max_model_len: int | None = getattr(config, "max_model_len", None)
        self.total_blocks = usable_blocks(kv_capacity_tokens)
        if self.total_blocks < 1:
            raise ConfigError(f"vllm-v1 needs at least 2 KV blocks of {BLOCK_SIZE} tokens (one "
                              f"is vLLM's null block), got {kv_capacity_tokens} tokens")
        self.free_blocks = self.total_blocks
        self.waiting: deque = deque()
        self.running: list = []  # admission order, prefilling requests included
        self._seq: dict[int, _Seq] = {}
        self.step_index = 0
        self.preemptions = 0

    @property
    def load(self) -> int:
        """Requests held (waiting, preempted, running): what a router balances."""
        return len(self.waiting) + len(self.running)

    def snapshot(self) -> tuple[int, int, int]:
        """(waiting, held, KV tokens in allocated blocks) after this step's allocations."""
        used = self.total_blocks - self.free_blocks
        return len(self.waiting), self.load, used * BLOCK_SIZE

    def add(self, request) -> None:
        """A request arrives at the back of `waiting` (doc 2.1); nothing is reserved."""
        self._seq[request.index] = _Seq()
        self.waiting.append(request)

    # -- schedule() (doc 3) ---------------------------------------------------------------------

    def _cap(self, tokens: int) -> int:
        limit = self.max_model_len
        return tokens if limit is None or tokens <= limit else limit

    def schedule(self, now: float) -> StepPlan:
        """Phase 1 over `running` in admission order, then (only if nothing was preempted)
        phase 2 over `waiting`, FCFS; advances each scheduled request's C (doc 3.2-3.5)."""
        return self._plan(0, self.budget, now)

    def schedule_after(self, head: int, blocks: int, tokens: int, now: float) -> StepPlan:
        """`schedule()` where its phase 1 runs the first `head` running requests' proposals
        whole, as `decode_room_sums` found it does (`blocks`: what they allocate; `tokens`:
        what they take of the budget): those blocks taken, then phase 1 over the rest and
        phase 2. The plan lists the rest's entries and phase 2's; the head's state is the
        caller's, who keeps it (`sync`) as after a segment's steps."""
        self.free_blocks -= blocks
        return self._plan(head, self.budget - tokens, now)

    def _plan(self, i: int, budget: int, now: float) -> StepPlan:
        """`schedule()` from running request i on, with `budget` tokens left."""
        plan, seqs = StepPlan(), self._seq
        scheduled, running, limit = plan.scheduled, self.running, self.max_model_len
        add = scheduled.append
        # (plain comparisons, not min/max: this loop runs once per running request and step)
        while i < len(running) and budget > 0:
            request = running[i]
            seq = seqs[request.index]
            total = request.prompt_tokens + request.generated  # N
            computed = seq.computed
            n = total + seq.spec - computed
            if n > budget:
                n = budget
            if limit is not None and n > limit - computed - 1:
                n = limit - computed - 1
            if n <= 0:
                i += 1
                continue
            need = -(-self._cap(computed + n) // BLOCK_SIZE) - seq.blocks  # blocks_for
            if need > 0:
                if need > self.free_blocks and not self._make_room(request, need, plan):
                    break  # it was the last one: preempted itself, and nothing is left to walk
                self.free_blocks -= need
                seq.blocks += need
            budget -= n
            drafts = n - (total - computed) if seq.spec else 0
            if drafts < 0:
                drafts = 0
            seq.spec = 0  # trimmed drafts are dropped; new ones come at the end of the step
            # _update_after_schedule: drafts count as computed
            seq.computed = computed + n
            prefilling = seq.prefilling
            add(Scheduled(request, n, computed, drafts, prefilling,
                          prefilling and request.generated > 0,
                          seq.placeholder and drafts > 0))
            i += 1
        while (not plan.preempted and budget > 0 and self.waiting
               and len(running) < self.config.max_num_seqs):
            request = self.waiting[0]
            seq = seqs[request.index]
            total = request.prompt_tokens + request.generated  # a resumed one: prompt + outputs
            if blocks_for(self._cap(total)) > self.free_blocks:
                break  # strict FCFS: nobody behind it is tried, nothing is preempted for it
            self.waiting.popleft()
            n = min(total, budget)
            seq.computed, seq.spec, seq.prefilling = n, 0, True  # from 0, as scheduled
            seq.blocks = blocks_for(self._cap(n))
            self.free_blocks -= seq.blocks
            running.append(request)
            if math.isnan(self.log.admitted_s[request.index]):  # the first admission
                self.log.admitted_s[request.index] = now
            budget -= n
            scheduled.append(Scheduled(request, n, 0, 0, True, request.generated > 0))
        return plan

    def _make_room(self, request, need: int, plan: StepPlan) -> bool:
        """Preempt `running[-1]` until `need` blocks are free (doc 3.3); False if `request`
        itself had to go."""
        while need > self.free_blocks:
            victim = self.running.pop()
            seq = self._seq[victim.index]
            self.free_blocks += seq.blocks
            seq.blocks = seq.computed = seq.spec = 0
            seq.prefilling, seq.placeholder = True, False
            victim.prefilled = 0
            self.waiting.appendleft(victim)
            self.preemptions += 1
            plan.preempted.append(victim)
            if victim is request:
                return False
        return True

    # -- the policy (doc 5.4) -------------------------------------------------------------------

    @property
    def kv_tokens(self) -> int:
        """The KV cache a policy's context says it has: the usable blocks' tokens."""
        return self.total_blocks * BLOCK_SIZE

    def context(self, batch: Sequence, now: float,
                lookahead: Callable[[int], np.ndarray] | None = None,
                allocating: int = 0) -> StepContext:
        """What the policy sees: KV room in whole blocks' tokens, the queue after scheduling
        (`allocating`: blocks the step being scheduled takes that are not taken yet)."""
        return StepContext(
            now_s=now, replica=self.replica, step_index=self.step_index, requests=batch,
            k_max=self.config.k_max, cost=self.cost,
            kv_capacity_tokens=self.kv_tokens,
            kv_free_tokens=(self.free_blocks - allocating) * BLOCK_SIZE,
            waiting=len(self.waiting), lookahead=lookahead,
        )

    def choose(self, batch: Sequence, now: float,
               lookahead: Callable[[int], np.ndarray] | None = None,
               ctx: StepContext | None = None) -> list[int]:
        """The policy's k for every request of `batch` (the requests of this step), checked
        against k_max (vLLM's num_speculative_tokens); `ctx`: the step's `context`, where the
        caller has built it."""
        if ctx is None:
            ctx = self.context(batch, now, lookahead)
        ks = [int(k) for k in self.policy.choose(ctx)]
        if len(ks) != len(batch):
            raise RuntimeError(f"policy {self.policy.name!r} returned {len(ks)} k for "
                               f"{len(batch)} requests")
        for k in ks:
            if not 0 <= k <= self.config.k_max:
                raise ConfigError(f"policy {self.policy.name!r} chose k={k}, outside the "
                                  f"engine's 0..k_max={self.config.k_max}; raise k_max or "
                                  "lower the policy's k")
        return ks

    # -- update_from_output() and the draft hand-off (doc 5, 7) ---------------------------------

    def update_from_output(self, plan: StepPlan, accepted: Sequence[int],
                           now: float) -> list[int]:
        """Commit the step: `accepted[i]` drafts of entry i were accepted (ignored for chunks).
        Returns the tokens each entry sampled: 0 for a chunk short of N, 1 for the chunk that
        completes it, accepted + 1 for a decode, cut at the request's length."""
        out = []
        seqs, limit = self._seq, self.max_model_len
        for entry, acc in zip(plan.scheduled, accepted):
            request = entry.request
            seq = seqs[request.index]
            total = request.prompt_tokens + request.generated
            if entry.prefill:
                request.prefilled = min(seq.computed, request.prompt_tokens)
                if seq.computed < total:
                    out.append(0)  # a partial chunk samples nothing
                    continue
                seq.prefilling = False
                request.generated += 1
                request.draft_feed = FIRST_FEED
                if math.isnan(self.log.first_token_s[request.index]):
                    self.log.first_token_s[request.index] = now
                out.append(1)
                continue
            room = request.output_tokens - request.generated
            if limit is not None and room > limit - total:
                room = limit - total
            emit = acc + 1 if acc < room else room  # min(acc + 1, room)
            seq.computed -= entry.drafts - acc  # rejected drafts roll back; blocks stay
            request.generated += emit
            request.steps += 1
            request.drafted += entry.drafts
            request.accepted += emit - 1
            out.append(emit)
        return out

    def decoding(self, request) -> bool:
        """Whether a running request has sampled since it was last (re-)admitted: its next
        step is a decode, not a prompt chunk."""
        return not self._seq[request.index].prefilling

    def finished(self, request) -> bool:
        """Stops of doc 8 for token-id workloads: max tokens (the output length), max_model_len."""
        if request.generated >= request.output_tokens:
            return True
        limit = self.max_model_len
        return limit is not None and request.prompt_tokens + request.generated >= limit

    def drafter_runs(self, plan: StepPlan) -> bool:
        """vLLM's `_input_fits_in_drafter` (doc 5.3): the proposer runs only if every request
        of the step stays K tokens clear of max_model_len (C before the step + n + K <=
        max_model_len). If one does not, every request that goes on gets K drafts of token id
        0 instead, `propose(..., placeholder=True)`: verified like drafts, all rejected."""
        if self.max_model_len is None or not self.config.k_max:
            return True
        longest = max(entry.computed + entry.tokens for entry in plan.scheduled)
        return longest + self.config.k_max <= self.max_model_len

    def propose_all(self, requests: Sequence, drafts: Sequence[int]) -> None:
        """`propose` of each request's drafts (none of them placeholders)."""
        if self.max_model_len is not None:
            for request, d in zip(requests, drafts):
                self.propose(request, d)
            return
        seqs = self._seq
        for request, d in zip(requests, drafts):
            seq = seqs[request.index]
            seq.spec = d if d >= 0 else 0  # max(d, 0)
            seq.placeholder = False

    def propose(self, request, drafts: int, placeholder: bool = False) -> None:
        """The drafts `request` proposed at the end of this step (at most max_model_len - N),
        verified when it is next scheduled; a request not scheduled keeps its older ones.
        `placeholder`: they are vLLM's zeros (`drafter_runs`), and every one will be rejected."""
        if self.max_model_len is not None:
            drafts = min(drafts, self.max_model_len - request.prompt_tokens - request.generated)
        seq = self._seq[request.index]
        seq.spec = max(drafts, 0)
        seq.placeholder = placeholder

    def finish_done(self, now: float, candidates: Sequence | None = None) -> list:
        """Retire finished requests: records, blocks (free for the next step), policy state
        (`candidates`: where the caller knows them, the only ones that can have finished)."""
        finished, running = self.finished, self.running
        if candidates is None or self.max_model_len is not None:  # (a length limit: any)
            if candidates is not None and not any(finished(request) for request in candidates):
                return []
            done = [request for request in running if finished(request)]
            if not done:
                return []
            gone = {id(request) for request in done}
            self.running = [request for request in running if id(request) not in gone]
        else:  # found by position among the candidates (C-level), not by a pass over the batch
            keep, done = split_finished(running, candidates, finished)
            if not done:
                return []
            self.running = keep
        log = self.log
        for request in done:
            log.finish_s[request.index] = now
            log.steps[request.index] = request.steps
            log.drafted[request.index] = request.drafted
            log.accepted[request.index] = request.accepted
            self.free_blocks += self._seq.pop(request.index).blocks
            self.policy.finish(request.request_id)
        return done

    # -- stretches of plain decode steps (the replica's fast path) -------------------------------

    def steady(self) -> bool:
        """Whether the next steps are plain decodes of the running requests, as long as the
        budget and the free blocks allow: nothing waits, nothing is (re-)prefilling or holds
        placeholder drafts, and no max_model_len can be reached."""
        if self.waiting or self.max_model_len is not None:
            return False
        seqs = self._seq
        for request in self.running:
            seq = seqs[request.index]
            if seq.prefilling or seq.placeholder:
                return False
        return True

    def next_decode_blocks(self) -> int | None:
        """Where `steady`: the blocks `schedule()` would allocate for the next step if it runs
        every running request's proposal whole (its first step as `decode_room` checks it),
        else None (it would trim drafts or preempt)."""
        seqs, need, tokens = self._seq, 0, 0
        for request in self.running:  # decode_room's first step, from the proposals
            seq = seqs[request.index]
            tokens += 1 + seq.spec
            # C + n = (prompt + g - 1) + (1 + spec) tokens' blocks
            blocks = blocks_for(request.prompt_tokens + request.generated + seq.spec)
            if blocks > seq.blocks:
                need += blocks - seq.blocks
        return need if need <= self.free_blocks and tokens <= self.budget else None

    def room(self) -> Room:
        """Where `steady`: what runs of the running requests' decode steps take their
        allocations from (simulator/stepped.py): each one's drafts proposed for its next step
        and the blocks it holds (copies, moved by the run and handed back to `decoded`), the
        free blocks and the budget. (A steady request's C is its tokens less one, as a
        decode's.)"""
        seqs, running = self._seq, self.running
        proposals = np.fromiter((seqs[request.index].spec for request in running), np.int64,
                                len(running))
        blocks = np.fromiter((seqs[request.index].blocks for request in running), np.int64,
                             len(running))
        return Room(proposals, blocks, self.free_blocks, self.budget, self.total_blocks,
                    BLOCK_SIZE)

    def proposals(self, requests: Sequence) -> list[int]:
        """The drafts each of `requests` proposed for its next step."""
        seqs = self._seq
        return [seqs[request.index].spec for request in requests]

    def decode_room(self, prompt: np.ndarray, gen: np.ndarray, drafts: np.ndarray
                    ) -> tuple[int, np.ndarray, np.ndarray]:
        """Of the running requests' next decode steps (`gen`: tokens generated before each,
        requests x steps; `drafts`: each one's drafts per step, the same shape), how many
        `schedule()` runs whole, before one where the budget would trim drafts or blocks run
        out (it would preempt); the KV tokens in allocated blocks after each of those steps'
        scheduling (what a step record keeps), and each request's blocks after the last."""
        seqs = self._seq
        held = np.fromiter((seqs[request.index].blocks for request in self.running), np.int64,
                           len(self.running))
        # a decode step schedules C + n = (prompt + g - 1) + (1 + d) tokens' blocks; they stay
        blocks = np.maximum.accumulate(np.maximum(
            blocks_for(prompt[:, None] + gen + drafts), held[:, None]), axis=1)
        allocated = blocks.sum(axis=0) - int(held.sum())
        fits = (allocated <= self.free_blocks) & (len(self.running) + drafts.sum(axis=0)
                                                  <= self.budget)
        n = len(fits) if fits.all() else int(fits.argmin())
        kv = (self.total_blocks - self.free_blocks + allocated[:n]) * BLOCK_SIZE
        return n, kv, blocks[:, n - 1] if n else held

    def walk_blocks(self, request, chain: np.ndarray, drafts) -> np.ndarray:
        """The blocks `request` holds before each step of a walk from where it is (`chain`:
        tokens generated before each step and after the last; `drafts`: each step's, or one
        for all) and after its last, as `decode_room` allocates them: a decode step schedules
        C + n = prompt + g + d tokens' blocks, and blocks are never given back while running."""
        held = self._seq[request.index].blocks
        out = np.empty(len(chain), dtype=np.int64)
        out[0] = held
        need = blocks_for(request.prompt_tokens + chain[:-1] + drafts)
        out[1:] = np.maximum.accumulate(np.maximum(need, held))
        return out

    def decode_room_sums(self, requests: int, allocated: np.ndarray, drafted
                         ) -> tuple[int, np.ndarray]:
        """`decode_room` from the batch's sums (simulator/batch_columns.py): of the steps
        whose blocks allocated since the first (`allocated`) and drafts (`drafted`: per step,
        or one for all) are given, how many `schedule()` runs whole, and the KV tokens in
        allocated blocks after each of those steps' scheduling. The caller takes the blocks
        (`take_blocks`, or `schedule_after` for a step's first requests) and keeps each
        request's own (`sync`)."""
        fits = (allocated <= self.free_blocks) & (requests + drafted <= self.budget)
        n = len(fits) if fits.all() else int(fits.argmin())
        kv = (self.total_blocks - self.free_blocks + allocated[:n]) * BLOCK_SIZE
        return n, kv

    def take_blocks(self, blocks: int) -> None:
        """Blocks the running requests took in steps that `decode_room_sums` allowed."""
        self.free_blocks -= blocks

    def sync(self, request, blocks: int, spec: int) -> None:
        """A running request's state after decode steps committed from its walk (`decoded`
        of one request, where the replica keeps the batch's sums and reads a request's
        progress only where something needs it): its KV entries, its blocks (already counted
        out of the free ones) and the drafts it proposed for its next step."""
        seq = self._seq[request.index]
        seq.blocks, seq.spec = blocks, spec
        seq.computed = request.prompt_tokens + request.generated - 1

    def decoded(self, blocks: np.ndarray, proposals: list[int]) -> None:
        """The running requests took decode steps as `decode_room` allowed (the replica
        committed them to the requests): their KV entries, their blocks (`blocks`), and the
        drafts each proposed at the end of the last (`proposals`; a finished one's is unused)."""
        seqs = self._seq
        for request, held, spec in zip(self.running, blocks.tolist(), proposals):
            seq = seqs[request.index]
            self.free_blocks -= held - seq.blocks
            seq.blocks, seq.spec = held, spec
            seq.computed = request.prompt_tokens + request.generated - 1

    # -- the workload ---------------------------------------------------------------------------

    @staticmethod
    def check_fits(request_ids, prompt_tokens, output_tokens, config: SchedulerSettings,
                   kv_capacity_tokens: int) -> None:
        """Refuse a request that could not finish even alone: at its last step it holds
        prompt + output - 1 tokens plus up to k_max drafts, and a request that cannot get its
        blocks with the whole pool would preempt itself forever."""
        usable = usable_blocks(kv_capacity_tokens)
        if usable < 1:
            raise ConfigError(f"vllm-v1 needs at least 2 KV blocks of {BLOCK_SIZE} tokens (one "
                              f"is vLLM's null block), got {kv_capacity_tokens} tokens")
        prompt = np.asarray(prompt_tokens, dtype=np.int64)
        peak = prompt + np.asarray(output_tokens, dtype=np.int64) - 1 + config.k_max
        limit = getattr(config, "max_model_len", None)
        if limit is not None:
            if int(prompt.max()) >= limit:
                worst = int(np.argmax(prompt))
                raise ConfigError(f"request {int(request_ids[worst])} has a {int(prompt[worst])}"
                                  f"-token prompt; vLLM rejects prompts of max_model_len "
                                  f"({limit}) tokens or more")
            peak = np.minimum(peak, limit)
        need = -(-peak // BLOCK_SIZE)
        worst = int(np.argmax(need))
        if need[worst] > usable:
            raise ConfigError(
                f"request {int(request_ids[worst])} can need {int(need[worst])} KV blocks "
                f"(prompt + output - 1 + k_max = {int(peak[worst])} tokens) but a replica has "
                f"{usable} usable blocks ({kv_capacity_tokens} tokens // {BLOCK_SIZE}, less "
                "vLLM's null block); use more KV cache or cap the lengths")
