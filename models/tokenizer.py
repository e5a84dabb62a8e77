"""Byte-level BPE (GPT-2 style) as SmolLM2 uses it, built from a vocabulary and a merge list.

No model hub is reachable, so the tokenizer comes from the GGUF file's `tokenizer.ggml.*` fields
instead of `tokenizer.json`. It reproduces Hugging Face's pipeline for SmolLM2: special tokens are
cut out of the text first; the rest is pre-tokenised by `Digits(individual_digits=True)` and then
GPT-2's regex (written out as a scanner over Unicode categories, so no `regex` dependency); each
piece is mapped byte-to-character and merged by rank. Decoding inverts the byte mapping, so
`decode(encode(text)) == text`, except that bytes without a token are dropped, as Hugging Face
drops them (no unknown token, no byte fallback): SmolLM2 lacks 21 of the 256, among them the C0
controls 0x04 0x06 0x13 0x14 0x16 0x1D and the lead bytes of code points U+40000..U+BFFFF.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from functools import lru_cache
from itertools import pairwise

#: The system turn SmolLM2-Instruct's chat template adds when the chat does not start with one.
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
_UNRANKED = 1 << 62  # the rank of a pair that never merges
_WORD_CACHE_SIZE = 100_000  # pre-token -> ids memo, cleared when full
_CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")  # after "'", GPT-2's pattern order
# Unicode's White_Space property: what `\s` matches in the Oniguruma regex Hugging Face runs.
_WHITE_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
    + "".join(map(chr, range(0x2000, 0x200B)))
)


def chat_prompt(user_text: str, system: str | None = SMOLLM2_SYSTEM) -> str:
    """A one-turn ChatML prompt ending where the assistant starts, as SmolLM2's template renders
    it with `add_generation_prompt=True` (its default system turn included unless None)."""
    turns = [] if system is None else [("system", system)]
    turns.append(("user", user_text))
    body = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)
    return body + "<|im_start|>assistant\n"


def user_turn_frame(tok: Tokenizer, system: str | None = SMOLLM2_SYSTEM
                    ) -> tuple[list[int], list[int]]:
    """The token ids of `chat_prompt` before and after the user's text: a self-written turn
    (Magpie) is sampled after the first and, once written, closed by the second."""
    before, after = chat_prompt("\0", system).split("\0")
    return tok.encode(before), tok.encode(after)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map: BPE runs on these characters, not raw bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _kind(char: str) -> str:
    """'S' whitespace, 'L' letter, 'N' number or 'O' other: the classes GPT-2's regex splits on."""
    if char in _WHITE_SPACE:
        return "S"
    category = unicodedata.category(char)[0]
    return category if category in "LN" else "O"


def _gpt2_pieces(text: str) -> Iterable[str]:
    r"""GPT-2's split, alternative by alternative: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
    ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ (leftmost alternative wins, each run greedy)."""
    i, n = 0, len(text)
    while i < n:
        if text[i] == "'":
            suffix = next((s for s in _CONTRACTIONS if text.startswith(s, i + 1)), None)
            if suffix is not None:
                yield text[i : i + 1 + len(suffix)]
                i += 1 + len(suffix)
                continue
        start = i
        if text[i] == " " and i + 1 < n and _kind(text[i + 1]) != "S":
            i += 1  # the optional leading space of " ?X+"
        kind = _kind(text[i])
        j = i + 1
        while j < n and _kind(text[j]) == kind:
            j += 1
        if kind == "S" and j < n and j - start > 1:
            j -= 1  # \s+(?!\S): leave the last space to prefix the next word
        yield text[start:j]
        i = j


def pre_tokenize(text: str) -> list[str]:
    """Digits one by one (SmolLM2's `Digits(individual_digits=True)`), then GPT-2's regex on the
    text between them."""
    pieces: list[str] = []
    start = 0
    for i, char in enumerate(text):
        if unicodedata.category(char)[0] == "N":
            pieces.extend(_gpt2_pieces(text[start:i]))
            pieces.append(char)
            start = i + 1
    pieces.extend(_gpt2_pieces(text[start:]))
    return pieces


class Tokenizer:
    """Byte-level BPE: `tokens[i]` is token i's text in byte-mapped characters, `merges` are
    "left right" pairs by priority, `special` the ids matched verbatim in text (never merged)."""

    def __init__(
        self, tokens: Sequence[str], merges: Sequence[str], special: Iterable[int], eos_id: int
    ) -> None:
        self.tokens = list(tokens)
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        if len(self.vocab) != len(self.tokens):
            raise ValueError("duplicate token strings in the vocabulary")
        self.ranks = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
        if any(len(pair) != 2 for pair in self.ranks):
            raise ValueError("every merge must be two symbols separated by one space")
        self.special = {self.tokens[i]: i for i in special}
        if not 0 <= eos_id < len(self.tokens):
            raise ValueError(f"eos_id {eos_id} is outside the vocabulary")
        self.eos_id = eos_id
        self._byte_char = bytes_to_unicode()
        self._char_byte = {c: b for b, c in self._byte_char.items()}
        longest_first = sorted(self.special, key=len, reverse=True)
        pattern = "|".join(map(re.escape, longest_first))
        self._special_re = re.compile(pattern) if pattern else None
        self._word_cache: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def token_id(self, token: str) -> int:
        """The id of one vocabulary entry, e.g. "<|im_end|>" or "ĠParis" (byte-mapped text)."""
        return self.vocab[token]

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of `text`; special-token strings in it become their ids unless special=False
        (then they are tokenised as plain text, as for untrusted input)."""
        if not special or self._special_re is None:
            return self._encode_plain(text)
        ids: list[int] = []
        start = 0
        for match in self._special_re.finditer(text):
            ids += self._encode_plain(text[start : match.start()])
            ids.append(self.special[match.group()])
            start = match.end()
        return ids + self._encode_plain(text[start:])

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of `ids`; bytes that do not complete a UTF-8 character decode to U+FFFD."""
        out = bytearray()
        for i in ids:
            token = self.tokens[i]
            if token in self.special:
                if not skip_special:
                    out += token.encode()
            else:
                out += bytes(self._char_byte[c] for c in token)
        return out.decode("utf-8", errors="replace")

    def _encode_plain(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in pre_tokenize(text):
            word = "".join(self._byte_char[b] for b in piece.encode())
            cached = self._word_cache.get(word)
            if cached is None:
                if len(self._word_cache) >= _WORD_CACHE_SIZE:
                    self._word_cache.clear()
                cached = self._word_cache[word] = [self.vocab[s] for s in self._bpe(word)]
            ids += cached
        return ids

    def _bpe(self, word: str) -> list[str]:
        """Merge the lowest-ranked adjacent pair, leftmost first, until no pair has a rank
        (unknown characters dropped first, as HF's BPE does)."""
        symbols = [c for c in word if c in self.vocab]
        while len(symbols) > 1:
            ranks = [self.ranks.get(pair, _UNRANKED) for pair in pairwise(symbols)]
            i = min(range(len(ranks)), key=ranks.__getitem__)  # the leftmost of the best
            if ranks[i] == _UNRANKED:
                break
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        return symbols
