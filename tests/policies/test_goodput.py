"""goodput (SmartSpec, Liu et al. 2024; the prototype's vllm/spec_decode/dsd.py): literal plans
under LinearCost, the EMA, the re-plan cadence, the KV check, per-request allocation, bounds."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.policy_fakes import FakeRequest, LinearCost, context, outcome

from policies import PolicyError, alpha_from_mean_accepted, expected_emitted, make_policy
from policies.goodput import Goodput, _inverted

NO_KNEE = 10**9


def _reqs(n: int, first_id: int = 0, prompt: int = 100) -> list[FakeRequest]:
    return [FakeRequest(first_id + i, prompt_tokens=prompt) for i in range(n)]


def _plan(policy: Goodput, reqs, **ctx_kw) -> list[int]:
    """Call `choose` until the policy re-plans (every `replan_every` calls); return that plan
    (as the prototype drafts it: no probe of a k = 0 plan)."""
    ks, probes = [], policy.faithful
    policy.faithful = True
    for _ in range(policy.replan_every):
        ks = list(policy.choose(context(reqs, **ctx_kw)))
    policy.faithful = probes
    return ks


# -- the batch plan: literal cases (LinearCost: T = 10 ms + 1 us/token + 1 ms per chain draft) --

def test_cheap_draft_and_high_acceptance_speculate():
    # a = 0.8, B = 1: goodput(k) = E(k) / (10.001 + 1.001 k ms):
    # k=0 0.1000 x 1.1 = 0.1100, k=1 0.1636, 2 0.2033, 3 0.2270, 4 0.2400, 5 0.2458,
    # k=6 0.2468, k=7 0.2446 (first drop: stop) -> 6
    policy = Goodput(initial_alpha=0.8, replan_every=1)
    assert _plan(policy, _reqs(1), cost=LinearCost(knee_tokens=NO_KNEE)) == [6]


def test_low_acceptance_stays_at_zero_thanks_to_the_bonus():
    # a = 0.15, draft 0.5 ms: goodput(0) = 1/10.001 = 0.09999 (x 1.1 = 0.10999),
    # goodput(1) = 1.15/10.502 = 0.10950: better than plain decoding, but not by 10%
    cost = LinearCost(draft_s=0.5e-3, knee_tokens=NO_KNEE)
    assert _plan(Goodput(initial_alpha=0.15, replan_every=1), _reqs(1), cost=cost) == [0]
    assert _plan(Goodput(initial_alpha=0.15, replan_every=1, k0_bonus=1.0), _reqs(1),
                 cost=cost) == [1]


def test_a_batch_past_the_compute_knee_stays_at_zero():
    # B = 400, a = 0.8, knee 256 tokens (+20 us per token above it):
    # k=0: 400 tokens, 10 + 0.4 + 2.88 = 13.28 ms, goodput 30.1 x 1.1 = 33.1 per ms
    # k=1: 800 tokens, 10 + 0.8 + 10.88 + 1 = 22.68 ms, 720 expected tokens: 31.7 per ms
    reqs = _reqs(400)
    assert set(_plan(Goodput(initial_alpha=0.8, replan_every=1), reqs, cost=LinearCost())) == {0}
    # the same batch without a knee speculates: 10.4 + 1.4 k ms, k=5 84.8 per ms, k=6 84.1
    assert set(_plan(Goodput(initial_alpha=0.8, replan_every=1), reqs,
                     cost=LinearCost(knee_tokens=NO_KNEE))) == {5}


def test_the_scan_stops_at_the_first_drop_as_the_prototype_does():
    # a bucketed cost: k=2 and 3 are slow, k=4 would be best overall; the prototype's scan
    # stops at k=2 (no better than k=1) and keeps 1
    class Bucketed:
        def step_s(self, ks, contexts):
            return 10e-3 + 0.1e-3 * max(ks) + (8e-3 if max(ks) in (2, 3) else 0.0)

    assert _plan(Goodput(initial_alpha=0.9, replan_every=1, k_max=4), _reqs(1),
                 cost=Bucketed()) == [1]


def test_k_is_capped_by_k_max_and_the_engine():
    cost = LinearCost(knee_tokens=NO_KNEE)
    assert _plan(Goodput(initial_alpha=0.95, replan_every=1, k_max=3), _reqs(2), cost=cost) \
        == [3, 3]
    assert _plan(Goodput(initial_alpha=0.95, replan_every=1, k_max=8), _reqs(2), cost=cost,
                 k_max=2) == [2, 2]


def test_the_engines_own_cost_model_is_asked_with_the_batch_contexts():
    seen = []

    class Spy(LinearCost):
        def step_s(self, ks, contexts):
            seen.append((list(ks), list(contexts)))
            return super().step_s(ks, contexts)

    reqs = [FakeRequest(0, prompt_tokens=50), FakeRequest(1, prompt_tokens=500, generated=9)]
    _plan(Goodput(replan_every=1, k_max=2), reqs, cost=Spy())
    assert seen and all(c == [51, 509] for _, c in seen)
    assert [ks for ks, _ in seen][:2] == [[0, 0], [1, 1]]


# -- the KV check ------------------------------------------------------------------------------

def test_kv_headroom_forces_k_zero():
    # two requests of 101 tokens: k=0 needs 2 (101 + 1) 1.1 = 224.4 tokens, k=1 226.6
    reqs = _reqs(2)
    cost = LinearCost(knee_tokens=NO_KNEE)
    assert _plan(Goodput(initial_alpha=0.9, replan_every=1), reqs, cost=cost,
                 kv_capacity_tokens=225) == [0, 0]
    assert _plan(Goodput(initial_alpha=0.9, replan_every=1), reqs, cost=cost,
                 kv_capacity_tokens=300)[0] > 0
    # the headroom is a parameter: without it, k=1 fits (2 * 103 = 206 <= 225)
    assert _plan(Goodput(initial_alpha=0.9, replan_every=1, kv_headroom=1.0), reqs, cost=cost,
                 kv_capacity_tokens=225)[0] > 0


def test_when_even_k_zero_overflows_the_plan_is_zero_not_k_max():
    # the prototype's 10000 s sentinel would score goodput B E(k) / 10000, largest at k_max
    assert _plan(Goodput(initial_alpha=0.9, replan_every=1), _reqs(2),
                 cost=LinearCost(knee_tokens=NO_KNEE), kv_capacity_tokens=100) == [0, 0]


# -- the acceptance estimate -------------------------------------------------------------------

def test_ema_after_one_step():
    policy = Goodput()
    policy.observe(context(_reqs(1)), [outcome(0, k=4, accepted=3)])
    assert policy.alpha_hat == pytest.approx(0.85 * 0.7 + 0.15 * 0.75)


def test_ema_reads_the_batch_ratio_and_skips_steps_without_drafts():
    policy = Goodput(ema_input="cumulative")
    reqs = _reqs(2)
    policy.observe(context(reqs), [outcome(0, k=4, accepted=3), outcome(1, k=4, accepted=1)])
    after = 0.85 * 0.7 + 0.15 * 4 / 8
    assert policy.alpha_hat == pytest.approx(after)
    policy.observe(context(reqs), [outcome(0, k=0, accepted=0), outcome(1, k=0, accepted=0)])
    assert policy.alpha_hat == pytest.approx(after)


def test_cumulative_input_follows_the_prototype_step_input_follows_the_step():
    steps = [(3, 4), (0, 4), (4, 4)]  # (accepted, drafted) of three steps of one request
    cumulative, per_step = Goodput(ema_input="cumulative"), Goodput(ema_input="step")
    a_cum = a_step = 0.7
    acc_total = drafted_total = 0
    for acc, k in steps:
        for p in (cumulative, per_step):
            p.observe(context(_reqs(1)), [outcome(0, k=k, accepted=acc)])
        acc_total, drafted_total = acc_total + acc, drafted_total + k
        a_cum = 0.85 * a_cum + 0.15 * acc_total / drafted_total  # vLLM V0's running counters
        a_step = 0.85 * a_step + 0.15 * acc / k
        assert cumulative.alpha_hat == pytest.approx(a_cum)
        assert per_step.alpha_hat == pytest.approx(a_step)
    assert a_cum != pytest.approx(a_step)


def test_inverted_input_is_the_iid_alpha_of_the_steps_mean_accepted():
    policy = Goodput(ema_input="inverted")
    reqs = _reqs(2)
    policy.observe(context(reqs), [outcome(0, k=4, accepted=4), outcome(1, k=4, accepted=0)])
    x = alpha_from_mean_accepted(2.0, 4)  # a (1 - a^4) / (1 - a) = 2: a ~ 0.741
    assert x == pytest.approx(0.7413, abs=1e-4)
    assert policy.alpha_hat == pytest.approx(0.85 * 0.7 + 0.15 * x)


def test_per_request_inverted_input_is_each_requests_own_iid_alpha():
    policy = Goodput(ema_input="inverted", per_request=True)
    reqs = _reqs(3)
    policy.observe(context(reqs), [outcome(0, k=4, accepted=1), outcome(1, k=0, accepted=0),
                                   outcome(2, k=2, accepted=2)])
    for rid, k, accepted in ((0, 4, 1), (2, 2, 2)):  # the EMA step of its own group, exactly
        x = _inverted(((k, [accepted]),))
        keep = policy.ema_keep
        assert policy.request_alpha(rid) == min(1.0, max(0.0, keep * 0.7 + (1.0 - keep) * x))
    assert _inverted(((4, [1]),)) == pytest.approx(alpha_from_mean_accepted(1.0, 4))
    assert policy.request_alpha(1) == 0.7  # it drafted nothing: nothing learnt


def test_the_estimate_drives_the_next_plan():
    policy = Goodput(initial_alpha=0.8, replan_every=1)
    reqs = _reqs(1)
    cost = LinearCost(draft_s=0.5e-3, knee_tokens=NO_KNEE)
    assert _plan(policy, reqs, cost=cost)[0] > 0
    for _ in range(40):  # nothing accepted, ever
        policy.observe(context(reqs), [outcome(0, k=4, accepted=0)])
    assert _plan(policy, reqs, cost=cost) == [0]
    # k = 0 is absorbing, as in the prototype: steps without drafts teach nothing
    before = policy.alpha_hat
    for _ in range(40):
        policy.observe(context(reqs), [outcome(0, k=0, accepted=0)])
    assert policy.alpha_hat == before and _plan(policy, reqs, cost=cost) == [0]


def test_a_zero_plan_probes_with_one_draft_and_recovers_when_drafts_are_accepted():
    """By default k = 0 is not for good: each re-planning step drafts k = 1 where the plan is 0,
    so an estimate an unlucky start drove down learns again; `faithful=true` never probes."""
    cost = LinearCost(draft_s=0.5e-3, knee_tokens=NO_KNEE)
    reqs = _reqs(2)
    for faithful in (False, True):
        policy = Goodput(initial_alpha=0.8, replan_every=4, faithful=faithful)
        for _ in range(30):  # an unlucky start: nothing accepted
            policy.observe(context(reqs), [outcome(r.request_id, k=4, accepted=0) for r in reqs])
        drafted = []
        for _ in range(200):
            ks = list(policy.choose(context(reqs, cost=cost)))
            assert policy.hold() == (0 if policy._probing else 3 - policy._calls % 4)
            drafted.append(ks[0])
            # the drafter is in fact good: every draft it makes is accepted
            policy.observe(context(reqs), [outcome(r.request_id, k=k, accepted=k)
                                           for r, k in zip(reqs, ks)])
        if faithful:
            assert set(drafted) == {0}  # the prototype's absorbing k = 0
        else:
            assert drafted[3] == 1 and drafted[:3] == [0, 0, 0]  # the first re-plan probes
            assert drafted[-1] > 1 and policy.alpha_hat > 0.8  # and speculation came back


def test_per_request_zero_plans_probe_too():
    cost = LinearCost(draft_s=0.5e-3, knee_tokens=NO_KNEE)
    reqs = _reqs(3)
    policy = Goodput(initial_alpha=0.05, replan_every=2, per_request=True)
    ks = [list(policy.choose(context(reqs, cost=cost))) for _ in range(3)]
    assert ks[1] == [1, 1, 1] and ks[2] == [0, 0, 0] and policy._plan_r == {0: 0, 1: 0, 2: 0}


# -- the re-plan cadence ---------------------------------------------------------------------------

def test_replans_only_every_replan_every_steps():
    policy = Goodput(initial_alpha=0.8)
    reqs = _reqs(1)
    cost = LinearCost(knee_tokens=NO_KNEE)
    ks = [policy.choose(context(reqs, cost=cost))[0] for _ in range(20)]
    assert ks[:19] == [0] * 19  # the prototype's last plan starts at 0
    assert ks[19] == 6
    for _ in range(40):
        policy.observe(context(reqs), [outcome(0, k=6, accepted=0)])
    ks = [policy.choose(context(reqs, cost=cost))[0] for _ in range(21)]
    # the new estimate shows at call 40: a plan of 0, which that step probes with one draft
    assert ks[:19] == [6] * 19 and ks[19] == 1 and ks[20] == 0 and policy._k == 0


def test_the_plan_applies_to_whoever_is_running():
    policy = Goodput(initial_alpha=0.8, replan_every=2)
    cost = LinearCost(knee_tokens=NO_KNEE)
    _plan(policy, _reqs(1), cost=cost)
    assert list(policy.choose(context(_reqs(3, first_id=10), cost=cost))) == [6, 6, 6]


# -- per-request allocation ------------------------------------------------------------------------

def _teach(policy: Goodput, rates: dict[int, float], steps: int = 30, k: int = 8) -> None:
    """Feed each request `steps` outcomes accepting round(rate * k) of k drafts."""
    reqs = [FakeRequest(rid) for rid in rates]
    for _ in range(steps):
        policy.observe(context(reqs), [outcome(rid, k=k, accepted=round(r * k))
                                       for rid, r in rates.items()])


def _goodput(alphas, ks, cost, reqs) -> float:
    tokens = sum(expected_emitted(a, k) for a, k in zip(alphas, ks))
    return tokens / cost.step_s(ks, [r.context_tokens for r in reqs])


def test_per_request_gives_more_k_to_the_request_that_accepts_more():
    cost = LinearCost(draft_s=0.5e-3, per_token_s=0.5e-3, knee_tokens=NO_KNEE)
    policy = Goodput(per_request=True, replan_every=1)
    _teach(policy, {0: 1.0, 1: 0.0})
    a0, a1 = policy.request_alpha(0), policy.request_alpha(1)
    assert a0 > 0.95 and a1 < 0.05
    reqs = [FakeRequest(0), FakeRequest(1)]
    ks = _plan(policy, reqs, cost=cost)
    assert ks[0] > ks[1] == 0
    best = max(itertools.product(range(9), repeat=2),
               key=lambda kk: _goodput([a0, a1], kk, cost, reqs))
    assert tuple(ks) == best
    # the batch-uniform plan cannot do this
    uniform = Goodput(replan_every=1)
    _teach(uniform, {0: 1.0, 1: 0.0})
    assert len(set(_plan(uniform, reqs, cost=cost))) == 1


def test_per_request_crosses_a_draft_passs_fixed_cost():
    # 8 requests at a = 0.7: one request's first draft (+0.7 tokens) does not pay for a 1 ms
    # pass on a 10 ms step, all eight together do; a +1-at-a-time greedy would stay at 0
    cost = LinearCost(knee_tokens=NO_KNEE)
    reqs = _reqs(8)
    ks = _plan(Goodput(per_request=True, replan_every=1), reqs, cost=cost)
    assert min(ks) >= 1
    assert _goodput([0.7] * 8, ks, cost, reqs) >= _goodput([0.7] * 8, [1] * 8, cost, reqs)


def _score(alphas, ks, cost, reqs) -> float:
    """Predicted goodput with the k = 0 bonus, what the plan maximises."""
    g = _goodput(alphas, ks, cost, reqs)
    return g * 1.1 if not any(ks) else g


@pytest.mark.parametrize("seed", range(3))
def test_per_request_plans_are_near_the_exhaustive_optimum(seed):
    rng = np.random.default_rng(seed)
    worst = 1.0
    for _ in range(40):
        b = int(rng.integers(1, 4))
        cost = LinearCost(draft_s=float(rng.uniform(0.2e-3, 4e-3)),
                          per_token_s=float(rng.choice([1e-6, 1e-4, 5e-4, 1e-3])),
                          knee_tokens=int(rng.integers(2, 20)))
        policy = Goodput(per_request=True, replan_every=1, k_max=4, ema_input="step",
                         ema_keep=0.0)
        reqs = [FakeRequest(i, prompt_tokens=int(rng.integers(50, 500))) for i in range(b)]
        alphas = [float(rng.uniform(0.05, 0.98)) for _ in reqs]
        for r, a in zip(reqs, alphas):  # ema_keep 0: the estimate is the last ratio
            policy.observe(context(reqs), [outcome(r.request_id, k=10**6,
                                                   accepted=round(a * 10**6))])
        ks = _plan(policy, reqs, cost=cost)

        best = max(_score(alphas, kk, cost, reqs) for kk in itertools.product(range(5), repeat=b))
        worst = min(worst, _score(alphas, ks, cost, reqs) / best)
    assert worst > 0.97


def test_new_requests_get_the_plans_median_and_finished_ones_are_forgotten():
    cost = LinearCost(draft_s=0.5e-3, per_token_s=0.5e-3, knee_tokens=NO_KNEE)
    policy = Goodput(per_request=True, replan_every=5)
    _teach(policy, {0: 1.0, 1: 0.0, 2: 0.5})
    reqs = [FakeRequest(i) for i in range(3)]
    ks = _plan(policy, reqs, cost=cost)
    median = sorted(ks)[1]
    out = list(policy.choose(context([*reqs, FakeRequest(7)], cost=cost)))
    assert out == [*ks, median]
    for rid in (0, 1, 2, 7):
        policy.finish(rid)
    assert not policy._alpha_r and not policy._totals_r and not policy._plan_r
    assert policy.request_alpha(0) == policy.initial_alpha


# -- parameters and properties ---------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    ({"initial_alpha": 1.2}, "initial_alpha"),
    ({"ema_keep": -0.1}, "ema_keep"),
    ({"ema_input": "lifetime"}, "ema_input must be one of censored, cumulative, step, inverted"),
    ({"replan_every": 0}, "replan_every"),
    ({"k_max": 65}, "k_max"),
    ({"k0_bonus": 0.0}, "k0_bonus"),
    ({"kv_headroom": float("inf")}, "kv_headroom"),
])
def test_bad_parameters_are_rejected_with_a_reason(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Goodput(**kwargs)


def test_command_line_parameters():
    policy = make_policy("goodput", {"per_request": "true", "replan_every": "5"})
    assert policy.per_request and policy.replan_every == 5
    assert not type(policy).stateless_per_batch  # it learns from outcomes
    with pytest.raises(PolicyError, match="ema_input"):
        make_policy("goodput", {"ema_input": "nope"})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), per_request=st.booleans(), k_max=st.integers(0, 10),
       engine_k_max=st.integers(0, 12), replan_every=st.integers(1, 4),
       ema_input=st.sampled_from(["cumulative", "step"]))
def test_k_within_bounds_whatever_is_observed(data, per_request, k_max, engine_k_max,
                                              replan_every, ema_input):
    policy = Goodput(per_request=per_request, k_max=k_max, replan_every=replan_every,
                     ema_input=ema_input)
    cost = LinearCost(draft_s=data.draw(st.floats(1e-5, 5e-3)),
                      per_token_s=data.draw(st.floats(1e-7, 1e-3)),
                      knee_tokens=data.draw(st.integers(1, 400)))
    kv = data.draw(st.integers(1, 200_000))
    live, next_id = {}, 0
    for _ in range(data.draw(st.integers(1, 12))):
        for _ in range(data.draw(st.integers(0, 4))):
            live[next_id] = FakeRequest(next_id, prompt_tokens=data.draw(st.integers(1, 3000)))
            next_id += 1
        for rid in data.draw(st.lists(st.sampled_from(sorted(live)), unique=True)) if live else []:
            del live[rid]
            policy.finish(rid)
        if not live:
            continue
        batch = list(live.values())
        ctx = context(batch, k_max=engine_k_max, cost=cost, kv_capacity_tokens=kv)
        ks = list(policy.choose(ctx))
        assert len(ks) == len(batch)
        assert all(isinstance(k, int) and 0 <= k <= min(k_max, engine_k_max) for k in ks)
        policy.observe(ctx, [outcome(r.request_id, k=k, accepted=data.draw(st.integers(0, k)))
                             for r, k in zip(batch, ks)])


def test_censored_input_is_the_maximum_likelihood_per_token_rate():
    policy = Goodput()  # ema_input="censored"
    ctx = context([FakeRequest(0), FakeRequest(1)])
    # 3 of 4 accepted then a rejection, and 4 of 4 accepted (no rejection seen): S = 7, F = 1
    policy.observe(ctx, [outcome(0, 4, 3), outcome(1, 4, 4)])
    assert policy.alpha_hat == pytest.approx(0.85 * 0.7 + 0.15 * 7 / 8)
    # a long run of i.i.d. acceptance at 0.7 drives the estimate to 0.7, not to accepted/drafted
    rng = np.random.default_rng(0)
    for _ in range(3000):
        acc = [int(min(4, rng.geometric(0.3) - 1)) for _ in range(2)]
        policy.observe(ctx, [outcome(0, 4, acc[0]), outcome(1, 4, acc[1])])
    assert policy.alpha_hat == pytest.approx(0.7, abs=0.02)


def _keeps_order_in_full(ks, order, u, d) -> bool:
    trial = list(ks)
    trial[u] += 1
    trial[d] -= 1
    seq = [trial[i] for i in order]
    return all(x >= y for x, y in itertools.pairwise(seq))


@pytest.mark.parametrize("seed", range(30))
def test_the_transfer_order_check_is_the_full_check(seed):
    """The climb's O(1) order check of a transfer (from the first request of a level to the
    last of another) agrees with checking the whole allocation."""
    from policies.goodput import _Ascent

    rng = np.random.default_rng(seed)
    b, k_cap = int(rng.integers(2, 12)), int(rng.integers(1, 6))
    order = rng.permutation(b).tolist()
    levels = sorted(rng.integers(0, k_cap + 1, b).tolist(), reverse=True)
    ks = [0] * b
    for place, i in enumerate(order):
        ks[i] = levels[place]
    ascent = _Ascent.__new__(_Ascent)
    ascent.order, ascent.k_cap = order, k_cap
    ascent.rank = {i: place for place, i in enumerate(order)}
    groups = ascent._levels(ks)
    checked = 0
    for up_level, ups in groups.items():
        for down_level, downs in groups.items():
            u, d = ups[0], downs[-1]
            if up_level < k_cap and down_level > 0 and u != d:
                checked += 1
                assert ascent._transfer_keeps_order(ks, u, d) == _keeps_order_in_full(
                    ks, order, u, d), (ks, order, u, d)
    assert checked or len(groups) == 1 or k_cap == 0
