"""The Spec-Bench prompt set that ships with spectune, and its split.

Recording, EAGLE training and the benchmarks all read the same 480 questions (turns[0] of each
line of a Spec-Bench/MT-Bench style .jsonl) and the same split: the even question ids train the
tuned lens and the EAGLE head, the odd ones evaluate them. One home for both, below every job.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

#: Spec-Bench's 480 questions, shipped (traces/data/prompts/README.md)
DEFAULT_PROMPTS = Path(__file__).resolve().parent / "data" / "prompts" / (
    "spec_bench_question.jsonl.gz")
SPLITS = ("all", "eval", "train")


def in_split(key: str, split: str) -> bool:
    """Whether question `key` belongs to `split`: train = even ids (the tuned lens and the EAGLE
    head were fitted on these), eval = odd ids, all = both."""
    if split == "all":
        return True
    if not key.lstrip("-").isdigit():
        raise ValueError(f"--split {split} needs integer question ids, got {key!r}")
    return (int(key) % 2 == 0) == (split == "train")


@dataclass(frozen=True)
class Prompt:
    key: str
    category: str | None
    text: str


def load_prompts(path: Path, limit: int | None = None,
                 categories: str | None = None) -> list[Prompt]:
    """turns[0] of every line, in file order; the first `limit` of each category."""
    rows = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text = row["turns"][0]
            except (json.JSONDecodeError, KeyError, IndexError, TypeError):
                raise ValueError(f"{path}:{number}: expected a JSON object with a non-empty "
                                 "'turns' list") from None
            if not isinstance(text, str):
                raise ValueError(f"{path}:{number}: turns[0] is not a string")
            key = str(row.get("question_id", number))
            rows.append(Prompt(key, row.get("category"), text))
    if not rows:
        raise ValueError(f"{path}: no prompts")
    if len({p.key for p in rows}) != len(rows):
        raise ValueError(f"{path}: question_id values repeat; they must be unique")
    if categories:
        wanted = [c.strip() for c in categories.split(",") if c.strip()]
        known = {p.category for p in rows}
        unknown = [c for c in wanted if c not in known]
        if unknown:
            raise ValueError(f"--categories: unknown {', '.join(unknown)}; {path} has "
                             f"{', '.join(sorted(str(c) for c in known))}")
        rows = [p for p in rows if p.category in wanted]
    return first_per_category(rows, limit)


def first_per_category(rows: list[Prompt], limit: int | None) -> list[Prompt]:
    """The first `limit` prompts of each category, in order (all with no limit)."""
    if limit is None:
        return rows
    seen: dict[str | None, int] = {}
    kept = []
    for p in rows:
        seen[p.category] = seen.get(p.category, 0) + 1
        if seen[p.category] <= limit:
            kept.append(p)
    return kept
