"""Speculation traces: per request, per output position, how far a draft chain would be accepted.

With greedy decoding the target's output is fixed, so recording `run[t]` once (teacher-forced)
lets the simulator replay any speculation policy exactly: a decode step at output position t
that drafts k tokens accepts min(k, run[t]). Optional per-position signals (acceptance
probability, KL, draft confidence) feed policies that adapt on them.

A trace recorded at a temperature > 0 (over a sampled output) replays the same way: with a
deterministic drafter, rejection sampling emits the draft iff it accepts it, so run[t] over the
sampled output is exactly what speculation accepted on that output (live/recorder.py).
"""

from __future__ import annotations

import itertools
import json
import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from traces._atomic import atomic_write
from traces._checks import count
from traces.errors import TraceError

SIGNALS = ("accept_prob", "kl", "draft_top1", "draft_entropy")
#: per-position arrays a trace may carry: the policy signals, and `proposable`, how many tokens
#: the drafter can propose at all from the true prefix at t (an n-gram lookup runs out of
#: matching text; absent means unlimited). The simulator drafts min(k, proposable[t]).
FIELDS = (*SIGNALS, "proposable")
FORMAT_VERSION = 1
_RUN_DTYPES = (np.int16, np.int32)



def _check_proposable(where: str, values: np.ndarray) -> None:
    """`proposable` counts the drafts a drafter could propose at each position: finite and not
    negative (a step drafts min(k, proposable) tokens; a negative or NaN count has no walk)."""
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(f"{where}: proposable[{i}] is {values[i]!r}; it counts the drafts a "
                         "drafter could propose there: give a finite number >= 0")

@dataclass(frozen=True, eq=False)
class RequestSpeculation:
    """Speculation record of one request with N output tokens.

    run[t] (t = 0..N-1): how many consecutive draft proposals starting at output position t match
    the target (position 0 comes from prefill and is never drafted, but is stored for simple
    indexing); recorded and parametric runs satisfy run[t] <= N - t (not re-checked here).
    Signals are float32 arrays of length N, or None when the drafter could not produce them
    (absence is None, never an all-NaN array). Arrays become read-only views, not copies, so
    100k-request traces stay cheap.
    """

    run: np.ndarray
    accept_prob: np.ndarray | None = None
    kl: np.ndarray | None = None
    draft_top1: np.ndarray | None = None
    draft_entropy: np.ndarray | None = None
    key: str = ""
    proposable: np.ndarray | None = None
    category: str | None = None

    def __post_init__(self) -> None:
        where = f"request {self.key!r}" if self.key else "request"
        run = np.asarray(self.run)
        if run.ndim != 1 or run.size == 0:
            raise TraceError(f"{where}: run must be a non-empty 1-D array (got shape {run.shape})")
        if run.dtype.kind not in "iu":
            raise TraceError(f"{where}: run must hold integers (got dtype {run.dtype})")
        low, high = int(run.min()), int(run.max())
        if low < 0:
            raise TraceError(f"{where}: run has a negative value ({low}); runs count matches")
        if run.dtype not in _RUN_DTYPES:
            if high > np.iinfo(np.int32).max:
                raise TraceError(f"{where}: run value {high} does not fit in int32")
            run = run.astype(np.int32)
        _freeze(self, "run", run)
        for name in FIELDS:
            values = getattr(self, name)
            if values is None:
                continue
            signal = np.asarray(values)
            if signal.shape != run.shape:
                raise TraceError(
                    f"{where}: {name} has shape {signal.shape} but run has {run.shape}; "
                    "give one value per output position"
                )
            if signal.dtype.kind not in "fiu":
                raise TraceError(f"{where}: {name} must hold numbers (got dtype {signal.dtype})")
            if name == "proposable":
                _check_proposable(where, signal)
            _freeze(self, name, signal.astype(np.float32, copy=False))
        if not isinstance(self.key, str):
            raise TraceError(f"{where}: key must be a string (got {type(self.key).__name__})")
        if self.category is not None and not isinstance(self.category, str):
            raise TraceError(f"{where}: category must be a string or None")

    def __len__(self) -> int:
        return int(self.run.size)

    def signals_present(self) -> frozenset[str]:
        """Names of the signals this request carries."""
        return frozenset(name for name in FIELDS if getattr(self, name) is not None)


@dataclass(frozen=True, eq=False)
class SpeculationTrace:
    """Speculation records for a set of requests, plus provenance in `meta`.

    meta holds e.g. drafter, target, temperature, max_run, source, parametric (bool), created;
    it must be JSON-serialisable because it is stored in the .npz as JSON. All requests must
    carry the same set of signals, so a policy can rely on signals_available().
    """

    requests: tuple[RequestSpeculation, ...]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.requests, RequestSpeculation):
            raise TraceError("SpeculationTrace: requests must be a sequence of RequestSpeculation")
        requests = tuple(self.requests)
        if not requests:
            raise TraceError("SpeculationTrace: no requests; a trace needs at least one request")
        for i, request in enumerate(requests):
            if not isinstance(request, RequestSpeculation):
                raise TraceError(f"SpeculationTrace: requests[{i}] is a "
                                 f"{type(request).__name__}, not a RequestSpeculation")
        expected = _signal_mask(requests[0])
        for i, request in enumerate(requests):
            if _signal_mask(request) != expected:
                raise TraceError(
                    f"SpeculationTrace: requests[{i}] has signals "
                    f"{sorted(request.signals_present())} but requests[0] has "
                    f"{sorted(requests[0].signals_present())}; every request must carry the same"
                )
        if not isinstance(self.meta, Mapping):
            raise TraceError(f"SpeculationTrace: meta must be a dict (got "
                             f"{type(self.meta).__name__})")
        meta = dict(self.meta)
        try:
            json.dumps(meta, allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise TraceError(f"SpeculationTrace: meta is not JSON-serialisable ({exc}); "
                             "store only strings, numbers, booleans, lists and dicts") from None
        object.__setattr__(self, "requests", requests)
        object.__setattr__(self, "meta", meta)

    def __len__(self) -> int:
        return len(self.requests)

    def signals_available(self) -> frozenset[str]:
        """Signals every request carries (the same for all requests, as validated)."""
        return self.requests[0].signals_present()

    def request_lengths(self) -> np.ndarray:
        """Each request's number of positions."""
        return np.fromiter((len(r) for r in self.requests), dtype=np.int64,
                           count=len(self.requests))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write one compressed .npz: concatenated arrays + offsets + keys + meta (as JSON).

        Written to a temporary file and renamed, so readers never see a partial trace.
        """
        lengths = np.fromiter((len(r) for r in self.requests), dtype=np.int64,
                              count=len(self.requests))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        run = np.concatenate([r.run for r in self.requests])
        run = run.astype(np.int16 if run.max() <= np.iinfo(np.int16).max else np.int32)
        categories = [r.category for r in self.requests]
        arrays: dict[str, np.ndarray] = {
            "format_version": np.asarray(FORMAT_VERSION, dtype=np.int64),
            "run": run,
            "offsets": offsets,
            "keys": np.asarray([r.key for r in self.requests], dtype=str),
            "categories": np.asarray([c or "" for c in categories], dtype=str),
            "has_category": np.asarray([c is not None for c in categories], dtype=bool),
            "meta_json": np.asarray(json.dumps(self.meta, sort_keys=True)),
        }
        for name in self.signals_available():
            arrays[name] = np.concatenate([getattr(r, name) for r in self.requests])
        with atomic_write(path) as handle:
            np.savez_compressed(handle, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SpeculationTrace:
        """Read a trace written by save(), validating it with file-named messages."""
        file = Path(path)
        if not file.is_file():
            what = "not a regular file" if file.exists() else "file not found"
            raise TraceError(f"{file}: {what}; give the path of a speculation trace (.npz)")
        try:
            with np.load(file, allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
            raise TraceError(f"{file}: not a speculation trace .npz ({exc}); write traces with "
                             "SpeculationTrace.save") from None
        return _from_arrays(arrays, str(file))

    @classmethod
    def from_concatenated(
        cls,
        run: np.ndarray,
        offsets: np.ndarray,
        meta: Mapping[str, object],
        keys: Sequence[str] | None = None,
        categories: Sequence[str | None] | None = None,
        signals: Mapping[str, np.ndarray] | None = None,
    ) -> SpeculationTrace:
        """Build a trace from arrays over all positions of all requests (the fast path).

        offsets[i]:offsets[i+1] are request i's positions. Validation runs once over the
        concatenation, which keeps 100k-request traces fast to build and load.
        """
        arrays: dict[str, np.ndarray] = {"run": np.asarray(run), "offsets": np.asarray(offsets)}
        n = arrays["offsets"].size - 1
        arrays["keys"] = np.asarray([str(i) for i in range(n)] if keys is None else keys, dtype=str)
        cats = [None] * max(n, 0) if categories is None else list(categories)
        arrays["categories"] = np.asarray([c or "" for c in cats], dtype=str)
        arrays["has_category"] = np.asarray([c is not None for c in cats], dtype=bool)
        for name, values in (signals or {}).items():
            if name not in FIELDS:
                raise TraceError(f"unknown signal {name!r}; known: {', '.join(FIELDS)}")
            arrays[name] = np.asarray(values)
        arrays["meta_json"] = np.asarray(json.dumps(dict(meta)))
        return _from_arrays(arrays, "SpeculationTrace.from_concatenated")


def run_from_matches(match: np.ndarray, max_run: int | None = None) -> np.ndarray:
    """Run lengths for greedy chain drafting from per-position match flags.

    run[t] = match[t] · (1 + run[t+1]) with run past the end = 0: the distance from t to the next
    non-match (or to the end). Vectorised with a reversed running minimum; optionally capped.
    """
    flags = np.asarray(match)
    if flags.ndim != 1:
        raise TraceError(f"match must be a 1-D array (got shape {flags.shape})")
    if flags.dtype.kind not in "biu":
        raise TraceError(f"match must hold booleans or 0/1 integers (got dtype {flags.dtype})")
    return runs_by_request(flags.astype(bool, copy=False), np.asarray([flags.size]), max_run)


def runs_by_request(match: np.ndarray, lengths: np.ndarray,
                    max_run: int | None = None) -> np.ndarray:
    """run_from_matches over several requests' positions concatenated (lengths sum to the size).

    Request boundaries act as non-matches, so a run never crosses into the next request.
    """
    if max_run is not None:
        max_run = count("max_run", max_run)
    total = match.size
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1 or (lengths < 0).any() or int(lengths.sum()) != total:
        raise TraceError(f"lengths must be >= 0 and sum to the number of positions ({total})")
    index = np.int32 if total < np.iinfo(np.int32).max else np.int64
    positions = np.arange(total, dtype=index)
    # stop[t] = t at a non-match; a matching last position of a request stops at its end, so the
    # reversed running minimum (the next stop at or after t) never reaches into the next request.
    stops = np.where(match, np.iinfo(index).max, positions)
    last = np.cumsum(lengths)[lengths > 0] - 1
    stops[last] = np.minimum(stops[last], last + 1)
    runs = np.minimum.accumulate(stops[::-1])[::-1]
    runs -= positions
    if max_run is not None:
        np.minimum(runs, max_run, out=runs)
    return runs


def _from_arrays(arrays: Mapping[str, np.ndarray], name: str) -> SpeculationTrace:
    missing = [key for key in ("run", "offsets", "keys", "meta_json") if key not in arrays]
    if missing:
        raise TraceError(f"{name}: missing array {missing[0]!r} (have: "
                         f"{', '.join(sorted(arrays))}); not a trace written by "
                         "SpeculationTrace.save")
    run, offsets = arrays["run"], arrays["offsets"]
    if run.ndim != 1 or run.dtype.kind not in "iu":
        raise TraceError(f"{name}: 'run' must be a 1-D integer array (got {run.dtype}, "
                         f"shape {run.shape})")
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or offsets.size < 2:
        raise TraceError(f"{name}: 'offsets' must be a 1-D integer array with at least 2 entries")
    lengths = np.diff(offsets.astype(np.int64))
    if offsets[0] != 0 or offsets[-1] != run.size or (lengths < 1).any():
        raise TraceError(
            f"{name}: inconsistent offsets (first {offsets[0]}, last {offsets[-1]}, {run.size} "
            "positions; each request needs >= 1 position); the file is damaged"
        )
    if run.size and run.min() < 0:
        i = int(np.argmax(run < 0))
        request = int(np.searchsorted(offsets, i, side="right")) - 1
        raise TraceError(f"{name}: negative run {run[i]} at request {request}, position "
                         f"{i - offsets[request]}; runs count matched proposals and are >= 0")
    run = run.view() if run.dtype in _RUN_DTYPES else run.astype(np.int32)
    n = lengths.size
    keys = arrays["keys"]
    categories = arrays.get("categories", np.full(n, "", dtype=str))
    has_category = arrays.get("has_category", np.zeros(n, dtype=bool))
    for label, values in (("keys", keys), ("categories", categories),
                          ("has_category", has_category)):
        if values.shape != (n,):
            raise TraceError(f"{name}: {label!r} has {values.size} entries for {n} requests")
    try:
        meta = json.loads(str(arrays["meta_json"]))
    except json.JSONDecodeError as exc:
        raise TraceError(f"{name}: meta_json is not valid JSON ({exc.msg})") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{name}: meta_json must encode a JSON object")
    meta_max_run = meta.get("max_run")
    max_run = int(run.max())
    if isinstance(meta_max_run, int) and max_run > meta_max_run:
        raise TraceError(f"{name}: a run of {max_run} exceeds meta max_run {meta_max_run}; "
                         "cap runs at max_run when recording")
    signals: dict[str, np.ndarray] = {}
    for signal in FIELDS:
        if signal in arrays:
            values = arrays[signal]
            if values.shape != run.shape or values.dtype.kind not in "fiu":
                raise TraceError(f"{name}: {signal!r} has shape {values.shape} / dtype "
                                 f"{values.dtype}; expected {run.size} numbers")
            if signal == "proposable":
                _check_proposable(name, values)
            signals[signal] = values.astype(np.float32, copy=False).view()
    run.setflags(write=False)
    for values in signals.values():
        values.setflags(write=False)
    bounds = offsets.astype(np.int64).tolist()
    spans = list(itertools.pairwise(bounds))
    columns = {"run": [run[start:stop] for start, stop in spans]}
    for signal in FIELDS:
        values = signals.get(signal)
        columns[signal] = ([None] * n if values is None
                           else [values[start:stop] for start, stop in spans])
    columns["key"] = keys.astype(str).tolist()
    columns["category"] = [c if has else None for c, has in zip(
        categories.astype(str).tolist(), has_category.tolist(), strict=True)]
    fields = list(columns)
    rows = zip(*(columns[f] for f in fields), strict=True)
    requests = tuple(_trusted_request(dict(zip(fields, row, strict=True))) for row in rows)
    return SpeculationTrace(requests=requests, meta=meta)


def _trusted_request(values: dict[str, object]) -> RequestSpeculation:
    """Build a request whose arrays were validated in bulk, skipping per-request checks.

    Per-request numpy checks cost microseconds each, which adds up to seconds at 100k requests.
    `values` maps every field name to its value.
    """
    request = object.__new__(RequestSpeculation)
    request.__dict__.update(values)
    return request


def _signal_mask(request: RequestSpeculation) -> tuple[bool, ...]:
    return tuple(getattr(request, name) is None for name in FIELDS)


def _freeze(obj: object, name: str, array: np.ndarray) -> None:
    view = array.view()
    view.setflags(write=False)
    object.__setattr__(obj, name, view)
