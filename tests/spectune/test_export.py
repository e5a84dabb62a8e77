"""spectune.export: schedules from measured points, three engine formats, their validators, and
the drafter each export names (the one tuned) or the reason it is not written."""

from __future__ import annotations

import json
from bisect import bisect_left
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import SchedulerConfig, get_model
from spectune.cli import main
from spectune.export import (
    EXPORTERS,
    BatchSchedule,
    Drafter,
    ExportError,
    _k_from_config,
    drafter_from,
    scenario_drafter,
    schedule_from_points,
    to_sglang,
    to_trtllm,
    to_vllm,
    validate_sglang,
    validate_trtllm,
    validate_vllm,
    write_exports,
)
from spectune.simulate import SimulationSpec
from traces import RequestSpeculation, SpeculationTrace

ENGINES = ("vllm", "trtllm", "sglang")
EAGLE = Drafter("eagle")  # the one drafter every engine can switch by batch size


def schedule_k(schedule: BatchSchedule, batch_size: int) -> int:
    """BatchSchedule's own meaning: the first step covering batch_size, else the last k."""
    i = bisect_left([bs for bs, _ in schedule.steps], batch_size)
    return schedule.steps[min(i, len(schedule.steps) - 1)][1]


def nearest_k(points, b: int) -> int:
    """Brute force: nearest point, ties to the larger batch size, same batch size: smaller k."""
    exact = [(Fraction(float(x)), k) for x, k in points]
    return min(exact, key=lambda p: (abs(p[0] - b), -p[0], p[1]))[1]


# -- schedule_from_points ------------------------------------------------------------------------

def test_literal_points():
    # Midpoints: (1.5 + 12) / 2 = 6.75, so 1..6 -> 4; (12 + 40) / 2 = 26, a tie at 26 goes to
    # the larger batch point (40, k=0), so 7..25 -> 2 and 26..64 -> 0.
    s = schedule_from_points([(1.5, 4), (12.0, 2), (40.0, 0)], k_max=8, max_batch=64)
    assert s.steps == ((6, 4), (25, 2), (64, 0))
    assert s.k_max == 8


def test_literal_any_order_repeats_and_merging():
    # Same points shuffled, plus a repeat of 12.0 that disagrees (the smaller k wins) and a point
    # at 3.0 with the same k as 1.5 (merged into one step).
    pts = [(40.0, 0), (12.0, 3), (3.0, 4), (1.5, 4), (12.0, 2)]
    assert schedule_from_points(pts, 8, 64).steps == ((7, 4), (25, 2), (64, 0))
    assert schedule_from_points([(5.0, 3)], 4, 10).steps == ((10, 3),)
    assert schedule_from_points([(100.0, 1), (200.0, 0)], 4, 16).steps == ((16, 1),)


def test_literal_exports():
    s = schedule_from_points([(1.5, 4), (12.0, 2), (40.0, 0)], k_max=8, max_batch=64)
    assert to_vllm(s) == {"speculative_config": {
        "num_speculative_tokens": 8,
        "num_speculative_tokens_per_batch_size": [[1, 6, 4], [7, 25, 2], [26, 64, 0]]}}
    assert to_trtllm(s) == {"speculative_config": {
        "max_draft_len": 4, "draft_len_schedule": {"6": 4, "25": 2, "64": 0}}}
    assert to_sglang(s) == {"1": {"candidate_steps": [4]}, "7": {"candidate_steps": [2]},
                            "26": {"candidate_steps": [0]}}


@pytest.mark.parametrize(("points", "k_max", "max_batch", "match"), [
    ([], 4, 8, "no points"),
    ([(float("nan"), 1)], 4, 8, "finite number"),
    ([(0.0, 1)], 4, 8, "finite number"),
    ([(2.0, 5)], 4, 8, "0..k_max=4"),
    ([(2.0, 1.0)], 4, 8, "integer"),
    ([(2.0, -1)], 4, 8, "0..k_max"),
    ([(2.0, 1)], 4, 0, "max_batch >= 1"),
])
def test_points_rejected(points, k_max, max_batch, match):
    with pytest.raises(ExportError, match=match):
        schedule_from_points(points, k_max, max_batch)


@pytest.mark.parametrize(("steps", "k_max", "match"), [
    ((), 4, "at least one"),
    (((8, 4), (8, 2)), 4, "strictly increasing"),
    (((8, 4), (4, 2)), 4, "strictly increasing"),
    (((0, 4),), 4, ">= 1"),
    (((8, 5),), 4, "0..k_max=4"),
    (((8, -1),), 4, "0..k_max"),
    (((8, 2.0),), 4, "integer pairs"),
    (((8, 2),), -1, "k_max >= 0"),
])
def test_batch_schedule_rejected(steps, k_max, match):
    with pytest.raises(ExportError, match=match):
        BatchSchedule(steps, k_max)


# -- round trips ---------------------------------------------------------------------------------

def assert_round_trip(schedule: BatchSchedule, engine: str) -> None:
    to_fn, validate, _ = EXPORTERS[engine]
    config = json.loads(json.dumps(to_fn(schedule)))  # as the engine would read the file
    validate(config)
    max_batch = schedule.steps[-1][0]
    got = [_k_from_config(engine, config, b) for b in range(1, max_batch + 1)]
    assert got == [schedule_k(schedule, b) for b in range(1, max_batch + 1)]


@pytest.mark.parametrize("engine", ENGINES)
def test_round_trip_literal(engine):
    s = schedule_from_points([(1.5, 5), (12.0, 3), (40.0, 1), (90.0, 0)], 5, 128)
    assert_round_trip(s, engine)


def test_beyond_max_batch_follows_each_engine():
    s = BatchSchedule(((8, 4), (32, 2)), k_max=4)  # last k is 2, not 0
    assert _k_from_config("vllm", to_vllm(s), 1000) == 2  # vLLM: the last range's K holds
    assert _k_from_config("sglang", to_sglang(s), 1000) == 2  # SGLang: the last slot
    assert _k_from_config("trtllm", to_trtllm(s), 33) == 0  # TensorRT-LLM: 0 above the last key


points_st = st.lists(
    st.tuples(st.floats(min_value=0.5, max_value=300.0, allow_nan=False),
              st.integers(min_value=0, max_value=8)),
    min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(points=points_st, k_max=st.integers(min_value=8, max_value=12),
       max_batch=st.integers(min_value=1, max_value=300))
def test_round_trip_property(points, k_max, max_batch):
    s = schedule_from_points(points, k_max, max_batch)
    assert s.steps[-1][0] == max_batch
    assert all(a[1] != b[1] for a, b in zip(s.steps, s.steps[1:]))  # equal neighbours merged
    assert [schedule_k(s, b) for b in range(1, max_batch + 1)] == \
        [nearest_k(points, b) for b in range(1, max_batch + 1)]
    assert_round_trip(s, "vllm")
    assert_round_trip(s, "sglang")
    ks = [k for _, k in s.steps]
    if ks[0] == max(ks) > 0:
        assert_round_trip(s, "trtllm")
    else:  # TensorRT-LLM needs max_draft_len = the k at batch size 1 = the largest k, > 0
        with pytest.raises(ExportError, match="trtllm: k is"):
            to_trtllm(s)


# -- validators ----------------------------------------------------------------------------------

VLLM = {"speculative_config": {"num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size":
                               [[1, 8, 4], [9, 32, 2], [33, 64, 0]]}}


def vllm_with(table, n=4):
    return {"speculative_config": {"num_speculative_tokens": n,
                                   "num_speculative_tokens_per_batch_size": table}}


@pytest.mark.parametrize(("config", "match"), [
    (vllm_with([[9, 32, 2], [1, 8, 4]]), "not sorted"),
    (vllm_with([[1, 8, 4], [5, 32, 2]]), "overlaps"),
    (vllm_with([[1, 8, 4], [12, 32, 2]]), r"gap after \[1, 8, 4\] \(batch sizes 9..11\)"),
    (vllm_with([[2, 8, 4], [9, 32, 2]]), "start at batch size 1"),
    (vllm_with([[1, 8, 5]]), "exceeds num_speculative_tokens = 4"),
    (vllm_with([[1, 8, 4.0]]), "three integers"),
    (vllm_with([[1, 8, True]]), "three integers"),
    (vllm_with([[1, 8, -1]]), "negative"),
    (vllm_with([[1, 8, 2]], n=0), "num_speculative_tokens = 0"),
    (vllm_with([]), "non-empty list"),
    ({"num_speculative_tokens": 4}, "no 'speculative_config'"),
])
def test_validate_vllm_rejects(config, match):
    validate_vllm(VLLM)
    with pytest.raises(ExportError, match=match):
        validate_vllm(config)


def trt_with(table, m=4):
    return {"speculative_config": {"max_draft_len": m, "draft_len_schedule": table}}


# The key-only tables of TensorRT-LLM (upper bounds) and SGLang (lower bounds) cannot have a gap:
# each key's range runs to the next key. A repeated batch size is their form of overlap.
@pytest.mark.parametrize(("config", "match"), [
    (trt_with({"32": 2, "8": 4}), "not sorted"),
    (trt_with({"8": 4, "08": 2}), "appears twice"),
    (trt_with({"0": 4, "8": 2}), "batch size 0 < 1"),
    (trt_with({"-1": 4, "8": 2}), "not a batch size"),
    (trt_with({"8": 4, "32": 5}), "exceeds max_draft_len = 4"),
    (trt_with({"8": 4, "32": 2.0}), "must be an integer"),
    (trt_with({"8.5": 4}), "not a batch size"),
    (trt_with({"8": 4, "32": -1}), "negative"),
    (trt_with({"8": 3, "32": 2}), r"smallest key \(8\) is 3, but max_draft_len is 4"),
    (trt_with({"8": 0}, m=0), "max_draft_len = 0"),
    ({"speculative_config": {"max_draft_len": 4, "max_concurrency": 8,
                             "draft_len_schedule": {"8": 4}}}, "max_concurrency"),
])
def test_validate_trtllm_rejects(config, match):
    validate_trtllm(trt_with({"8": 4, "32": 2, "64": 0}))
    validate_trtllm(trt_with({8: 4, 32: 2}))  # Python dicts may use int keys
    with pytest.raises(ExportError, match=match):
        validate_trtllm(config)


def sg(k):
    return {"candidate_steps": [k]}


@pytest.mark.parametrize(("config", "k_max", "match"), [
    ({"1": sg(4), "32": sg(0), "8": sg(2)}, None, "not sorted"),
    ({"1": sg(4), "8": sg(2), "08": sg(1)}, None, "appears twice"),
    ({"2": sg(4), "8": sg(2)}, None, "smallest batch-size key is 2; start at 1"),
    ({"0": sg(4)}, None, "batch size 0 < 1"),
    ({"1": sg(4), "-8": sg(2)}, None, "silently ignores"),
    ({"1": sg(5)}, 4, "exceeds k_max = 4"),
    ({"1": sg(2.0)}, None, "must be an integer"),
    ({"1": sg(-1)}, None, "negative"),
    ({"1": {"candidate_steps": [1, 3, 7]}}, None, "exactly one step"),
    ({"1": {}}, None, "exactly one step"),
    ({"ema_alpha": 0.2}, None, "no batch-size key"),
])
def test_validate_sglang_rejects(config, k_max, match):
    validate_sglang({"ema_alpha": 0.2, "1": sg(4), "8": sg(2), "32": sg(0)}, k_max=4)
    with pytest.raises(ExportError, match=match):
        validate_sglang(config, k_max=k_max)


# -- files ---------------------------------------------------------------------------------------

def test_write_exports(tmp_path):
    s = schedule_from_points([(1.5, 4), (12.0, 2), (40.0, 1)], 8, 64, source="unit test")
    written = write_exports(tmp_path / "out", s, EAGLE)
    assert sorted(written) == sorted(ENGINES)
    for engine, name in written.items():
        config = json.loads((tmp_path / "out" / name).read_text())
        EXPORTERS[engine][1](config)
        note = config["_spectune"]
        assert note["source"] == "unit test" and note["schedule"] == [[6, 4], [25, 2], [64, 1]]
        assert note["how_to_use"] and note["drafter"]["kind"] == "eagle"
        assert [_k_from_config(engine, config, b) for b in range(1, 65)] == \
            [schedule_k(s, b) for b in range(1, 65)]
    trt = json.loads((tmp_path / "out" / written["trtllm"]).read_text())
    assert "Batches above 64 get 0" in trt["_spectune"]["how_to_use"]
    sgl = json.loads((tmp_path / "out" / written["sglang"]).read_text())
    assert "[6, 25]" in sgl["_spectune"]["how_to_use"]  # the range ends for --cuda-graph-bs


def test_write_exports_all_or_nothing(tmp_path):
    rising = BatchSchedule(((4, 2), (16, 4), (64, 0)), k_max=4)  # k rises: no TensorRT-LLM form
    with pytest.raises(ExportError, match="nothing written: trtllm: k is 2 at batch size 1"):
        write_exports(tmp_path, rising, EAGLE)
    assert list(tmp_path.iterdir()) == []
    assert write_exports(tmp_path, rising, EAGLE, engines=["vllm", "sglang"]) == {
        "vllm": "vllm_speculative_config.json", "sglang": "sglang_adaptive_config.json"}
    with pytest.raises(ExportError, match="unknown engine"):
        write_exports(tmp_path, rising, EAGLE, engines=["tgi"])



# -- the drafter: every export names the one tuned, or is not written --------------------------

SCHEDULE = schedule_from_points([(1.5, 4), (12.0, 2), (40.0, 0)], k_max=8, max_batch=64,
                                source="unit test")


def export_one(tmp_path, drafter: Drafter, engine: str) -> dict:
    """The written config of one engine (write_exports writes it or raises)."""
    name = write_exports(tmp_path, SCHEDULE, drafter, engines=[engine])[engine]
    return json.loads((tmp_path / name).read_text())


def spec_of(config: dict) -> dict:
    return config["speculative_config"]


def names_eagle(text: str) -> bool:
    """Does an export's text launch or configure an EAGLE drafter (any engine's spelling)?"""
    return any(s in text for s in ('"eagle', '"Eagle', "--speculative-algorithm EAGLE"))


def test_ngram_exports_ngram_and_sglang_says_why_not(tmp_path):
    ngram = Drafter("ngram", ngram=(1, 3), tuned="unit test")
    vllm = export_one(tmp_path, ngram, "vllm")
    assert {k: spec_of(vllm)[k] for k in ("method", "prompt_lookup_min", "prompt_lookup_max")} \
        == {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    assert vllm["_spectune"]["drafter"]["method"] == "ngram"
    assert "\"method\":\"ngram\"" in vllm["_spectune"]["how_to_use"]
    trt = export_one(tmp_path, ngram, "trtllm")
    assert spec_of(trt)["decoding_type"] == "NGram"
    assert spec_of(trt)["max_matching_ngram_size"] == 3
    with pytest.raises(ExportError, match=r"sglang: .*n-gram lookup.*NGRAM.*only with EAGLE"):
        export_one(tmp_path, ngram, "sglang")
    assert not (tmp_path / EXPORTERS["sglang"][2]).exists()
    assert not names_eagle(json.dumps([vllm, trt]))  # nor a drafter that was not tuned


def test_draft_model_exports_name_the_model(tmp_path):
    drafter = scenario_drafter(SimulationSpec(draft="Llama-160M", acceptance="beta:7,3"),
                               SchedulerConfig())
    assert (drafter.kind, drafter.model, drafter.checkpoint) == \
        ("draft-model", "Llama-160M", "JackFram/llama-160m")
    vllm = export_one(tmp_path, drafter, "vllm")
    assert (spec_of(vllm)["method"], spec_of(vllm)["model"]) == \
        ("draft_model", "JackFram/llama-160m")
    assert vllm["_spectune"]["drafter"]["model"] == "Llama-160M"
    trt = export_one(tmp_path, drafter, "trtllm")
    assert (spec_of(trt)["decoding_type"], spec_of(trt)["speculative_model"]) == \
        ("DraftTarget", "JackFram/llama-160m")
    with pytest.raises(ExportError, match="STANDALONE"):
        export_one(tmp_path, drafter, "sglang")
    uncatalogued = Drafter("draft-model", model="SmolLM2-135M-EE4")
    assert "<checkpoint of SmolLM2-135M-EE4>" in \
        export_one(tmp_path, uncatalogued, "vllm")["_spectune"]["how_to_use"]


def eagle_recording(path, drafter: str = "eagle"):
    SpeculationTrace(requests=(RequestSpeculation(run=np.array([0, 2, 1, 0])),),
                     meta={"drafter": drafter, "target": "SmolLM2-135M-Instruct"}).save(path)
    return str(path)


def test_eagle_recording_names_eagle(tmp_path):
    acceptance = eagle_recording(tmp_path / "eagle.npz")
    drafter = scenario_drafter(SimulationSpec(draft="Llama-68M", acceptance=acceptance),
                               SchedulerConfig())
    assert (drafter.kind, drafter.caveat) == ("eagle", "")  # the draft shape costs the head
    assert names_eagle(json.dumps(export_one(tmp_path, drafter, "vllm")))
    assert spec_of(export_one(tmp_path, drafter, "vllm"))["method"] == "eagle3"
    assert spec_of(export_one(tmp_path, drafter, "trtllm"))["decoding_type"] == "Eagle3"
    sglang = export_one(tmp_path, drafter, "sglang")
    assert "--speculative-algorithm EAGLE3" in sglang["_spectune"]["how_to_use"]
    assert sglang["_spectune"]["drafter"]["method"] == "EAGLE3"


@pytest.mark.parametrize(("kind", "why"), [
    ("eagle-tree", "static tree"), ("eagle-ngram", "n-gram lookup's token"),
    ("early-exit", "first layers")])
def test_drafters_no_engine_runs_are_not_written(tmp_path, kind, why):
    for engine in ENGINES:
        with pytest.raises(ExportError, match=f"{engine}: the tune drafted with .*{why}"):
            export_one(tmp_path, Drafter(kind), engine)
    assert list(tmp_path.iterdir()) == []


SHAPE = get_model("Llama-68M")


@pytest.mark.parametrize(("draft", "meta", "kind", "caveat"), [
    (None, {}, "ngram", ""),  # parametric acceptance, model-free latency
    (None, {"drafter": "ngram:2-4"}, "ngram", ""),
    (None, {"drafter": "ngram (vLLM, 2-4)"}, "ngram", ""),  # recorded inside vLLM
    (SHAPE, {}, "draft-model", ""),
    (SHAPE, {"drafter": "model:llama-68m"}, "draft-model", ""),
    (SHAPE, {"drafter": "quant:4"}, "draft-model", ""),
    (SHAPE, {"drafter": "eagle@int8"}, "eagle", ""),
    (SHAPE, {"drafter": "eagle-tree", "tree": [[0]]}, "eagle-tree", ""),
    (SHAPE, {"drafter": "eagle+ngram"}, "eagle-ngram", ""),
    (SHAPE, {"drafter": "early-exit:24:lens"}, "early-exit", ""),
    # They disagree: the latency side is what the engine must run; the caveat says so.
    (SHAPE, {"drafter": "ngram"}, "draft-model", "recorded with drafter ngram"),
    (SHAPE, {"drafter": "model:Llama-160M"}, "draft-model", "exported as Llama-68M"),
    # No draft pass costed, but a head's or a draft model's acceptance: that drafter was tuned
    # (an n-gram lookup would not accept what it accepted), its cost left out, and said so.
    (None, {"drafter": "eagle"}, "eagle", "costed no draft pass"),
    (None, {"drafter": "early-exit:24:lens"}, "early-exit", "costed no draft pass"),
    (None, {"drafter": "model:Llama-160M"}, "draft-model", "costed no draft pass"),
    (None, {"drafter": "quant:4"}, "ngram", "costs no draft model"),
    (None, {"drafter": "mystery"}, "ngram", "recorded with drafter mystery"),
])
def test_drafter_from_the_scenario_halves(draft, meta, kind, caveat):
    drafter = drafter_from(draft, meta, "acc")
    assert drafter.kind == kind
    assert (caveat in drafter.caveat) if caveat else drafter.caveat == ""
    assert drafter.tuned.startswith("latency: ") and "acceptance: acc, " in drafter.tuned
    if meta.get("drafter") in ("ngram:2-4", "ngram (vLLM, 2-4)"):
        assert drafter.ngram == (2, 4)


def test_caveat_reaches_the_file(tmp_path):
    drafter = drafter_from(SHAPE, {"drafter": "ngram", "target": "t"}, "smollm2-ngram")
    note = export_one(tmp_path, drafter, "vllm")["_spectune"]["drafter"]
    assert note["model"] == "Llama-68M" and "recorded with drafter ngram" in note["caveat"]
    assert "smollm2-ngram" in note["tuned"]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"kind": "medusa"}, "drafter kind 'medusa'"),
    ({"kind": "draft-model"}, "needs the draft model's name"),
    ({"kind": "ngram", "ngram": (3, 1)}, "1 <= min <= max"),
])
def test_drafter_rejected(kwargs, match):
    with pytest.raises(ExportError, match=match):
        Drafter(**kwargs)


@pytest.mark.parametrize(("args", "method"), [
    ([], "ngram"),  # the embedded tune: model-free latency, the shipped n-gram recording
    (["--draft", "Llama-68M", "--acceptance", "iid:0.7"], "draft_model"),
])
def test_tune_cli_exports_the_tuned_drafter(tmp_path, capsys, args, method):
    out = tmp_path / "tune"
    assert main(["tune", "--rates", "4", "--seeds", "1", "--requests", "40", "--policies",
                 "fixed", "--no-samples", "--jobs", "1", "--no-report", "--out", str(out),
                 *args]) == 0
    tune = json.loads((out / "tune.json").read_text())
    vllm = json.loads((out / tune["exports"]["vllm"]).read_text())
    assert spec_of(vllm)["method"] == method
    assert "sglang" not in tune["exports"]
    assert not (out / "exports" / EXPORTERS["sglang"][2]).exists()
    assert "only with EAGLE/EAGLE3" in tune["export_problems"]["sglang"]
    assert "no sglang config" in capsys.readouterr().out
    for file in (out / "exports").iterdir():
        assert not names_eagle(file.read_text())  # nor a drafter that was not tuned


def test_tune_cli_of_an_early_exit_recording_exports_no_ngram(tmp_path, capsys):
    """The README's `tune --acceptance smollm2-early-exit-24-lens` (tune drafts model-free by
    default) wrote an n-gram vLLM config: an n-gram lookup would not accept what the early exit
    accepted. No engine drafts with an early exit, so nothing is written, each with its reason."""
    out = tmp_path / "tune"
    assert main(["tune", "--rates", "4", "--seeds", "1", "--requests", "40", "--policies",
                 "fixed", "--acceptance", "smollm2-early-exit-24-lens", "--k-max", "8",
                 "--no-samples", "--jobs", "1", "--no-report", "--out", str(out)]) == 0
    tune = json.loads((out / "tune.json").read_text())
    printed = capsys.readouterr().out
    assert tune["exports"] == {} and not any((out / "exports").glob("*"))
    assert set(tune["export_problems"]) == set(EXPORTERS)
    assert all("early exit" in why for why in tune["export_problems"].values())
    assert "n-gram" not in printed
