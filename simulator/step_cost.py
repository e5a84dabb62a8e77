"""Cost of one engine iteration, composed from a LatencyModel's forward passes.

An iteration with per-request k_r costs max k_r draft passes (pass j over the requests with
k_r >= j), one verify pass over sum_r (k_r + 1) tokens plus any prompt chunks, and the
per-iteration overhead (docs/design.md "Latency models"). The chain's first draft pass feeds each
request's catch-up (`feeds`, simulator/draft_feed.py); model-free drafters cost nothing. Batches
are ragged, not padded to the largest k as engines with fixed CUDA-graph shapes are. `cached`
may be 2-D (requests x steps) for the fast path, with requests bucketed by k. Every rule and
why: docs/step-cost.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simulator.draft_tree import TreeShape
from simulator.kernels import compiled
from simulator.latency import LatencyModel
from simulator.roofline import RooflineLatency


class StepCostModel:
    """Iteration times from a latency model; also the `StepCost` a policy sees.

    With a `draft_tree` (simulator/draft_tree.py; by default the latency model's, which
    `validate` takes from a tree drafter) a request at k drafts the tree to depth k: its
    verify pass feeds `draft_tokens(k)` + 1 tokens, and its head pass j >= 2 one entry per
    node of depth j - 1 that has children, each seeing the history, its ancestors and itself.
    Every k still counts k drafted positions (a chain of k is the one-node-per-depth tree)."""

    def __init__(self, latency: LatencyModel, draft_tree: TreeShape | None = None,
                 speculating: bool = False) -> None:
        self.latency = latency
        self.draft_tree = draft_tree if draft_tree is not None else getattr(
            latency, "draft_tree", None)
        #: a step with decodes and no drafts, on an engine that speculates, pays the latency
        #: model's idle proposer time (its proposer ran and found nothing: vLLM's n-gram)
        self.idle_s = float(getattr(latency, "idle_proposer_s", 0.0)) if speculating else 0.0
        #: on the roofline, the numbers its passes are priced from, per role, as the compiled
        #: loops take them (simulator/compiled.py); None on another latency model
        self._roofline = ({role: _loop_numbers(latency, role) for role in ("target", "draft")}
                          if type(latency) is RooflineLatency else None)
        #: ... where a step of a draft model's chain is priced by one compiled loop
        #: (`_chain_step_s`): no tree, no idle proposer
        self._chain_step = (self._roofline is not None and self._roofline["draft"] is not None
                            and self.draft_tree is None and not self.idle_s)

    def iteration_s(
        self,
        ks: Sequence[int] | np.ndarray,
        cached: Sequence[int] | np.ndarray,
        prefill_seqs: int = 0,
        prefill_tokens: int = 0,
        prefill_cached: int = 0,
        prefill_pairs: int = 0,
        feeds: Sequence[int] | np.ndarray | None = None,
        in_step_order: bool = False,
    ):
        """Seconds of one iteration (float), or of each column of `cached` if it is 2-D.

        ks      (R,) draft tokens per decode request; (R, S) with a 2-D `cached`: per step too
        cached  (R,) or (R, S): tokens in each decode request's KV cache before the verify pass
        prefill_*: aggregates of the prompt chunks processed in the same iteration
        feeds   None, or like `cached`: tokens each request feeds in its chain's first draft
                pass (its catch-up; 1 when None); ignored where k = 0
        in_step_order: with a 2-D `cached`, add each step's draft passes in the order one
                step adds them (its floats to the bit, as a run stepped one at a time has them)
        """
        if (self._chain_step and not prefill_seqs and len(ks)
                and not (isinstance(cached, np.ndarray) and cached.ndim == 2)
                and compiled() is not None):  # one step of a draft model's chain, compiled
            return self._chain_step_s(ks, cached, feeds)
        lat, tree = self.latency, self.draft_tree
        # no draft model and a chain: nothing to bucket by k, the verify pass's sums suffice
        # (the same integers: the hot path of model-free drafters, in either form)
        chain_only = tree is None and not lat.has_draft_model
        many = isinstance(cached, np.ndarray) and cached.ndim == 2  # np.ndim copies a list
        distinct = None
        varied = False  # drafts that vary by step too, with a draft model drafting a chain
        if many:
            ks = np.asarray(ks, dtype=np.int64)
            if chain_only:
                return self._verify_steps_s(ks, cached)
            varied = ks.ndim == 2 and tree is None and not prefill_seqs
            if varied:  # each step's verify sums from the matrices, not per k (same integers)
                n_decode, positions, cached_total = len(cached), ks.sum(axis=0), cached.sum(axis=0)
                # causal pairs of a (k+1)-token verify over c cached: (k+1)c + (k+1)(k+2)/2
                pairs = ((ks + 1) * cached).sum(axis=0) + own_pairs(ks).sum(axis=0)
            else:
                distinct, counts, sums = _buckets_per_step(ks, cached)
        elif chain_only:
            n_decode, positions, cached_total, pairs = verify_sums(ks, cached)
        else:
            distinct, counts, sums = _buckets(ks, cached)
        if distinct is not None:
            n_decode = sum(counts)
            widths = distinct if tree is None else [tree.draft_tokens(k) for k in distinct]
            cached_total = sum(sums) if sums else 0
            # causal pairs of a (k+1)-token verify over c cached: (k+1)c + (k+1)(k+2)/2
            own = [(k + 1) * (k + 2) // 2 if tree is None else tree.verify_pairs(k)
                   for k in distinct]
            pairs = sum((w + 1) * s + n * o for w, n, s, o in zip(widths, counts, sums, own))
            # host time per drafted position, as `validate` fits it on the engines' `drafted`
            # (a tree's depth, not its nodes)
            positions = sum(k * n for k, n in zip(distinct, counts))
            positions_fed = sum(w * n for w, n in zip(widths, counts))
        else:
            positions_fed = positions
        total = self._target_s(n_decode, positions, positions_fed, cached_total, pairs,
                               prefill_seqs, prefill_tokens, prefill_cached, prefill_pairs)
        if lat.has_draft_model:
            first = None if feeds is None else (
                _catch_up_steps(np.asarray(ks), cached, np.asarray(feeds)) if many
                else _catch_up(ks, cached, feeds))
            if varied:
                return total + self._varied_chain_s(ks, cached, first, in_step_order)
            if tree is not None:  # a tree has passes to its depth only
                distinct, counts, sums = _capped(distinct, counts, sums, tree.depth)
            total = total + self._draft_chain_s(distinct, counts, sums, prefill_seqs,
                                                prefill_tokens, prefill_cached, prefill_pairs,
                                                first, in_step_order)
        return total

    def _chain_step_s(self, ks, cached, feeds) -> float:
        """`iteration_s` of one decode step of a draft model's chain on the roofline, in one
        compiled loop (simulator/compiled.py): the same floats, as its sums are the same
        integers and its passes are added in the same order."""
        fed = feeds is not None
        if len(cached) != len(ks) or (fed and len(feeds) != len(cached)):
            raise ValueError(f"ks, cached and feeds must have one entry per request, got "
                             f"{len(ks)}, {len(cached)} and {len(feeds) if fed else 'none'}")
        return compiled().chain_step_time(
            np.asarray(ks, dtype=np.int64), np.asarray(cached, dtype=np.int64),
            np.asarray(feeds, dtype=np.int64) if fed else _NO_FEEDS, fed,
            self._roofline["target"], self._roofline["draft"],
            self.latency.step_overhead_s(len(ks)))

    def _target_s(self, n_decode, positions, positions_fed, cached_total, pairs,
                  prefill_seqs: int = 0, prefill_tokens: int = 0, prefill_cached: int = 0,
                  prefill_pairs: int = 0):
        """The target's part of an iteration (its verify pass with any prompt chunks, the
        step's overhead, the idle proposer) from the verify pass's sums: `positions` drafts
        (`positions_fed` the tokens they feed: a tree's nodes) over `n_decode` requests."""
        lat = self.latency
        query = positions_fed + n_decode
        if prefill_seqs and getattr(lat, "mixed_parts", False):
            # prompt chunks priced as a prefill (a continuing chunk too) and the decodes as
            # their own pass; the pass's fixed cost is paid once
            total = lat.forward_s("target", prefill_seqs, prefill_tokens, prefill_cached,
                                  prefill_pairs, phase="prefill")
            if n_decode:
                total = (total + lat.forward_s("target", n_decode, query, cached_total, pairs)
                         - lat.fixed_pass_s)
        else:
            total = lat.forward_s("target", n_decode + prefill_seqs, query + prefill_tokens,
                                  cached_total + prefill_cached, pairs + prefill_pairs)
        total = total + lat.step_overhead_s(n_decode + prefill_seqs, positions)
        if self.idle_s:
            total = total + self._idle_proposer_s(n_decode, positions)
        return total

    def chain_mixed_s(self, seqs: int, drafted: int, cached: int, pairs: int,
                      prefill_seqs: int, prefill_tokens: int, prefill_cached: int,
                      prefill_pairs: int) -> float:
        """`iteration_s` of one step whose decodes (a model-free chain's, where
        `prices_chain_sums`) are given by their verify pass's sums, with prompt chunks beside
        them: the same Python integers reach the latency model, so the same float."""
        return self._target_s(seqs, drafted, drafted, cached, pairs, prefill_seqs,
                              prefill_tokens, prefill_cached, prefill_pairs)

    def _verify_steps_s(self, ks: np.ndarray, cached: np.ndarray) -> np.ndarray:
        """Many steps of one batch whose drafter has no model (so no draft passes) and drafts
        a chain: each step's verify aggregates summed directly, not per k (the same integers
        as the buckets', with fewer numpy calls: the fast path's hot spot)."""
        k = ks if ks.ndim == 2 else ks[:, None]
        # causal pairs of a (k+1)-token verify over c cached: (k+1)c + (k+1)(k+2)/2
        pairs = ((k + 1) * cached).sum(axis=0) + ((k + 1) * (k + 2) // 2).sum(axis=0)
        return self.chain_steps_s(len(cached), k.sum(axis=0), cached.sum(axis=0), pairs)

    def chain_segment_s(self, ks: np.ndarray, prompts: np.ndarray, gen: np.ndarray,
                        gen_sums: np.ndarray | None = None, drafted: np.ndarray | None = None
                        ) -> np.ndarray | None:
        """`iteration_s(ks, prompts[:, None] + gen - 1)` for a model-free chain drafter (None
        for any other), from the batch's sums: ks (R,) or (R, S), prompts (R,), gen (R, S)
        tokens generated before each step. The same integer arrays reach the latency model, so
        the same floats, with fewer numpy passes over (R, S) arrays: the fast path's hot spot.
        `gen_sums`, `drafted`: gen's and a 2-D ks' column sums, where the caller has them."""
        if not self.prices_chain_sums:
            return None
        before = prompts - 1  # each request's cached tokens before its first generated one
        cached = (gen.sum(axis=0) if gen_sums is None else gen_sums) + int(before.sum())
        k1 = ks + 1
        if ks.ndim == 1:  # (k + 1)(p - 1 + g) summed over the requests, for every step at once
            drafted = np.array([int(ks.sum())], dtype=np.int64)
            pairs = k1 @ gen + (int(k1 @ before) + int(own_pairs(ks).sum()))
        else:
            drafted = ks.sum(axis=0) if drafted is None else drafted
            # (k + 1) c + (k + 1)(k + 2) / 2 = (k + 1)(2 (c + 1) + k) / 2, c = p - 1 + g: fewer
            # array passes; halving after the sum is exact (each (k + 1)(k + 2) is even)
            c1 = gen + (before + 1)[:, None]  # c + 1
            pairs = (k1 * (c1 + c1 + ks)).sum(axis=0) // 2
        return self.chain_steps_s(len(prompts), drafted, cached, pairs)

    @property
    def prices_chain_sums(self) -> bool:
        """Whether a chain's step is priced from its verify pass's sums alone (a model-free
        drafter, no tree): what `chain_segment_s` and `chain_steps_s` price."""
        return self.draft_tree is None and not self.latency.has_draft_model

    @property
    def prices_alternatives_at_once(self) -> bool:
        """Whether a planner's alternatives are priced in one call from their verify pass's
        sums (`chain_sums_s`, `steps_s`), to the floats of one by one: a model-free chain on a
        latency model whose arrays give its scalars' numbers and that prices in batches. (A
        draft model's chain on such a model is priced at once by `steps_s` too, from its
        passes rather than the sums alone.)"""
        lat = self.latency
        return self.prices_chain_sums and lat.arrays_match_scalars and lat.batch_pricing

    def chain_steps_s(self, seqs, drafted, cached, pairs):
        """A model-free chain's steps from their verify pass's sums, where `prices_chain_sums`:
        requests, drafts, cached tokens and causal pairs (elementwise over arrays, one entry
        per step): the same floats as `chain_segment_s` of the matrices they sum."""
        lat = self.latency
        if (isinstance(drafted, np.ndarray) and self._roofline is not None  # (scalars: below)
                and not self.idle_s and isinstance(seqs, int) and seqs > 0
                and compiled() is not None):
            if isinstance(cached, int):  # one cached total for every step (a planner's
                # alternatives for one batch)
                cached = np.full(len(drafted), cached, dtype=np.int64)
            if _steps_of(drafted, cached, pairs):  # the same, compiled
                return compiled().verify_times(seqs, drafted, cached, pairs,
                                               *self._roofline["target"],
                                               lat.step_overhead_s(seqs))
        total = lat.forward_s("target", seqs, drafted + seqs, cached, pairs)
        total = total + lat.step_overhead_s(seqs, drafted)
        return total + self._idle_proposer_s(seqs, drafted) if self.idle_s else total

    def _idle_proposer_s(self, seqs, drafted):
        """`idle_s` where a step decodes and drafts nothing, else 0 (elementwise)."""
        if isinstance(seqs, np.ndarray) or isinstance(drafted, np.ndarray):
            return np.where((np.asarray(seqs) > 0) & (np.asarray(drafted) == 0), self.idle_s, 0.0)
        return self.idle_s if seqs > 0 and drafted == 0 else 0.0

    def chain_sums_s(self, requests, drafted: Sequence[int], cached,
                     pairs: Sequence[int]) -> list[float] | None:
        """Policy-facing: `step_s` of steps given by their verify pass's sums: requests, drafted
        tokens, cached tokens (sum_r c_r) and causal pairs, sum_r (k_r + 1) c_r + (k_r + 1)
        (k_r + 2) / 2; one step per element of `drafted` (`requests` and `cached` may be one
        for all). The same floats as `step_s` of their ks; None where a step's price is not a
        function of those sums (a draft model, a tree, a latency model whose arrays might not
        match its scalars), or where the latency model does not price alternatives at once
        (`batch_pricing` False: a profile, whose planners weigh what they weigh one by one)."""
        if not self.prices_alternatives_at_once:
            return None
        if isinstance(requests, int) and isinstance(cached, int) and len(drafted) <= 2:
            # a step or two: Python floats cost less than arrays, and are the same floats
            return [float(self.chain_steps_s(requests, int(d), cached, int(p)))
                    for d, p in zip(drafted, pairs)]
        if not isinstance(requests, int):
            requests = np.asarray(requests, dtype=np.int64)
        if not isinstance(cached, int):
            cached = np.asarray(cached, dtype=np.int64)
        return np.atleast_1d(self.chain_steps_s(
            requests, np.asarray(drafted, dtype=np.int64), cached,
            np.asarray(pairs, dtype=np.int64))).tolist()

    def _pass_shape(self, j: int) -> tuple[int, int]:
        """Pass j's (entries fed per request, entries each request holds before it beyond its
        c_r): a chain feeds 1 after j - 1; a tree's pass j >= 2 feeds the nodes of depth j - 1
        that have children, after the history's 1 and the nodes of passes 2..j-1."""
        tree = self.draft_tree
        if tree is None or j == 1:
            return 1, j - 1
        return tree.expanding(j - 1), 1 + sum(tree.expanding(i) for i in range(1, j - 1))

    def _draft_chain_s(self, distinct, counts, sums, prefill_seqs, prefill_tokens,
                       prefill_cached, prefill_pairs, first, in_step_order=False):
        """Draft passes 1..max k; pass j feeds one token to each request with k_r >= j, which
        holds c_r + j - 1 cached tokens before it (so c_r + j causal pairs). `first`: what the
        catch-up adds to pass 1's (tokens, cached, pairs), or None."""
        passes = max(max(distinct, default=0), 1 if prefill_seqs else 0)
        if passes == 0:
            return 0.0
        if sums and np.ndim(sums[0]):
            return self._draft_chain_per_step(distinct, counts, sums, passes, first,
                                              in_step_order)
        forward = self.latency.forward_s
        by_k = dict(zip(distinct, zip(counts, sums)))
        total, n_j, c_j = 0.0, 0, 0
        for j in range(passes, 0, -1):
            if j in by_k:  # requests drafting exactly j join every pass up to j
                n_j, c_j = n_j + by_k[j][0], c_j + by_k[j][1]
            rows, held = self._pass_shape(j)  # an entry of pass j sees c_r + j entries
            seqs, tokens, cached, pairs = n_j, n_j * rows, c_j + n_j * held, rows * (c_j + n_j * j)
            if j == 1 and first is not None:
                tokens, cached, pairs = tokens + first[0], cached + first[1], pairs + first[2]
            if j == 1 and prefill_seqs:  # the draft model prefills this batch's prompt chunks
                seqs, tokens = seqs + prefill_seqs, tokens + prefill_tokens
                cached, pairs = cached + prefill_cached, pairs + prefill_pairs
            total += forward("draft", seqs, tokens, cached, pairs)
        return total

    def _draft_chain_per_step(self, distinct, counts, sums, passes, first, in_step_order):
        """The same chain for many steps of one batch (no prompt chunks), vectorised: each
        pass's requests and their cached tokens summed from the buckets (counts per step too
        where the ks are), then `_passes_s`."""
        steps = len(sums[0])
        per_step = any(np.ndim(n) for n in counts)
        seqs = np.zeros((passes, steps if per_step else 1), dtype=np.int64)
        cached = np.zeros((passes, steps), dtype=np.int64)
        for k, n, s in zip(distinct, counts, sums):  # a request drafting k joins passes 1..k
            seqs[:k] += n
            cached[:k] += s
        return self._passes_s(seqs, cached, first, in_step_order, per_step)

    def _passes_s(self, seqs: np.ndarray, cached: np.ndarray, first, in_step_order: bool,
                  per_step: bool) -> np.ndarray:
        """Draft passes 1..P of many steps from each pass's requests `seqs` ((P, 1), or
        (P, steps) where they vary by step) and their cached tokens before the chain
        (P, steps). The passes' times are summed down the passes, or, `in_step_order`, from the
        last pass to the first as `_draft_chain_s` adds them (a pass a step does not run adds
        0.0 exactly)."""
        passes, steps = cached.shape
        j = np.arange(1, passes + 1).reshape(-1, 1)
        shape = np.array([self._pass_shape(i) for i in range(1, passes + 1)], dtype=np.int64)
        rows, held = shape[:, :1], shape[:, 1:]
        pairs = rows * (cached + seqs * j)
        cached += seqs * held
        tokens = seqs * rows
        if first is not None:  # the catch-up: pass 1 feeds more tokens over fewer cached
            if not per_step:
                tokens = np.repeat(tokens, steps, axis=1)
            tokens[0] += first[0]
            cached[0] += first[1]
            pairs[0] += first[2]
        times = self.latency.forward_s("draft", seqs, tokens, cached, pairs)
        if per_step:  # a pass a step does not run costs nothing, whatever the model says of it
            times = np.where(seqs > 0, times, 0.0)
        if not in_step_order:
            return times.sum(axis=0)
        total = times[-1].copy()
        for row in times[-2::-1]:
            total += row
        return total

    def chain_passes_s(self, seqs: np.ndarray, cached: np.ndarray, feed_tokens: np.ndarray,
                       feed_pairs: np.ndarray, in_step_order: bool):
        """A chain's draft passes j = 1..P over many steps from their sums: `seqs` (P x
        steps) the requests drafting at least j, `cached` their cached tokens before the
        chain (a fresh array: the numpy code changes it in place), and pass 1's catch-up
        tokens and pairs per step (simulator/batch_columns.py). The same integers as
        `iteration_s`'s matrices give, so the same floats; on the roofline, with the compiled
        loops, the same operations compiled (simulator/compiled.py)."""
        loops = compiled()
        if loops is not None and self.draft_tree is None and self._roofline is not None:
            times = loops.chain_pass_times(seqs, cached, feed_tokens, feed_pairs,
                                           *self._roofline["draft"], in_step_order)
            return times[0] if in_step_order else times.sum(axis=0)  # the same, compiled
        return self._passes_s(seqs, cached, (feed_tokens, -feed_tokens, feed_pairs),
                              in_step_order, True)

    def _varied_chain_s(self, ks: np.ndarray, cached: np.ndarray, first,
                        in_step_order: bool):
        """The draft passes of many steps whose drafts vary by step ((requests x steps) `ks`:
        capped or walked): each pass's requests taken from the matrices directly (the same
        integers as the buckets', in a few array passes instead of a few per k)."""
        passes = int(ks.max())
        if passes == 0:
            return 0.0
        joins = ks >= np.arange(1, passes + 1).reshape(-1, 1, 1)  # pass j: requests with k >= j
        return self._passes_s(joins.sum(axis=1), np.where(joins, cached, 0).sum(axis=1),
                              first, in_step_order, True)

    def step_s(self, ks: Sequence[int], context_tokens: Sequence[int],
               feeds: Sequence[int] | None = None) -> float:
        """Policy-facing: one decode step for requests whose sequences are `context_tokens` long
        and whose chains' first draft passes feed `feeds` (their `draft_feed`; None: one each).

        The newest token of each sequence is fed again with the drafts, so the cache holds
        context - 1 tokens before the verify pass.
        """
        return self.iteration_s(ks, np.asarray(context_tokens, dtype=np.int64) - 1, feeds=feeds)

    def steps_s(self, ks_rows: Sequence[Sequence[int]] | np.ndarray,
                context_tokens: Sequence[int]) -> list[float]:
        """Policy-facing: `step_s` of each row of `ks_rows` (lists, or an integer matrix),
        alternatives for the same requests (what a planner weighs), priced in one numpy pass
        where that gives the same floats as one by one (a model-free chain drafter on a latency
        model whose arrays match its scalars; or a draft model's chain on such a model, its
        passes added in the order one step adds them), else one by one."""
        if len(ks_rows) == 0:
            return []
        lat = self.latency
        # a draft model's passes at once cost about what four rows one by one do (measured:
        # docs/speed.md), and give the same floats either way; compiled, less than one row
        compiled_chain = self._roofline is not None and compiled() is not None
        chain_model = ((len(ks_rows) >= DRAFT_ROWS_AT_ONCE or compiled_chain)
                       and len(context_tokens) > 0
                       and self.draft_tree is None and lat.has_draft_model
                       and lat.arrays_match_scalars and lat.batch_pricing)
        if not (self.prices_alternatives_at_once or chain_model):
            rows = ks_rows.tolist() if isinstance(ks_rows, np.ndarray) else ks_rows
            return [float(self.step_s(ks, context_tokens)) for ks in rows]
        cached = np.asarray(context_tokens, dtype=np.int64) - 1
        if chain_model and compiled_chain:
            return self._alternatives_s(np.array(ks_rows, dtype=np.int64), cached)
        ks = np.array(ks_rows, dtype=np.int64).T  # requests x alternatives
        cached = np.broadcast_to(cached[:, None], ks.shape)
        if chain_model:  # the fast path's varied steps: each column's floats as `step_s`'s
            return np.atleast_1d(self.iteration_s(ks, cached, in_step_order=True)).tolist()
        return self._verify_steps_s(ks, cached).tolist()

    def _alternatives_s(self, ks: np.ndarray, cached: np.ndarray) -> list[float]:
        """`steps_s` of a draft model's chain on the roofline, with the compiled loops: each
        alternative (a row of `ks`) priced from its sums as the fast path prices a step from
        the kept sums (`_Stretch._from_columns`: its verify pass, then its passes added from
        the last), so the same floats as `iteration_s` of its matrix in step order."""
        if not self.idle_s:  # in one call: its sums, verify passes and draft passes
            return compiled().alternatives_times(
                ks, cached, self._roofline["target"], self._roofline["draft"],
                self.latency.step_overhead_s(len(cached))).tolist()
        drafted, pairs, seqs, held = compiled().alternative_sums(ks, cached)
        n = len(drafted)
        total = self.chain_steps_s(len(cached), drafted, int(cached.sum()), pairs)
        if len(seqs):  # (no alternative drafts: no pass, as `_varied_chain_s` adds none)
            none = np.zeros(n, dtype=np.int64)  # no catch-up: each chain feeds one token
            total = total + self.chain_passes_s(seqs, held, none, none, in_step_order=True)
        return total.tolist()

    def prefill_s(self, prompt_tokens: Sequence[int]) -> float:
        """An iteration that prefills whole prompts and nothing else."""
        seqs = len(prompt_tokens)
        tokens = sum(prompt_tokens)
        pairs = sum(p * (p + 1) // 2 for p in prompt_tokens)
        lat = self.latency
        total = lat.forward_s("target", seqs, tokens, 0, pairs) + lat.step_overhead_s(seqs)
        if lat.has_draft_model:
            total += lat.forward_s("draft", seqs, tokens, 0, pairs)
        return float(total)


_NO_FEEDS = np.zeros(0, dtype=np.int64)  # `_chain_step_s` without catch-up feeds

#: from this many alternatives on, `steps_s` prices a draft model's chain at once
DRAFT_ROWS_AT_ONCE = 4

#: (k + 1)(k + 2) / 2 for k = 0..1023: a verify pass's own causal pairs, looked up
_OWN_PAIRS = (np.arange(1, 1025, dtype=np.int64) * np.arange(2, 1026, dtype=np.int64)) // 2


def _loop_numbers(latency: RooflineLatency, role: str) -> tuple | None:
    """A role's pass numbers as the compiled loops take them: memory s, per token, compute per
    query token, per pair, fixed, whether there are all-reduces, their s per pass and per
    token (`RooflineLatency.pass_coefficients`); None for a draft that is no model."""
    numbers = latency.pass_coefficients(role)
    if numbers is None:
        return None
    m0, m1, f_q, f_pair, fixed, c0, c1 = numbers
    return m0, m1, f_q, f_pair, fixed, bool(c0 or c1), c0, c1


def _steps_of(*columns) -> bool:
    """Whether these are one-dimensional integer arrays of one length (a step's per entry)."""
    first = columns[0]
    return all(isinstance(c, np.ndarray) and c.ndim == 1 and c.dtype == np.int64
               and len(c) == len(first) for c in columns)


def own_pairs(ks):
    """(k + 1)(k + 2) / 2 elementwise: one lookup instead of three array operations (an
    int for an int)."""
    if isinstance(ks, int):
        return (ks + 1) * (ks + 2) // 2
    try:
        return _OWN_PAIRS[ks]
    except IndexError:  # a k past the table (or negative: the formula's answer, as ever)
        return (ks + 1) * (ks + 2) // 2


def _catch_up(ks, cached, feeds) -> tuple[int, int, int]:
    """What feeding f_r tokens instead of one in the first draft pass adds to its (tokens,
    cached, pairs), summed over the requests that draft: a request that holds c_r + 1 - f_r
    cached entries before it feeds f_r (it ends the pass at c_r + 1 either way). Plain Python:
    the engine calls it every iteration."""
    if len(feeds) != len(cached):
        raise ValueError(f"feeds must have the shape of cached ({len(cached)},), got "
                         f"({len(feeds)},)")
    tokens = pairs = 0
    for k, c, f in zip(ks, cached, feeds):
        if k > 0 and f != 1:  # g = f - 1 more tokens: g (c + 1) - g (g + 1) / 2 more pairs
            tokens += f - 1
            pairs += (f - 1) * (c + 1) - (f - 1) * f // 2
    return int(tokens), -int(tokens), int(pairs)


def _catch_up_steps(ks, cached, feeds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same per step for (requests x steps) `cached` and `feeds` (numpy arrays)."""
    if feeds.shape != cached.shape:
        raise ValueError(f"feeds must have the shape of cached {cached.shape}, got "
                         f"{feeds.shape}")
    drafting = ks > 0
    if drafting.ndim == 2:  # drafts per step too: a step that drafts nothing feeds nothing
        extra = np.where(drafting, feeds - 1, 0)
    else:
        if not drafting.all():
            cached, feeds = cached[drafting], feeds[drafting]
        extra = feeds - 1
    # g more tokens: g (c + 1) - g (g + 1) / 2 more causal pairs
    tokens = extra.sum(axis=0)
    pairs = (extra * (cached + 1) - extra * (extra + 1) // 2).sum(axis=0)
    return tokens, -tokens, pairs


def _capped(distinct: list, counts: list, sums: list, depth: int) -> tuple[list, list, list]:
    """The buckets with every k above `depth` merged into `depth` (sums may be arrays)."""
    if not distinct or max(distinct) <= depth:
        return distinct, counts, sums
    merged: dict[int, list] = {}
    for k, n, s in zip(distinct, counts, sums):
        k = min(int(k), depth)
        if k in merged:
            merged[k] = [merged[k][0] + n, merged[k][1] + s]
        else:
            merged[k] = [n, s]
    keys = sorted(merged)
    return keys, [merged[k][0] for k in keys], [merged[k][1] for k in keys]


def verify_sums(ks: Sequence[int], cached: Sequence[int]) -> tuple[int, int, int, int]:
    """(requests, drafts, cached tokens, causal pairs) of a chain's verify pass, in plain
    Python: the step path calls it every iteration."""
    if isinstance(ks, np.ndarray):
        ks = ks.tolist()
    if isinstance(cached, np.ndarray):  # Python ints: numpy scalars are slow one by one
        cached = cached.tolist()
    drafts = total = pairs = 0
    for k, c in zip(ks, cached):
        drafts += k
        total += c
        pairs += (k + 1) * c + (k + 1) * (k + 2) // 2
    return len(ks), drafts, total, pairs


def _buckets(ks: Sequence[int], cached: Sequence[int]) -> tuple[list, list, list]:
    """Per distinct k: (k, how many requests, sum of their cached tokens), in plain Python."""
    counts: dict[int, int] = {}
    sums: dict[int, int] = {}
    for k, c in zip(ks, cached):
        k = int(k)
        counts[k] = counts.get(k, 0) + 1
        sums[k] = sums.get(k, 0) + int(c)
    distinct = sorted(counts)
    return distinct, [counts[k] for k in distinct], [sums[k] for k in distinct]


def _buckets_per_step(ks: np.ndarray, cached: np.ndarray) -> tuple[list, list, list]:
    """The same for a (requests x steps) matrix: sums are per-step arrays, and so are counts
    where `ks` is per step too (requests x steps: a drafter that proposes fewer than k)."""
    if ks.min() == ks.max():
        return [int(ks.flat[0])], [len(ks)], [cached.sum(axis=0)]
    if ks.ndim == 2:  # a bucket empty at a step adds 0 to each of its sums
        masks = [(int(k), ks == k) for k in np.unique(ks)]
        return ([k for k, _ in masks], [m.sum(axis=0) for _, m in masks],
                [np.where(m, cached, 0).sum(axis=0) for _, m in masks])
    distinct = np.unique(ks).tolist()
    return (distinct, [int((ks == k).sum()) for k in distinct],
            [cached[ks == k].sum(axis=0) for k in distinct])
