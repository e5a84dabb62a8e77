"""The EAGLE training data's cache packs into one file and unpacks into a cache that
`continue_prompts` reads without generating anything, with clear errors for wrong files."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.scripts import load_script  # noqa: E402
from support.tiny_models import TINY, sharpened  # noqa: E402

from eagle.training_data import (  # noqa: E402
    PACK_FORMAT,
    batched_features,
    continue_prompts,
    document_prompts,
    document_sources,
    pack_continuations,
    read_packed,
    unpack_continuations,
)
from models.llama import LlamaModel, config_for  # noqa: E402

PROMPTS = [("a", [5, 9, 13]), ("b", [7, 1]), ("c", [2, 4, 6, 8])]


class NoModel:
    """A target that must not be called: everything should come from the cache."""

    def __getattr__(self, name):
        raise AssertionError(f"the target was used ({name}) though the cache held everything")


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return sharpened(LlamaModel.random(config_for(TINY), seed=0))


def generate(target, work):
    greedy_and_sampled = continue_prompts(target, PROMPTS, [0.0, 1.0], 10, work / "conts",
                                          eos_id=3, seed=4, batch=2)
    other = continue_prompts(target, PROMPTS[:1], [1.0], 6, work / "other", eos_id=None, seed=5)
    return greedy_and_sampled, other


def test_a_packed_cache_unpacks_into_the_same_continuations_without_the_model(target,
                                                                            tmp_path):
    made = generate(target, tmp_path / "run1")
    counts = pack_continuations(tmp_path / "run1", tmp_path / "new" / "data.npz",
                                meta={"seed": 4})
    assert counts == {"conts": 6, "other": 1}
    meta, folders = read_packed(tmp_path / "new" / "data.npz")
    assert meta["format"] == PACK_FORMAT and meta["seed"] == 4 and meta["files"] == counts
    assert folders["other"] == {"a-0": list(made[1][0].output)}

    written = unpack_continuations(tmp_path / "new" / "data.npz", tmp_path / "run2")
    assert written == {"conts": 6, "other": 1}
    assert generate(NoModel(), tmp_path / "run2") == made
    # unpacking again over the same data writes nothing and is no error
    again = unpack_continuations(tmp_path / "new" / "data.npz", tmp_path / "run2")
    assert again == {"conts": 0, "other": 0}


def test_token_ids_are_stored_narrow_when_they_fit(tmp_path):
    for name, tokens, dtype in (("small", [1, 65535], np.uint16), ("big", [1, 70000], np.int32)):
        (tmp_path / name / "f").mkdir(parents=True)
        (tmp_path / name / "f" / "x-0.json").write_text(json.dumps(tokens))
        pack_continuations(tmp_path / name, tmp_path / f"{name}.npz")
        with np.load(tmp_path / f"{name}.npz") as data:
            assert data["f.tokens"].dtype == dtype
        assert read_packed(tmp_path / f"{name}.npz")[1] == {"f": {"x-0": tokens}}


def test_unpacking_over_different_data_is_refused(target, tmp_path):
    generate(target, tmp_path / "run1")
    pack_continuations(tmp_path / "run1", tmp_path / "data.npz")
    (tmp_path / "run2" / "conts").mkdir(parents=True)
    (tmp_path / "run2" / "conts" / "a-0.json").write_text("[1, 2, 3]")
    with pytest.raises(ValueError, match=r"a-0.json differs from .*empty --work folder"):
        unpack_continuations(tmp_path / "data.npz", tmp_path / "run2")


def test_bad_files_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no cached continuations"):
        pack_continuations(tmp_path / "empty", tmp_path / "x.npz")
    with pytest.raises(ValueError, match=r"no packed continuations at .*--pack"):
        read_packed(tmp_path / "missing.npz")
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(ValueError, match="not a packed continuation file"):
        read_packed(tmp_path / "text.npz")
    np.savez(tmp_path / "other.npz", meta=np.asarray(json.dumps({"format": "x"})))
    with pytest.raises(ValueError, match="format 'x', expected"):
        read_packed(tmp_path / "other.npz")
    meta = np.asarray(json.dumps({"format": PACK_FORMAT}))
    np.savez(tmp_path / "short.npz", meta=meta, **{"f.names": np.array(["a", "b"]),
             "f.lengths": np.array([2, 2]), "f.tokens": np.array([1, 2, 3], dtype=np.uint16)})
    with pytest.raises(ValueError, match="lengths summing to 4, 3 tokens"):
        read_packed(tmp_path / "short.npz")
    np.savez(tmp_path / "unsafe.npz", meta=meta, **{"f.names": np.array(["../evil"]),
             "f.lengths": np.array([1]), "f.tokens": np.array([1], dtype=np.uint16)})
    with pytest.raises(ValueError, match="unsafe file names"):
        read_packed(tmp_path / "unsafe.npz")
    np.savez(tmp_path / "partial.npz", meta=meta, **{"f.names": np.array(["a"])})
    with pytest.raises(ValueError, match="folder 'f' lacks"):
        read_packed(tmp_path / "partial.npz")


def train_eagle_script():
    return load_script("train_eagle")


def test_train_eagle_keeps_the_features_of_its_data_for_a_resumed_run(target, tmp_path,
                                                                       monkeypatch):
    module = train_eagle_script()
    conts, _ = generate(target, tmp_path / "run")
    first = module.cached_features(target, conts, tmp_path / "features")
    assert len(list((tmp_path / "features").iterdir())) == 1
    calls = counting_passes(module, monkeypatch)
    again = module.cached_features(target, conts, tmp_path / "features")
    assert calls == []  # the same data: its own file, not even a probe
    assert_same_features(first, again)
    assert len(again) == len(conts)
    module.cached_features(target, conts[1:], tmp_path / "features")  # other data: another file
    assert calls == [1, 0]  # a probe, then nothing new to compute
    assert len(list((tmp_path / "features").iterdir())) == 2


class Stopped(Exception):
    pass


def test_features_are_written_in_shards_and_a_stopped_pass_resumes(target, tmp_path,
                                                                    monkeypatch):
    """Shards of SHARD sequences, each written when done: a pass stopped after its first shard
    computes only the others when run again, and ends with the features of an unstopped pass."""
    module = train_eagle_script()
    monkeypatch.setattr(module, "SHARD", 2)
    conts, _ = generate(target, tmp_path / "run")
    assert len(conts) > 2 * module.SHARD
    real = module.shared_prefix_features
    calls: list[int] = []

    def stop_after_one(target, part):
        if calls:
            raise Stopped  # as if killed while computing the second shard
        calls.append(len(part))
        return real(target, part)

    monkeypatch.setattr(module, "shared_prefix_features", stop_after_one)
    with pytest.raises(Stopped):
        module.cached_features(target, conts, tmp_path / "features")
    (home,) = (tmp_path / "features").iterdir()
    assert [p.name for p in home.iterdir()] == ["shard-00000.pt"]
    monkeypatch.setattr(module, "shared_prefix_features", real)
    calls = counting_passes(module, monkeypatch)
    resumed = module.cached_features(target, conts, tmp_path / "features")
    shards = (len(conts) + 1) // 2
    assert calls == [len(c) for c in [conts[i : i + 2] for i in range(2, len(conts), 2)]]
    assert len(list(home.iterdir())) == shards
    assert_same_features(resumed, real(target, conts))


def new_sequences(target, folder: Path):
    """Two continuations of a prompt that sorts between PROMPTS' ("c" < this < "a" < "b")."""
    return continue_prompts(target, [("n", [6, 3])], [0.0, 1.0], 5, folder, eos_id=None, seed=2)


def counting_passes(module, monkeypatch) -> list[int]:
    """Record how many sequences each `shared_prefix_features` call computes."""
    calls, real = [], module.shared_prefix_features

    def counted(target, conts):
        calls.append(len(conts))
        return real(target, conts)

    monkeypatch.setattr(module, "shared_prefix_features", counted)
    return calls


def assert_same_features(a, b):
    assert len(a) == len(b)
    for (t1, f1, p1), (t2, f2, p2) in zip(a, b):
        assert torch.equal(t1, t2) and torch.equal(f1, f2) and p1 == p2


def test_grown_data_computes_only_its_new_sequences(target, tmp_path, monkeypatch):
    """Features of data that grew take the old sequences from the earlier file (after its
    longest one, computed again, matches it bit for bit) and equal a from-scratch computation,
    with the new sequences sorted in among the old."""
    module = train_eagle_script()
    conts, _ = generate(target, tmp_path / "run")
    new = new_sequences(target, tmp_path / "new")
    grown = sorted([*conts, *new], key=lambda c: (c.prompt, c.key))
    assert grown[:2] != [*new] and grown[-2:] != [*new]  # in the middle
    module.cached_features(target, conts, tmp_path / "features")
    calls = counting_passes(module, monkeypatch)
    reused = module.cached_features(target, grown, tmp_path / "features")
    assert calls == [1, len(new)]  # the probe, then only the new sequences
    assert_same_features(reused, module.shared_prefix_features(target, grown))
    assert len(list((tmp_path / "features").glob("features-*"))) == 2


def test_features_of_other_weights_are_not_reused(target, tmp_path, monkeypatch, capsys):
    module = train_eagle_script()
    conts, _ = generate(target, tmp_path / "run")
    other = sharpened(LlamaModel.random(config_for(TINY), seed=1))
    module.cached_features(other, conts[:-1], tmp_path / "features")
    calls = counting_passes(module, monkeypatch)
    mine = module.cached_features(target, conts, tmp_path / "features")
    assert calls == [1, len(conts)]  # the probe failed: everything computed
    assert "recomputing a sequence of it differs" in capsys.readouterr().err
    assert_same_features(mine, module.shared_prefix_features(target, conts))


@pytest.mark.parametrize("content", [b"not a torch file", "truncated", "wrong shape"])
def test_unreadable_feature_files_are_skipped_with_a_message(target, tmp_path, monkeypatch,
                                                             capsys, content):
    module = train_eagle_script()
    conts, _ = generate(target, tmp_path / "run")
    folder = tmp_path / "features"
    module.cached_features(target, conts[:-1], folder)
    good = next(folder.glob("features-*/shard-*.pt"))
    bad = folder / "features-bad.pt"
    if content == "truncated":
        bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif content == "wrong shape":
        torch.save([(torch.tensor([1, 2]), torch.zeros(2, 3))], bad)  # pairs, not triples
    else:
        bad.write_bytes(content)
    calls = counting_passes(module, monkeypatch)
    mine = module.cached_features(target, conts, folder)
    assert "skipping features-bad.pt, not a readable features file" in capsys.readouterr().err
    assert calls == [1, 1]  # the good file still served: a probe, then the one new sequence
    assert_same_features(mine, module.shared_prefix_features(target, conts))


def test_training_items_put_each_prompt_in_the_loss_once_and_documents_never(target, tmp_path):
    module = train_eagle_script()
    conts, _ = generate(target, tmp_path / "run")
    conts = sorted(conts, key=lambda c: (c.prompt, c.key))
    data = [(torch.tensor(c.tokens), None, len(c.prompt)) for c in conts]
    document = conts[-1].prompt
    items = module.training_items(conts, data, {document})
    starts = [(c.prompt, start) for c, (_, _, start) in zip(conts, items)]
    for i, (prompt, start) in enumerate(starts):
        earlier = any(q == prompt for q, _ in starts[:i])
        whole = not earlier and prompt != document
        assert start == (0 if whole else len(prompt)), (i, prompt, start)
    assert sum(start == 0 for _, start in starts) == len({c.prompt for c in conts}) - 1
    with pytest.raises(ValueError):  # data of another length is refused, not cut short
        module.training_items(conts, data[:-1], set())


def refusal(argv: list[str], tmp_path, capsys) -> str:
    """What train_eagle.py says when it refuses `argv` (a usage error: exit code 2)."""
    with pytest.raises(SystemExit) as stopped:
        train_eagle_script().main([*argv, "--work", str(tmp_path / "w")])
    assert stopped.value.code == 2
    return capsys.readouterr().err


def test_train_eagle_refuses_a_missing_data_file_before_loading_the_model(tmp_path, capsys):
    assert "no packed continuations at" in refusal(["--data", str(tmp_path / "none.npz")],
                                                   tmp_path, capsys)


def test_fused_features_are_kept_apart_from_unfused_ones(target, tmp_path):
    """A target handing out lower layers too (`--fuse-layers`) writes wider features under
    another name: an unfused run never reads them, nor a fused run the unfused ones."""
    module = train_eagle_script()
    conts, _ = generate(target, tmp_path / "run")
    narrow = module.cached_features(target, conts, tmp_path / "features")
    tapped = copy.deepcopy(target)
    tapped.set_feature_layers([0])
    wide = module.cached_features(tapped, conts, tmp_path / "features")
    assert len(list((tmp_path / "features").iterdir())) == 2
    hidden = target.config.shape.hidden
    for (_, f_narrow, _), (_, f_wide, _) in zip(narrow, wide):
        assert f_wide.shape[1] == 2 * hidden and torch.equal(f_wide[:, hidden:], f_narrow)


def test_train_eagle_refuses_fuse_layers_that_are_not_numbers(tmp_path, capsys):
    assert ("--fuse-layers '1,mid': give comma-separated layer numbers"
            in refusal(["--fuse-layers", "1,mid"], tmp_path, capsys))


ANSWERS = [(f"question {i}?", f"answer number {i}.") for i in range(10)]


def test_document_prompts_take_spec_bench_long_context_forms():
    """Even turns summarize 1-2 answers run together; odd turns list 1-2 answers as passages,
    one per line, then the question of one of those answers; no turn twice."""
    turns = document_prompts(ANSWERS, 40, seed=3)
    assert [k.split("-")[0] for k, _ in turns] == [f"{'sum' if i % 2 == 0 else 'rag'}{i}"
                                                  for i in range(40)]
    assert len({text for _, text in turns}) == 40
    sizes = set()
    for key, text in turns:
        if key.startswith("sum"):
            assert text.startswith("Summarize: answer number ") and "\n" not in text
            sizes.add(text.count("answer number"))
        else:
            *passages, question = text.split("\n")
            assert len(passages) in (1, 2)
            assert len(set(passages)) == len(passages)  # no answer twice in one turn
            assert all(p in {a for _, a in ANSWERS} for p in passages)
            asked = {q: a for q, a in ANSWERS}[question]
            assert asked in passages  # the question is one of its own passages' questions
            sizes.add(len(passages))
    assert sizes == {1, 2}
    wide = document_prompts(ANSWERS, 40, seed=3, passages=(3, 3))
    assert all(text.count("answer number") == 3 for _, text in wide)


def test_document_prompts_are_fixed_by_the_seed_and_keyed_by_their_text():
    """Keys name the text, so a cache of answers keyed by them never pairs an answer with
    another document when the answers given change."""
    assert document_prompts(ANSWERS, 12, seed=1) == document_prompts(ANSWERS, 12, seed=1)
    assert document_prompts(ANSWERS, 12, seed=1) != document_prompts(ANSWERS, 12, seed=2)
    assert document_prompts(ANSWERS, 5, seed=1) == document_prompts(ANSWERS, 12, seed=1)[:5]
    grown = [*ANSWERS, ("question 10?", "answer number 10.")]
    before = dict(document_prompts(ANSWERS, 12, seed=1))
    after = dict(document_prompts(grown, 12, seed=1))
    assert before != after
    assert all(before[key] == after[key] for key in before.keys() & after.keys())


def test_document_prompts_refuse_too_few_answers_and_bad_ranges():
    with pytest.raises(ValueError, match="only 1 answers were given"):
        document_prompts(ANSWERS[:1], 4)
    assert document_prompts(ANSWERS[:1], 0) == []
    with pytest.raises(ValueError, match="1 <= low <= high"):
        document_prompts(ANSWERS, 4, passages=(2, 1))
    with pytest.raises(ValueError, match="only 8 distinct document prompts"):
        document_prompts(ANSWERS[:2], 10)  # two answers make only 4 summaries (A, B, AB, BA)


def test_train_eagle_refuses_doc_prompts_without_self_prompts(tmp_path, capsys):
    assert ("--doc-prompts 10: give a count >= 0, and --self-prompts too"
            in refusal(["--doc-prompts", "10"], tmp_path, capsys))


def test_batched_features_equal_the_one_sequence_passes(target, tmp_path):
    """The GPU path's features (whole sequences, several per ragged pass, left on the device)
    are the CPU path's up to rounding, with the same tokens and prompt lengths, in order."""
    module = train_eagle_script()
    conts, _ = generate(target, tmp_path)
    one_by_one = module.shared_prefix_features(target, conts)
    batched = batched_features(target, conts, batch=4)
    assert len(batched) == len(one_by_one) == len(conts)
    for (t1, f1, p1), (t2, f2, p2) in zip(batched, one_by_one):
        assert torch.equal(t1, t2) and p1 == p2
        assert f1.shape == f2.shape
        torch.testing.assert_close(f1, f2, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        batched_features(target, conts, batch=0)


def test_train_eagle_refuses_a_device_torch_cannot_use(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train_eagle_script().main(["--device", "nosuchdevice", "--work", str(tmp_path)])
    assert "--device 'nosuchdevice'" in capsys.readouterr().err


def test_document_sources_are_the_greedy_answers_or_fresh_cached_samples(target, tmp_path):
    """Temperature 0 keeps the greedy answers (the shipped recipe); above it, answers to the
    first `count` turns are sampled, cached, and fixed by the seed."""
    greedy = continue_prompts(target, PROMPTS, [0.0], 8, tmp_path / "greedy", eos_id=None)
    assert document_sources(target, PROMPTS, greedy, 0.0, 2, 8, tmp_path / "s",
                            eos_id=None) == greedy
    assert not (tmp_path / "s").exists()  # nothing sampled for the shipped recipe
    sampled = document_sources(target, PROMPTS, greedy, 1.5, 2, 8, tmp_path / "s",
                               eos_id=None, seed=7)
    assert [c.prompt for c in sampled] == [tuple(p) for _, p in PROMPTS[:2]]
    assert all(len(c.output) == 8 for c in sampled)
    assert [c.output for c in sampled] != [c.output for c in greedy[:2]]
    assert len(list((tmp_path / "s").glob("*.json"))) == 2
    again = document_sources(target, PROMPTS, greedy, 1.5, 2, 8, tmp_path / "s", eos_id=None,
                             seed=7)
    assert again == sampled
    other = document_sources(target, PROMPTS, greedy, 1.5, 2, 8, tmp_path / "other",
                             eos_id=None, seed=8)
    assert [c.output for c in other] != [c.output for c in sampled]
    with pytest.raises(ValueError, match="must be >= 0"):
        document_sources(target, PROMPTS, greedy, -1.0, 2, 8, tmp_path / "s", eos_id=None)


def test_train_eagle_refuses_a_negative_document_temperature(tmp_path, capsys):
    assert "--doc-temperature -0.5: give 0" in refusal(["--doc-temperature", "-0.5"], tmp_path,
                                                         capsys)


ARTICLE = " ".join(f"Sentence {i} of the story." for i in range(10))
PASSAGES = {key: [f"Passage {key}{j} text." for j in range(5)] for key in ("r1", "r2", "r3")}
SPLIT = ([("s1", "summarization", "Summarize: " + ARTICLE),
          ("s2", "summarization", "Summarize: Too short. Two sentences.")]
         + [(key, "rag", "\n".join([*p, f"Question {key}?"])) for key, p in PASSAGES.items()]
         + [(f"t{i}", "translation", f"Translate German to English: Satz {i} .")
            for i in range(3)]
         + [("q1", "qa", "Who wrote it?")])


def test_recombined_documents_rearrange_only_the_given_real_text():
    """Article parts are runs of the article's own sentences; RAG turns keep their question last
    and take passages of their own question (the mixed ones two of another's too); translation
    turns join two different given sentences; other categories and too-short articles give
    nothing."""
    from eagle.training_data import recombined_documents

    turns = recombined_documents(SPLIT, seed=0)
    forms = [key.split("-")[0] for key, _ in turns]
    assert forms.count("part") == 3 and forms.count("de") == 3 * 3
    assert forms.count("rag") == 2 * 3 and forms.count("sum") == 3 and forms.count("mix") == 3
    assert len({key for key, _ in turns}) == len(turns)
    sentences = set(ARTICLE.replace(". ", ".\n").split("\n"))
    every_passage = {p for ps in PASSAGES.values() for p in ps}
    for key, text in turns:
        form, source = key.split("-")[:2]
        if form == "part":
            assert source == "s1" and text.startswith("Summarize: ")
            part = text[len("Summarize: "):].replace(". ", ".\n").split("\n")
            assert set(part) <= sentences and 4 <= len(part) <= 6
            assert " ".join(part) in ARTICLE  # a run, in order
        elif form in ("rag", "mix"):
            *passages, question = text.split("\n")
            assert question == f"Question {source}?"
            own = [p for p in passages if p in PASSAGES[source]]
            assert set(passages) <= every_passage and len(set(passages)) == len(passages)
            assert len(passages) - len(own) == (2 if form == "mix" else 0)
            assert len(passages) in ((5, 3) if form == "rag" else (4,))
        elif form == "sum":
            body = text[len("Summarize: "):]
            assert "\n" not in body and body.count("Passage") == 2
            assert all(p in PASSAGES[source] for p in body.replace(". P", ".\nP").split("\n"))
        else:
            assert form == "de" and text.startswith("Translate German to English: ")
            words = text.split(": ", 1)[1]
            assert words.count("Satz") == 2 and words.split(" .")[0] == f"Satz {source[1:]}"
            assert len(set(words.split(" . "))) == 2  # two different sentences


def test_recombined_documents_are_fixed_by_the_seed():
    from eagle.training_data import recombined_documents

    assert recombined_documents(SPLIT, seed=1) == recombined_documents(SPLIT, seed=1)
    assert recombined_documents(SPLIT, seed=1) != recombined_documents(SPLIT, seed=2)
    assert recombined_documents([], seed=1) == []
