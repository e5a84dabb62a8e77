"""The policy protocol: what a speculation-length policy sees each step and what it is told after.

The same policy objects run in the simulator and in the live engine, so a policy only ever sees
signals a real engine could see: its requests' own outcomes for positions that were actually
verified (up to and including the first rejection), batch composition, the cost model and KV room.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from policies.kernels import compiled


class PolicyError(ValueError):
    """A user-facing policy problem (unknown name or parameter, bad value); one clear line."""


class RequestView(Protocol):
    """Read-only view of one running request (the engine's own state object; do not mutate).

    An engine whose drafter knows before verification how many tokens it can propose at the
    next position (an n-gram lookup's match) also gives `draftable` (None: no limit); read it
    with getattr, as not every engine has it."""

    request_id: int
    prompt_tokens: int
    output_tokens: int  # the request's max tokens: the engine stops there
    generated: int  # tokens emitted so far, including the prefill's first token
    steps: int  # decode steps taken
    drafted: int  # draft tokens proposed so far
    accepted: int  # draft tokens accepted so far
    #: tokens the next chain's first draft pass feeds: its catch-up on what the target committed
    #: since the last chain (simulator/draft_feed.py), what `StepCost.step_s` takes as `feeds`.
    #: After k = 0 steps it holds a backlog that drafting pays once, whenever it resumes: a
    #: per-step objective that charges it to one step stops drafting for good (policies/goodput.py)
    draft_feed: int

    @property
    def context_tokens(self) -> int:
        """prompt + generated: the sequence length the next step attends over."""
        ...


class StepCost(Protocol):
    """The serving system's own cost model (the simulator's latency model, not a copy)."""

    def step_s(self, ks: Sequence[int], context_tokens: Sequence[int],
               feeds: Sequence[int] | None = None) -> float:
        """Predicted seconds of one decode step with per-request k and context lengths; `feeds`
        (the requests' `draft_feed`) prices the chain's first draft pass as the engine does, where
        a draft model runs (None: one token per request)."""
        ...


def price_steps(cost: StepCost, ks_rows: Sequence[Sequence[int]] | np.ndarray,
                context_tokens: Sequence[int]) -> list[float]:
    """`cost.step_s` of each row of `ks_rows` (alternatives for the same requests; lists, or
    an integer matrix): through the cost model's `steps_s` where it has one (the simulator's
    prices them at once, to the same floats), else one call per row."""
    many = getattr(cost, "steps_s", None)
    if many is not None:
        return many(ks_rows, context_tokens)
    if isinstance(ks_rows, np.ndarray):
        ks_rows = ks_rows.tolist()
    return [cost.step_s(ks, context_tokens) for ks in ks_rows]


def prefix_counts(rows: np.ndarray, totals: Sequence[int] | np.ndarray, b: int
                  ) -> list[list[int]]:
    """A planner's alternatives as ks: for each total D of `totals`, each of the `b` requests'
    count among the first D entries of `rows` (its drafts ranked best first, by request);
    compiled where the simulator's loops run (policies/compiled.py), the same integers."""
    loops = compiled()
    if loops is not None:
        return loops.prefix_counts(rows, np.asarray(totals, dtype=np.int64), b).tolist()
    return [np.bincount(rows[:d], minlength=b).tolist() for d in totals]


class SumsPricer:
    """`cost.chain_sums_s` where the cost model prices a step from its verify pass's sums (a
    model-free drafter on a latency model whose arrays give its scalars' numbers), else None;
    asked once per cost model, as a planner that prices every step calls it every step."""

    __slots__ = ("_of", "_sums")

    def __init__(self) -> None:
        self._of: object = None  # the cost model `_sums` was read from
        self._sums: Callable | None = None

    def __call__(self, cost: StepCost) -> Callable | None:
        if self._of is not cost:
            sums = getattr(cost, "chain_sums_s", None)
            self._of = cost
            self._sums = sums if sums is not None and sums(1, [0], 0, [0]) is not None else None
        return self._sums


@dataclass(frozen=True, slots=True)
class StepContext:
    """Everything a policy may look at when choosing k for the running requests of one step."""

    now_s: float
    replica: int
    step_index: int
    requests: Sequence[RequestView]
    k_max: int  # the engine's hard cap on k (KV look-ahead reserved per request)
    cost: StepCost
    kv_capacity_tokens: int
    kv_free_tokens: int
    waiting: int  # requests queued at this replica, not yet admitted
    #: simulation only, and only for policies with `simulation_only = True`: a request's future
    #: accepted runs (run[t] for every output position), i.e. what an oracle would know.
    lookahead: Callable[[int], np.ndarray] | None = None

    @property
    def batch_size(self) -> int:
        return len(self.requests)


@dataclass(frozen=True, slots=True)
class DraftOutcome:
    """What verification revealed for one request in one step.

    `signals` hold per-position values (kl, draft_top1, draft_entropy, accept_prob) for the
    positions whose prefix was the true one: the accepted drafts and the first rejected one.
    They are filled only with the signals the policy declared in `Policy.signals`.
    """

    request_id: int
    k: int
    accepted: int
    emitted: int
    position: int  # output position of the first drafted token
    signals: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepOutcomes:
    """One step's `DraftOutcome`s as columns (`Policy.observe_columns`), one row per request:
    row r is request `request_ids[r]`'s. `signals[name]` is (requests x width) float64 whose
    row r holds the positions from `position[r]` on, of which the first `lengths[name][r]` are
    the revealed ones (a `DraftOutcome`'s slice); the rest are not to be read. An engine that
    has a step's numbers as arrays hands them on without building an object per request."""

    request_ids: Sequence[int]
    k: np.ndarray  # int64, like accepted, emitted and position
    accepted: np.ndarray
    emitted: np.ndarray
    position: np.ndarray
    signals: Mapping[str, np.ndarray] = field(default_factory=dict)
    lengths: Mapping[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, outcomes: Sequence[DraftOutcome], names: Iterable[str] | None = None
           ) -> StepOutcomes:
        """The columns of `outcomes`, with the signals in `names` (None: every one they have;
        a signal an outcome lacks, or holds as None: length 0 in its row). Refuses what no
        verification gives (a count that is not a non-negative integer, a signal that is not a
        vector of numbers) with a ValueError naming the request."""
        wanted = (sorted({name for o in outcomes for name in o.signals}) if names is None
                  else sorted(names))
        signals, lengths = {}, {}
        for name in wanted:
            rows = [_signal_row(o, name) for o in outcomes]
            lengths[name] = np.array([len(row) for row in rows], dtype=np.int64)
            matrix = np.full((len(outcomes), max(map(len, rows), default=0)), np.nan)
            for r, row in enumerate(rows):
                matrix[r, :len(row)] = row
            signals[name] = matrix
        counts = np.array([[_count(o, attr) for attr in ("k", "accepted", "emitted", "position")]
                           for o in outcomes], dtype=np.int64).reshape(len(outcomes), 4)
        k, accepted, emitted, position = counts.T.copy()
        return cls([o.request_id for o in outcomes], k, accepted, emitted, position, signals,
                   lengths)

    def outcomes(self) -> list[DraftOutcome]:
        """The `DraftOutcome` of every row, its signals as float64 vectors (one it lacked:
        empty)."""
        ks, accepted = self.k.tolist(), self.accepted.tolist()
        emitted, position = self.emitted.tolist(), self.position.tolist()
        lengths = {name: self.lengths[name].tolist() for name in self.signals}
        return [DraftOutcome(rid, ks[r], accepted[r], emitted[r], position[r],
                             {name: matrix[r, :lengths[name][r]]
                              for name, matrix in self.signals.items()})
                for r, rid in enumerate(self.request_ids)]


#: set while `Policy.observe` and `observe_columns` forward a step to each other: the one
#: forwarded to does not forward it back
_FORWARDING: ContextVar[bool] = ContextVar("spectune_policy_forwarding", default=False)


@contextmanager
def _forwarding():
    token = _FORWARDING.set(True)
    try:
        yield
    finally:
        _FORWARDING.reset(token)


def _count(outcome: DraftOutcome, attr: str) -> int:
    """An outcome's count, checked: a non-negative integer."""
    value = getattr(outcome, attr)
    try:
        count = operator.index(value)
    except TypeError:
        count = -1
    if count < 0 or isinstance(value, (bool, np.bool_)):
        raise ValueError(f"outcome of request {outcome.request_id}: {attr} must be a "
                         f"non-negative integer, got {value!r}")
    return count


def _signal_row(outcome: DraftOutcome, name: str) -> np.ndarray:
    """An outcome's values of one signal as a float64 vector (none where it has none)."""
    values = outcome.signals.get(name)
    if values is None:
        return np.zeros(0)
    try:
        row = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        row = None
    if row is None or row.ndim != 1:
        raise ValueError(f"outcome of request {outcome.request_id}: signal {name!r} must be a "
                         f"vector of numbers, one per revealed position, got {values!r}")
    return row


class RequestWalker(Protocol):
    """One request's `choose` and `observe`, for a policy whose k for a request depends on that
    request's outcomes alone (`Policy.walker`): an engine that knows the request's future
    (a simulator) asks it step after step for that request only, without a batch. A walker may
    also offer `walk_all(start, run, cap)`, the whole walk from output position `start` at once
    as (walk, drafts) arrays, or None (simulator/request.py, `walk_alone`)."""

    def k(self, position: int) -> int:
        """What `choose` gives the request at this output position, 0..the engine's k_max,
        before the drafter's own cap; with the policy's draft stop applied where
        `Policy.walker_stops` says so."""
        ...

    def saw(self, drafted: int, accepted: int, emitted: int, position: int) -> None:
        """`observe` of the request's step at `position` (a `DraftOutcome`'s numbers)."""
        ...


@dataclass
class RequestStates:
    """A policy's state of some requests as arrays, for an engine that runs their steps in a
    compiled loop (simulator/compiled_walked.py: the walked policies' under vLLM's scheduler,
    where a step verifies the k chosen a step earlier; goodput's and the oracle's under every
    scheduler): `kind` names the policy's rules there; `state`, `level` and `rate` are each
    request's integer and float state, or the batch's (goodput; the policy says which is
    what), `knobs` and `weights` its integer and float parameters. The loop moves the three
    states in place and the policy's `keep_states` takes them back."""

    kind: str
    state: np.ndarray
    level: np.ndarray
    rate: np.ndarray
    knobs: np.ndarray
    weights: np.ndarray


class HeldSteps:
    """The steps an engine ran on one `choose` of a policy that holds (`Policy.hold`): the
    first and those held after it, as (requests x steps) integer arrays, the requests in the
    order of the step's `ctx.requests`. One column is one step's outcomes (`DraftOutcome`).

    The arrays are built when first read: an engine that keeps the batch's sums per step
    (simulator/batch_columns.py) has `column_sums` without them, and a policy that reads
    only those never pays for them."""

    __slots__ = ("_arrays", "_build", "request_ids", "steps", "sums")

    def __init__(self, request_ids: Sequence[int], steps: int,
                 build: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
                 sums: tuple[Sequence[int], Sequence[int], Sequence[int]] | None = None):
        self.request_ids = request_ids
        self.steps = steps
        #: `column_sums()`, where the engine has them already (it sums whole segments at once)
        self.sums = sums
        self._build = build  # () -> (k, accepted, emitted, position)
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def _read(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if self._arrays is None:
            self._arrays = self._build()
        return self._arrays

    @property
    def k(self) -> np.ndarray:
        """Drafts proposed: the chosen k, or fewer where the drafter ran out."""
        return self._read()[0]

    @property
    def accepted(self) -> np.ndarray:
        """Accepted drafts that count (emitted - 1)."""
        return self._read()[1]

    @property
    def emitted(self) -> np.ndarray:
        return self._read()[2]

    @property
    def position(self) -> np.ndarray:
        """Output position of the step's first drafted token."""
        return self._read()[3]

    def column_sums(self) -> tuple[Sequence[int], Sequence[int], Sequence[int]]:
        """Per step, over the requests: accepted drafts, drafts, and first rejections seen
        (requests that accepted fewer than they drafted)."""
        if self.sums is not None:
            return self.sums
        return (self.accepted.sum(axis=0).tolist(), self.k.sum(axis=0).tolist(),
                (self.accepted < self.k).sum(axis=0).tolist())


class Policy:
    """Base class of speculation-length policies; subclasses are dataclasses of their parameters.

    Class attributes tell the engine what the policy needs, so it can skip work it does not:
      stateless_per_batch  k depends only on which requests are running (not on outcomes, time or
                           context): the engine may ask once per change of the running set, and
                           need not bring the requests' progress (generated, steps, ...) up to
                           date before it asks (the simulator's fast path reads it lazily).
      signals              per-position signals `observe` wants (subset of traces.SIGNALS).
      uses_draft_stop      `stop_drafting` is consulted during drafting (confidence-style rules).
      stop_signals         the signals an override of `stop_chains` reads; the simulator leaves
                           the others out (a requests x 0 array), as building them costs.
                           `stop_positions` reads them too.
      simulation_only      needs `StepContext.lookahead` (an oracle); refused by the live engine.
      walker_stops         its `walker` applies its draft stop; else a simulator walks it only
                           where it folds the stop into the drafter's cap (`stop_positions`).
      compiled_steps       its steps run in compiled loops where they are loaded: the
                           requests from which a run of it repays loading them (0: none
                           shorter than any policy's, simulator/kernels.py); per instance,
                           `runs_repay_from` (its parameters may change it).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    stateless_per_batch: ClassVar[bool] = False
    signals: ClassVar[frozenset[str]] = frozenset()
    uses_draft_stop: ClassVar[bool] = False
    stop_signals: ClassVar[frozenset[str]] = frozenset({"draft_top1", "draft_entropy"})
    simulation_only: ClassVar[bool] = False
    walker_stops: ClassVar[bool] = False
    compiled_steps: ClassVar[int] = 0

    def runs_repay_from(self) -> int:
        """The requests from which a run of this policy, with these parameters, repays loading
        the compiled loops (`compiled_steps`)."""
        return self.compiled_steps

    @classmethod
    def replaces(cls, name: str, *methods: str) -> bool:
        """Whether this class overrides `name` (a fast form: `stop_positions`, `walker`) in a
        class at least as derived as each that defines one of `methods`, the ones it stands
        for: a subclass that changed one of those without redefining `name` keeps the slow,
        exact path rather than its parent's fast form of rules it no longer follows."""
        if getattr(cls, name) is getattr(Policy, name):
            return False
        own = next(c for c in cls.__mro__ if name in vars(c))
        return all(issubclass(own, next(c for c in cls.__mro__ if m in vars(c)))
                   for m in methods)

    @classmethod
    def unused_parameters(cls, pinned: Mapping[str, Any]) -> frozenset[str]:
        """Parameters that do nothing given the pinned ones: a tuner does not search them."""
        return frozenset()

    def may_draft(self, k_max: int) -> bool:
        """Whether this policy can draft at all under an engine look-ahead of `k_max`: an
        engine serving one that cannot runs without speculation (no proposer to pay for)."""
        return k_max > 0

    def choose(self, ctx: StepContext) -> Sequence[int]:
        """k for every request of `ctx.requests`, in the same order, each in 0..ctx.k_max.

        Adaptive policies clamp their choice to `ctx.k_max` (the engine's KV look-ahead); a
        policy told to draft a fixed k above it is a configuration error the engine reports.
        """
        raise NotImplementedError

    def k_by_batch(self, cost: StepCost, k_max: int, largest: int) -> list[int] | None:
        """The k that `choose` gives every request of a running batch of b requests, for b
        = 0..`largest` (larger batches: the last), where it depends on nothing else (its cost
        model is `cost`); None (the default) elsewhere. A simulator runs such a policy's whole
        run in one compiled loop too, walking the batch anew where its k changes; read only
        from the class that also defines `choose` (`replaces`)."""
        return None

    def constant_k(self, k_max: int) -> int | None:
        """The k that `choose` gives every request at every step under a look-ahead of
        `k_max` (before a drafter's caps and a folded stop), where it always does; None (the
        default) where its ks depend on anything else, or where it would be refused. A
        simulator runs such a policy's whole run in one compiled loop (simulator/whole_run.py);
        a subclass that redefines `choose` is not trusted with its parent's (`replaces`)."""
        return None

    @classmethod
    def observes(cls) -> bool:
        """Whether it learns from outcomes: it overrides `observe` or `observe_columns` (an
        engine that knows it does not skips building them)."""
        return (cls.observe is not Policy.observe
                or cls.observe_columns is not Policy.observe_columns)

    @classmethod
    def reads_columns(cls) -> bool:
        """Whether an engine tells it a step's outcomes as columns (`observe_columns`): it
        overrides that as far down as `observe`; else as objects (`observe`)."""
        return cls.replaces("observe_columns", "observe")

    def tell(self, ctx: StepContext, outcomes: Sequence[DraftOutcome]) -> None:
        """What an engine calls after verification: `outcomes` in the form the policy reads
        (`reads_columns`), so every engine calls the same method of a policy."""
        if type(self).reads_columns():
            self.observe_columns(ctx, StepOutcomes.of(outcomes, type(self).signals))
        else:
            self.observe(ctx, outcomes)

    def observe(self, ctx: StepContext, outcomes: Sequence[DraftOutcome]) -> None:
        """Called after verification with one outcome per request that was in the step. A
        policy overrides this or `observe_columns`; this one hands the outcomes' columns to
        the latter (with the signals the policy reads), once: a subclass that overrides both
        and calls up from each is not sent round again."""
        if type(self).observe_columns is not Policy.observe_columns and not _FORWARDING.get():
            with _forwarding():
                self.observe_columns(ctx, StepOutcomes.of(outcomes, type(self).signals))

    def observe_columns(self, ctx: StepContext, outcomes: StepOutcomes) -> None:
        """`observe` of a step's outcomes as columns, one row per request: what an engine that
        has them as arrays calls where the policy reads them so (`reads_columns`), sparing an
        object per request. This one hands their objects to `observe`, once (as `observe`)."""
        if type(self).observe is not Policy.observe and not _FORWARDING.get():
            with _forwarding():
                self.observe(ctx, outcomes.outcomes())

    def hold(self) -> int:
        """After `choose`: how many more steps of the same requests it would give the same ks,
        whatever those steps reveal. The engine may then run them without asking (costed at once,
        up to the next arrival or finish) and report them all to `observe_held`. 0 (the
        default): ask every step. A policy that holds reads no `signals` and no draft stop."""
        return 0

    def observe_held(self, ctx: StepContext, steps: HeldSteps) -> None:
        """The steps of one held choice, in order: each stands for one `choose` (the later ones
        gave the first one's ks) and one `observe` of its column. A policy whose `hold` can be
        above 0 implements it; `ctx` is the last step's."""
        raise NotImplementedError(f"policy {self.name!r} holds its k but has no observe_held")

    def stop_drafting(
        self, request: RequestView, depth: int, draft_top1: float, draft_entropy: float
    ) -> bool:
        """Draft-stop rules, asked after each draft token with that token's signals.

        `depth` is the token's 0-based place in the chain. True stops the chain after it: the
        token is kept and verified (as transformers' ConfidenceCriteria and DSDE's AdaEDL loop
        do), so a chain stopped at depth d drafts d + 1 tokens and costs d + 1 draft passes.
        """
        return False

    def stop_chains(self, requests: Sequence[RequestView], ks: Sequence[int],
                    draft_top1: np.ndarray, draft_entropy: np.ndarray) -> list[int]:
        """`stop_drafting` over whole chains: each request's chain length under the rule, at
        most its k. Row i of the (requests x max k) float64 arrays holds request i's signals at
        the positions its chain drafts. An engine calls this instead of `stop_drafting` token by
        token only where a policy overrides it (with an array form that decides the same)."""
        out = []
        for request, k, top1, entropy in zip(requests, ks, draft_top1.tolist(),
                                             draft_entropy.tolist()):
            for d in range(k):
                if self.stop_drafting(request, d, top1[d], entropy[d]):
                    k = d + 1
                    break
            out.append(k)
        return out

    def walks_apart(self) -> bool:
        """Whether each request's walk (`walker`) depends on that request alone: its walker
        reads nothing another request's steps or finish wrote (as a start carried over from
        the last finished request). A simulator may then make the walks in any order, ahead
        of the run (simulator/whole_run.py). False by default; read only from a class at least
        as derived as the one that defines `walker` (`replaces`)."""
        return False

    def walker(self, request_id: int, k_max: int,
               signals: Mapping[str, np.ndarray]) -> RequestWalker:
        """Overridden by a policy whose k for each request depends on nothing but that
        request's own outcomes (not on the batch, the load, the time or other requests, but
        where its batch overrules it and says so: `walks_agree`): the
        request's `choose` and `observe` one step at a time, from its state now (`signals`: its
        trace's signals per output position, those the policy reads). A simulator then walks
        each request's whole decode at once instead of asking every step, so the policy's
        state moves as `observe` would move it but all at once, when the decode starts, ahead
        of the clock, and never again. Used only where the class that defines it also defines
        `choose`, `observe` and (unless folded, `stop_positions`) the draft stop
        (`replaces`), and where `walks_with` the cost model. A `simulation_only` policy's
        walker is also given `run=`, the request's accepted runs (what `StepContext.lookahead`
        gives for it)."""
        raise NotImplementedError(f"policy {self.name!r} does not walk requests alone")

    def walks_with(self, cost: StepCost) -> bool:
        """Whether its `walker` stands for `choose` under this cost model (default: yes). A
        policy whose walks hold only while its batch does not overrule them (`walks_agree`)
        says no where checking that would cost more than asking every step."""
        return True

    def walks_agree(self, ctx: StepContext, positions: np.ndarray) -> int:
        """For a policy whose k per request follows its walker unless the batch overrules it
        (the oracle's batch cap): of the next steps, where each running request of
        `ctx.requests` stands at output position `positions[r, t]` before step t (requests x
        steps, from their walks), how many from the first `choose` would give the walks' ks.
        A simulator takes the step after them one at a time, through `choose`, and walks anew
        the requests that step took off their walks (with whole prompts, every one), so a
        policy that overrides this learns nothing from outcomes (`observes` False: its
        stepped steps are told nothing, and its walks are made again); one that does is never
        walked. The default: all of them (the walker alone decides)."""
        return positions.shape[1]

    def stop_positions(self, signals: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """Where the stop rule reads nothing but the drafted token's own signals (not the
        request, its state or the token's depth): for a request's whole trace (`signals`: its
        `stop_signals` per position, float64), True at each position a chain stops after. A
        simulator then folds the rule into the drafter's cap per position, once per request,
        instead of asking it every step (the request view's `draftable` then includes the stop,
        so such a policy should not read it). Used only where the class that defines it also
        defines the rule (`replaces`). None (the default): the rule depends on more."""
        return None

    def finish(self, request_id: int) -> None:
        """The request left the system: drop any per-request state."""

    def params(self) -> dict[str, Any]:
        """The policy's parameters (dataclass fields) for records and reports."""
        from dataclasses import asdict, is_dataclass

        return asdict(self) if is_dataclass(self) else {}
