"""The profiled latency model: pass times from a `LatencyTable` timed on the device at hand.

Per role (target, draft), a linear form in the pass's aggregates is fitted on all that role's rows
(`simulator.fit.fit_linear`) and corrected inside each phase's grid by the measured/fitted ratio,
interpolated at the query's uniform equivalent, so grid points come back exactly and ragged
batches inherit their neighbours' correction. A pass's shape says which grid it uses (decode,
draft, prefill, verify, or catch-up: simulator/draft_feed.py). Outside a grid's box the nearest
point's ratio is kept (`extrapolation="clamp"`, the default), which measured closer than the fit
alone. The grid rules and the extrapolation's measurements: docs/profiling.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from simulator.errors import ConfigError
from simulator.fit import (
    AXES,
    COEFFICIENTS,
    PhaseGrid,
    fit_linear,
    linear_form,
    uniform_aggregates,
)
from simulator.latency import ArrayLike, LatencyModel, Role
from simulator.latency_table import DRAFT_CATCH_UP_KEY, ROLE_PHASES, LatencyTable

Extrapolation = Literal["clamp", "fit"]
_SCALARS = (int, float, np.integer, np.floating)
#: up to this many passes, an array is priced one pass at a time (`_scalar`): the same floats
#: as `_passes`, which costs some 40 numpy calls per phase whatever the passes
FEW_PASSES = 24
_STEP_PHASE = {"target": "decode", "draft": "draft"}  # the phase of one token per request
_MULTI_PHASE = {"target": "verify", "draft": "catchup"}  # several tokens per request at c > 0


@dataclass
class _RoleModel:
    """One role's fitted form and its phase grids (None where a phase has no usable grid)."""

    coef: np.ndarray
    grids: dict[str, PhaseGrid | None]
    report: dict = field(default_factory=dict)


#: table meta key: how a step of prompt chunks and decodes is priced ("one pass", the default, or
#: "parts")
MIXED_STEPS_KEY = "mixed_steps"
#: an engine's host time between iterations, fitted on served runs / measured as a constant
HOST_GAP_KEY = "iteration_gap"
HOST_GAP_CONSTANT_KEY = "iteration_gap_s"
#: a speculating engine's extra time in a step without drafts, timed in the profile
IDLE_PROPOSER_KEY = "idle_proposer_s"
#: the engine's speed measured after the profile, on windows it served, that `with_host_time`
#: applies: {"phase_scales": {phase: s, ...}, "host_scale": s, "source": "..."}
CALIBRATION_KEY = "calibration"


class ProfiledLatency(LatencyModel):
    """Forward-pass times fitted to a profiled table; see the module docstring.

    The table times forward passes only; an engine's host work around them is
    `step_overhead_s + per_seq_overhead_s * num_seqs + per_draft_token_s * drafted` per iteration,
    plus `spec_step_overhead_s` when the step verifies drafts (0 unless the caller measured it:
    `spectune validate` does). `pass_scale` multiplies every
    pass: the device's speed now relative to when the table was timed (1.0 unless measured);
    `phase_scales` ({"prefill": s, "decode": s, "verify": s}, each optional) multiplies the
    target's passes of each phase on top of it: where the speed moved unevenly across shapes.
    A mixed step priced in parts takes the prefill pass's fixed cost out (`fixed_pass_s`, at
    the prefill's scale), so the one it pays is its decode pass's.

    Arrays are priced with the scalar form's operations in its order, exp and log taken by
    math's (`_passes`), so that they give the scalars' floats: the fast path's segments then
    keep the step path's records.
    """

    arrays_match_scalars = True
    #: planners price a profile's alternatives one by one, as before its arrays matched its
    #: scalars (auto weighs a subset of its draft totals on it: docs/policy-auto.md)
    batch_pricing = False

    def __init__(self, table: LatencyTable, step_overhead_s: float = 0.0,
                 extrapolation: Extrapolation = "clamp", *, per_seq_overhead_s: float = 0.0,
                 per_draft_token_s: float = 0.0, spec_step_overhead_s: float = 0.0,
                 pass_scale: float = 1.0,
                 phase_scales: Mapping[str, float] | None = None) -> None:
        for name, value in (("step_overhead_s", step_overhead_s),
                            ("per_seq_overhead_s", per_seq_overhead_s),
                            ("per_draft_token_s", per_draft_token_s),
                            ("spec_step_overhead_s", spec_step_overhead_s)):
            if not (isinstance(value, _SCALARS) and 0 <= value < float("inf")):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        if not (isinstance(pass_scale, _SCALARS) and 0 < pass_scale < float("inf")):
            raise ConfigError(f"pass_scale must be a finite number > 0, got {pass_scale!r}")
        self.phase_scales = _checked_phase_scales(phase_scales)
        if extrapolation not in ("clamp", "fit"):
            raise ConfigError(f"extrapolation must be 'clamp' or 'fit', got {extrapolation!r}")
        rows = table.rows
        t = rows["median_s"].to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(t) & (t > 0)):
            bad = int(np.flatnonzero(~(np.isfinite(t) & (t > 0)))[0])
            raise ConfigError(f"profiled latency: row {bad + 1}: median_s must be a finite "
                              f"time > 0, got {t[bad]!r}")
        if not (rows["role"] == "target").any():
            raise ConfigError("profiled latency: the table has no target rows; "
                              "profile the target model first")
        self.table = table
        self._overhead = float(step_overhead_s)
        self._per_seq = float(per_seq_overhead_s)
        self._per_draft = float(per_draft_token_s)
        self._spec_step = float(spec_step_overhead_s)
        idle = table.meta.get(IDLE_PROPOSER_KEY, 0.0)
        if not (isinstance(idle, _SCALARS) and math.isfinite(idle)):
            raise ConfigError(f"profiled latency: meta {IDLE_PROPOSER_KEY!r} must be a finite "
                              f"number of seconds, got {idle!r}")
        self.idle_proposer_s = float(idle)
        self.pass_scale = float(pass_scale)
        self.extrapolation: Extrapolation = extrapolation
        self._clamp = extrapolation == "clamp"
        self._roles = {role: _build_role(rows[rows["role"] == role])
                       for role in ROLE_PHASES if (rows["role"] == role).any()}
        self._scalar_coef = {r: tuple(float(x) for x in m.coef) for r, m in self._roles.items()}
        self.source = _source(table.meta, "draft" in self._roles)
        self.draft_catch_up = table.meta.get(DRAFT_CATCH_UP_KEY, "bonus")
        mixed = table.meta.get(MIXED_STEPS_KEY, "one pass")
        if mixed not in ("one pass", "parts"):
            raise ConfigError(f"profiled latency: meta {MIXED_STEPS_KEY!r} must be 'one pass' or "
                              f"'parts', got {mixed!r}")
        #: price an iteration of prompt chunks and decodes as its prefill pass plus its decode
        #: pass less one fixed cost, each scaled by its own phase's grid (the profile's meta
        #: says so where its mixed steps were checked against an engine: docs/vllm.md)
        self.mixed_parts = mixed == "parts"

    @classmethod
    def with_host_time(cls, table: LatencyTable, pass_scale: float = 1.0,
                       host_scale: float = 1.0,
                       phase_scales: Mapping[str, float] | None = None) -> ProfiledLatency:
        """The table's model plus the host time between iterations its meta records, where the
        profile comes from an engine whose iteration times leave that time out (vLLM's): the
        model fitted on served runs (`iteration_gap`: fixed, per request, per step that
        verifies drafts; live/vllm_gap.py), else a constant (`iteration_gap_s`), else none;
        `host_scale` multiplies it (the host's speed now against the runs it was fitted on);
        `pass_scale` and `phase_scales` as the class says. A profile calibrated since it was
        timed (its meta's `CALIBRATION_KEY`) has its scales applied too, times these."""
        if not (isinstance(host_scale, _SCALARS) and 0 <= host_scale < float("inf")):
            raise ConfigError(f"host_scale must be a finite number >= 0, got {host_scale!r}")
        host_scale, phase_scales = _calibrated(table.meta.get(CALIBRATION_KEY), host_scale,
                                               phase_scales)
        fitted = table.meta.get(HOST_GAP_KEY)
        if fitted is None:
            return cls(table, float(table.meta.get(HOST_GAP_CONSTANT_KEY, 0.0)) * host_scale,
                       pass_scale=pass_scale, phase_scales=phase_scales)
        try:
            return cls(table, fitted["fixed_s"] * host_scale,
                       per_seq_overhead_s=fitted["per_request_s"] * host_scale,
                       spec_step_overhead_s=fitted["speculative_step_s"] * host_scale,
                       pass_scale=pass_scale, phase_scales=phase_scales)
        except (KeyError, TypeError):
            raise ConfigError(f"profiled latency: meta {HOST_GAP_KEY!r} must hold fixed_s, "
                              f"per_request_s and speculative_step_s; got {fitted!r}") from None

    @property
    def fixed_pass_s(self) -> float:
        """The target's fitted cost of a pass that computes nothing (its form's constant), at the
        prefill's scale: what a mixed step priced in parts takes out of its prefill pass."""
        fixed = self._scalar_coef["target"][0] * self.pass_scale
        return fixed * self.phase_scales["prefill"] if self.phase_scales else fixed

    @property
    def has_draft_model(self) -> bool:
        return "draft" in self._roles

    def forward_s(self, role: Role, num_seqs: ArrayLike, query_tokens: ArrayLike,
                  cached_tokens: ArrayLike, attn_pairs: ArrayLike,
                  phase: str | None = None) -> ArrayLike:
        """Fitted form × interpolated ratio, elementwise; 0 for an empty pass or no draft.
        `phase` names the grid to read (a prompt chunk that continues a cached prompt is still
        a prefill); None: the phase the shape implies."""
        if role not in ROLE_PHASES:
            raise ConfigError(f"role must be 'target' or 'draft', got {role!r}")
        model = self._roles.get(role)
        if (isinstance(num_seqs, _SCALARS) and isinstance(query_tokens, _SCALARS)
                and isinstance(cached_tokens, _SCALARS) and isinstance(attn_pairs, _SCALARS)):
            if model is None:
                return 0.0
            t = self._scalar(role, model, num_seqs, query_tokens, cached_tokens, attn_pairs,
                             phase)
            return t * self.pass_scale
        args = np.broadcast_arrays(num_seqs, query_tokens, cached_tokens, attn_pairs)
        shape = args[0].shape
        if model is None:
            return _out(np.zeros(shape))
        b, q, c, p = (np.asarray(x, dtype=np.float64).ravel() for x in args)
        if len(b) <= FEW_PASSES:  # one by one costs less than the arrays' calls
            scalar, scale = self._scalar, self.pass_scale
            return _out(np.array([scalar(role, model, *shape_of, phase) * scale for shape_of
                                  in zip(b.tolist(), q.tolist(), c.tolist(), p.tolist())],
                                 dtype=np.float64).reshape(shape))
        out = np.zeros(len(b))
        live = (b > 0) & (q > 0)
        if live.any():
            out[live] = self._passes(role, model, b[live], q[live], c[live], p[live], phase)
        return _out(out.reshape(shape))

    def _passes(self, role: str, model: _RoleModel, b: np.ndarray, q: np.ndarray,
                c: np.ndarray, p: np.ndarray, phase: str | None) -> np.ndarray:
        """`_scalar` of passes that run, as float64 arrays, to the bit (its operations in its
        order, element by element; exp and log taken by math's, as numpy's differ from them
        in the last bit), scaled by `pass_scale`: the engine's segments price as arrays the
        passes its steps price one by one."""
        k0, k1, k2, k3, k4 = self._scalar_coef[role]
        t = k0 + k1 * b + k2 * q + k3 * c + k4 * p
        if phase is not None:
            phases = {phase: np.ones(len(b), dtype=bool)}
            c = np.zeros(len(b)) if phase == "prefill" else c
        else:
            step = q == b
            prefill = ~step & (c == 0) & (q > b)
            phases = {_STEP_PHASE[role]: step, "prefill": prefill,
                      _MULTI_PHASE[role]: ~step & ~prefill}
        for name, mask in phases.items():
            grid = model.grids.get(name)
            if grid is None or not mask.any():
                continue
            bb = b[mask]
            log_ratio = grid.interpolate_many(bb, q[mask] / bb, c[mask] / bb, self._clamp)
            t[mask] = t[mask] * np.fromiter(map(math.exp, log_ratio.tolist()), np.float64,
                                            len(log_ratio))
        if self.phase_scales and role == "target":
            for name, mask in phases.items():
                t[mask] = t[mask] * self.phase_scales[name]
        return t * self.pass_scale

    def _scalar(self, role: str, model: _RoleModel, b, q, c, p, phase=None) -> float:
        """The same for one pass in plain Python: the engine calls this once per iteration."""
        if b <= 0 or q <= 0:
            return 0.0
        k0, k1, k2, k3, k4 = self._scalar_coef[role]
        t = k0 + k1 * b + k2 * q + k3 * c + k4 * p
        if phase is not None:
            c = 0 if phase == "prefill" else c
        elif q == b:
            phase = _STEP_PHASE[role]
        elif c == 0 and q > b:
            phase = "prefill"
        else:
            phase = _MULTI_PHASE[role]
        grid = model.grids.get(phase)
        if grid is not None:
            t *= math.exp(grid.interpolate_scalar(b, q / b, c / b, self._clamp))
        if self.phase_scales and role == "target":
            t *= self.phase_scales[phase]
        return float(t)

    def step_overhead_s(self, num_seqs: ArrayLike, drafted_tokens: ArrayLike = 0) -> ArrayLike:
        """Host time of an iteration that runs anything (0 when idle); see the class doc."""
        if isinstance(num_seqs, _SCALARS) and isinstance(drafted_tokens, _SCALARS):
            if num_seqs <= 0:
                return 0.0
            host = self._overhead + self._per_seq * num_seqs + self._per_draft * drafted_tokens
            return host + self._spec_step if self._spec_step and drafted_tokens > 0 else host
        n = np.asarray(num_seqs, dtype=np.float64)
        drafted = np.asarray(drafted_tokens)
        host = self._overhead + self._per_seq * n + self._per_draft * drafted
        if self._spec_step:
            host = host + np.where(drafted > 0, self._spec_step, 0.0)
        return _out(np.where(n > 0, host, 0.0))

    def describe(self) -> dict:
        """Coefficients, fit quality and grid ranges per role and phase, for reports."""
        meta = self.table.meta
        return {
            "kind": "profiled",
            "source": self.source,
            "device": meta["device"],
            "dtype": meta["dtype"],
            "created": meta["created"],
            "step_overhead_s": self._overhead,
            "per_seq_overhead_s": self._per_seq,
            "per_draft_token_s": self._per_draft,
            "spec_step_overhead_s": self._spec_step,
            "pass_scale": self.pass_scale,
            "extrapolation": self.extrapolation,
            "draft_catch_up": self.draft_catch_up,
            "draft_tree": None if self.draft_tree is None else self.draft_tree.to_json(),
            "roles": {role: m.report for role, m in self._roles.items()},
        } | ({"idle_proposer_s": self.idle_proposer_s} if self.idle_proposer_s else {}) | (
            {"phase_scales": self.phase_scales} if self.phase_scales else {}) | (
            {CALIBRATION_KEY: meta[CALIBRATION_KEY]} if CALIBRATION_KEY in meta else {})


def _build_role(rows: pd.DataFrame) -> _RoleModel:
    """Fit the role's linear form on all its rows, then one ratio grid per phase."""
    b, q, c, p = uniform_aggregates(rows["num_seqs"], rows["query_tokens_per_seq"],
                                    rows["cached_tokens_per_seq"])
    t = rows["median_s"].to_numpy(dtype=np.float64)
    coef = fit_linear(b, q, c, p, t)
    log_ratio = np.log(t) - np.log(np.maximum(linear_form(coef, b, q, c, p), 1e-300))
    fit_err = np.abs(np.expm1(-log_ratio)) * 100
    model = _RoleModel(coef, {})
    phases: dict[str, dict] = {}
    role = str(rows["role"].iloc[0])
    for phase in ROLE_PHASES[role]:
        mask = (rows["phase"] == phase).to_numpy()
        if not mask.any():
            model.grids[phase] = None
            phases[phase] = {"points": 0, "interpolation": "no rows: fitted form alone"}
            continue
        points = rows.loc[mask, list(AXES)].to_numpy(dtype=np.float64)
        grid = PhaseGrid.build(points, log_ratio[mask])
        model.grids[phase] = grid if isinstance(grid, PhaseGrid) else None
        info: dict = {"points": int(mask.sum())}
        for i, axis in enumerate(AXES):
            info[axis] = [int(points[:, i].min()), int(points[:, i].max())]
        if isinstance(grid, PhaseGrid):
            shape = "x".join(str(len(v)) for v in grid.values)
            info["interpolation"] = f"multilinear on a {shape} log grid"
            info["filled_nodes"] = grid.filled
        else:
            info["interpolation"] = f"{grid}: fitted form alone"
        phases[phase] = info
    model.report = {
        "rows": len(rows),
        "coefficients": dict(zip(COEFFICIENTS, (float(x) for x in coef))),
        "fit_abs_pct": {"median": float(np.median(fit_err)), "max": float(fit_err.max())},
        "phases": phases,
    }
    return model


def _calibrated(calibration, host_scale: float, phase_scales: Mapping[str, float] | None
                ) -> tuple[float, Mapping[str, float] | None]:
    """The host and phase scales given, times a profile's calibration (meta
    `CALIBRATION_KEY`, or None)."""
    if calibration is None:
        return host_scale, phase_scales
    if not (isinstance(calibration, Mapping)
            and isinstance(calibration.get("phase_scales"), Mapping)
            and "host_scale" in calibration):
        raise ConfigError(f"profiled latency: meta {CALIBRATION_KEY!r} must hold host_scale "
                          f"and phase_scales ({{phase: scale}}); got {calibration!r}")
    host = calibration["host_scale"]
    phases = _checked_phase_scales(calibration["phase_scales"])
    # 0 is a speed a window can measure: a log that leaves no time between iterations
    if not (isinstance(host, _SCALARS) and 0 <= host < float("inf")):
        raise ConfigError(f"profiled latency: meta {CALIBRATION_KEY!r}: host_scale must be a "
                          f"finite number >= 0, got {host!r}")
    given = _checked_phase_scales(phase_scales) or {}
    return host_scale * host, {p: (phases or {}).get(p, 1.0) * given.get(p, 1.0)
                               for p in ROLE_PHASES["target"]}


def _checked_phase_scales(scales: Mapping[str, float] | None) -> dict[str, float] | None:
    """Every target phase's scale (1.0 where not given), or None where none is given."""
    if not scales:
        return None
    phases = ROLE_PHASES["target"]
    for phase, value in scales.items():
        if phase not in phases:
            raise ConfigError(f"phase_scales: {phase!r} is not a target phase "
                              f"({', '.join(phases)})")
        if not (isinstance(value, _SCALARS) and 0 < value < float("inf")):
            raise ConfigError(f"phase_scales[{phase!r}] must be a finite number > 0, "
                              f"got {value!r}")
    return {phase: float(scales.get(phase, 1.0)) for phase in phases}


def _source(meta: dict, has_draft: bool) -> str:
    """'profile: DEVICE, DTYPE, TARGET target + DRAFT draft, DATE' from the table's meta."""
    models = f"{meta['target']['name']} target"
    if has_draft:
        models += f" + {meta['draft']['name']} draft"
    else:
        models += " (no draft model timed)"
    return f"profile: {meta['device']}, {meta['dtype']}, {models}, {meta['created'][:10]}"


def _out(t: np.ndarray) -> ArrayLike:
    return float(t) if np.ndim(t) == 0 else t


# -- error evaluation (`spectune profile` reports these) -----------------------------------------


def heldout_split(table: LatencyTable, fraction: float = 0.2,
                  seed: int = 0) -> tuple[LatencyTable, pd.DataFrame]:
    """(training table, held-out rows): up to `fraction` of each phase grid's interior points.

    Interior: strictly between the smallest and largest value on every axis that has three or
    more values (an axis with one or two values has no inside). Corners and the box's faces
    along those axes stay in training because interpolation needs them to bracket anything, so
    the held-out error measures interpolation, not extrapolation. No two held-out points are
    grid neighbours, so each is predicted from its own neighbours: over a cell twice the grid's
    spacing, which makes the error an upper estimate for the full table. At least one point
    is held out of a phase that has any interior; the model fills the holes (`PhaseGrid`).
    """
    if not 0 <= fraction < 1:
        raise ConfigError(f"heldout fraction must be in [0, 1), got {fraction!r}")
    rows = table.rows
    rng = np.random.default_rng(seed)
    held: list[int] = []
    for _, group in rows.groupby(["role", "phase"], sort=True):
        points = group[list(AXES)].to_numpy()
        ranks = np.column_stack([np.unique(v, return_inverse=True)[1] for v in points.T])
        wide = ranks.max(axis=0) >= 2
        interior = np.all((ranks > 0) & (ranks < ranks.max(axis=0)) | ~wide, axis=1)
        candidates = np.flatnonzero(interior) if wide.any() else np.array([], dtype=int)
        if not len(candidates) or fraction == 0:
            continue
        want, chosen = max(1, round(fraction * len(candidates))), []
        for i in rng.permutation(candidates):
            if all(np.abs(ranks[i] - ranks[j]).sum() > 1 for j in chosen):
                chosen.append(i)
                if len(chosen) == want:
                    break
        held.extend(group.index[chosen].tolist())
    held_mask = rows.index.isin(held)
    train = LatencyTable(rows[~held_mask].reset_index(drop=True), table.meta)
    return train, rows[held_mask].reset_index(drop=True)


def prediction_errors(model: LatencyModel, rows: pd.DataFrame) -> np.ndarray:
    """Signed relative errors (predicted / measured - 1) for uniform table rows, in row order."""
    b, q, c, p = uniform_aggregates(rows["num_seqs"], rows["query_tokens_per_seq"],
                                    rows["cached_tokens_per_seq"])
    ragged = pd.DataFrame({"role": rows["role"].to_numpy(), "num_seqs": b, "query_tokens": q,
                           "cached_tokens": c, "attn_pairs": p,
                           "median_s": rows["median_s"].to_numpy()})
    return ragged_errors(model, ragged)


def ragged_errors(model: LatencyModel, ragged: pd.DataFrame) -> np.ndarray:
    """Signed relative errors for measured passes given by their aggregates, in row order.

    Columns: role, num_seqs, query_tokens, cached_tokens, attn_pairs, median_s.
    """
    need = ("role", "num_seqs", "query_tokens", "cached_tokens", "attn_pairs", "median_s")
    missing = [col for col in need if col not in ragged.columns]
    if missing:
        raise ConfigError(f"ragged passes: missing columns {missing}")
    unknown = ~ragged["role"].isin(["target", "draft"]).to_numpy()
    if unknown.any():
        raise ConfigError(f"ragged passes: row {int(np.flatnonzero(unknown)[0]) + 1}: role "
                          f"must be 'target' or 'draft'")
    out = np.empty(len(ragged))
    for role in ("target", "draft"):
        mask = (ragged["role"] == role).to_numpy()
        if mask.any():
            sub = ragged[mask]
            pred = model.forward_s(role, *(sub[col].to_numpy(dtype=np.float64)
                                          for col in need[1:5]))
            out[mask] = np.asarray(pred) / sub["median_s"].to_numpy(dtype=np.float64) - 1
    return out


def error_summary(errors: np.ndarray) -> dict:
    """Median, 90th percentile and max of |error| in percent, and the count (None when empty)."""
    e = np.abs(np.asarray(errors, dtype=np.float64)) * 100
    if e.size == 0:
        return {"median_abs_pct": None, "p90_abs_pct": None, "max_abs_pct": None, "n": 0}
    return {"median_abs_pct": float(np.median(e)), "p90_abs_pct": float(np.percentile(e, 90)),
            "max_abs_pct": float(e.max()), "n": int(e.size)}
