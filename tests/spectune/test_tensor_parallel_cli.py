"""`--tp` on the command line: a 70B replica of four H100s simulates, what does not fit or does
not split says so in one line, plan compares GPU x TP shapes, and a one-GPU run reads as before."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from simulator import SchedulerConfig
from simulator.catalog import get_gpu, get_model
from simulator.tensor_parallel import group_kv_capacity_tokens
from spectune.cli import main
from spectune.evaluate import Task
from spectune.plan import _best_per_shape, _overall_choice, format_plan
from spectune.search import Candidate
from spectune.simulate import SimulationSpec

SEVENTY_B = ["simulate", "--target", "Llama-3.1-70B", "--hardware", "H100-SXM", "--tp", "4",
             "--draft", "Llama-3.2-1B"]


def _err(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_llama_70b_on_four_h100s_simulates(capsys):
    assert main([*SEVENTY_B, "--requests", "40", "--format", "json"]) == 0
    s = json.loads(capsys.readouterr().out)
    inputs = s["inputs"]
    assert s["requests"] == 40 and 0 < s["tpot_s"]["p50"] <= s["tpot_s"]["p99"]
    assert inputs["spec"]["tp"] == 4 and "draft_tp" not in inputs["spec"]
    assert "tensor parallel: target on 4 GPUs, draft on one GPU" in inputs["latency_model"]
    assert inputs["kv_capacity_tokens"] == group_kv_capacity_tokens(
        get_gpu("H100-SXM"), get_model("Llama-3.1-70B"), get_model("Llama-3.2-1B"), tp=4)
    assert main([*SEVENTY_B, "--requests", "40"]) == 0
    assert "replicas 1 of TP 4 (4 GPUs)" in capsys.readouterr().out


def test_the_draft_at_the_targets_degree_frees_kv_but_costs_more_per_step(capsys):
    runs = {}
    for draft_tp in ("1", "same"):
        assert main([*SEVENTY_B, "--requests", "40", "--draft-tp", draft_tp, "--format",
                     "json"]) == 0
        runs[draft_tp] = json.loads(capsys.readouterr().out)
    assert runs["same"]["inputs"]["spec"]["draft_tp"] == "same"
    assert "draft at TP 4" in runs["same"]["inputs"]["latency_model"]
    # split four ways, the draft's weights and KV leave GPU 0 more room, but its passes are
    # slower: a 1B draft's 32 all-reduce points (37.75 us each) cost more than the three
    # quarters of its bytes they save (1.54 against 0.99 ms per pass)
    assert runs["same"]["inputs"]["kv_capacity_tokens"] > runs["1"]["inputs"]["kv_capacity_tokens"]
    assert runs["same"]["tpot_s"]["mean"] > runs["1"]["tpot_s"]["mean"]


def test_a_one_gpu_summary_records_no_tp(capsys):
    assert main(["simulate", "--requests", "20", "--format", "json"]) == 0
    spec = json.loads(capsys.readouterr().out)["inputs"]["spec"]
    assert "tp" not in spec and "draft_tp" not in spec and spec["requests"] == 20


@pytest.mark.parametrize(("argv", "message"), [
    (["simulate", "--target", "Llama-3.1-70B", "--hardware", "H100-SXM"],
     "leaves no room for a KV cache on H100-SXM"),
    (["simulate", "--target", "Llama-3.1-70B", "--hardware", "H100-SXM"],
     "split it over more GPUs: it fits with --tp 2"),
    (["simulate", "--target", "Llama-3.1-70B", "--hardware", "L4", "--tp", "4"],
     "no room for a KV cache on 4 x L4: 35.4 GB of weights on one GPU against 19.6 GB usable"),
    (["simulate", "--target", "Llama-3.1-70B", "--hardware", "L4", "--tp", "4"],
     "it fits with --tp 8"),
    (["simulate", "--tp", "3"], "--tp must be one of 1, 2, 4, 8 (GPUs per replica), got 3"),
    (["simulate", "--target", "Qwen2.5-7B", "--tp", "8"],
     "--tp 8: Qwen2.5-7B's 28 attention heads do not split 8 ways; use --tp 1, 2 or 4"),
    (["simulate", "--tp", "2", "--draft-tp", "4"],
     "--draft-tp 4 is more GPUs than the replica's --tp 2"),
    (["simulate", "--tp", "2", "--draft-tp", "two"], "--draft-tp must be 1, 2, 4, 8 or 'same'"),
    (["simulate", "--profile", "cpu-smollm2-135m", "--tp", "2"],
     "a profile was timed on one device and is not scaled to a group"),
])
def test_what_cannot_be_served_is_one_line(argv, message, capsys):
    assert message in _err(capsys, [*argv, "--requests", "5"])


def test_tp_is_part_of_the_cache_key():
    task = Task(SimulationSpec(target="Llama-3.1-70B", tp=2), SchedulerConfig(),
                Candidate("fixed", (("k", 2),)), 4.0, 0)
    keys = {replace(task, scenario=replace(task.scenario, tp=tp)).key() for tp in (2, 4, 8)}
    keys.add(replace(task, scenario=replace(task.scenario, draft_tp="same")).key())
    assert len(keys) == 4


PLAN = ["plan", "--target", "Llama-3.1-70B", "--draft", "none", "--acceptance", "beta:7,3",
        "--hardware-options", "H100-SXM", "--tp-options", "1,4", "--target-rate", "10",
        "--slo-ttft", "2", "--slo-tpot", "0.05", "--prices", "H100-SXM=3", "--requests", "30",
        "--tolerance", "0.2", "--policies", "fixed:k=0", "--jobs", "1"]


def test_plan_compares_shapes_and_skips_what_does_not_fit(tmp_path, capsys):
    assert main([*PLAN, "--out", str(tmp_path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [skipped] = doc["skipped"]
    assert (skipped["hardware"], skipped["tp"]) == ("H100-SXM", 1)
    assert "it fits with --tp 2" in skipped["why"]
    [row] = doc["plans"]
    assert (row["gpu"], row["tp"], row["hardware"]) == ("H100-SXM", 4, "H100-SXM TP4")
    assert row["replicas_needed"] >= 1 and row["gpus_needed"] == 4 * row["replicas_needed"]
    assert row["cost_per_hour"] == 3 * row["gpus_needed"]
    [choice] = doc["choices"]
    assert choice["tp"] == 4 and choice["by"] == "cost per hour"
    table = format_plan(json.loads((tmp_path / "plan.json").read_text()))
    assert "    hardware  TP  max req/s  replicas  GPUs  cost/h" in table
    assert "choice (cost per hour): " in table and "skipped H100-SXM at TP 1:" in table
    [best] = doc["best_per_shape"]
    assert (best["tp"], best["label"]) == (4, "fixed(k=0)")
    assert doc["choice"]["gpus_needed"] == row["gpus_needed"]
    assert "the best policy per shape\n    H100-SXM TP 4: fixed(k=0), " in table
    assert "choice (cost per hour, each shape with its best policy): " in table


def _row(policy: str, tp: int, rate: float, target: float = 10.0, price: float = 3.0) -> dict:
    replicas = math.ceil(target / rate)
    return {"label": policy, "hardware": f"H100-SXM TP{tp}", "gpu": "H100-SXM", "tp": tp,
            "max_rate_per_replica": rate, "replicas_needed": replicas,
            "gpus_needed": replicas * tp, "cost_per_hour": replicas * tp * price}


def test_each_shape_gets_its_own_best_policy_and_the_plan_the_cheapest_pair():
    # k=4 wins on TP 4 (6 against 5 req/s), k=0 on TP 8 (11 against 10.5): a policy per shape
    plans = [_row("fixed(k=0)", 4, 5.0), _row("fixed(k=0)", 8, 11.0),
             _row("fixed(k=4)", 4, 6.0), _row("fixed(k=4)", 8, 10.5)]
    best = _best_per_shape(plans)
    assert [(b["hardware"], b["label"]) for b in best] == [
        ("H100-SXM TP4", "fixed(k=4)"), ("H100-SXM TP8", "fixed(k=0)")]
    # at 10 req/s: TP 4 with k=4 needs 2 replicas = 8 GPUs (24/h); TP 8 with k=0, 1 = 8 (24/h):
    # a tie keeps the first listed
    choice = _overall_choice(best)
    assert (choice["tp"], choice["label"], choice["gpus_needed"], choice["by"]) == (
        4, "fixed(k=4)", 8, "cost per hour")
    # unpriced, by GPUs; a shape where no policy has capacity is left out
    plans[1]["max_rate_per_replica"] = None
    plans[3] = {**_row("fixed(k=4)", 8, 2.0), "cost_per_hour": None}
    best = _best_per_shape(plans)
    assert [(b["tp"], b["label"], b["max_rate_per_replica"]) for b in best] == [
        (4, "fixed(k=4)", 6.0), (8, "fixed(k=4)", 2.0)]
    assert _overall_choice(best)["by"] == "GPUs"
    assert _overall_choice([{**b, "gpus_needed": None} for b in best]) is None  # no target rate


def test_a_plan_on_one_gpu_prints_as_before():
    from tests.test_goldens import GOLDEN

    golden = json.loads((GOLDEN / "plan.json").read_text())["result"]
    table = format_plan({**golden, "meta": {**golden["meta"], "wall_s": 0}})
    assert table.splitlines()[1].split() == ["hardware", "max", "req/s", "replicas", "cost/h",
                                              "at", "0.95x", "at", "1.05x"]
    assert "TP" not in table.replace("TPOT", "") and "choice" not in table
    assert "skipped" not in table
    assert all("tp" not in p and "gpus_needed" not in p for p in golden["plans"])


@pytest.mark.parametrize(("flag", "message"), [
    (["--tp-options", "1,3"], "--tp-options: '3': give distinct degrees among 1, 2, 4, 8"),
    (["--tp-options", "2,2"], "--tp-options: '2'"),
    (["--hardware-options", "L4", "--prices", "L4=1", "--tp-options", "1,2"],
     "no hardware option fits: L4 at TP 1"),
])
def test_bad_tp_options_are_one_line(flag, message, tmp_path, capsys):
    assert message in _err(capsys, [*PLAN, *flag, "--out", str(tmp_path)])


def test_the_fast_path_keeps_the_stepped_records_in_a_group(tmp_path):
    """A group's passes go through the same arrays-equal-scalars roofline: costing a segment in
    one numpy pass gives the records stepping one iteration at a time gives."""
    digests = []
    for extra in ([], ["--no-fast-path"]):
        out = tmp_path / ("stepped" if extra else "fast")
        assert main(["simulate", "--target", "Llama-3.1-70B", "--tp", "8", "--draft", "none",
                     "--acceptance", "smollm2-ngram", "--requests", "120", "--rate", "6",
                     "--out", str(out), "--format", "json", *extra]) == 0
        digests.append([(out / name).read_bytes() for name in ("requests.csv", "steps.csv")])
    assert digests[0] == digests[1]
