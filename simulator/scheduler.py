"""One rule book for admission, prefill chunks, k and finishing, shared by the simulator's
replicas and the live engine.

The scheduler is pure bookkeeping, as in nano-vllm (an engine step is schedule -> run ->
postprocess): it keeps the queues and the KV reservations, decides who is admitted and which
prompt chunks run, checks the policy's k and builds what the policy sees, and retires finished
requests. It knows no clock (callers pass `now`) and no torch: `simulator/replica.py` executes
its plans with the cost model and replayed acceptance, `live/loop.py` with real
forward passes. Validation means something because both follow this one copy of the rules.

The rules (FCFS with reservation): a request reserves prompt + output + k_max KV tokens on
admission and keeps them until it finishes, so nothing is ever preempted; waiting requests are
admitted in arrival order while the batch cap (`max_num_seqs`), the KV cache and the token
budget allow, and the first that does not fit stops admission (no skipping ahead).

This module also holds the registry (`--scheduler NAME`). The second rule book, "vllm-v1"
(vLLM V1's block allocation, one token budget, preemption by recompute), lives in
simulator/scheduler_vllm.py: docs/vllm-v1-scheduler.md, section "What spectune models".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from policies import Policy, StepContext, StepCost
from simulator.draft_feed import FIRST_FEED
from simulator.errors import ConfigError

if TYPE_CHECKING:  # pandas: only the engines that write logs load it
    from simulator.logs import RequestLog

#: a prompt chunk of one iteration: (request, tokens in this chunk, tokens already cached)
Chunk = tuple[Any, int, int]


class SchedulerSettings(Protocol):
    """What a scheduler reads of its configuration (simulator/config.py's `SchedulerConfig`,
    which imports this module to check the name it is given)."""

    scheduler: str
    max_num_seqs: int
    max_batched_tokens: int | None
    chunked_prefill: bool
    k_max: int


_SCHEDULERS: dict[str, type] = {}
_S = TypeVar("_S", bound=type)


def register_scheduler(cls: _S) -> _S:
    """Class decorator: make a scheduler selectable by its `name` (`--scheduler NAME`).

    A class with `plans_whole_step = True` (simulator/scheduler_vllm.py's "vllm-v1", which
    simulator/config.py imports so that it is always registered) is run by the replica as
    vLLM's schedule / update_from_output instead of this class's calls."""
    if cls.name in _SCHEDULERS and _SCHEDULERS[cls.name] is not cls:
        raise TypeError(f"scheduler name {cls.name!r} is already registered")
    _SCHEDULERS[cls.name] = cls
    return cls


def scheduler_names() -> list[str]:
    return sorted(_SCHEDULERS)


def scheduler_class(name: str) -> type:
    """The class registered as `name` (KeyError if none)."""
    return _SCHEDULERS[name]


def make_scheduler(config: SchedulerSettings, kv_capacity_tokens: int, policy: Policy,
                   log: RequestLog, cost: StepCost, replica: int = 0) -> Any:
    """The scheduler `config.scheduler` names, for one replica (or the live engine): a
    `Scheduler`, or a class that `plans_whole_step` (simulator/scheduler_vllm.py)."""
    return _SCHEDULERS[config.scheduler](config, kv_capacity_tokens, policy, log, cost, replica)


@register_scheduler
class Scheduler:
    """The queues and KV reservations of one replica, and the rules that move requests on.

    Requests are any objects with the simulator's request fields (index, request_id,
    prompt_tokens, output_tokens, generated, prefilled, reserve, steps, drafted, accepted,
    draft_feed): `simulator.request.RequestState` and the live engine's `LiveRequest`."""

    name = "fcfs-reserve"
    #: False: the replica and the live loop run this class's calls one by one (vllm-v1 plans a
    #: whole step in one call: simulator/scheduler_vllm.py)
    plans_whole_step = False

    @staticmethod
    def check_fits(request_ids, prompt_tokens, output_tokens, config: SchedulerSettings,
                   kv_capacity_tokens: int) -> None:
        """Each request's whole reservation must fit a replica; without chunked prefill its
        prompt must also fit one iteration's token budget."""
        reserve = np.asarray(prompt_tokens) + np.asarray(output_tokens) + config.k_max
        worst = int(np.argmax(reserve))
        if reserve[worst] > kv_capacity_tokens:
            raise ConfigError(
                f"request {int(request_ids[worst])} needs {int(reserve[worst])} KV-cache tokens "
                f"(prompt {int(prompt_tokens[worst])} + output {int(output_tokens[worst])} + k_max "
                f"{config.k_max}) but a replica holds {kv_capacity_tokens}; use a GPU with more "
                "memory or cap the lengths"
            )
        budget = config.max_batched_tokens
        if budget is not None and not config.chunked_prefill:
            longest = int(np.argmax(prompt_tokens))
            if prompt_tokens[longest] > budget:
                raise ConfigError(
                    f"request {int(request_ids[longest])} has a "
                    f"{int(prompt_tokens[longest])}-token prompt, over the {budget}-token budget "
                    "per iteration; raise max_batched_tokens or use --chunked-prefill"
                )

    def __init__(self, config: SchedulerSettings, kv_capacity_tokens: int, policy: Policy,
                 log: RequestLog, cost: StepCost, replica: int = 0) -> None:
        self.config = config
        self.kv_capacity = kv_capacity_tokens
        self.policy = policy
        self.log = log
        self.cost = cost  # the step cost model the policy reads
        self.replica = replica
        self.waiting: deque = deque()
        self.prefilling: list = []  # admitted, prompt not whole yet
        self.running: list = []
        self.kv_used = 0
        self.step_index = 0
        #: counts the changes of `running` (a start, a finish): equal counts, the same requests
        #: (a request that starts and finishes in one prefill counts twice, the set unchanged)
        self.changes = 0

    @property
    def load(self) -> int:
        """Requests held (queued, prefilling, decoding): what a router balances."""
        return len(self.waiting) + len(self.prefilling) + len(self.running)

    def snapshot(self) -> tuple[int, int, int]:
        """(waiting, held, KV tokens reserved): what a step's record keeps of its start."""
        return len(self.waiting), self.load, self.kv_used

    # -- admission ---------------------------------------------------------------------------

    def add(self, request) -> None:
        """A request arrives: its KV reservation is fixed, and it waits (see check_fits)."""
        request.reserve = request.prompt_tokens + request.output_tokens + self.config.k_max
        self.waiting.append(request)

    def _fits(self, request) -> bool:
        return (len(self.running) + len(self.prefilling) < self.config.max_num_seqs
                and self.kv_used + request.reserve <= self.kv_capacity)

    def _admit(self, now: float) -> Any:
        request = self.waiting.popleft()
        self.kv_used += request.reserve
        self.log.admitted_s[request.index] = now
        self.prefilling.append(request)
        return request

    def admit_whole(self, now: float) -> list:
        """Whole-prompt admission (no chunking): FCFS while seqs, KV and token budget allow;
        the admitted prompts are prefilled in an iteration of their own."""
        admitted: list = []
        budget = self.config.max_batched_tokens or np.inf
        used = 0
        while self.waiting:
            request = self.waiting[0]
            if not self._fits(request) or used + request.prompt_tokens > budget:
                break
            used += request.prompt_tokens
            admitted.append(self._admit(now))
        return admitted

    def prefill_pending(self) -> bool:
        """Whether a chunked-prefill step could have a prompt to chunk: one being prefilled,
        or a waiting one that fits now (which only a finish or an arrival changes)."""
        return bool(self.prefilling) or (bool(self.waiting) and self._fits(self.waiting[0]))

    def plan_chunks(self, decode_tokens: int, now: float) -> list[Chunk]:
        """Chunked prefill: the token budget left after the decode requests' verify tokens goes
        to the prompts being prefilled (oldest first), then to waiting requests admitted FCFS
        while the batch cap and the KV cache allow."""
        budget = max(0, self.config.max_batched_tokens - decode_tokens)
        chunks: list[Chunk] = []
        for request in self.prefilling:
            if budget == 0:
                break
            n = min(request.prompt_tokens - request.prefilled, budget)
            chunks.append((request, n, request.prefilled))
            budget -= n
        while self.waiting and budget > 0 and self._fits(self.waiting[0]):
            request = self._admit(now)
            n = min(request.prompt_tokens, budget)
            chunks.append((request, n, 0))
            budget -= n
        return chunks

    def start_decoding(self, requests: Sequence, now: float) -> None:
        """Prompts now whole: each emitted its first token at `now`, and decodes from here."""
        done = {id(request) for request in requests}
        self.prefilling = [request for request in self.prefilling if id(request) not in done]
        self.changes += bool(requests)
        for request in requests:
            request.prefilled = request.prompt_tokens
            request.generated = 1
            request.draft_feed = FIRST_FEED
            self.log.first_token_s[request.index] = now
            self.running.append(request)

    # -- the policy --------------------------------------------------------------------------

    @property
    def kv_tokens(self) -> int:
        """The KV cache a policy's context says it has."""
        return self.kv_capacity

    def context(self, batch: Sequence, now: float,
                lookahead: Callable[[int], np.ndarray] | None = None) -> StepContext:
        """What the policy sees of this step."""
        return StepContext(
            now_s=now, replica=self.replica, step_index=self.step_index, requests=batch,
            k_max=self.config.k_max, cost=self.cost, kv_capacity_tokens=self.kv_tokens,
            kv_free_tokens=self.kv_capacity - self.kv_used, waiting=len(self.waiting),
            lookahead=lookahead,
        )

    def choose(self, batch: Sequence, now: float,
               lookahead: Callable[[int], np.ndarray] | None = None,
               ctx: StepContext | None = None) -> list[int]:
        """The policy's k for every request of `batch`, checked against the engine's k_max
        (`ctx`: this step's `context`, where the caller has built it)."""
        if ctx is None:
            ctx = self.context(batch, now, lookahead)
        ks = list(map(int, self.policy.choose(ctx)))
        if len(ks) != len(batch):
            raise RuntimeError(f"policy {self.policy.name!r} returned {len(ks)} k for "
                               f"{len(batch)} requests")
        k_max = self.config.k_max
        if ks and not 0 <= min(ks) <= max(ks) <= k_max:
            k = next(k for k in ks if not 0 <= k <= k_max)
            raise ConfigError(f"policy {self.policy.name!r} chose k={k}, outside the "
                              f"engine's 0..k_max={k_max}; raise k_max or lower the policy's k")
        return ks

    # -- finishing ---------------------------------------------------------------------------

    def finish_done(self, now: float, candidates: Sequence | None = None) -> list:
        """Retire the requests that reached their length: their records, their KV, the
        policy's state of them. Returns them, for the executor's own clean-up. `candidates`:
        where the caller knows them, the only running requests that can have reached it."""
        running = self.running
        if candidates is None:
            if not any(request.generated >= request.output_tokens for request in running):
                return []
            keep, done = [], []
            for request in running:
                (keep if request.generated < request.output_tokens else done).append(request)
        else:  # found by position among the candidates (C-level), not by a pass over the batch
            keep, done = split_finished(running, candidates, _reached_length)
            if not done:
                return []
        log = self.log
        for request in done:
            log.finish_s[request.index] = now
            log.steps[request.index] = request.steps
            log.drafted[request.index] = request.drafted
            log.accepted[request.index] = request.accepted
            self.kv_used -= request.reserve
            self.policy.finish(request.request_id)
        self.running = keep
        self.changes += 1
        return done


def _reached_length(request) -> bool:
    return request.generated >= request.output_tokens


def split_finished(running: list, candidates: Sequence, finished: Callable
                   ) -> tuple[list, list]:
    """`running` without its `finished` requests, and those in order, where only `candidates`
    can have finished: found by position (C-level) rather than by a pass over the batch; where
    a finished candidate is not running (a caller outside `finish_done`'s contract), every
    finished running request, as a pass finds them."""
    found = [request for request in candidates if finished(request)]
    try:
        at = sorted({running.index(request) for request in found})
    except ValueError:
        at = [i for i, request in enumerate(running) if finished(request)]
    keep = running.copy()
    for i in reversed(at):
        del keep[i]
    return keep, [running[i] for i in at]
