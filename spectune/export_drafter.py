"""The drafter a tune simulated, which every engine export must name (or not be written).

It comes from the scenario's two halves: the draft model its latency costs (the roofline's or a
profile's) and the drafter its acceptance was recorded with (a recording's meta). Where they
disagree the latency side wins, with a caveat in the export's note: an engine must run the
drafter whose cost was simulated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from spectune.export_schedule import ExportError, is_int

#: Drafter families: a model-free n-gram lookup, a separate draft model, an EAGLE head drafting a
#: chain, the head drafting a static tree, the head taking an n-gram lookup's token, and an early
#: exit (the target's own first layers). The drafter names of drafters/registry.py map onto them.
DRAFTER_KINDS = ("ngram", "draft-model", "eagle", "eagle-tree", "eagle-ngram", "early-exit")
_EAGLE_KINDS = {"eagle": "eagle", "eagle+ngram": "eagle-ngram", "eagle-tree": "eagle-tree"}
_HEAD_KINDS = ("eagle", "eagle-tree", "eagle-ngram", "early-exit")  # drafted by the target's parts


@dataclass(frozen=True)
class Drafter:
    """The drafter a tune simulated, which every export must name. `model` is the draft model an
    engine runs (kind draft-model) and `checkpoint` its weights where the catalog knows them;
    `ngram` is the lookup's (min, max) match length (kind ngram). `tuned` says what was simulated;
    `caveat`, where the latency and the acceptance describe different drafters, which one the
    export follows."""

    kind: str
    model: str | None = None
    checkpoint: str | None = None
    ngram: tuple[int, int] = (1, 3)
    tuned: str = ""
    caveat: str = ""

    def __post_init__(self) -> None:
        if self.kind not in DRAFTER_KINDS:
            raise ExportError(f"drafter kind {self.kind!r}: choose from "
                              f"{', '.join(DRAFTER_KINDS)}")
        if self.kind == "draft-model" and not self.model:
            raise ExportError("a draft-model drafter needs the draft model's name")
        if not (len(self.ngram) == 2 and all(map(is_int, self.ngram))
                and 1 <= self.ngram[0] <= self.ngram[1]):
            raise ExportError(f"drafter ngram={self.ngram!r}: need 1 <= min <= max match length")

    def describe(self) -> str:
        """In words, e.g. "draft model Llama-68M (JackFram/llama-68m)"."""
        if self.kind == "ngram":
            return f"n-gram lookup (matches of {self.ngram[0]}-{self.ngram[1]} tokens)"
        if self.kind == "draft-model":
            where = f" ({self.checkpoint})" if self.checkpoint else ""
            return f"draft model {self.model}{where}"
        return {"eagle": "an EAGLE head drafting a chain",
                "eagle-tree": "an EAGLE head drafting a static tree",
                "eagle-ngram": "an EAGLE head taking an n-gram lookup's token on a suffix match",
                "early-exit": "an early exit (the target's first layers)"}[self.kind]


class _Recorded(NamedTuple):
    """A recording's drafter as a family; kind "" for a name spectune does not know."""

    kind: str
    model: str | None = None
    ngram: tuple[int, int] = (1, 3)


#: a recording made by vLLM's own n-gram proposer: "ngram (vLLM, MIN-MAX)"
_VLLM_NGRAM = re.compile(r"ngram \(vLLM, (\d+)-(\d+)\)")


def _recorded(name: str) -> _Recorded:
    """meta["drafter"] of a recording, as drafters/registry.py `make_drafter` names them:
    ngram[:MIN-MAX], early-exit:L[:lens], quant:BITS, eagle[@int8][:PATH], eagle+ngram[...],
    eagle-tree[...], model:SHAPE."""
    served = _VLLM_NGRAM.fullmatch(name)  # recorded inside vLLM (live/vllm_acceptance.py)
    if served:
        return _Recorded("ngram", ngram=(int(served[1]), int(served[2])))
    head, _, arg = name.partition(":")
    base = head.partition("@")[0]
    if base == "ngram":
        lo, _, hi = arg.partition("-")
        ok = lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)
        return _Recorded("ngram", ngram=(int(lo), int(hi)) if ok else (1, 3))
    if base in _EAGLE_KINDS:
        return _Recorded(_EAGLE_KINDS[base])
    if base == "early-exit":
        return _Recorded("early-exit")
    if base in ("model", "quant"):  # quant:BITS: a rounded copy of the target, run as a draft
        return _Recorded("draft-model", arg if base == "model" and arg else None)
    return _Recorded("")


def _checkpoint(source: str) -> str | None:
    """The Hugging Face repository of a catalog shape ("config.json of REPO"), else None."""
    prefix = "config.json of "
    return source[len(prefix):] if source.startswith(prefix) else None


def drafter_from(draft: Any, acceptance_meta: Mapping, acceptance: str = "") -> Drafter:
    """The drafter of a scenario from its two halves: `draft`, the model its latency costs (a
    ModelShape: name, source; None for model-free drafting), and the acceptance's meta, whose
    "drafter" names a recording's drafter (a parametric acceptance has none). Where they
    disagree the latency side wins: an engine must run the drafter whose cost was simulated. An
    EAGLE head or early exit is costed as a draft model, so that pairing is no disagreement."""
    name = acceptance_meta.get("drafter")
    rec = _recorded(name) if isinstance(name, str) and name else None
    tuned = _tuned(draft, name if rec else None, acceptance_meta, acceptance)
    if draft is None:
        return _model_free(rec, name, tuned)
    if rec is not None and rec.kind in _HEAD_KINDS:
        return Drafter(rec.kind, tuned=tuned)
    return Drafter("draft-model", draft.name, _checkpoint(draft.source), tuned=tuned,
                   caveat=_model_caveat(rec, name, draft.name))


def _tuned(draft: Any, name: str | None, meta: Mapping, acceptance: str) -> str:
    cost = (f"{draft.name} costs each draft pass" if draft is not None
            else "no draft pass is costed (model-free drafting)")
    label = f"{acceptance}, " if acceptance else ""
    acc = (f"{label}recorded with drafter {name} for {meta.get('target', '?')}" if name
           else f"{label}parametric (no drafter recorded)")
    return f"latency: {cost}; acceptance: {acc}"


def _model_free(rec: _Recorded | None, name: Any, tuned: str) -> Drafter:
    """No draft pass was costed. An n-gram (or parametric) acceptance is the model-free drafter
    itself. A recording of a head or a draft model still names the drafter whose acceptance was
    tuned (an n-gram lookup would not accept what it accepted), with a caveat that its cost was
    left out."""
    if rec is None or rec.kind == "ngram":
        return Drafter("ngram", ngram=rec.ngram if rec else (1, 3), tuned=tuned)
    uncosted = (f"the latency costed no draft pass, so {name}'s own drafting time was left out "
                "of the tune: cost it (--profile, or --draft for a draft model) and re-tune "
                "before relying on the table")
    if rec.kind in _HEAD_KINDS:
        return Drafter(rec.kind, tuned=tuned, caveat=uncosted)
    if rec.kind == "draft-model" and rec.model:
        return Drafter("draft-model", rec.model, tuned=tuned, caveat=uncosted)
    return Drafter("ngram", tuned=tuned, caveat=(
        f"the acceptance was recorded with drafter {name}, but the latency costs no draft model: "
        "exported as the model-free drafter (n-gram lookup) the latency simulated, whose own "
        f"acceptance is not {name}'s. Re-tune with an n-gram recording (smollm2-ngram), or cost "
        f"{name} with --draft or --profile"))


def _model_caveat(rec: _Recorded | None, name: Any, model: str) -> str:
    if rec is None or (rec.kind == "draft-model"
                       and (rec.model is None or rec.model.lower() == model.lower())):
        return ""
    return (f"the acceptance was recorded with drafter {name}, but the latency costs draft model "
            f"{model}: exported as {model}, the drafter the simulated engine ran and paid for, "
            f"whose acceptance is not {name}'s. Re-tune with a recording of {model}, or with "
            "--draft none for a model-free drafter")


def scenario_drafter(scenario: Any, scheduler: Any) -> Drafter:
    """The Drafter a tune of `scenario` (a SimulationSpec, run under `scheduler`) simulated: the
    draft model its latency model costs, and the drafter its acceptance was recorded with."""
    from spectune.simulate import build_latency

    latency, _ = build_latency(scenario, scheduler)
    return drafter_from(_costed_draft(latency), _acceptance_meta(scenario.acceptance),
                        scenario.acceptance)


def _costed_draft(latency: Any) -> Any:
    """The draft ModelShape a latency model times (a profile's table names it; the roofline
    holds it), or None when no draft pass is costed."""
    if not latency.has_draft_model:
        return None
    table = getattr(latency, "table", None)
    return table.draft if table is not None else latency.draft


def _acceptance_meta(spec: str) -> Mapping:
    """The meta of a recorded acceptance (a shipped name or a .npz); {} for a parametric one.
    The same lookup order as spectune.simulate.build_acceptance."""
    from importlib import resources

    from traces import SpeculationTrace
    from traces.builtin import builtin_speculation_path, speculation_names

    if spec in speculation_names():
        with resources.as_file(builtin_speculation_path(spec)) as path:
            return SpeculationTrace.load(path).meta
    if spec.endswith(".npz") or Path(spec).exists():
        return SpeculationTrace.load(spec).meta
    return {}
