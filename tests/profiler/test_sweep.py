"""The sweep times a draft pass where the engine runs it: right after a target pass."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

from support.tiny_models import TINY  # noqa: E402

from models.llama import LlamaModel, config_for  # noqa: E402
from profiler.grid import Grid  # noqa: E402
from profiler.sweep import DRAFT_TIMING, Models, Sweep  # noqa: E402
from simulator.latency_table import new_meta  # noqa: E402

GRID = Grid(batch_sizes=(1, 2), query_tokens=(1, 2), context_tokens=(4, 8), prompt_tokens=(4,),
            prefill_batch_sizes=(1,))


def models() -> Models:
    draft_shape = dataclasses.replace(TINY, name="tiny-draft", layers=1)
    return Models(LlamaModel.random(config_for(TINY), seed=0),
                  LlamaModel.random(config_for(draft_shape), seed=1))


def meta(m: Models) -> dict:
    return new_meta("cpu: test", "none", torch.__version__, "float32", m.target.config.shape,
                    m.draft.config.shape, GRID.as_dict(), 1, 0, notes="test")


def test_every_timed_draft_pass_follows_a_target_pass(tmp_path):
    m = models()
    calls: list[str] = []
    for role, model in (("target", m.target), ("draft", m.draft)):
        model.register_forward_pre_hook(lambda *_, r=role: calls.append(r))
    sweep = Sweep(m, GRID, torch.device("cpu"), meta(m), tmp_path / "p", warmup=1)
    sweep.round()
    drafts = [i for i, role in enumerate(calls) if role == "draft"]
    timed = drafts[1::2]  # each draft job: one warm-up call, then the timed one
    assert timed and len(timed) * 2 == len(drafts)
    assert all(calls[i - 1] == "target" for i in timed)
    saved = json.loads((tmp_path / "p" / "samples.json").read_text())
    assert saved["meta"]["draft_timing"] == DRAFT_TIMING


def test_a_sweep_timed_the_old_way_is_not_resumed(tmp_path):
    m = models()
    Sweep(m, GRID, torch.device("cpu"), meta(m), tmp_path / "p", warmup=0).round()
    path = tmp_path / "p" / "samples.json"
    saved = json.loads(path.read_text())
    del saved["meta"]["draft_timing"]  # as written before draft passes followed a target pass
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="draft_timing"):
        Sweep(m, GRID, torch.device("cpu"), meta(m), tmp_path / "p", warmup=0)


def test_the_draft_is_timed_at_its_catch_up_and_the_profile_says_what_it_feeds(tmp_path):
    """Draft rows at one token per request (`draft`) and at every longer query (`catchup`: a
    chain's first pass); the meta names the draft's catch-up rule, which the latency model
    takes (a draft LlamaModel keeps its drafts: "bonus"; an EAGLE head: "committed"), and a
    sweep with another rule is not resumed."""
    from drafters.eagle import EagleDrafter
    from models.eagle_head import EagleHead, HeadTiming
    from simulator.profiled import ProfiledLatency

    m = models()
    sweep = Sweep(m, GRID, torch.device("cpu"), meta(m), tmp_path / "p", warmup=0)
    sweep.round()
    table, _ = sweep.results()
    rows = table.rows[table.rows.role == "draft"]
    catchup = rows[rows.phase == "catchup"]
    assert sorted(set(catchup.query_tokens_per_seq)) == [2]
    assert len(catchup) == len(GRID.batch_sizes) * len(GRID.context_tokens)
    assert (rows[rows.phase == "draft"].query_tokens_per_seq == 1).all()
    latency = ProfiledLatency(table)
    assert latency.draft_catch_up == "bonus"
    assert latency.describe()["roles"]["draft"]["phases"]["catchup"]["points"] == len(catchup)
    # a catch-up pass at a grid point comes back as measured, not from the fitted form alone
    point = catchup.iloc[0]
    b, q, c = (int(point[col]) for col in ("num_seqs", "query_tokens_per_seq",
                                           "cached_tokens_per_seq"))
    predicted = latency.forward_s("draft", b, b * q, b * c, b * (q * c + q * (q + 1) // 2))
    assert predicted == pytest.approx(point.median_s, rel=1e-9)

    head = HeadTiming(EagleHead(m.target, torch.arange(TINY.vocab)))
    assert head.catch_up == EagleDrafter.catch_up == "committed"  # the profile's, the drafter's
    eagle = Models(m.target, head)
    with pytest.raises(ValueError, match="draft_catch_up"):
        Sweep(eagle, GRID, torch.device("cpu"), meta(m), tmp_path / "p", warmup=0)
    sweep = Sweep(eagle, GRID, torch.device("cpu"), meta(m), tmp_path / "eagle", warmup=0)
    sweep.round()
    assert ProfiledLatency(sweep.results()[0]).draft_catch_up == "committed"
