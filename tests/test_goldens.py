"""Golden outputs: what simulate, tune and plan print and write stays identical, bit for bit.

Recorded before the restructure (one scheduler for simulator and live engine, a package per
job), so every step of it is checked against the behaviour it must keep. Each case covers a part
of the engine: every policy; iid, beta, markov and recorded acceptance; the roofline and the
profiled CPU latency model; chunked prefill; several replicas with each router; a small tune and
plan. A case's golden is its JSON summary (less wall-clock times) and the sha256 of each record
file it wrote (requests.csv, steps.csv), so a change in any request's or step's numbers fails.

Regenerate only for a change meant to alter results, and say why in the commit:
    .venv/bin/python tests/test_goldens.py --record
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import sys
import tempfile
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"
#: fields that measure the machine, not the simulation, or say what dispatched the simulations
#: (a local pool or Ray: the results are the same, tests/spectune/test_ray_executor.py) or ran
#: their steps (compiled runs of steps where numba is loaded: tests/simulator/
#: test_compiled_steps.py)
VOLATILE = {"wall_s", "engine_s", "created", "reused_from_cache", "executor", "ray_address",
            "steps_at_once", "whole_run"}

#: cases whose latency model is fitted at load time (a profile: least squares through BLAS,
#: numpy's log and exp), whose last bits depend on the CPU's vector units. Their record files
#: must match exactly and their summaries to 1e-12: on an AMD EPYC (AVX-512) VM the profiled
#: case's files matched its recording while its summary floats moved in the 15th and 16th
#: digits, and numpy's log and exp there differ from the C library's on 39 and 9,154 of 200,000
#: inputs. Every other case is compared bit for bit.
CPU_DEPENDENT = {"simulate-gammatune-profiled-cpu"}

SIMULATE = {
    "fixed-iid": ["--requests", "200", "--acceptance", "iid:0.7", "--policy", "fixed",
                  "--set", "k=3"],
    "goodput-beta": ["--requests", "200", "--acceptance", "beta:7,3", "--policy", "goodput",
                     "--rate", "8"],
    "kld-markov": ["--requests", "150", "--acceptance", "markov:0.9,0.3@50~20", "--policy",
                   "kld_variance", "--rate", "6"],
    "batch-adaptive-ngram-recording": ["--requests", "200", "--acceptance", "smollm2-ngram",
                                       "--draft", "none", "--policy", "batch_adaptive",
                                       "--rate", "12"],
    "gammatune-profiled-cpu": ["--profile", "cpu-smollm2-135m", "--requests", "40", "--rate",
                               "1", "--acceptance", "smollm2-ngram", "--policy", "gammatune"],
    "heuristic-chunked-prefill": ["--requests", "200", "--acceptance", "iid:0.6~10",
                                  "--policy", "heuristic", "--rate", "10",
                                  "--max-batched-tokens", "512", "--chunked-prefill"],
    "confidence-round-robin": ["--requests", "300", "--acceptance", "beta:6,3~20", "--policy",
                               "confidence", "--rate", "20", "--replicas", "3", "--router",
                               "round-robin"],
    "adaedl-least-loaded": ["--requests", "300", "--acceptance", "iid:0.8~20", "--policy",
                            "adaedl", "--rate", "20", "--replicas", "3", "--router",
                            "least-loaded", "--max-num-seqs", "32"],
    "oracle-early-exit-recording": ["--requests", "150", "--acceptance",
                                    "smollm2-early-exit-24-lens", "--policy", "oracle",
                                    "--k-max", "8", "--rate", "4"],
    "gammatune-plus-early-exit": ["--requests", "150", "--acceptance",
                                  "smollm2-early-exit-24-lens", "--policy", "gammatune_plus",
                                  "--k-max", "8", "--rate", "4"],
    "plain-gamma-kv-limit": ["--workload", "gamma", "--rate", "15", "--cv", "3", "--requests",
                             "300", "--acceptance", "iid:0.7", "--policy", "fixed", "--set",
                             "k=0", "--kv-capacity-tokens", "20000"],
    "eagle-tree-recording": ["--requests", "150", "--acceptance", "smollm2-eagle-tree",
                             "--policy", "fixed", "--set", "k=3", "--k-max", "4", "--rate", "5"],
    "goodput-per-request-code": ["--workload", "azure-code", "--requests", "200", "--rate", "6",
                                 "--acceptance", "beta:5,3", "--policy", "goodput", "--set",
                                 "per_request=true", "--no-fast-path"],
    "auto-ngram-recording": ["--requests", "200", "--acceptance", "smollm2-ngram", "--draft",
                             "none", "--policy", "auto", "--rate", "8"],
    "auto-draft-model-beta": ["--requests", "150", "--acceptance", "beta:7,3~20", "--policy",
                              "auto", "--rate", "8", "--seed", "4"],
}
TUNE = ["tune", "--workload", "poisson", "--requests", "60", "--lengths", "fixed:200,60",
        "--acceptance", "beta:7,3", "--rates", "4", "30", "--policies", "fixed,goodput",
        "--seeds", "2", "--points", "2", "--jobs", "1", "--no-report"]
PLAN = ["plan", "--requests", "60", "--slo-ttft", "1", "--slo-tpot", "0.03", "--policies",
        "fixed:k=0,fixed:k=4,goodput", "--tolerance", "0.1", "--jobs", "1"]


def _strip(value):
    """`value` without the fields that measure the machine (nested)."""
    from spectune.files import without_keys

    return without_keys(value, VOLATILE)


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of every CSV a run wrote, by its path in the folder."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*.csv"))}


def _run(argv: list[str], folder: Path) -> dict:
    """Run the CLI in-process; the case's golden: its JSON result and its files' digests."""
    from spectune.cli import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main([*argv, "--out", str(folder)])
    assert code == 0, f"spectune {' '.join(argv)} exited {code}"
    if argv[0] == "simulate":
        result = json.loads(printed.getvalue())
    else:
        result = json.loads((folder / f"{argv[0]}.json").read_text())
    return {"argv": argv, "result": _strip(result), "files": _digests(folder)}


def cases() -> dict[str, list[str]]:
    out = {f"simulate-{name}": ["simulate", *argv, "--format", "json"]
           for name, argv in SIMULATE.items()}
    out["tune"], out["plan"] = TUNE, PLAN
    return out


@pytest.mark.parametrize("name", sorted(cases()))
def test_output_is_identical_to_its_golden(name, tmp_path, monkeypatch):
    """As a user's command in a fresh process: the compiled loops not loaded yet (an earlier
    test's sweep may have loaded them in this process, and a policy whose runs stand for it
    would then take them, its summary saying it left the fast path: the same records)."""
    from policies import kernels as policy_kernels
    from simulator import kernels

    monkeypatch.delenv("SPECTUNE_KERNELS", raising=False)
    for module, name_ in ((kernels, "_loaded"), (kernels, "_active"), (policy_kernels, "_active")):
        monkeypatch.setattr(module, name_, None)
    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    got = json.loads(json.dumps(_run(cases()[name], tmp_path / "out")))
    assert got["argv"] == golden["argv"], "the case changed: rerecord it on purpose"
    assert got["files"] == golden["files"], f"{name}: a record file changed"
    if name in CPU_DEPENDENT and got["result"] != golden["result"]:
        assert _close(got["result"], golden["result"]), f"{name}: the summary changed"
        return
    assert got["result"] == golden["result"], f"{name}: the summary changed"


def _close(got, want, rel: float = 1e-12) -> bool:
    """`got` equals `want` but for floats within `rel` of each other (nested)."""
    if isinstance(want, dict):
        return (isinstance(got, dict) and got.keys() == want.keys()
                and all(_close(got[k], want[k], rel) for k in want))
    if isinstance(want, list):
        return (isinstance(got, list) and len(got) == len(want)
                and all(_close(g, w, rel) for g, w in zip(got, want)))
    if isinstance(want, float) and isinstance(got, float):
        return math.isclose(got, want, rel_tol=rel)
    return got == want


def test_every_case_has_a_golden_and_every_golden_a_case():
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(cases())


def record() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for name, argv in cases().items():
        with tempfile.TemporaryDirectory() as tmp:
            data = _run(argv, Path(tmp) / "out")
        (GOLDEN / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"recorded {name}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/test_goldens.py --record")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    record()
