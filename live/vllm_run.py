"""One measured vLLM run: start the server, warm it up, serve a workload, stop it, keep
everything (per-request times and speculation counts, the iteration log, the outputs).

The warm-up (a few short requests of growing batch) runs before the measured part, so that
compiling for new shapes is not timed; the iteration log is cut where the workload began.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from live.vllm_client import serve_workload, served_frame, warm_up
from live.vllm_log import read_iterations
from live.vllm_profile import probe
from live.vllm_server import VllmServer, VllmSettings
from traces import Workload


@dataclass
class VllmRun:
    requests: pd.DataFrame  # served_frame
    iterations: pd.DataFrame  # read_iterations, measured part only
    outputs: list[list[int]]
    per_step: list[tuple[list[int], list[int]]]  # (drafted, accepted) per request
    meta: dict


def run_vllm(settings: VllmSettings, venv: Path,
             workloads: dict[str, tuple[Workload, Sequence[Sequence[int]]]],
             out: Path) -> dict[str, VllmRun]:
    """Serve each workload in turn on one fresh server (they share its settings); write
    requests.csv, iterations.csv, outputs.json, per_step.json and meta.json to out/LABEL
    (the server's log is out/server.log)."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "server.log"
    started = time.perf_counter()
    runs = {}
    with VllmServer(settings, venv, log) as server:
        ready_s = time.perf_counter() - started
        model = str(settings.model_dir)
        warm_up(server.url, model, next(iter(workloads.values()))[1])
        k = settings.speculative_tokens
        probe(server.url, model, log, k)  # the first probe's shapes run cold: not kept
        for label, (workload, prompts) in workloads.items():
            before = probe(server.url, model, log, k)
            first = len(read_iterations(log))
            served = serve_workload(server.url, model, workload, prompts)
            time.sleep(1.0)
            iterations = read_iterations(log).iloc[first:].reset_index(drop=True)
            after = probe(server.url, model, log, k)
            runs[label] = _keep(served, workload, iterations, settings, ready_s, out / label, log,
                                before + after)
    return runs


def load_run(folder: Path) -> VllmRun:
    """A run `run_vllm` kept (out/LABEL), read back: simulate it again without serving it."""
    missing = [name for name in ("requests.csv", "iterations.csv", "outputs.json",
                                 "per_step.json", "meta.json") if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder}: no measured vLLM run here (missing "
                                f"{', '.join(missing)})")
    per_step = [(list(d), list(a)) for d, a in json.loads((folder / "per_step.json").read_text())]
    return VllmRun(pd.read_csv(folder / "requests.csv"), pd.read_csv(folder / "iterations.csv"),
                   json.loads((folder / "outputs.json").read_text()), per_step,
                   json.loads((folder / "meta.json").read_text()))


def _keep(served, workload: Workload, iterations: pd.DataFrame, settings: VllmSettings,
          ready_s: float, out: Path, log: Path, probes: list[dict]) -> VllmRun:
    errors = [s.error for s in served if s.error]
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(served)} requests failed; the first: "
                           f"{errors[0]} (server log: {log})")
    out.mkdir(parents=True, exist_ok=True)
    requests = served_frame(served, workload)
    meta = {"settings": {k: str(v) if isinstance(v, Path) else v
                         for k, v in asdict(settings).items()},
            "ready_s": ready_s, "requests": len(workload), "workload": workload.source,
            "probe_rows": probes}
    per_step = [(s.per_step_drafted, s.per_step_accepted) for s in served]
    requests.to_csv(out / "requests.csv", index=False)
    iterations.to_csv(out / "iterations.csv", index=False)
    (out / "outputs.json").write_text(json.dumps([s.token_ids for s in served]))
    (out / "per_step.json").write_text(json.dumps(per_step))
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return VllmRun(requests, iterations, [s.token_ids for s in served], per_step, meta)
