"""Reproduce the shipped EAGLE head for SmolLM2-135M from scratch (eagle/data/README.md).

    python scripts/train_eagle.py --out eagle/data/smollm2-135m-eagle.npz

Stages (continuations are cached under --work, so a rerun resumes; --pack writes them to one file
and --data unpacks such a file, so another run skips the generation): the target's continuations of
the training split (even Spec-Bench question ids; greedy and sampled); --self-prompts user turns
the target writes itself (Magpie-style, eagle/training_data.self_prompts) and its greedy answers
to them; --doc-prompts long-context turns in Spec-Bench's summarize and RAG forms made of
those answers (eagle/training_data.document_prompts) and the target's greedy answers to them;
with --real-documents, turns recombining the training split's own articles, passages and
sentences (eagle/training_data.recombined_documents) and the target's greedy answers to them;
a draft vocabulary from all of that text; the target's features over prompt +
continuation; training with a fixed seed (the curve is printed, with held-out acceptance on the
first 3 odd-id questions of each category after every epoch); and the fp16 weights with what
they were made from. The features (--work/features, 256 sequences per memory-mapped shard: the
fused features of the 8,000-turn data are 23.6 GB, more than the CPU VM's memory) and a training
checkpoint every 10 minutes and at each epoch's end (--work/checkpoints) are kept too, so a
stopped run started again goes on from its last finished shard or checkpoint and ends with the
weights of a run never stopped (same threads).

With --device cuda the same stages run on a GPU (scripts/eagle_cuda_check.py checks that first):
features are computed for many whole sequences per pass and stay on the GPU, and each training
step's sequences go through one packed set of chain passes (`eagle.losses.packed_loss`), so an
epoch over 2.6 M positions takes ~40 s on an H100 instead of ~50 min on a 2-core CPU. Nothing is
kept under --work/features or --work/checkpoints there; --epoch-heads keeps each epoch's head.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle.chains import eagle_runs
from eagle.train_spec import TrainSpec
from eagle.training import checkpoint_name, draft_vocabulary, feature_rms, init_head, train_head
from eagle.training_data import (
    Continuation,
    batched_features,
    continue_prompts,
    document_prompts,
    document_sources,
    pack_continuations,
    recombined_documents,
    self_prompts,
    unpack_continuations,
)
from models.eagle_head import EagleHead, save_head
from models.gguf import load_smollm2
from models.tokenizer import chat_prompt, user_turn_frame
from spectune.record import acceptance_k1, tokens_per_step
from traces import atomic_write
from traces.prompts import DEFAULT_PROMPTS, first_per_category, in_split, load_prompts

#: What the data and the head were made from (written into both files' meta).
TARGET = "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised fp32)"

#: (tokens, features [len, hidden], prompt length) per training sequence.
Features = list[tuple[torch.Tensor, torch.Tensor, int]]


@torch.no_grad()
def shared_prefix_features(target, conts) -> Features:
    """(tokens, features, prompt length) per continuation; each prompt's features are computed
    once and its continuations extend a copy of its KV cache."""
    out, prompt_cache = [], {}
    for c in conts:
        key = c.prompt
        if key not in prompt_cache:
            cache = target.new_cache(len(c.prompt) + 300)
            hidden = target([torch.tensor(c.prompt)], [cache], logits="hidden")[0]
            prompt_cache = {key: (cache, hidden.float().clone())}  # continuations are grouped
        cache, prompt_hidden = prompt_cache[key]
        cache = cache.clone()
        rest = target([torch.tensor(c.output)], [cache], logits="hidden")[0].float().clone()
        out.append((torch.tensor(c.tokens), torch.cat((prompt_hidden, rest)), len(c.prompt)))
    return out


def _sequence_key(tokens, prompt_length: int) -> bytes:
    """A short digest of one sequence (its prompt length and tokens)."""
    row = np.asarray([int(prompt_length), *(int(t) for t in tokens)], dtype=np.int64)
    return hashlib.blake2b(row.tobytes(), digest_size=16).digest()


def _load_features(path: Path) -> Features:
    """A features file, memory-mapped: a multi-GB file costs page cache, not process memory."""
    return torch.load(path, weights_only=True, mmap=True)


#: sequences per features shard: fused features of the 8,000-turn data are 23.6 GB in fp32,
#: more than the CPU VM's memory, so they are written a shard at a time (~0.7 GB each) and read
#: back memory-mapped; a stopped run keeps its finished shards
SHARD = 256


def _shards(home: Path, n: int) -> list[Path]:
    return [home / f"shard-{i:05d}.pt" for i in range((n + SHARD - 1) // SHARD)]


def _feature_sources(folder: Path, skip: Path) -> list[tuple[Path, list[Path]]]:
    """Earlier features in `folder`, newest first: one-file (.pt) sets and sharded folders (their
    finished shards)."""
    found = [(path, sorted(path.glob("shard-*.pt")) if path.is_dir() else [path])
             for path in folder.glob("features-*")
             if path != skip and (path.is_dir() or path.suffix == ".pt")]
    return sorted(found, key=lambda e: e[0].stat().st_mtime, reverse=True)


def _read_shards(shards: list[Path]) -> Features:
    return [entry for path in shards for entry in _load_features(path)]


def reusable_features(target, wanted: set[bytes], folder: Path, skip: Path) -> dict[bytes, tuple]:
    """Entries of the other feature sets in `folder` (newest first) whose sequence is `wanted`
    (keys from `_sequence_key`), so that data grown by new sequences computes only those. A set
    counts only if its longest wanted sequence, computed again now, gives bit-identical
    features: a set made from other weights or layers, or on a CPU whose kernels round
    differently, is left alone; so is a file that cannot be read."""
    found: dict[bytes, tuple] = {}
    for path, parts in _feature_sources(folder, skip):
        if len(found) == len(wanted):
            break
        mine = {}
        for part in parts:
            try:
                entries = {}
                for tokens, features, prompt_length in _load_features(part):
                    key = _sequence_key(tokens.tolist(), prompt_length)
                    if key in wanted and key not in found:
                        entries[key] = (tokens, features, int(prompt_length))
            except Exception as error:  # any unreadable file is skipped, and said so
                print(f"features: skipping {part.name}, not a readable features file ({error})",
                      file=sys.stderr)
                continue
            mine.update(entries)
        if not mine:
            continue
        tokens, features, prompt_length = max(mine.values(), key=lambda e: len(e[0]))
        probe = Continuation("probe", tuple(tokens[:prompt_length].tolist()),
                             tuple(tokens[prompt_length:].tolist()))
        again = shared_prefix_features(target, [probe])[0][1]
        if again.shape == features.shape and torch.equal(again, features):
            found.update(mine)
        else:
            print(f"features: not reusing {path.name}: recomputing a sequence of it differs "
                  f"(other weights, layers or CPU)", file=sys.stderr)
    return found


def cached_features(target, conts, folder: Path) -> Features:
    """`shared_prefix_features`, kept in `folder` under a name made from the target's weights
    and every sequence, `SHARD` sequences per file: a resumed run (`train_head`'s checkpoint)
    skips this pass (64 min on the 2-core AVX2 VM), a run stopped inside it computes only the
    shards it had not finished, and a run on grown data computes only its new sequences, taking
    the others from earlier sets (`reusable_features`)."""
    digest = hashlib.sha256(TARGET.encode())
    if target.feature_layers:  # fused features: other columns (unfused runs keep their names)
        digest.update(f"layers {list(target.feature_layers)}".encode())
    digest.update(target.embed[:, :64].float().numpy().tobytes())  # which weights, cheaply
    for c in conts:
        digest.update(np.asarray([len(c.prompt), *c.tokens], dtype=np.int64).tobytes())
    home = folder / f"features-{digest.hexdigest()[:16]}"
    shards = _shards(home, len(conts))
    if all(path.is_file() for path in shards):
        return _read_shards(shards)
    keys = [_sequence_key(c.tokens, len(c.prompt)) for c in conts]
    known = reusable_features(target, set(keys), folder, home) if folder.is_dir() else {}
    if known:
        print(f"features: {sum(k in known for k in keys)} of {len(conts)} sequences taken from "
              f"earlier files", file=sys.stderr)
    home.mkdir(parents=True, exist_ok=True)
    for i, path in enumerate(shards):
        if path.is_file():  # finished by a run that was stopped
            continue
        part, part_keys = conts[i * SHARD : (i + 1) * SHARD], keys[i * SHARD : (i + 1) * SHARD]
        fresh = iter(shared_prefix_features(target, [c for c, k in zip(part, part_keys)
                                                     if k not in known]))
        data = [known[k] if k in known else next(fresh) for k in part_keys]
        with atomic_write(path) as handle:
            torch.save(data, handle)
    return _read_shards(shards)  # as a resumed run sees them (and the earlier sets let go)


def training_items(conts, data: Features, context_only: set[tuple[int, ...]]) -> list[tuple]:
    """(tokens, features, start) per sequence for `train_head`: the loss covers each prompt's
    text once (with its first continuation), then only the outputs; a prompt in `context_only`
    (a document turn: its text is answers the loss covers already) is never in the loss."""
    seen = set(context_only)
    items = []
    for c, (tokens, features, prompt_length) in zip(conts, data, strict=True):
        items.append((tokens, features, prompt_length if c.prompt in seen else 0))
        seen.add(c.prompt)
    return items


def held_out(head, target, eval_set, k: int = 4) -> dict:
    runs = [eagle_runs(head, target, p, o, k)[0] for p, o in eval_set]
    return {"acceptance_k1": acceptance_k1(runs), "tokens_per_step": tokens_per_step(runs, k)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("runs/eagle-train"))
    ap.add_argument("--out", type=Path, default=Path("runs/eagle-train/head.npz"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperatures", default="0,0.8,0.8",
                    help="one continuation per prompt per temperature (0: greedy)")
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=16384, help="draft vocabulary size")
    ap.add_argument("--self-prompts", type=int, default=0,
                    help="user turns to sample from the target itself (kept: those that end)")
    ap.add_argument("--doc-prompts", type=int, default=0,
                    help="long-context user turns (summarize / RAG forms) built from the answers "
                         "to the self-written turns, and answered greedily; needs --self-prompts")
    ap.add_argument("--doc-temperature", type=float, default=0.0,
                    help="make the documents of answers sampled at this temperature (one to "
                         "each of the first 2 x --doc-prompts self-written turns) instead of "
                         "the turns' greedy answers (0, the default and the shipped recipe); "
                         "their text then enters the loss too, as no other sequence covers it")
    ap.add_argument("--real-documents", action="store_true",
                    help="also ~400 turns recombining the training split's real documents "
                         "(article parts, RAG passages reordered and mixed, translation "
                         "sentences paired: eagle/training_data.recombined_documents), answered "
                         "greedily; their text enters the loss")
    ap.add_argument("--data", type=Path,
                    help="a packed data file (--pack) to unpack into --work before generating: "
                         "the run then trains on that data instead of generating it again")
    ap.add_argument("--pack", type=Path,
                    help="write the generated continuations to this file (one compressed .npz)")
    ap.add_argument("--fuse-layers", default="",
                    help="comma-separated 0-based decoder layers whose outputs the head fuses "
                         "with the last layer's (EAGLE-3 style, e.g. 1,14,26); default: none")
    ap.add_argument("--head-layers", type=int, default=1,
                    help="decoder layers in the head (EAGLE: 1, the default)")
    ap.add_argument("--device", default="cpu",
                    help="where the target and the head run: cpu (default; features and training "
                         "checkpoints kept under --work, so a stopped run resumes) or cuda (whole "
                         "sequences batched, features kept on the GPU, each step's sequences "
                         "packed into one pass, nothing kept: a GPU run takes minutes)")
    ap.add_argument("--epoch-heads", type=Path,
                    help="also write the head after every epoch to this folder (head-e<N>.npz)")
    ap.add_argument("--data-only", action="store_true",
                    help="stop once the continuations are generated (and cached under --work)")
    for f in dataclasses.fields(TrainSpec):
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    args = ap.parse_args(argv)
    try:
        spec = TrainSpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainSpec)})
    except ValueError as error:
        ap.error(str(error))
    if not 1 <= args.head_layers <= 8:
        ap.error(f"--head-layers {args.head_layers}: give 1 to 8")
    if args.doc_temperature < 0:
        ap.error(f"--doc-temperature {args.doc_temperature}: give 0 (greedy answers) or more")
    if args.doc_prompts < 0 or (args.doc_prompts and not args.self_prompts):
        ap.error(f"--doc-prompts {args.doc_prompts}: give a count >= 0, and --self-prompts too "
                 f"(the documents are the target's answers to its self-written turns)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(spec.seed)
    started = time.perf_counter()

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {text}", flush=True)

    if args.data is not None:
        try:
            written = unpack_continuations(args.data, args.work)
        except ValueError as error:
            ap.error(str(error))
        say(f"unpacked {args.data} into {args.work}: {written} new files per folder")
    try:
        fuse = [int(i) for i in args.fuse_layers.split(",") if i.strip()]
    except ValueError:
        ap.error(f"--fuse-layers {args.fuse_layers!r}: give comma-separated layer numbers, "
                 f"e.g. 1,14,26")
    try:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device here")
        torch.empty(0, device=device)
    except RuntimeError as error:
        ap.error(f"--device {args.device!r}: {error}")
    target, tok = load_smollm2(torch.float32, device=device)
    try:
        target.set_feature_layers(fuse)
    except ValueError as error:
        ap.error(f"--fuse-layers {args.fuse_layers!r}: {error}")
    questions = load_prompts(DEFAULT_PROMPTS)
    train = [p for p in questions if in_split(p.key, "train")]
    prompts = [(p.key, tok.encode(chat_prompt(p.text))) for p in train]
    temps = [float(t) for t in args.temperatures.split(",")]
    conts = continue_prompts(target, prompts, temps, args.max_tokens,
                             args.work / "continuations", eos_id=tok.eos_id, seed=args.data_seed,
                             batch=args.batch,
                             progress=lambda d, n: say(f"continuations {d}/{n}"))
    own = []
    if args.self_prompts:
        pre_query, tail = user_turn_frame(tok)
        asked = self_prompts(target, pre_query, args.self_prompts, args.work / "self-prompts",
                             eos_id=tok.eos_id, seed=args.data_seed, batch=args.batch,
                             progress=lambda d, n: say(f"self prompts {d}/{n}"))
        own = [(f"self{i}", [*pre_query, *body, *tail]) for i, body in enumerate(asked)]
        say(f"{len(asked)} of {args.self_prompts} self-written user turns kept")
        own_answers = continue_prompts(target, own, [0.0], args.max_tokens,
                                       args.work / "self-continuations", eos_id=tok.eos_id,
                                       seed=args.data_seed, batch=args.batch,
                                       progress=lambda d, n: say(f"self continuations {d}/{n}"))
        conts += own_answers
    docs = []
    if args.doc_prompts:
        sources = document_sources(target, own, own_answers, args.doc_temperature,
                                   2 * args.doc_prompts, args.max_tokens,
                                   args.work / "self-sampled", eos_id=tok.eos_id,
                                   seed=args.data_seed, batch=args.batch,
                                   progress=lambda d, n: say(f"document sources {d}/{n}"))
        answered = [(tok.decode(body), tok.decode([t for t in c.output if t != tok.eos_id]))
                    for body, c in zip(asked, sources) if len(c.output) > 32]
        try:
            texts = document_prompts(answered, args.doc_prompts, seed=args.data_seed)
        except ValueError as error:
            ap.error(f"--doc-prompts {args.doc_prompts} (documents: the answers over 32 tokens "
                     f"to the self-written turns): {error}")
        docs = [(key, tok.encode(chat_prompt(text))) for key, text in texts]
        say(f"{len(docs)} document turns from {len(answered)} answers")
        conts += continue_prompts(target, docs, [0.0], args.max_tokens,
                                  args.work / "doc-continuations", eos_id=tok.eos_id,
                                  seed=args.data_seed, batch=args.batch,
                                  progress=lambda d, n: say(f"doc continuations {d}/{n}"))
    real = []
    if args.real_documents:
        split = [(p.key, p.category or "", p.text) for p in train]
        real = [(key, tok.encode(chat_prompt(text)))
                for key, text in recombined_documents(split, seed=args.data_seed)]
        say(f"{len(real)} turns recombining the training split's documents")
        conts += continue_prompts(target, real, [0.0], args.max_tokens,
                                  args.work / "real-doc-continuations", eos_id=tok.eos_id,
                                  seed=args.data_seed, batch=args.batch,
                                  progress=lambda d, n: say(f"real-document continuations "
                                                            f"{d}/{n}"))
    conts.sort(key=lambda c: (c.prompt, c.key))
    evals = first_per_category([p for p in questions if in_split(p.key, "eval")], 3)
    eval_conts = continue_prompts(target, [(p.key, tok.encode(chat_prompt(p.text))) for p in evals],
                                  [0.0], 128, args.work / "eval", eos_id=tok.eos_id,
                                  batch=args.batch)
    eval_set = [(c.prompt, c.output) for c in eval_conts]
    if args.pack is not None:
        counts = pack_continuations(args.work, args.pack, meta={
            "target": TARGET,
            "prompts": "Spec-Bench questions with even ids (continuations), self-written user "
                       "turns (self-prompts) and their answers (self-continuations), "
                       "summarize/RAG turns made of those answers and their answers "
                       "(doc-continuations), turns recombining the even ids' documents and their "
                       "answers (real-doc-continuations); eval: "
                       "greedy answers to the first 3 odd-id questions per category (held out)",
            "temperatures": temps, "max_tokens": args.max_tokens, "seed": args.data_seed,
            "self_prompts": args.self_prompts, "doc_prompts": args.doc_prompts,
            "doc_temperature": args.doc_temperature, "real_documents": len(real),
            "batch": args.batch, "threads": args.threads,
            "torch": torch.__version__})
        say(f"packed {counts} files into {args.pack}")
    if args.data_only:
        say(f"data only: {len(conts)} continuations, {sum(len(c.output) for c in conts)} output "
            f"tokens cached under {args.work}")
        return 0
    # outputs copy prompts
    texts = [c.output for c in conts] + [p for _, p in prompts + own + docs + real]
    vocab = draft_vocabulary(texts, args.vocab, always=[tok.eos_id],
                             vocab=target.config.shape.vocab)
    chosen = set(vocab.tolist())
    cover = {"train_outputs": float(np.mean([t in chosen for c in conts for t in c.output])),
             "eval_outputs": float(np.mean([t in chosen for _, o in eval_set for t in o]))}
    say(f"{len(conts)} continuations, {sum(len(c.output) for c in conts)} output tokens; draft "
        f"vocabulary {len(vocab)} covers {cover['train_outputs']:.4f} of the training outputs, "
        f"{cover['eval_outputs']:.4f} of the held-out ones")
    on_cpu = device.type == "cpu"
    if on_cpu:
        data = cached_features(target, conts, args.work / "features")
    else:
        data = batched_features(target, conts)
    say(f"features of {sum(len(t) for t, _, _ in data)} positions"
        + (f" (layers {fuse} fused with the last)" if fuse else ""))
    hidden = target.config.shape.hidden
    head = init_head(EagleHead(target, vocab, fuse, args.head_layers), spec.seed, spec.layer_init,
                     feature_rms(data, hidden))
    say(f"before training: {held_out(head, target, eval_set)}")
    # documents of greedy answers repeat text the loss covers already; sampled ones do not
    repeated = {tuple(p) for _, p in docs} if args.doc_temperature == 0 else set()
    items = training_items(conts, data, repeated)
    checkpoint = args.work / "checkpoints" / checkpoint_name(spec, head, items) if on_cpu else None
    packed = not on_cpu
    made = {"target": TARGET,
            "data": {"prompts": f"Spec-Bench questions with even ids ({len(train)}), ChatML",
                     "self_prompts": {"sampled": args.self_prompts, "kept": len(own),
                                      "answers": "greedy"},
                     "doc_prompts": {"count": len(docs), "forms": "summarize, rag",
                                     "answers": "greedy",
                                     **({"documents": f"answers sampled at temperature "
                                                      f"{args.doc_temperature}"}
                                        if args.doc_temperature else {})},
                     "real_documents": {"count": len(real), "answers": "greedy",
                                        "made_by": "eagle.training_data.recombined_documents"},
                     "temperatures": temps, "max_tokens": args.max_tokens,
                     "seed": args.data_seed, "sequences": len(conts),
                     "output_tokens": sum(len(c.output) for c in conts)},
            "draft_vocab": {"size": len(vocab), "coverage": cover},
            "train": {**dataclasses.asdict(spec), "packed": packed},
            "threads": args.threads, "torch": torch.__version__,
            "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                       else "cpu")}

    last: dict = {}  # the latest epoch's held-out figures: the final head's

    def evaluate(epoch: int) -> str:
        """Held-out figures after an epoch (and its head, with --epoch-heads)."""
        figures = last["figures"] = held_out(head, target, eval_set)
        if args.epoch_heads is not None:
            save_head(head, args.epoch_heads / f"head-e{epoch}.npz",
                      {**made, "epoch": epoch, "held_out_first3_per_category": figures})
        return json.dumps(figures)

    try:
        curve = train_head(head, items, spec, log=say, checkpoint=checkpoint, evaluate=evaluate,
                           packed=packed)
    except ValueError as error:
        ap.error(str(error))
    final = last["figures"] if "figures" in last else held_out(head, target, eval_set)
    meta = {**made, "curve": curve, "held_out_first3_per_category": final,
            "wall_s": round(time.perf_counter() - started, 1)}
    save_head(head, args.out, meta)
    say(f"final held-out {final}; weights written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
