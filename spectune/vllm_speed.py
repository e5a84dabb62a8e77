"""How fast a served vLLM ran against its profile, from its iteration log and the simulated run
of the same workload: over the whole run (`busy_ratio`), step for step (`iteration_agreement`),
and per phase shape for shape (`phase_speeds`; `ServedTimes`, its sums, pooled over windows:
what `validate --calibrate` scales by). Each
compares vLLM's logged iteration time with the simulated pass time less the host time the
simulator charged the step (`step_host_s`): vLLM's log leaves the host time out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

#: the target's phases a calibration scales (ProfiledLatency's phase_scales)
PHASES = ("prefill", "decode", "verify")


def busy_ratio(iterations: pd.DataFrame, steps: pd.DataFrame, host_s) -> float:
    """vLLM's logged time in iterations over the simulator's time in passes, for the whole run:
    above 1, vLLM ran slower than its profile (the machine's speed, or the profile's shapes).
    `host_s`: the host time each simulated step carries (a number, or one per step)."""
    logged, simulated = busy_times(iterations, steps, host_s)
    return logged / simulated if simulated else float("nan")


def busy_times(iterations: pd.DataFrame, steps: pd.DataFrame, host_s) -> tuple[float, float]:
    """(vLLM's logged iteration time, the simulator's pass time) of a whole run, in seconds:
    `busy_ratio`'s numerator and denominator, which windows pool as sums."""
    passes = steps.duration_s.to_numpy() - np.broadcast_to(host_s, len(steps))
    return float(iterations.elapsed_ms.sum()) / 1000, float(passes.clip(min=0).sum())


def iteration_agreement(iterations: pd.DataFrame, steps: pd.DataFrame, host_s) -> dict:
    """Simulated against logged time per iteration, where the two runs' i-th steps have the same
    shape (prompt tokens, decode requests and tokens): how many matched, and the median |error|
    of the simulated pass time (less `host_s`, as in busy_ratio) against vLLM's iteration time,
    in percent."""
    busy = ((steps.decode_seqs + steps.prefill_seqs) > 0).to_numpy()
    host = np.broadcast_to(host_s, len(steps))[busy]
    steps = steps[busy].reset_index(drop=True)
    n = min(len(steps), len(iterations))
    logged, sim = iterations.iloc[:n], steps.iloc[:n]
    same = ((logged.context_tokens.to_numpy() == sim.prefill_tokens.to_numpy())
            & (logged.generation_requests.to_numpy() == sim.decode_seqs.to_numpy())
            & (logged.generation_tokens.to_numpy()
               == (sim.decode_seqs + sim.drafted).to_numpy()))
    passes = sim.duration_s.to_numpy() - host[:n]
    errors = (passes / (logged.elapsed_ms.to_numpy() / 1000) - 1)[same]
    return {"matched": int(same.sum()), "of": len(iterations),
            "median_abs_error_pct": float(np.median(np.abs(errors)) * 100) if same.any()
            else float("nan")}


def step_host_s(latency, steps: pd.DataFrame) -> np.ndarray:
    """The host time the simulator charged each of its steps (the profile's gap model)."""
    host = latency.step_overhead_s((steps.decode_seqs + steps.prefill_seqs).to_numpy(),
                                   steps.drafted.to_numpy())
    return np.broadcast_to(np.asarray(host, dtype=np.float64), len(steps))


def phase_speeds(iterations: pd.DataFrame, steps: pd.DataFrame, host_s) -> dict[str, float]:
    """vLLM's speed per phase against the profile, shape for shape (`matched_times`' ratios):
    unlike `busy_ratio` it does not move with how often each shape ran, which near saturation
    differs between vLLM and the simulation (docs/vllm.md). A phase nothing matched takes the
    ratio over all phases (1 where nothing matched at all)."""
    return _ratios(matched_times(iterations, steps, host_s))


def matched_times(iterations: pd.DataFrame, steps: pd.DataFrame, host_s
                  ) -> dict[str, tuple[float, float]]:
    """Per phase, (vLLM's logged time, the simulated time) over the logged iterations whose
    shape (prompt tokens, decode requests, decode tokens) the simulated run also has: each
    iteration's own time against the simulated mean pass time of its shape (less `host_s`). An
    iteration with prompt tokens counts as a prefill (in a step priced in parts its prompt
    chunk is most of the time), one with drafts as a verify, else a decode."""
    if "dummy" in iterations:  # vLLM's warm-up iterations run no request
        iterations = iterations[~iterations.dummy.astype(bool)]
    busy = ((steps.decode_seqs + steps.prefill_seqs) > 0).to_numpy()
    passes = (steps.duration_s.to_numpy() - np.broadcast_to(host_s, len(steps)))[busy]
    steps = steps[busy]
    shape = pd.MultiIndex.from_arrays(
        [steps.prefill_tokens.to_numpy(), steps.decode_seqs.to_numpy(),
         (steps.decode_seqs + steps.drafted).to_numpy()])
    mean_pass = pd.Series(passes.clip(min=0), index=shape).groupby(level=[0, 1, 2]).mean()
    logged_shape = pd.MultiIndex.from_arrays(
        [iterations.context_tokens.to_numpy(), iterations.generation_requests.to_numpy(),
         iterations.generation_tokens.to_numpy()])
    simulated = mean_pass.reindex(logged_shape).to_numpy()
    logged = iterations.elapsed_ms.to_numpy() / 1000
    phase = np.where(iterations.context_tokens.to_numpy() > 0, "prefill", np.where(
        iterations.generation_tokens.to_numpy() > iterations.generation_requests.to_numpy(),
        "verify", "decode"))
    matched = np.isfinite(simulated) & (np.nan_to_num(simulated) > 0)
    return {name: (float(logged[matched & (phase == name)].sum()),
                   float(simulated[matched & (phase == name)].sum())) for name in PHASES}


def _ratios(times: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Logged over simulated time per phase; a phase with no time on either side takes the
    ratio over all phases (1 where there is none)."""
    logged = sum(t for t, _ in times.values())
    simulated = sum(s for _, s in times.values())
    overall = logged / simulated if logged > 0 and simulated > 0 else 1.0
    return {name: t / s if t > 0 and s > 0 else overall for name, (t, s) in times.items()}


@dataclass(frozen=True)
class ServedTimes:
    """One served window's times beside its simulation with the profile unscaled, kept as sums
    so that windows pool (`+`): per phase, logged and simulated time over the iterations
    matched shape for shape (`matched_times`); the host time between iterations (busy time
    less logged time) and the profile's host model of those iterations; all logged iteration
    time and all simulated pass time (`busy_ratio`'s). `windows`: how many are pooled."""

    matched: dict[str, tuple[float, float]]
    host: tuple[float, float]
    busy: tuple[float, float]
    windows: int = 1

    @classmethod
    def of(cls, run, steps: pd.DataFrame, latency) -> ServedTimes:
        """`run`: the served window (live/vllm_run.py); `steps`: its simulation with the
        profile unscaled (`latency`)."""
        from live.vllm_gap import served_gap

        host_s = step_host_s(latency, steps)
        requests, drafted, gap = served_gap(run.iterations, run.requests)
        modelled = float(np.sum(latency.step_overhead_s(requests.to_numpy(),
                                                        drafted.to_numpy())))
        return cls(matched_times(run.iterations, steps, host_s), (gap, modelled),
                   busy_times(run.iterations, steps, host_s))

    def __add__(self, other: ServedTimes) -> ServedTimes:
        return ServedTimes({name: (t + other.matched[name][0], s + other.matched[name][1])
                            for name, (t, s) in self.matched.items()},
                           (self.host[0] + other.host[0], self.host[1] + other.host[1]),
                           (self.busy[0] + other.busy[0], self.busy[1] + other.busy[1]),
                           self.windows + other.windows)

    def aged(self, keep: float) -> ServedTimes:
        """Every sum times `keep`: older windows weigh less in a pool (`+`) with newer ones."""
        return ServedTimes({name: (t * keep, s * keep) for name, (t, s) in self.matched.items()},
                           (self.host[0] * keep, self.host[1] * keep),
                           (self.busy[0] * keep, self.busy[1] * keep), self.windows)

    def speed(self) -> WindowSpeed:
        """The ratios: passes per phase, host time (1 where the profile models none; 0 where
        the log leaves none, the served iterations' logged time filling their busy time),
        busy ratio (None where nothing was simulated)."""
        gap, modelled = self.host
        logged, simulated = self.busy
        return WindowSpeed(_ratios(self.matched),
                           max(gap, 0.0) / modelled if modelled > 0 else 1.0,
                           logged / simulated if simulated > 0 else None, self.windows)


def pooled(earlier: ServedTimes | None, window: ServedTimes, keep: float) -> ServedTimes:
    """`window` pooled after the `earlier` ones (None: none), each earlier window weighing
    `keep` of the one after it: the sums `validate --calibrate` scales a run by."""
    return window if earlier is None else earlier.aged(keep) + window


@dataclass(frozen=True)
class WindowSpeed:
    """How fast served windows ran against the profile (`ServedTimes.speed`): their passes per
    phase (`phase_speeds`), their host time between iterations over the profile's host model
    of those iterations, their busy ratio (reported), and how many windows were pooled."""

    phases: dict[str, float]
    host: float
    busy: float | None
    windows: int = 1

    def to_json(self) -> dict:
        return {"passes_by_phase": self.phases, "host": self.host, "busy_ratio": self.busy,
                "windows": self.windows}
