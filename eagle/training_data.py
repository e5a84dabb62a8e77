"""Training data for the EAGLE head: the target's own continuations, and its features over them.

EAGLE's head learns to predict the target's next last-layer feature, so its data is the target
itself: prompts (outside the evaluation split) continued by the target, greedy and sampled, then
one teacher-forced target pass over prompt + continuation giving the feature (the last layer's
output before the final norm) at every position. Continuations are cached one file per (prompt,
sample) so an interrupted run resumes, and fixed by (seed, prompt key, sample index). A run's
cache packs into one compressed file (`pack_continuations`) that another run unpacks instead of
generating again: on a CPU the generation is most of a run's time.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.generate import output_generator, target_outputs
from models.llama import LlamaModel
from traces import atomic_write

#: The format name inside a packed cache file (`pack_continuations`).
PACK_FORMAT = "spectune-eagle-continuations/1"

#: The instructions before Spec-Bench's summarization and translation questions' text.
SUMMARIZE = "Summarize: "
TRANSLATE = "Translate German to English: "


@dataclass(frozen=True)
class Continuation:
    """One training sequence: a prompt (token ids) and what the target wrote after it."""

    key: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]

    @property
    def tokens(self) -> list[int]:
        return [*self.prompt, *self.output]


def continue_prompts(
    target: LlamaModel,
    prompts: Sequence[tuple[str, Sequence[int]]],
    temperatures: Sequence[float],
    max_tokens: int,
    folder: Path,
    *,
    eos_id: int | None,
    seed: int = 0,
    batch: int = 16,
    progress=None,
) -> list[Continuation]:
    """Each (key, prompt) continued once per temperature (0: greedy), cached under `folder`.

    Sample j of prompt `key` draws from the stream fixed by (seed, f"{key}/{j}"), so a resumed or
    re-batched run writes the same files (up to batched near-ties, as any batched generation).
    """
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(f"{key}-{j}", list(prompt), t, f"{key}/{j}")
            for j, t in enumerate(temperatures) for key, prompt in prompts]
    out: dict[str, Continuation] = {}
    todo = []
    for name, prompt, t, stream in jobs:
        path = folder / f"{name}.json"
        if path.is_file():
            out[name] = Continuation(name, tuple(prompt), tuple(json.loads(path.read_text())))
        else:
            todo.append((name, prompt, t, stream))
    by_temperature: dict[float, list] = {}
    for job in todo:
        by_temperature.setdefault(job[2], []).append(job)
    done = len(out)
    for t, group in by_temperature.items():
        for start in range(0, len(group), batch):
            chunk = group[start : start + batch]
            streams = [output_generator(seed, stream) for *_, stream in chunk]
            outputs = target_outputs(target, [p for _, p, _, _ in chunk], max_tokens, eos_id, t,
                                     streams if t > 0 else None)
            for (name, prompt, _, _), output in zip(chunk, outputs):
                with atomic_write(folder / f"{name}.json") as handle:
                    handle.write(json.dumps(output).encode())
                out[name] = Continuation(name, tuple(prompt), tuple(output))
            done += len(chunk)
            if progress is not None:
                progress(done, len(jobs))
    return [out[name] for name, *_ in jobs]


@torch.no_grad()
def target_features(target: LlamaModel, tokens: Sequence[int]) -> torch.Tensor:
    """The target's last-layer output before the final norm at every position [N, hidden] in
    fp32: one teacher-forced pass, as the live engine's verify passes compute it."""
    sequence = torch.tensor(list(tokens), dtype=torch.int64, device=target.config.device)
    hidden = target([sequence], [target.new_cache(len(sequence))], logits="hidden")[0]
    return hidden.float().cpu().clone()  # a normal tensor (training saves it for backward)


@torch.no_grad()
def batched_features(
    target: LlamaModel, conts: Sequence[Continuation], batch: int = 32
) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(tokens, features [len, width], prompt length) per continuation, every tensor left on the
    target's device, `batch` whole sequences per teacher-forced pass.

    Why: on a GPU a pass over one sequence is bound by kernel launches, so one ragged pass over
    many sequences costs little more than one over a single sequence; keeping the features on
    the device spares training a copy per step. (On a CPU, `scripts/train_eagle.py` keeps its
    one-sequence-at-a-time features, whose files a later run can reuse bit for bit.)"""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    device = target.config.device
    out = []
    for start in range(0, len(conts), batch):
        chunk = conts[start : start + batch]
        tokens = [torch.tensor(c.tokens, dtype=torch.int64, device=device) for c in chunk]
        caches = [target.new_cache(len(t)) for t in tokens]
        hidden = target(tokens, caches, logits="hidden")
        # clone: a normal tensor, not an inference-mode one (training may save it for backward)
        out += [(t, h.float().clone(), len(c.prompt)) for t, h, c in zip(tokens, hidden, chunk)]
    return out


def self_prompts(
    target: LlamaModel,
    pre_query: Sequence[int],
    count: int,
    folder: Path,
    *,
    eos_id: int,
    seed: int = 0,
    batch: int = 32,
    max_tokens: int = 96,
    min_tokens: int = 6,
    progress=None,
) -> list[list[int]]:
    """User turns the instruct model writes itself (Magpie: Xu et al. 2024, arXiv:2406.08464).

    Given only its chat template up to the start of a user turn (`pre_query`), an aligned model
    samples what a user would ask; at temperature 1 the questions are as varied as its chat
    training data. `count` are sampled (cached like any continuation); kept are those that end
    (EOS) within `max_tokens` with at least `min_tokens` tokens, without repeats. Returned without
    the EOS, in sampling order."""
    conts = continue_prompts(target, [(f"q{i}", pre_query) for i in range(count)], [1.0],
                             max_tokens, folder, eos_id=eos_id, seed=seed, batch=batch,
                             progress=progress)
    seen: set[tuple[int, ...]] = set()
    out = []
    for c in conts:
        body = c.output[:-1]
        if not c.output or c.output[-1] != eos_id or len(body) < min_tokens or body in seen:
            continue
        seen.add(body)
        out.append(list(body))
    return out


def document_sources(
    target: LlamaModel,
    turns: Sequence[tuple[str, Sequence[int]]],
    greedy: Sequence[Continuation],
    temperature: float,
    count: int,
    max_tokens: int,
    folder: Path,
    *,
    eos_id: int | None,
    seed: int = 0,
    batch: int = 16,
    progress=None,
) -> list[Continuation]:
    """The answers `document_prompts` builds its documents from: the greedy answers to the
    self-written turns (temperature 0, the shipped recipe), or answers to the first `count` turns
    sampled at `temperature` (cached under `folder` like any continuation).

    Why: documents of greedy answers are text the target would write itself, so the head
    predicts the target's answers over them far better than over a real article
    (`scripts/eagle_generalization.py --documents`: 0.86 against 0.50 held out); sampled text is
    the nearest to an unfamiliar document the target can write."""
    if temperature < 0 or count < 0:
        raise ValueError(f"temperature {temperature} and count {count} must be >= 0")
    if temperature == 0:
        return list(greedy)
    return continue_prompts(target, list(turns)[:count], [temperature], max_tokens, folder,
                            eos_id=eos_id, seed=seed, batch=batch, progress=progress)


def document_prompts(
    answers: Sequence[tuple[str, str]],
    count: int,
    *,
    seed: int = 0,
    passages: tuple[int, int] = (1, 2),
) -> list[tuple[str, str]]:
    """`count` distinct user turns in the long-context forms of Spec-Bench's summarization and
    RAG questions, built from target-written (question, answer) texts: alternately "Summarize: "
    before 1-2 answers run together (an article), and 1-2 answers as passages separated by
    newlines, followed by the question of one of them on the last line.

    Why: self-written turns are short chat questions, so the head rarely sees the target read a
    long prompt and copy from it, which is where it is weakest (summaries, RAG). The documents
    are the target's own answers, so nothing comes from the evaluation split; two answers of up
    to 256 tokens keep a document and its answer mostly inside the training window (512).
    Returns (key, text) pairs, fixed by `seed`; a key ("sum<i>-<hash>", "rag<i>-<hash>") names
    its text, so a cached answer is never paired with another document when the answers given
    change (more self prompts, another seed)."""
    low, high = passages
    if not 1 <= low <= high:
        raise ValueError(f"passages must be (low, high) with 1 <= low <= high; got {passages}")
    if count > 0 and len(answers) < high:
        raise ValueError(f"document prompts take up to {high} answers each; only "
                         f"{len(answers)} answers were given (write more self prompts)")
    rng = np.random.default_rng([seed, 0x0D0C])
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for _ in range(100 * count):
        if len(out) == count:
            break
        i = len(out)
        picks = rng.choice(len(answers), size=int(rng.integers(low, high + 1)), replace=False)
        texts = [answers[j][1].strip() for j in picks]
        if i % 2 == 0:
            form, text = "sum", SUMMARIZE + " ".join(texts)
        else:
            question = answers[picks[int(rng.integers(len(picks)))]][0].strip()
            form, text = "rag", "\n".join([*texts, question])
        if text in seen:
            continue
        seen.add(text)
        out.append((f"{form}{i}-{hashlib.sha256(text.encode()).hexdigest()[:12]}", text))
    if len(out) < count:
        raise ValueError(f"only {len(out)} distinct document prompts could be made of "
                         f"{len(answers)} answers; {count} were asked for")
    return out


def pack_continuations(work: Path, path: Path, meta: dict | None = None) -> dict[str, int]:
    """Every continuation cached in `work`'s folders (`continue_prompts`: one JSON list of token
    ids per sample) in one compressed .npz, with `meta` (how they were made); returns the files
    packed per folder. Token ids are stored as uint16 where they fit."""
    work = Path(work)
    arrays: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for folder in sorted(p for p in work.iterdir() if p.is_dir()) if work.is_dir() else []:
        files = sorted(folder.glob("*.json"))
        if not files:
            continue
        outputs = [json.loads(f.read_text()) for f in files]
        tokens = np.array([t for o in outputs for t in o], dtype=np.int64)
        if tokens.size and tokens.min() < 0:
            raise ValueError(f"{folder}: negative token ids in the cache; not a continuation cache")
        wide = tokens.size and tokens.max() >= 2**16
        arrays[f"{folder.name}.names"] = np.array([f.stem for f in files])
        arrays[f"{folder.name}.lengths"] = np.array([len(o) for o in outputs], dtype=np.int64)
        arrays[f"{folder.name}.tokens"] = tokens.astype(np.int32 if wide else np.uint16)
        counts[folder.name] = len(files)
    if not counts:
        raise ValueError(f"{work}: no cached continuations (*.json in its folders) to pack")
    meta = {"format": PACK_FORMAT, **(meta or {}), "files": counts}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as handle:
        np.savez_compressed(handle, meta=np.asarray(json.dumps(meta)), **arrays)
    return counts


def read_packed(path: Path) -> tuple[dict, dict[str, dict[str, list[int]]]]:
    """(meta, {folder: {name: tokens}}) of a `pack_continuations` file, checked."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no packed continuations at {path} (make one with "
                         "scripts/train_eagle.py --pack)")
    try:
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            arrays = {name: data[name] for name in data.files if name != "meta"}
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(f"{path}: not a packed continuation file ({error})") from None
    if meta.get("format") != PACK_FORMAT:
        raise ValueError(f"{path}: format {meta.get('format')!r}, expected {PACK_FORMAT!r}")
    folders: dict[str, dict[str, list[int]]] = {}
    for folder in sorted({name.rsplit(".", 1)[0] for name in arrays}):
        try:
            names, lengths = arrays[f"{folder}.names"], arrays[f"{folder}.lengths"]
            tokens = arrays[f"{folder}.tokens"].astype(np.int64)
        except KeyError as error:
            raise ValueError(f"{path}: folder {folder!r} lacks {error}") from None
        if len(names) != len(lengths) or int(lengths.sum()) != len(tokens):
            raise ValueError(f"{path}: folder {folder!r}: {len(names)} names, {len(lengths)} "
                             f"lengths summing to {int(lengths.sum())}, {len(tokens)} tokens")
        bad = [str(n) for n in names if not str(n) or "/" in str(n) or str(n).startswith(".")]
        if bad or "/" in folder or folder.startswith("."):
            raise ValueError(f"{path}: unsafe file names {(bad or [folder])[:3]}")
        ends = np.cumsum(lengths)
        folders[folder] = {str(n): tokens[e - n_ : e].tolist()
                           for n, n_, e in zip(names, lengths, ends)}
    return meta, folders


def unpack_continuations(path: Path, work: Path) -> dict[str, int]:
    """Write a packed file's continuations into `work` as `continue_prompts`' cache; returns the
    files written per folder. A file already there must hold the same tokens: two different
    data sets in one work folder would train on a mixture nobody asked for."""
    _, folders = read_packed(path)
    written: dict[str, int] = {}
    for folder, files in folders.items():
        (Path(work) / folder).mkdir(parents=True, exist_ok=True)
        written[folder] = 0
        for name, tokens in files.items():
            target = Path(work) / folder / f"{name}.json"
            if target.is_file():
                if json.loads(target.read_text()) != tokens:
                    raise ValueError(f"{target} differs from {path}'s {folder}/{name}: unpack "
                                     "into an empty --work folder")
                continue
            with atomic_write(target) as handle:
                handle.write(json.dumps(tokens).encode())
            written[folder] += 1
    return written




def _sentences(text: str) -> list[str]:
    """`text` cut after each ., ! or ? followed by a space (news text: good enough)."""
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def recombined_documents(
    questions: Sequence[tuple[str, str, str]],
    *,
    seed: int = 0,
    article_parts: int = 3,
    rag_variants: int = 4,
    translation_pairs: int = 3,
) -> list[tuple[str, str]]:
    """New user turns in Spec-Bench's long-context and translation forms, made of the real text
    of the given (key, category, text) questions (pass the training split only): per
    summarization article, `article_parts` turns summarizing a part of it (first half, second
    half, middle); per RAG question, `rag_variants` turns (its passages reordered, three of
    them, two of them to summarize, two of them with two of another question's before the
    question); per translation sentence, `translation_pairs` turns translating it run together
    with another one. Returns (key, text) pairs, fixed by `seed`; each key names its text.

    Why: the head is weakest on real documents (summaries of news articles, passages): the
    documents it trains on are otherwise the target's own answers, which it predicts far
    better than a real article (`scripts/eagle_generalization.py --documents`). These turns put
    real text from outside the evaluation split in front of the target, in new arrangements,
    so that the target's answers to them are new sequences over real documents."""
    rng = np.random.default_rng([seed, 0xD0C5])
    by_category: dict[str, list[tuple[str, str]]] = {}
    for key, category, text in questions:
        by_category.setdefault(category, []).append((key, text))
    out: list[tuple[str, str]] = []

    def add(form: str, key: str, text: str) -> None:
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        out.append((f"{form}-{key}-{len(out)}-{digest}", text))

    for key, text in by_category.get("summarization", []):
        body = text[len(SUMMARIZE):] if text.startswith(SUMMARIZE) else text
        sentences = _sentences(body)
        if len(sentences) < 4:
            continue
        half, fifth = len(sentences) // 2, len(sentences) // 5
        parts = [sentences[:half], sentences[half:], sentences[fifth : len(sentences) - fifth]]
        for part in parts[:article_parts]:
            add("part", key, SUMMARIZE + " ".join(part))
    rags = by_category.get("rag", [])
    for index, (key, text) in enumerate(rags):
        *passages, question = text.split("\n")
        if len(passages) < 3:
            continue
        other = rags[(index + 1 + int(rng.integers(max(len(rags) - 1, 1)))) % len(rags)][1]
        other_passages = other.split("\n")[:-1]
        shuffled = [passages[i] for i in rng.permutation(len(passages))]
        three = [passages[i] for i in sorted(rng.choice(len(passages), 3, replace=False))]
        two = [passages[i] for i in sorted(rng.choice(len(passages), 2, replace=False))]
        mixed = [*two, *[other_passages[i] for i in rng.choice(len(other_passages),
                                                                min(2, len(other_passages)),
                                                                replace=False)]]
        mixed = [mixed[i] for i in rng.permutation(len(mixed))]
        variants = ["\n".join([*shuffled, question]), "\n".join([*three, question]),
                    SUMMARIZE + " ".join(two), "\n".join([*mixed, question])]
        for form, variant in zip(("rag", "rag", "sum", "mix"), variants[:rag_variants]):
            add(form, key, variant)
    sentences = [(key, text[len(TRANSLATE):]) for key, text in by_category.get("translation", [])
                 if text.startswith(TRANSLATE)]
    for index, (key, sentence) in enumerate(sentences):
        for _ in range(translation_pairs if len(sentences) > 1 else 0):
            j = (index + 1 + int(rng.integers(len(sentences) - 1))) % len(sentences)
            add("de", key, TRANSLATE + sentence + " " + sentences[j][1])
    return out
