"""Checks every EAGLE head variant (fused, several layers, int8) must pass (torch needed): its
batched chains are its live chains, and the live engine drafting with it is lossless and accepts
exactly what `eagle_runs` records."""

from __future__ import annotations

import numpy as np

from support.engine import LinearLatency
from support.tiny_models import TINY, one_by_one_greedy

#: Five requests: when each arrives and how many tokens it asks for.
ARRIVALS = [0.0, 0.0, 0.0, 0.001, 0.002]
OUTPUTS = [30, 1, 25, 12, 40]


def live_requests():
    """Five random prompts arriving at ARRIVALS, each asking for its OUTPUTS tokens."""
    from traces import Workload

    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, TINY.vocab, int(rng.integers(4, 20))).tolist() for _ in OUTPUTS]
    workload = Workload(arrival_s=np.asarray(ARRIVALS),
                        prompt_tokens=np.asarray([len(p) for p in prompts]),
                        output_tokens=np.asarray(OUTPUTS), request_ids=np.arange(len(prompts)),
                        source="test")
    return prompts, workload


def assert_chains_equal_live(head, target) -> None:
    """Every base's chain to depth 4 from `chain_passes` equals the head fed live, entry by
    entry through its KV cache."""
    import torch

    from eagle.chains import chain_passes
    from eagle.training_data import target_features
    from models.generate import target_outputs

    rng = np.random.default_rng(0)
    prompt = rng.integers(0, TINY.vocab, 9).tolist()
    tokens = torch.tensor(prompt + target_outputs(target, [prompt], 20)[0])
    features = target_features(target, tokens.tolist())
    checked = 0
    for depth, rows, predicted in chain_passes(head, tokens, features, 4, first_base=3):
        for j, base in enumerate(range(rows.start, rows.stop)):
            cache = head.new_cache(64)
            live, _ = head([tokens[1 : base + 2]], [features[: base + 1]], [cache])
            for d in range(2, depth + 1):
                live, _ = head([tokens[base + d : base + d + 1]], [live], [cache])
            torch.testing.assert_close(predicted[j], live[0], rtol=1e-4, atol=1e-4)
            checked += 1
    assert checked > 60


def assert_live_eagle_lossless(target, head, chunked: bool) -> None:
    """The live engine with `EagleDrafter(head)` at fixed k=4 (whole or chunked prefill) writes
    one-by-one greedy output and accepts per step what `eagle_runs` records; something is
    accepted."""
    from drafters.eagle import EagleDrafter
    from eagle.chains import eagle_runs
    from live.engine import LiveEngine
    from policies import make_policy
    from simulator import SchedulerConfig, StepCostModel

    sched = SchedulerConfig(max_num_seqs=3, kv_capacity_tokens=100_000, k_max=6,
                            chunked_prefill=chunked, max_batched_tokens=9 if chunked else None)
    prompts, workload = live_requests()
    engine = LiveEngine(target, EagleDrafter(head), make_policy("fixed", {"k": 4}), sched,
                        cost=StepCostModel(LinearLatency()))
    res = engine.run(workload, prompts, realtime=False)
    accepted = 0
    for rid, steps in res.decode_log.groupby("request_id"):
        assert list(res.outputs[rid]) == one_by_one_greedy(target, prompts[rid], OUTPUTS[rid])
        run, _ = eagle_runs(head, target, prompts[rid], res.outputs[rid], sched.k_max)
        expected = [min(4, int(run[g]), OUTPUTS[rid] - g - 1) for g in steps.position]
        assert steps.accepted.tolist() == expected, f"request {rid}"
        accepted += sum(expected)
    assert accepted > 0
