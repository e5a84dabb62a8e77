"""`goodput`: SmartSpec (Liu et al. 2024, arXiv 2406.14066; docs/policies.md §3).

Choose k to maximise predicted goodput, tokens emitted per second of step time, from an EMA of the
acceptance rate and the engine's own cost model, re-planned every `replan_every` steps. It follows
the authors' prototype (`LiuXiaoxuanPKU/vllm`, `vllm/spec_decode/dsd.py`), and departs from it
where the prototype would mislead here: the draft catch-up left out of the price, an infinite
(not 10000 s) time for a KV-infeasible k, and an acceptance estimate that allows for censoring.
The prototype read, each departure with its measurements, and the per-request planner:
docs/policy-goodput.md.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from policies.base import (
    HeldSteps,
    Policy,
    RequestStates,
    StepContext,
    StepOutcomes,
    price_steps,
)
from policies.registry import register
from policies.vocabulary import alpha_from_mean_accepted, expected_emitted

EMA_INPUTS = ("censored", "cumulative", "step", "inverted")
#: per-request plans stop climbing when no move raises predicted goodput by this fraction: finer
#: steps are noise next to the acceptance estimates' own error, and cost a cost-model call each
MIN_GAIN = 1e-3
#: per request, `request_states`' `state` (simulator/compiled_goodput.py reads it): the batch's
#: entries (its calls, the plan of a request that arrived after the last plan, whether the
#: last call probed, whether a run re-planned), then R_FIELDS per request from R_HEAD (its
#: censored sums, its plan or NO_PLAN, its id); `level` is each request's estimate
R_CALLS, R_NEW, R_PROBING, R_REPLANNED = range(4)
R_HEAD, R_FIELDS = 4, 5
R_ACCEPTED, R_DRAFTED, R_REJECTED, R_PLAN, R_ID = range(R_FIELDS)
NO_PLAN = -1


@register
@dataclass
class Goodput(Policy):
    """SmartSpec: k maximising predicted goodput, re-planned every `replan_every` steps."""

    name: ClassVar[str] = "goodput"
    description: ClassVar[str] = (
        "SmartSpec (Liu et al. 2024): the k that maximises predicted goodput from an EMA of "
        "acceptance and the cost model, re-planned every 20 steps")
    stateless_per_batch: ClassVar[bool] = False  # it learns from outcomes
    # (its steps run in compiled runs, at a half to a fifth of the time of its held segments:
    # a 10,000-request `spectune simulate` of it took 1.83-1.89 s with the loops, 2.31-2.34 s
    # without, about 0.5 s of it their loading)
    compiled_steps: ClassVar[int] = 5_000
    # (per request its plans cost most in Python, so the loops repay sooner: a `spectune
    # simulate` of it took 1.30 s with them and 1.44 s without at 500 requests, 1.34 against
    # 1.07 at 300, 1.37 against 2.26 at 1,000)
    compiled_steps_per_request: ClassVar[int] = 500

    initial_alpha: float = field(default=0.7, metadata={
        "help": "acceptance estimate before anything is observed"})
    ema_keep: float = field(default=0.85, metadata={
        "help": "EMA weight of the old estimate: a <- keep*a + (1-keep)*x, x per ema_input",
        "bounds": (0.5, 0.98)})
    ema_input: str = field(default="censored", metadata={
        "help": "what the EMA reads: censored (running MLE of the per-token rate from accepted "
                "drafts and first rejections), cumulative (running accepted/drafted), step "
                "(this step's accepted/drafted), or inverted (the i.i.d. alpha that explains "
                "this step's mean accepted)"})
    replan_every: int = field(default=20, metadata={
        "help": "re-plan k every this many steps (calls); in between the last plan is reused"})
    k_max: int = field(default=8, metadata={
        "help": "largest k considered (also capped by the engine's k_max)"})
    k0_bonus: float = field(default=1.1, metadata={
        "help": "goodput of k=0 is multiplied by this: speculation must win by that margin",
        "bounds": (1.0, 1.3)})
    kv_headroom: float = field(default=1.1, metadata={
        "help": "k is infeasible if B*(mean context + k + 1)*headroom exceeds the KV capacity"})
    faithful: bool = field(default=False, metadata={
        "help": "the prototype's k = 0, for good: once a plan is 0 nothing is drafted, so "
                "nothing updates the acceptance estimate again. false (default): a step that "
                "re-plans a request (or the batch) to k = 0 drafts k = 1 there, a probe every "
                "replan_every steps, so the estimate keeps learning (docs/policy-goodput.md)"})
    per_request: bool = field(default=False, metadata={
        "help": "per-request k from each request's own acceptance estimate (a local search on "
                "predicted goodput) instead of one k for the batch",
        "grid": (False, True)})

    def __post_init__(self) -> None:
        if not 0.0 <= self.initial_alpha <= 1.0:
            raise ValueError(f"initial_alpha must be in [0, 1], got {self.initial_alpha}")
        if not 0.0 <= self.ema_keep <= 1.0:
            raise ValueError(f"ema_keep must be in [0, 1], got {self.ema_keep}")
        if self.ema_input not in EMA_INPUTS:
            raise ValueError(f"ema_input must be one of {', '.join(EMA_INPUTS)}, "
                             f"got {self.ema_input!r}")
        if self.replan_every < 1:
            raise ValueError(f"replan_every must be >= 1, got {self.replan_every}")
        if not 0 <= self.k_max <= 64:
            raise ValueError(f"k_max must be in 0..64, got {self.k_max}")
        if not self.k0_bonus > 0 or math.isinf(self.k0_bonus):
            raise ValueError(f"k0_bonus must be a positive number, got {self.k0_bonus}")
        if not self.kv_headroom > 0 or math.isinf(self.kv_headroom):
            raise ValueError(f"kv_headroom must be a positive number, got {self.kv_headroom}")
        self.alpha_hat = self.initial_alpha  # the batch estimate (batch-uniform mode)
        self._totals = [0, 0, 0]  # accepted, drafted, first rejections seen (see ema_input)
        self._calls = 0
        self._k = 0  # the last batch plan (the prototype's last_proposed_len starts at 0)
        # per-request mode: each request's estimate, totals, and planned k; the fallback k for
        # requests that arrived after the last plan
        self._alpha_r: dict[int, float] = {}
        self._totals_r: dict[int, list[int]] = {}
        self._plan_r: dict[int, int] = {}
        self._k_new = 0
        self._probing = False  # this call's ks probe k = 0 plans with k = 1 (see `faithful`)

    # -- the protocol ------------------------------------------------------------------------

    def runs_repay_from(self) -> int:
        if self.ema_input != "censored":  # (its steps run as before: nothing to repay)
            return 0
        return self.compiled_steps_per_request if self.per_request else self.compiled_steps

    def choose(self, ctx: StepContext) -> Sequence[int]:
        b = len(ctx.requests)
        if b == 0:
            return []
        self._calls += 1
        k_cap = min(self.k_max, ctx.k_max)
        replan = self._calls % self.replan_every == 0
        if not self.per_request:
            if replan:
                self._k = self._plan_batch(ctx, k_cap)
            ks = [min(self._k, ctx.k_max)] * b
        else:
            if replan:
                plan = self._plan_per_request(ctx, k_cap)
                self._plan_r = {r.request_id: k for r, k in zip(ctx.requests, plan)}
                self._k_new = statistics.median_low(plan)
            ks = [min(self._plan_r.get(r.request_id, self._k_new), ctx.k_max)
                  for r in ctx.requests]
        # a k = 0 plan drafts nothing, so it would learn nothing: its re-planning step probes
        self._probing = replan and not self.faithful and k_cap >= 1 and 0 in ks
        return [k or 1 for k in ks] if self._probing else ks

    def observe_columns(self, ctx: StepContext, outcomes: StepOutcomes) -> None:
        """The EMA step from the requests that drafted (per request, each from its own)."""
        ks, accepted = outcomes.k.tolist(), outcomes.accepted.tolist()
        inverted = self.ema_input == "inverted"
        if self.per_request:
            for rid, k, acc in zip(outcomes.request_ids, ks, accepted):
                if k > 0:
                    totals = self._totals_r.setdefault(rid, [0, 0, 0])
                    old = self._alpha_r.get(rid, self.initial_alpha)
                    self._alpha_r[rid] = self._ema_of(
                        old, totals, acc, k, int(acc < k), _groups([k], [acc]) if inverted else ())
            return
        drafting = [(k, acc) for k, acc in zip(ks, accepted) if k > 0]
        if drafting:  # the prototype skips steps without drafts (its ratio would be NaN)
            self.alpha_hat = self._ema_of(
                self.alpha_hat, self._totals, sum(acc for _, acc in drafting),
                sum(k for k, _ in drafting), sum(acc < k for k, acc in drafting),
                _groups(ks, accepted) if inverted else ())

    def hold(self) -> int:
        """Until the next re-plan (every `replan_every` calls) `choose` repeats the last plan;
        a probing step (see `faithful`) holds for nothing: the next step goes back to the plan."""
        if self._probing:
            return 0
        return self.replan_every - 1 - self._calls % self.replan_every

    def observe_held(self, ctx: StepContext, steps: HeldSteps) -> None:
        """The held steps' calls, and each step's outcomes as `observe` reads them, in order."""
        self._calls += steps.steps - 1
        if self.per_request:
            for rid, ks, accs in zip(steps.request_ids, steps.k.tolist(),
                                     steps.accepted.tolist()):
                if not any(ks):
                    continue
                totals = self._totals_r.setdefault(rid, [0, 0, 0])
                alpha = self._alpha_r.get(rid, self.initial_alpha)
                if self.ema_input == "censored":  # the default, without a call per step
                    alpha = self._censored(alpha, totals, accs, ks,
                                           [acc < kk for kk, acc in zip(ks, accs)])
                else:
                    for kk, acc in zip(ks, accs):
                        if kk > 0:
                            alpha = self._ema_of(alpha, totals, acc, kk, int(acc < kk),
                                                 ((kk, [acc]),))
                self._alpha_r[rid] = alpha
            return
        # a request that drafts nothing accepts nothing and is no rejection: sums over all
        # requests are the sums over the drafting ones
        columns = steps.column_sums()
        if self.ema_input == "censored":  # the default, without a call per step
            self.alpha_hat = self._censored(self.alpha_hat, self._totals, *columns)
            return
        for step, (acc, drafted, rejected) in enumerate(zip(*columns)):
            if drafted:
                groups = _groups(steps.k[:, step].tolist(),
                                 steps.accepted[:, step].tolist()) if (
                    self.ema_input == "inverted") else ()
                self.alpha_hat = self._ema_of(self.alpha_hat, self._totals, acc, drafted,
                                              rejected, groups)

    def _censored(self, alpha: float, totals: list[int], accepted: Sequence[int],
                  drafts: Sequence[int], rejected: Sequence[int]) -> float:
        """`_ema_of` with ema_input "censored" over consecutive steps (of the batch, or of
        one request: `alpha` and `totals` its estimate and sums): the same float operations
        in the same order, without a call per step. Updates `totals`, returns the estimate."""
        keep = self.ema_keep
        acc_total, drafted_total, rej_total = totals
        for acc, drafted, rej in zip(accepted, drafts, rejected):
            if drafted:
                acc_total += acc
                drafted_total += drafted
                rej_total += rej
                x = acc_total / (acc_total + rej_total) if acc_total + rej_total else 1.0
                # min(1.0, max(0.0, a)) as _ema_of clamps, without the two calls
                alpha = keep * alpha + (1.0 - keep) * x
                alpha = alpha if alpha > 0.0 else 0.0
                alpha = alpha if alpha < 1.0 else 1.0
        totals[:] = acc_total, drafted_total, rej_total
        return alpha

    def request_states(self, request_ids: Sequence[int], k_max: int) -> RequestStates:
        """The state for compiled engine steps (`RequestStates`): the batch's (the
        batch-uniform plan, the censored estimate): `state` its censored sums, calls, last
        plan and whether the last call probed, `level` its estimate; per request, `state` as
        R_CALLS .. R_ID say (R_REPLANNED 0: a run sets it where it re-plans), `level` each
        request's estimate. Knobs replan_every, its k cap and faithful; weights ema_keep,
        k0_bonus and kv_headroom."""
        knobs = np.array([self.replan_every, min(self.k_max, k_max), self.faithful],
                         dtype=np.int64)
        weights = np.array([self.ema_keep, self.k0_bonus, self.kv_headroom], dtype=np.float64)
        if self.per_request:
            state = [self._calls, self._k_new, self._probing, 0]  # (R_CALLS .. R_REPLANNED)
            for rid in request_ids:  # (R_ACCEPTED .. R_ID)
                state += [*self._totals_r.get(rid, (0, 0, 0)), self._plan_r.get(rid, NO_PLAN),
                          rid]
            return RequestStates(
                "goodput_per_request", np.array(state, dtype=np.int64),
                np.array([self.request_alpha(rid) for rid in request_ids], dtype=np.float64),
                np.zeros(0), knobs, weights)
        accepted, drafted, rejected = self._totals
        return RequestStates(
            "goodput", np.array([accepted, drafted, rejected, self._calls, self._k,
                                 self._probing], dtype=np.int64),
            np.array([self.alpha_hat], dtype=np.float64), np.zeros(0), knobs, weights)

    def keep_states(self, request_ids: Sequence[int], states: RequestStates,
                    touched) -> None:
        """The state after compiled engine steps, each of which called `choose` and observed
        its outcomes (per request: the sums and estimate of those that drafted, `touched`;
        where the steps re-planned, the plans of these requests alone, as `choose` keeps)."""
        if self.per_request:
            state = states.state.tolist()
            self._calls, self._k_new = state[R_CALLS], state[R_NEW]
            self._probing = bool(state[R_PROBING])
            alphas = states.level.tolist()
            for i, (rid, moved) in enumerate(zip(request_ids, touched.tolist())):
                if moved:
                    at = R_HEAD + R_FIELDS * i
                    self._totals_r[rid] = state[at + R_ACCEPTED: at + R_REJECTED + 1]
                    self._alpha_r[rid] = alphas[i]
            if state[R_REPLANNED]:
                self._plan_r = {rid: state[R_HEAD + R_FIELDS * i + R_PLAN]
                                for i, rid in enumerate(request_ids)}
            return
        accepted, drafted, rejected, calls, plan, probing = states.state.tolist()
        self._totals = [accepted, drafted, rejected]
        self._calls, self._k, self._probing = calls, plan, bool(probing)
        self.alpha_hat = float(states.level[0])

    def finish(self, request_id: int) -> None:
        self._alpha_r.pop(request_id, None)
        self._totals_r.pop(request_id, None)
        self._plan_r.pop(request_id, None)

    # -- estimates ---------------------------------------------------------------------------

    def _ema_of(self, old: float, totals: list[int], accepted: int, drafted: int,
                rejected: int, groups) -> float:
        """The EMA step from one step's sums over the requests that drafted: accepted drafts,
        drafts, observed first rejections; `groups` ((k, [accepted, ...]), ...) for `inverted`."""
        totals[0] += accepted
        totals[1] += drafted
        totals[2] += rejected
        if self.ema_input == "censored":
            x = totals[0] / (totals[0] + totals[2]) if totals[0] + totals[2] else 1.0
        elif self.ema_input == "cumulative":
            x = totals[0] / totals[1]
        elif self.ema_input == "step":
            x = accepted / drafted
        else:
            x = _inverted(groups)
        return min(1.0, max(0.0, self.ema_keep * old + (1.0 - self.ema_keep) * x))

    def request_alpha(self, request_id: int) -> float:
        """A request's acceptance estimate (per-request mode); `initial_alpha` if unseen."""
        return self._alpha_r.get(request_id, self.initial_alpha)

    # -- plans -------------------------------------------------------------------------------

    def _plan_batch(self, ctx: StepContext, k_cap: int) -> int:
        """The prototype's `get_draft_propose_len`: scan k upward, stop at the first drop (every
        k priced in one call, then scanned)."""
        b = len(ctx.requests)
        contexts = [r.context_tokens for r in ctx.requests]
        ks = range(k_cap + 1)
        goodputs = self._uniform_goodputs(
            ctx, [b * expected_emitted(self.alpha_hat, k) for k in ks], contexts)
        best_goodput, best_k = -1.0, 0
        for k, goodput in zip(ks, goodputs):
            if k == 0:
                goodput *= self.k0_bonus
            if goodput > best_goodput:
                best_goodput, best_k = goodput, k
            else:
                break
        return best_k

    def _uniform_goodputs(self, ctx: StepContext, tokens: Sequence[float],
                          contexts: Sequence[int]) -> list[float]:
        """`_goodputs` of every request at k, for k = 0, 1, ... (one per entry of `tokens`):
        from the verify pass's sums where the cost model prices steps from them."""
        chain_sums = getattr(ctx.cost, "chain_sums_s", None)
        if chain_sums is not None:
            b, total = len(contexts), sum(contexts)
            cached = total - b  # each request's KV before the verify pass
            fits = self._fitting(ctx, [b * k for k in range(len(tokens))], b, total)
            # sum_r (k + 1) c_r + (k + 1)(k + 2) / 2 = (k + 1) C + b (k + 1)(k + 2) / 2
            times = chain_sums(b, [b * k for k in fits], cached,
                               [(k + 1) * cached + b * ((k + 1) * (k + 2) // 2) for k in fits]
                               ) if fits else []
            if times is not None:
                goodputs = [0.0] * len(tokens)
                for k, seconds in zip(fits, times):
                    goodputs[k] = tokens[k] / seconds
                return goodputs
        return self._goodputs(ctx, tokens, [[k] * len(contexts) for k in range(len(tokens))],
                              contexts)

    def _goodputs(self, ctx: StepContext, tokens: Sequence[float], ks_rows: Sequence[list[int]],
                  contexts: Sequence[int]) -> list[float]:
        """Expected tokens per second of each alternative step (its expected tokens, its ks);
        0 for one that would not fit the KV cache (infinite time). Priced in one call."""
        return self._fitting_goodputs(
            ctx, tokens, [sum(ks) for ks in ks_rows], contexts,
            lambda fits: price_steps(ctx.cost, [ks_rows[i] for i in fits], contexts))

    def _goodputs_of_sums(self, ctx: StepContext, tokens: Sequence[float], moved, chain_sums,
                          contexts: Sequence[int], cached: int) -> list[float] | None:
        """`_goodputs` of alternatives given by their verify pass's (drafts, causal pairs);
        None where the cost model does not price steps from those sums."""
        return self._fitting_goodputs(
            ctx, tokens, [d for d, _ in moved], contexts,
            lambda fits: chain_sums(len(contexts), [moved[i][0] for i in fits], cached,
                                    [moved[i][1] for i in fits]) if fits else [])

    def _fitting_goodputs(self, ctx: StepContext, tokens: Sequence[float],
                          drafts: Sequence[int], contexts: Sequence[int],
                          price) -> list[float] | None:
        """Tokens per second of each alternative with `drafts` drafts in all; 0 for one that
        would not fit the KV cache. `price(indices)` gives the fitting ones' step times (or
        None: then so is the answer)."""
        fits = self._fitting(ctx, drafts, len(contexts), sum(contexts))
        times = price(fits)
        if times is None:  # the cost model does not price these steps that way
            return None
        out = [0.0] * len(drafts)
        for i, seconds in zip(fits, times):
            out[i] = tokens[i] / seconds
        return out

    def _fitting(self, ctx: StepContext, drafts: Sequence[int], b: int, total: int
                 ) -> list[int]:
        """Which alternatives (`drafts` in all, b requests holding `total` tokens) fit the KV
        cache with the policy's headroom."""
        base = total // b * b + b  # the need but for the drafts
        return [i for i, d in enumerate(drafts)
                if (base + d) * self.kv_headroom <= ctx.kv_capacity_tokens]

    def _plan_per_request(self, ctx: StepContext, k_cap: int) -> list[int]:
        """Per-request k: local ascent of sum_r E_r(k_r) / T_step(ks) (docs/policies.md §3 option).

        Allocations keep k nonincreasing along the requests ranked by their own a_r (ties: shorter
        context first). Each round takes the group move (raise the first s of a level, or lower
        the last s) or, failing that, the transfer of one draft between levels that raises
        predicted goodput most, by at least MIN_GAIN. The climb starts from all k_r = 0 and from
        the best batch-uniform k; the better end must beat k = 0 scaled by `k0_bonus`. Why not a
        plain greedy, and what a plan costs: docs/policy-goodput.md.
        """
        reqs = ctx.requests
        b = len(reqs)
        contexts = [r.context_tokens for r in reqs]
        alphas = [self.request_alpha(r.request_id) for r in reqs]
        order = sorted(range(b), key=lambda i: (-alphas[i], contexts[i], reqs[i].request_id))
        zeros = [0] * b
        # every uniform k priced at once (k = 0: b tokens, as E(0) = 1 exactly)
        goodputs = self._uniform_goodputs(
            ctx, [sum(expected_emitted(a, k) for a in alphas) for k in range(k_cap + 1)],
            contexts)
        plans = [(goodputs[0] * self.k0_bonus, zeros)]
        uniform = max(range(k_cap + 1), key=goodputs.__getitem__)
        ascent = _Ascent(self, ctx, alphas, order, contexts, k_cap)
        for start in sorted({0, uniform}):
            plans.append(ascent.run(start))
        return max(plans, key=lambda p: p[0])[1]


class _Ascent:
    """Hill climbing over allocations that are nonincreasing along `order` (see above).

    Where the cost model prices a step from its verify pass's sums (`chain_sums_s`: a
    model-free chain drafter), a move is priced from the sums it changes (drafts, causal pairs),
    kept as the climb goes: the same integers, so the same floats, as pricing each trial's ks."""

    def __init__(self, policy: Goodput, ctx: StepContext, alphas, order, contexts, k_cap):
        self.policy, self.ctx, self.alphas = policy, ctx, alphas
        self.order, self.contexts, self.k_cap = order, contexts, k_cap
        self.rank = {i: place for place, i in enumerate(order)}
        # a_i^j: what request i's j-th draft adds to its expected emitted tokens
        self.powers = [[a ** j for j in range(k_cap + 1)] for a in alphas]
        self.cached = [c - 1 for c in contexts]  # each request's KV before the verify pass
        self.total_cached = sum(self.cached)
        chain_sums = getattr(ctx.cost, "chain_sums_s", None)
        self.chain_sums = chain_sums if chain_sums is not None and chain_sums(
            len(contexts), [0], self.total_cached, [0]) is not None else None
        # the verify pass's causal pairs of a request at k, less (k + 1) c: (k + 1)(k + 2) / 2
        self.own = [(k + 1) * (k + 2) // 2 for k in range(k_cap + 1)]

    def run(self, k0: int) -> tuple[float, list[int]]:
        ks = [k0] * len(self.order)
        tokens = sum(expected_emitted(a, k0) for a in self.alphas)
        current = self.policy._goodputs(self.ctx, [tokens], [ks], self.contexts)[0]
        sums = (k0 * len(ks), sum((k0 + 1) * c + self.own[k0] for c in self.cached))
        while True:
            for moves in (self._group_moves(ks), self._transfers(ks)):
                best = self._best(list(moves), ks, sums, tokens, current)
                if best is not None:
                    current, ks, sums, gain = best
                    tokens += gain
                    break
            else:
                return current, ks

    def _best(self, moves, ks, sums, tokens, current):
        """The move that raises goodput most: (goodput, new ks, new sums, token gain), or
        None. `moves`: (requests, their new k's, token gain, change of drafts, change of causal
        pairs), every one priced in one call."""
        if not moves:
            return None
        gains = [tokens + move[2] for move in moves]
        drafted, pairs = sums
        moved = [(drafted + move[3], pairs + move[4]) for move in moves]
        if self.chain_sums is not None:
            goodputs = self.policy._goodputs_of_sums(self.ctx, gains, moved, self.chain_sums,
                                                     self.contexts, self.total_cached)
        else:
            goodputs = self.policy._goodputs(self.ctx, gains,
                                             [_changed(ks, *move[:2]) for move in moves],
                                             self.contexts)
        best = None
        for m, goodput in enumerate(goodputs):
            if goodput > current * (1.0 + MIN_GAIN) and (best is None or goodput > best[0]):
                best = (goodput, m)
        if best is None:
            return None
        goodput, m = best
        return goodput, _changed(ks, *moves[m][:2]), moved[m], moves[m][2]

    def _levels(self, ks: list[int]) -> dict[int, list[int]]:
        """Level -> its requests, in `order`."""
        levels: dict[int, list[int]] = {}
        for i in self.order:
            levels.setdefault(ks[i], []).append(i)
        return levels

    def _group_moves(self, ks: list[int]):
        """Raise the first s requests of a level by one, or lower the last s (s = 1, 2, 4, ...,
        all): the moves that keep k nonincreasing along `order`. A move's token gain E(new) -
        E(old) is the a_i^j its drafts add (or minus, remove), summed in order from 0; its
        causal pairs change by (new - old) c_i + own(new) - own(old) per request."""
        powers, cached, own = self.powers, self.cached, self.own
        for level, group in self._levels(ks).items():
            before = list(itertools.accumulate((cached[i] for i in group), initial=0))
            if level < self.k_cap:
                up = [powers[i][level + 1] for i in group]
                step = own[level + 1] - own[level]
                for s in _sizes(len(group)):
                    yield group[:s], level + 1, sum(up[:s]), s, before[s] + s * step
            if level > 0:
                down = [-powers[i][level] for i in group]
                step, n = own[level - 1] - own[level], len(group)
                for s in _sizes(n):
                    yield (group[-s:], level - 1, sum(down[-s:]), -s,
                           before[n - s] - before[n] + s * step)

    def _transfers(self, ks: list[int]):
        """Move one draft from the last request of a level to the first of another: the
        verified tokens stay level, which is what crosses a knee or a CUDA-graph bucket."""
        levels = self._levels(ks)
        powers, cached, own = self.powers, self.cached, self.own
        for up_level, ups in levels.items():
            for down_level, downs in levels.items():
                u, d = ups[0], downs[-1]
                if (up_level < self.k_cap and down_level > 0 and u != d
                        and self._transfer_keeps_order(ks, u, d)):
                    yield ([u, d], [up_level + 1, down_level - 1],
                           sum((powers[u][up_level + 1], -powers[d][down_level])), 0,
                           cached[u] + own[up_level + 1] - own[up_level]
                           - cached[d] + own[down_level - 1] - own[down_level])

    def _transfer_keeps_order(self, ks: list[int], u: int, d: int) -> bool:
        """Whether k stays nonincreasing along `order` with u raised and d lowered by one.
        `ks` is (every allocation of the climb is), u is the first of its level and d the last
        of its own: raising u stays at or below whatever precedes it (a higher level) and
        lowering d at or above what follows it (a lower one), unless d comes right before u
        and ends up below it (tests/policies/test_goodput.py checks this against every pair)."""
        return not (self.rank[u] == self.rank[d] + 1 and ks[d] - 1 < ks[u] + 1)


def _changed(ks: list[int], requests: list[int], news) -> list[int]:
    """`ks` with each of `requests` set to its new k (`news`: one each, or one for all)."""
    trial = list(ks)
    if isinstance(news, int):
        for i in requests:
            trial[i] = news
    else:
        for i, k in zip(requests, news):
            trial[i] = k
    return trial


def _groups(ks: Sequence[int], accepted: Sequence[int]) -> tuple:
    """((k, [accepted, ...]), ...) of the requests that drafted, by k in order of appearance."""
    groups: dict[int, list[int]] = {}
    for k, acc in zip(ks, accepted):
        if k > 0:
            groups.setdefault(k, []).append(acc)
    return tuple(groups.items())


def _inverted(groups) -> float:
    """The i.i.d. alpha whose E[accepted | k] matches the mean accepted of each group of outcomes
    with the same k, averaged over the groups weighted by their drafts."""
    drafted = sum(k * len(acc) for k, acc in groups)
    return sum(k * len(acc) * alpha_from_mean_accepted(sum(acc) / len(acc), k)
               for k, acc in groups) / drafted


def _sizes(n: int) -> list[int]:
    """1, 2, 4, ... below n, and n (nothing if n = 0)."""
    if n <= 0:
        return []
    out, s = [], 1
    while s < n:
        out.append(s)
        s *= 2
    out.append(n)
    return out
