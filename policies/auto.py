"""`auto`: spectune's own speculation policy (docs/policy-auto.md).

Each step it drafts, for every request, the tokens whose expected worth beats their price on this
step's cost curve. A draft's worth is the chance it is accepted, from a survival model over the
request's state (new, cold, fresh, or a streak of drafts accepted in a row across steps: an
n-gram lookup that is copying keeps copying), learnt online from every verified position and
censoring-aware (only the accepted drafts and the first rejection count; nothing past it was
seen), scaled by the request's own accepted-over-expected ratio and, while drafting, by the
drafter's confidence. A first draft outside a streak is also worth the streak it may find.
The price is the latency model's: every "draft the D most likely tokens" is priced in one call and
the step takes the D with the most tokens per second, so load, batch size and context decide how
far to go without a parameter saying so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import ClassVar

import numpy as np

from policies.base import (
    Policy,
    RequestView,
    StepContext,
    StepOutcomes,
    SumsPricer,
    prefix_counts,
    price_steps,
)
from policies.kernels import compiled
from policies.registry import register
from policies.rows import RowPool

#: a request's state before a step: new (nothing verified yet), cold (its last chain's first draft
#: was rejected), fresh (its last chain accepted some, then a rejection) or a streak of L >= 1
#: drafts accepted in a row. Acceptance is learnt per bin: the first draft of a chain by the
#: request's state, a later one by its streak so far (streaks of MAX_STREAK or more share one)
NEW, COLD, FRESH = -2, -1, 0
MAX_STREAK = 16
STREAK_BINS = MAX_STREAK + 3  # new, cold, fresh, then streaks 1..MAX_STREAK
TOP1_BINS = 10  # the drafter's top-1 probability in tenths
ALPHA_MAX = 0.98  # no draft is certain: a chain's survival keeps falling
#: where the cost model does not price steps from their sums (a draft model, a tree, a profile),
#: the draft totals tried (one cost-model call each) are those of these survival thresholds and
#: TOTALS_TRIED totals spaced geometrically from 1 to all
THRESHOLDS = (0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05)
TOTALS_TRIED = 12


class StateRows(RowPool):
    """Requests' states, accepted and expected drafts as arrays, a row each: where runs of
    steps read and move them in place (simulator/stepped.py), instead of `Auto`'s dicts. A
    request's state is kept in one place, its row or the dicts; `known`: it has an entry (it
    drafted), as a key of the dicts."""

    def __init__(self, rows: int = 64) -> None:
        self.state = np.zeros(0, dtype=np.int64)
        self.observed = np.zeros(0)
        self.expected = np.zeros(0)
        self.known = np.zeros(0, dtype=np.bool_)
        super().__init__(rows)

    def _extend(self, n: int, rows: int) -> None:
        for name, fill in (("state", NEW), ("observed", 0.0), ("expected", 0.0),
                           ("known", False)):
            old = getattr(self, name)
            grown = np.full(rows, fill, dtype=old.dtype)
            grown[:n] = old
            setattr(self, name, grown)

    def rows(self, ids: Sequence[int], streak: dict[int, int], observed: dict[int, float],
             expected: dict[int, float]) -> np.ndarray:
        """Each request's row; a request without one takes one, its entry moving out of the
        dicts (none: NEW, 0.0, 0.0 and not known)."""
        out = np.empty(len(ids), dtype=np.int64)
        for i, rid in enumerate(ids):
            row, new = self.row(rid)
            if new:
                known = rid in streak
                self.state[row] = streak.pop(rid) if known else NEW
                self.observed[row] = observed.pop(rid) if known else 0.0
                self.expected[row] = expected.pop(rid) if known else 0.0
                self.known[row] = known
            out[i] = row
        return out

    def take(self, rid: int, streak: dict[int, int], observed: dict[int, float],
             expected: dict[int, float]) -> None:
        """A request's row back into the dicts (where it is known), its row freed."""
        row = self.release(rid)
        if self.known[row]:
            streak[rid] = int(self.state[row])
            observed[rid] = float(self.observed[row])
            expected[rid] = float(self.expected[row])


@register
@dataclass
class Auto(Policy):
    """Per request, per step: the drafts worth their price, from streak survival and the cost
    curve (module docstring). No parameter is searched by `spectune tune`: the defaults are
    meant to work as they are (the policy matrix ran them); pin one to try another value."""

    name: ClassVar[str] = "auto"
    description: ClassVar[str] = (
        "spectune's own: per-request k from each request's acceptance streak and the drafter's "
        "confidence, priced on this step's cost curve; works without tuning")
    signals: ClassVar[frozenset[str]] = frozenset({"draft_top1"})
    uses_draft_stop: ClassVar[bool] = True
    stop_signals: ClassVar[frozenset[str]] = frozenset({"draft_top1"})
    # (its steps run in compiled runs at about a tenth of their cost: a 300-request `spectune
    # simulate` of it took 0.84-0.95 s with the loops, 1.04 s without. kld_variance's runs save
    # less: 300 of its requests took 0.82-0.93 s with them, 0.73-0.74 without, so it loads them
    # from as many requests as other policies)
    compiled_steps: ClassVar[int] = 300

    k_max: int = field(default=10, metadata={
        "help": "largest k considered (also capped by the engine's k_max): the cost curve, not "
                "this cap, is meant to decide"})
    prior_alpha: float = field(default=0.6, metadata={
        "help": "acceptance of a draft assumed before any is verified"})
    prior_weight: float = field(default=4.0, metadata={
        "help": "pseudo-observations behind the prior: in each streak bin, behind a request's "
                "own ratio and behind each confidence bin's"})
    k0_bonus: float = field(default=1.0, metadata={
        "help": "tokens per second of drafting nothing are multiplied by this: speculation must "
                "win by that margin"})
    stop_slack: float = field(default=0.5, metadata={
        "help": "chains are drafted up to where their survival falls to this fraction of the "
                "step's threshold; the drafter's confidence then decides where each stops"})

    def __post_init__(self) -> None:
        if isinstance(self.k_max, bool) or not 0 <= self.k_max <= 64:
            raise ValueError(f"k_max must be in 0..64, got {self.k_max}")
        if not 0.0 < self.prior_alpha < 1.0:
            raise ValueError(f"prior_alpha must be in (0, 1), got {self.prior_alpha}")
        for name in ("prior_weight", "k0_bonus"):
            value = getattr(self, name)
            if not value > 0 or math.isinf(value):
                raise ValueError(f"{name} must be a positive number, got {value}")
        if not 0.0 < self.stop_slack <= 1.0:
            raise ValueError(f"stop_slack must be in (0, 1], got {self.stop_slack}")
        w = self.prior_weight
        self._seen = np.full(STREAK_BINS, float(w))  # verified positions by bin (see NEW)
        self._accepted = np.full(STREAK_BINS, w * self.prior_alpha)
        self._streak: dict[int, int] = {}  # each request's state: NEW, COLD, FRESH or L >= 1
        self._observed: dict[int, float] = {}  # a request's accepted drafts
        self._expected: dict[int, float] = {}  # ... and what the population predicted for them
        #: ... or, for the requests runs of steps read (simulator/stepped.py), their rows
        self._rows: StateRows | None = None
        self._top1_observed = np.zeros(TOP1_BINS)
        self._top1_expected = np.zeros(TOP1_BINS)
        # the last plan, for the draft stop: its requests, acceptance rows and threshold
        self._plan_ids: list[int] = []
        # ... their states and own ratios, current while no outcome or finish came after
        # (`_revision` then is `_plan_at`): observe_columns reads them instead of the dicts
        self._plan_states = np.zeros(0, dtype=np.int64)
        self._plan_ratios = np.zeros(0)
        self._plan_at = -1
        self._revision = 0  # outcomes and finishes so far
        self._plan_rows: dict[int, int] | None = None  # built where stop_drafting asks
        self._plan_alpha = np.zeros((0, 0))
        self._plan_confidence = np.ones(TOP1_BINS)
        self._through: dict[int, float] = {}  # stop_drafting's chain so far, per request
        self._threshold = math.inf
        self._sums_pricer = SumsPricer()  # the cost model's chain_sums_s, or None

    # -- estimates ---------------------------------------------------------------------------

    def acceptance(self, requests: Sequence[RequestView], depth: int) -> np.ndarray:
        """(requests x depth) chance that each request accepts its draft at each depth given it
        accepted those before: its bin's, times its ratio, at the drafter's mean confidence."""
        states, ratios = self._states_ratios([r.request_id for r in requests])
        rows, scales, _ = self._rows_scales(states, ratios, self._mean_lift())
        return self._acceptance_in(self._accepted / self._seen, rows, scales, depth)

    def _states_ratios(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Each request's state (NEW, COLD, FRESH or its streak) and its own ratio, accepted
        over expected with the prior behind it."""
        self._held(ids)
        streak, observed, expected = self._streak, self._observed, self._expected
        w = self.prior_weight
        return (np.array([streak.get(rid, NEW) for rid in ids], dtype=np.int64),
                np.array([(observed.get(rid, 0.0) + w) / (expected.get(rid, 0.0) + w)
                          for rid in ids]))

    @staticmethod
    def _rows_scales(states: np.ndarray, ratios: np.ndarray, mean_lift: float
                     ) -> tuple[np.ndarray, np.ndarray, bool]:
        """Each request's row of `BIN_TABLE` (its state), its ratio times the mean confidence
        lift (a draft's own confidence is known only once it is drafted: `stop_chains` uses
        it), and whether any request is outside a streak (new, cold or fresh)."""
        return (np.minimum(states, MAX_STREAK) - NEW, ratios * mean_lift,
                bool(len(states)) and int(states.min()) <= FRESH)

    @staticmethod
    def _acceptance_in(a_pop: np.ndarray, rows, scales: np.ndarray, depth: int) -> np.ndarray:
        """`acceptance` of requests in the given `BIN_TABLE` rows with the given scales, from
        the population's acceptance per bin `a_pop`."""
        return np.minimum(a_pop[BIN_TABLE[rows, :depth]] * scales[:, None], ALPHA_MAX)

    def _mean_lift(self) -> float:
        """The confidence factor of a draft whose confidence is not known yet: all of them."""
        w = self.prior_weight
        return ((float(_add(self._top1_observed)) + w)
                / (float(_add(self._top1_expected)) + w))

    def _discovery(self, ctx: StepContext, rows: np.ndarray, a_pop: np.ndarray,
                   scales: np.ndarray, survival: np.ndarray, contexts: list[int]) -> np.ndarray:
        """What accepting its first draft adds for a request outside a streak: how much more
        the next step's chain is worth in a streak than in its state now (each draft's chance
        less its price at this step, the drafts that pay summed). Where acceptance comes in
        spans (text being copied) a request that never drafts would never learn a span began;
        where it does not (i.i.d. drafts), a streak predicts nothing and this is 0."""
        price = self._draft_price(ctx, contexts)
        depth = survival.shape[1]
        # every request as if in a streak of 1: one row of bins for all
        streak_row = a_pop[BIN_TABLE[1 - NEW, :depth]]
        hot = np.minimum(streak_row * scales[:, None], ALPHA_MAX).cumprod(axis=1)
        gain = (_add(np.maximum(hot - price, 0.0), axis=1)
                - _add(np.maximum(survival - price, 0.0), axis=1))
        return np.where(rows <= FRESH - NEW, np.maximum(gain, 0.0), 0.0)

    def _draft_price(self, ctx: StepContext, contexts: list[int]) -> float:
        """One more draft's price in tokens: the tokens this step would have to emit in the
        time it adds, at the rate of a step without drafts (`contexts`: each request's)."""
        b = len(contexts)
        sums = self._sums_pricer(ctx.cost)
        if sums is not None:  # the same floats as pricing the two rows of ks
            cached = sum(contexts) - b
            first = contexts[0] - 1
            times = sums(b, [0, 1], cached, [cached + b, cached + b + first + 2])
        else:
            times = price_steps(ctx.cost, [[0] * b, [1] + [0] * (b - 1)], contexts)
        return b * (times[1] - times[0]) / times[0]

    # -- the protocol ------------------------------------------------------------------------

    def choose(self, ctx: StepContext) -> Sequence[int]:
        requests = ctx.requests
        b, depth = len(requests), min(self.k_max, ctx.k_max)
        ids = self._plan_ids = [r.request_id for r in requests]
        self._plan_rows = None  # built where stop_drafting asks (the live engine)
        self._plan_at = -1
        mean_lift = self._mean_lift()
        self._plan_confidence = self._lift() / mean_lift  # fixed until the outcomes arrive
        self._threshold = math.inf
        if b == 0 or depth == 0:
            return [0] * b
        states, ratios = self._plan_states, self._plan_ratios = self._states_ratios(ids)
        self._plan_at = self._revision
        rows, scales, outside = self._rows_scales(states, ratios, mean_lift)
        a_pop = self._accepted / self._seen
        contexts, reach = [], []
        for r in requests:
            contexts.append(r.context_tokens)
            # drafts past the request's end, or past what the drafter can propose, are worth
            # nothing
            can = getattr(r, "draftable", None)
            left = r.output_tokens - r.generated - 1
            reach.append(min(depth, left) if can is None else min(depth, left, can))
        loops = compiled()
        if loops is not None:  # the same, compiled (policies/compiled.py)
            return self._choose_compiled(loops, ctx, rows, scales, outside, a_pop,
                                         depth, contexts, reach)
        alpha = self._acceptance_in(a_pop, rows, scales, depth)
        survival = alpha.cumprod(axis=1)  # the chance the j-th draft is accepted
        # ... and what finding a streak adds to a first draft (column 0 stays the largest)
        if outside:
            survival[:, 0] *= 1.0 + self._discovery(ctx, rows, a_pop, scales, survival, contexts)
        survival[np.arange(depth) >= np.array(reach)[:, None]] = 0.0
        self._plan_alpha = alpha
        worth = survival.ravel()
        order = (-worth).argsort(kind="stable")[: int(np.count_nonzero(worth))]
        totals, times = self._price(ctx, contexts, worth[order], order, depth)
        tokens = b + np.concatenate(([0.0], worth[order].cumsum()))[totals]
        rates = tokens / times
        rates[0] *= self.k0_bonus  # totals[0] is always 0 drafts
        drafts = int(totals[int(rates.argmax())])
        if drafts == 0:
            return [0] * b
        self._threshold = float(worth[order[drafts - 1]])
        # plan past the threshold by `stop_slack`: the draft stop cuts each chain back
        return _add(survival >= self._threshold * self.stop_slack, axis=1).tolist()

    def _choose_compiled(self, loops, ctx: StepContext, rows: np.ndarray, scales: np.ndarray,
                         outside: bool, a_pop: np.ndarray, depth: int, contexts: list[int],
                         reach: list[int]) -> list[int]:
        """`choose` from its rows, scales and reach on, in the compiled loops."""
        price = self._draft_price(ctx, contexts) if outside else 0.0
        alpha, survival, order, ranked = loops.plan(
            a_pop, BIN_TABLE, rows, scales, depth,
            np.array(reach, dtype=np.int64), price, outside, 1 - NEW, FRESH - NEW, ALPHA_MAX)
        self._plan_alpha = alpha
        totals, times = self._price(ctx, contexts, ranked, order, depth, loops)
        drafts, threshold, ks = loops.pick(ranked, totals, times, len(contexts), self.k0_bonus,
                                           survival, self.stop_slack)
        if drafts:
            self._threshold = float(threshold)
        return ks.tolist()

    def _price(self, ctx: StepContext, contexts: list[int], worth: np.ndarray, order: np.ndarray,
               depth: int, loops=None) -> tuple[np.ndarray, np.ndarray]:
        """Draft totals D to weigh (the D most likely drafts each: `order` into the requests x
        `depth` worths, `worth` theirs) and each one's step time: every D where the cost
        model prices a step from its verify pass's sums, else the totals of THRESHOLDS and
        TOTALS_TRIED. No KV check: the engine holds each request's look-ahead up to its k_max
        (a policy's own check refused drafts the reservation already covers)."""
        b = len(contexts)
        chain_sums = self._sums_pricer(ctx.cost)
        if chain_sums is not None:
            cached_sum = sum(contexts) - b  # the requests' KV before the verify
            totals = np.arange(len(worth) + 1)
            if loops is not None:
                pairs = loops.verify_pairs(order, depth, np.array(contexts, dtype=np.int64),
                                           cached_sum + b)
            else:
                rows, cols = order // depth, order % depth
                cached = np.array(contexts, dtype=np.int64) - 1  # each request's
                # the j-th draft of request r (j from 1) adds c_r + j + 1 causal pairs
                pairs = cached_sum + b + np.concatenate(([0], (cached[rows] + cols + 2).cumsum()))
            times = np.array(chain_sums(b, totals, cached_sum, pairs), dtype=np.float64)
        else:
            n = len(worth)
            totals = np.unique(np.concatenate((
                [0, n], np.searchsorted(-worth, _BELOW_THRESHOLDS, side="right"),
                geometric_totals(n))))
            totals = totals[totals <= n]
            ks_rows = (prefix_counts(order // depth, totals, b) if loops is None
                       else loops.prefix_counts(order // depth, totals, b))  # (as an array)
            times = np.array(price_steps(ctx.cost, ks_rows, contexts), dtype=np.float64)
        return totals, times

    def stop_chains(self, requests: Sequence[RequestView], ks: Sequence[int],
                    draft_top1: np.ndarray, draft_entropy: np.ndarray) -> list[int]:
        """Each chain drafts on while its next draft's worth, given the drafter's confidence in
        the drafts before it, reaches the step's threshold (`stop_drafting` token by token)."""
        width = draft_top1.shape[1] if draft_top1.ndim == 2 else 0
        if width <= 1 or [r.request_id for r in requests] != self._plan_ids:
            return list(ks)  # a chain of one draft has nothing to stop
        loops = compiled()
        if (loops is not None and width <= self._plan_alpha.shape[1]
                and draft_top1.dtype == np.float64):  # compiled (its bins: float64 products)
            return loops.stop_lengths(self._plan_alpha, self._plan_confidence, draft_top1,
                                      np.array(ks, dtype=np.int64), self._threshold,
                                      ALPHA_MAX).tolist()
        plan = self._plan_alpha[:, :width]
        # the chance the chain is right through each draft, confidence known
        through = np.minimum(plan * self._plan_confidence[_top1_bins(draft_top1)],
                             ALPHA_MAX).cumprod(axis=1)
        stops = through[:, :-1] * plan[:, 1:] < self._threshold  # stop after that draft
        lengths = np.where(stops.any(axis=1), stops.argmax(axis=1) + 1, width)
        return np.minimum(lengths, ks).tolist()

    def stop_drafting(self, request: RequestView, depth: int, draft_top1: float,
                      draft_entropy: float) -> bool:
        """Stop after this draft when the next one's worth, the chance the chain is right
        through this one (its confidence known) times the next one's planned acceptance, falls
        below the step's threshold: the same decisions as `stop_chains`, asked token by token
        in depth order."""
        if self._plan_rows is None:
            self._plan_rows = {rid: row for row, rid in enumerate(self._plan_ids)}
        row = self._plan_rows.get(request.request_id)
        if row is None or depth >= self._plan_alpha.shape[1]:
            return False
        alpha = min(float(self._plan_alpha[row, depth]
                          * self._plan_confidence[_top1_bin(draft_top1)]), ALPHA_MAX)
        through = alpha if depth == 0 else self._through.get(request.request_id, 1.0) * alpha
        self._through[request.request_id] = through
        if depth + 1 >= self._plan_alpha.shape[1]:
            return True
        return through * float(self._plan_alpha[row, depth + 1]) < self._threshold

    def _lift(self) -> np.ndarray:
        """Acceptance by the drafter's confidence over the model's prediction, per tenth."""
        w = self.prior_weight
        return (self._top1_observed + w) / (self._top1_expected + w)

    def observe_columns(self, ctx: StepContext, outcomes: StepOutcomes) -> None:
        """Each verified position updates the three factors of the acceptance model, bin x
        request's ratio x confidence lift, fitted online as a multiplicative model: every
        factor counts a position as the exposure the other two give it. Counting plainly would
        credit a factor with what another explains (good requests reach long streaks more
        often, and draft with more confidence) and over-predict where all three are high."""
        ids = outcomes.request_ids
        if len(set(ids)) != len(ids):  # (each row's state is read before the step's fit)
            raise ValueError(f"auto was told of a request twice in one step: {list(ids)}")
        if self._plan_at == self._revision and list(ids) == self._plan_ids:
            states, ratios = self._plan_states, self._plan_ratios  # read by this step's plan
        else:
            states, ratios = self._states_ratios(ids)
        self._revision += 1
        top1 = outcomes.signals.get("draft_top1")
        if top1 is None:  # no confidence read: every position's factor is 1
            top1, known = np.zeros((len(ids), 0)), np.zeros(len(ids), dtype=np.int64)
        else:  # (float64: its bins are float64 products, as the draft stop's)
            top1 = np.ascontiguousarray(top1, dtype=np.float64)
            known = outcomes.lengths.get("draft_top1")
            if known is None:
                raise ValueError("auto's outcomes hold draft_top1 without its revealed lengths")
        a_pop, lift = self._accepted / self._seen, self._lift()
        ks, hits_of = outcomes.k.tolist(), outcomes.accepted.tolist()
        loops = compiled()
        if loops is not None:  # the same, compiled (policies/compiled.py)
            counts = (self._seen.copy(), self._accepted.copy(), self._top1_observed.copy(),
                      self._top1_expected.copy())
            expected, after = loops.observe_step(*counts, a_pop, lift, BIN_TABLE, states,
                                                 ratios, outcomes.k, outcomes.accepted, top1,
                                                 known, NEW, FRESH, COLD, MAX_STREAK)
            expected, after = expected.tolist(), after.tolist()
        else:
            counts, expected, after = self._fit(a_pop.tolist(), lift.tolist(), states.tolist(),
                                                ratios.tolist(), ks, hits_of, top1.tolist(),
                                                known.tolist())
        self._seen, self._accepted, self._top1_observed, self._top1_expected = counts
        self._held(ids)
        streak, observed, expected_of = self._streak, self._observed, self._expected
        for rid, k, hits, e, state in zip(ids, ks, hits_of, expected, after):
            if k:
                observed[rid] = observed.get(rid, 0.0) + hits
                expected_of[rid] = expected_of.get(rid, 0.0) + e
                streak[rid] = state

    def _fit(self, a_pop: list[float], lift: list[float], states: list[int],
             ratios: list[float], ks: list[int], hits_of: list[int], top1: list[list[float]],
             known: list[int]) -> tuple[tuple[np.ndarray, ...], list[float], list[int]]:
        """`observe_columns`' counts in Python: the four count arrays after the step, and each
        request's expected accepted drafts and state after it (`compiled.observe_step`)."""
        # counted in Python floats and written back once: the same sums as adding in place
        seen_by_bin, accepted_by_bin = self._seen.tolist(), self._accepted.tolist()
        top1_observed, top1_expected = self._top1_observed.tolist(), self._top1_expected.tolist()
        expected_out, after = [0.0] * len(ks), list(states)
        for r, k in enumerate(ks):
            if k == 0:
                continue
            hits, state, ratio, confidences = hits_of[r], states[r], ratios[r], top1[r]
            seen = hits + 1 if hits < k else k  # the accepted drafts and the first rejection
            read = min(known[r], seen)  # those whose confidence was read
            bins = _BIN_ROWS[(state if state < MAX_STREAK else MAX_STREAK) - NEW]
            expected = 0.0
            for i in range(seen):
                b, hit = bins[i], i < hits
                if i >= read:  # no confidence read: a factor of 1 (the same floats)
                    seen_by_bin[b] += ratio
                    accepted_by_bin[b] += hit
                    expected += a_pop[b]
                    continue
                t = _top1_bin(confidences[i])
                confidence = lift[t]
                seen_by_bin[b] += ratio * confidence
                accepted_by_bin[b] += hit
                expected += a_pop[b] * confidence
                top1_observed[t] += hit
                top1_expected[t] += a_pop[b] * ratio
            expected_out[r] = expected
            after[r] = max(state, FRESH) + hits if hits == k else FRESH if hits else COLD
        counts = (np.array(seen_by_bin), np.array(accepted_by_bin), np.array(top1_observed),
                  np.array(top1_expected))
        return counts, expected_out, after

    # -- steps run elsewhere (simulator/stepped.py) --------------------------------------

    def request_rows(self, ids: Sequence[int]) -> tuple[StateRows, np.ndarray]:
        """Each request's row of its state, accepted drafts and the drafts the population
        predicted for them (`StateRows`): what a run of steps outside `choose` and
        `observe_columns` reads and moves in place (`counts` the population's, handed back
        through `took_steps`)."""
        if self._rows is None:
            self._rows = StateRows()
        return self._rows, self._rows.rows(ids, self._streak, self._observed, self._expected)

    def _held(self, ids: Sequence[int]) -> None:
        """These requests' states in the dicts, where `choose` and `observe_columns` read
        them (those in rows move back)."""
        rows = self._rows
        if rows is None or not rows.row_of:
            return
        row_of = rows.row_of
        for rid in ids:
            if rid in row_of:
                rows.take(rid, self._streak, self._observed, self._expected)

    def state_of(self, rid: int) -> tuple[int, float, float]:
        """A request's state, accepted and expected drafts, wherever they are kept."""
        rows = self._rows
        if rows is not None and rid in rows.row_of:
            row = rows.row_of[rid]
            return int(rows.state[row]), float(rows.observed[row]), float(rows.expected[row])
        return (self._streak.get(rid, NEW), self._observed.get(rid, 0.0),
                self._expected.get(rid, 0.0))

    def counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Copies of the fit's four count arrays: verified positions and accepted drafts by
        bin, accepted and predicted drafts by confidence tenth."""
        return (self._seen.copy(), self._accepted.copy(), self._top1_observed.copy(),
                self._top1_expected.copy())

    def took_steps(self, steps: int, counts: tuple[np.ndarray, ...]) -> None:
        """`steps` steps were chosen, stopped and observed outside (as `choose`, `stop_chains`
        and `observe_columns` would have), the requests' rows moved in place: take the counts
        after them. The last plan is forgotten: the next step plans afresh."""
        self._seen, self._accepted, self._top1_observed, self._top1_expected = counts
        self._revision += steps
        self.forget_plan()

    def forget_plan(self) -> None:
        """Forget the last plan (its requests, rows and threshold): a step was chosen outside
        `choose` (simulator/stepped.py), so the next fit reads the states afresh and the draft
        stop reads no plan of another step."""
        self._plan_ids, self._plan_at, self._plan_rows = [], -1, None
        self._threshold = math.inf

    def finish(self, request_id: int) -> None:
        self._revision += 1
        if self._rows is not None:
            self._rows.release(request_id)
        self._streak.pop(request_id, None)
        self._observed.pop(request_id, None)
        self._expected.pop(request_id, None)


_BELOW_THRESHOLDS = -np.array(THRESHOLDS)  # searched for in the ranked worths, negated
_BELOW_THRESHOLDS.flags.writeable = False


@lru_cache(maxsize=1024)
def geometric_totals(n: int) -> np.ndarray:
    """TOTALS_TRIED draft totals spaced geometrically from 1 to n (at least 1), rounded."""
    totals = np.geomspace(1, max(n, 1), TOTALS_TRIED).round().astype(np.int64)
    totals.flags.writeable = False  # shared by every step with n drafts worth something
    return totals


def _bin(state: int, depth: int) -> int:
    """The acceptance bin of a chain's draft at `depth` (from 0) for a request in `state`."""
    if depth == 0:
        return state - NEW if state <= FRESH else min(state, MAX_STREAK) + 2
    return min(max(state, 0) + depth, MAX_STREAK) + 2


#: np.sum without its Python wrapper (the same reduction): auto runs every step of the step path
_add = np.add.reduce

#: `_bin` of every state NEW..MAX_STREAK (row state - NEW) at every depth below 64 (a longer
#: streak's bins are MAX_STREAK's)
BIN_TABLE = np.array([[_bin(state, depth) for depth in range(64)]
                       for state in range(NEW, MAX_STREAK + 1)], dtype=np.int64)
_BIN_ROWS = BIN_TABLE.tolist()  # the same, as lists: observe reads it one position at a time


def _top1_bin(value: float) -> int:
    """A top-1 probability's tenth (NaN: the lowest, an unreadable signal is no confidence)."""
    if not value >= 0.0:
        return 0
    # (just under 1, value * TOP1_BINS can round up to TOP1_BINS)
    return TOP1_BINS - 1 if value >= 1.0 else min(int(value * TOP1_BINS), TOP1_BINS - 1)


def _top1_bins(values: np.ndarray) -> np.ndarray:
    """`_top1_bin` of every element."""
    # fmax takes 0 over NaN; an infinite value lands in an end bin as _top1_bin puts it
    return np.minimum(np.fmax(values * TOP1_BINS, 0.0), TOP1_BINS - 1).astype(np.int64)
