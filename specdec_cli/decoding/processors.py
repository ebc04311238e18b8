"""The decoding rules: logits processors, stopping criteria, and the per-answer state they share.

Every rule is a transformers `LogitsProcessor` / `StoppingCriteria`, so the speculative loop and
the HF `generate` baselines run literally the same objects (seed failure F13). A processor is a
pure function of (input_ids, scores): it sees the whole history it is given (F10), and the loop
gives it prompt + answer so far + the draft prefix for every position it scores.

The rules are defined over the answer's *characters*, whatever the tokenization, so they mean the
same on a character tokenizer (the tests') and on Qwen's byte-level BPE (语/速/较快, 音/调/偏/高),
which the demo pair's tokenizer reproduces:

* no-repeat n-gram (n=4) over the stream of the answer's CJK content characters, punctuation
  stripped: a token is banned when any character it adds would complete a 4-gram the stream
  already holds (HF's `NoRepeatNGramLogitsProcessor` rule, F5, applied to characters instead of
  ids; HF's own works on ids, which on Qwen bans the second 适中 of 音调适中，音量适中).
* 紧邻同字: a CJK character may double (慢慢, 断断续续, 慢吞吞: reduplication is how Chinese describes
  a voice) but never stand three times in a row (慢慢慢); a mark between is fine (女声，声音).
* punctuation gate (F8): a mark only after 4 CJK characters since the last one; a sentence end only
  once the answer holds 12 CJK characters, and that is also when a sentence end stops generation.
* never emitted: special and markup tokens other than the end-of-turn ids, partial UTF-8 tokens,
  a sentence end with text after it in one token, rows past the tokenizer.
* repetition penalty: HF's semantics (F4) on the answer's CJK content *tokens* (F9), except the
  token that would double the single character just written (the second 慢 of 慢/慢).

Why n=4 and 12 characters, and what the penalty does to 音 in 音调/音量/音色: docs/engine.md, "The decoding rules, on characters".

Speed (V≈152k): each rule's bans for an answer prefix are a few index arrays found through
`RuleIndex` lookups, computed once per prefix by `AnswerTracker` (draft and verification score the
same prefixes) and extended token by token, never by re-reading the history; a row is then written
only at those indexes. `DecodingRules.process_block` does a whole verification block in one call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import (
    EosTokenCriteria,
    LogitsProcessor,
    LogitsProcessorList,
    MaxLengthCriteria,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .config import DecodingConfig
from .vocab import NO, RuleIndex, TokenFacts, facts_for_tokenizer, is_cjk

_EMPTY = np.zeros(0, np.int64)
_DEFAULTS = DecodingConfig()


class VocabMasks:
    """A vocabulary's per-token facts (`TokenFacts`), for models whose logits have `vocab_size`
    rows (which may exceed the tokenizer's length: those rows are never real tokens)."""

    def __init__(self, facts: TokenFacts, vocab_size: int) -> None:
        self.facts = facts
        self.vocab_size = max(vocab_size, len(facts))

    @property
    def n_text(self) -> int:
        return len(self.facts)

    def index(self, n: int, comma_min: int, stop_min: int) -> RuleIndex:
        return self.facts.index(n, comma_min, stop_min)

    @classmethod
    def from_texts(cls, texts: Sequence[str], vocab_size: int, control: Sequence[int] = ()) -> VocabMasks:
        """From each id's text directly (tests, toy vocabularies); `control` ids are not text."""
        return cls(TokenFacts.from_texts(list(texts), frozenset(control)), vocab_size)

    @classmethod
    def for_tokenizer(cls, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> VocabMasks:
        """From a tokenizer: every id decoded once, cached in memory and on disk by the tokenizer's
        content (vocab.facts_for_tokenizer)."""
        return cls(facts_for_tokenizer(tokenizer), vocab_size)


# -- the answer, as the rules see it ---------------------------------------------------------------

@dataclass(eq=False)
class AnswerState:
    """The rules' view of one answer prefix, derived from the previous prefix's state and one token."""

    stream: str = ""              # CJK content characters so far
    since_mark: int = 0           # CJK characters since the last mark
    last: int = NO                # code point of the answer's last character
    grams: frozenset = frozenset()  # n-grams of `stream`
    internal: np.ndarray = field(default_factory=lambda: _EMPTY)  # tokens holding one of `grams` inside
    content: tuple[int, ...] = ()  # distinct CJK content token ids, in order of first use
    stop: bool = False            # the last token ends the sentence with enough characters before it
    loop: bool = False            # the last token completes a tandem repeat (chars or ids)
    run: int = 0                  # how many times `last` (when CJK) stands side by side at the end
    double: int = NO              # the id a doubling would repeat: the last token, a lone CJK character
    cache: dict = field(default_factory=dict)

    def then(self, token: int, path: list[int], facts: TokenFacts, index: RuleIndex) -> AnswerState:
        """The state after `token`; `path` is the answer's ids up to and including it."""
        n = index.n
        if token >= index.n_text:  # a row past the tokenizer (only with the rules off)
            return AnswerState(self.stream, self.since_mark, self.last, self.grams, self.internal, self.content,
                               loop=_id_tandem(path, 1), run=self.run, double=self.double)
        chars = facts.cjk[token]
        stream = self.stream + chars
        mark_after = int(facts.mark_after[token])
        since = mark_after if mark_after != NO else self.since_mark + len(chars)
        last, run = self.last, self.run
        if facts.last[token] != NO:
            last = int(facts.last[token])
            tail = int(facts.tail_run[token])
            run = self.run + tail if facts.uniform[token] and facts.first[token] == self.last else tail
        # A lone CJK character written once: the token that doubles it is reduplication, which the
        # repetition penalty leaves alone (慢/慢; 慢/慢/慢 is banned outright by 紧邻同字).
        double = token if run == 1 and facts.uniform[token] and len(chars) == 1 else NO
        grams, internal = self.grams, self.internal
        if chars and len(stream) >= n:
            start = max(len(self.stream) - n + 1, 0)
            new = [stream[i:i + n] for i in range(start, len(stream) - n + 1)]
            fresh = [g for g in new if g not in grams]
            if fresh:
                grams = grams | set(fresh)
                held = [index.holding(g) for g in fresh]
                internal = np.concatenate([internal, *held]) if any(h.size for h in held) else internal
        content = self.content
        if index.content[token] and token not in content:
            content = (*content, token)
        end = int(facts.end_pos[token])
        stop = end != NO and len(self.stream) + end >= index.stop_min
        # A unit of one token is a loop for tokens without CJK (ok ok); for CJK tokens it is a
        # doubling (轻/轻) that 紧邻同字 lets stand once, and a repeated word of two or more
        # characters (较快较快) is a character tandem already.
        pure_cjk = bool(chars) and not facts.punct[token]
        loop = _char_tandem(stream, len(self.stream)) or _id_tandem(path, 2 if pure_cjk else 1)
        return AnswerState(stream, since, last, grams, internal, content, stop, loop, run, double)


def _char_tandem(stream: str, new_from: int) -> bool:
    """A tandem repeat `uu` (|u| >= 2 characters) ending at one of the characters from `new_from`:
    音色中音色中, 犹豫犹豫, 地方的地方的. Units of one character are 紧邻同字's business (and
    natural text has them across marks: 女声，声音)."""
    for e in range(max(new_from, 3), len(stream)):
        ch = stream[e]
        for u in range(2, (e + 1) // 2 + 1):
            if stream[e - u] == ch and stream[e - 2 * u + 1:e - u + 1] == stream[e - u + 1:e + 1]:
                return True
    return False


def _id_tandem(path: list[int], min_unit: int) -> bool:
    """A tandem repeat of token ids (unit >= min_unit tokens) ending at the last id: ABAB loops of
    tokens that hold no CJK character (Latin, digits), which the character rules cannot see."""
    e = len(path) - 1
    last = path[e] if path else None
    for u in range(min_unit, (e + 1) // 2 + 1):
        if path[e - u] == last and path[e - 2 * u + 1:e - u + 1] == path[e - u + 1:e + 1]:
            return True
    return False


class AnswerTracker:
    """States along the answer prefixes last asked about. Draft positions, their verification and
    HF `generate` all ask about a prefix of (or one token past) the previous path, so each state is
    computed once; a different branch truncates the path back to the common prefix."""

    def __init__(self, masks: VocabMasks, n: int = _DEFAULTS.no_repeat_ngram,
                 comma_min: int = _DEFAULTS.comma_min_chars, stop_min: int = _DEFAULTS.stop_min_chars) -> None:
        self.masks = masks
        self.facts = masks.facts
        self.index = masks.index(n, comma_min, stop_min)
        self.path: list[int] = []
        self.states: list[AnswerState] = [AnswerState()]

    def state(self, answer: Sequence[int]) -> AnswerState:
        """The state after `answer` (the answer's token ids, prompt excluded)."""
        path, n = self.path, len(answer)
        k = len(path)
        if n < k or list(answer[:k]) != path:
            k = 0
            for a, b in zip(path, answer, strict=False):
                if a != b:
                    break
                k += 1
            del path[k:]
            del self.states[k + 1:]
        for token in answer[k:]:
            path.append(int(token))
            self.states.append(self.states[-1].then(int(token), path, self.facts, self.index))
        return self.states[n]

    def loop_after(self, answer: Sequence[int], start: int) -> bool:
        """Whether a token of answer[start:] completes a tandem repeat (the loop gate, F10/F11)."""
        self.state(answer)
        return any(s.loop for s in self.states[start + 1:len(answer) + 1])


# -- the processors --------------------------------------------------------------------------------

def _np(row: torch.Tensor) -> np.ndarray | None:
    """A numpy view of a CPU row (numpy's fancy read/write on a 1-D CPU row is ~10x faster than
    torch's index ops), None on an accelerator."""
    return row.numpy() if row.device.type == "cpu" and not row.requires_grad else None


def ban_(row: torch.Tensor, ids: np.ndarray) -> None:
    """row[ids] = -inf, in place (ids below the row's width: callers filter)."""
    if not ids.size:
        return
    view = _np(row)
    if view is not None:
        view[ids] = -np.inf
    else:
        row.index_fill_(0, torch.from_numpy(ids).to(row.device), -float("inf"))


def _below(ids: np.ndarray, width: int, n_text: int) -> np.ndarray:
    """Token ids (all < n_text) that exist in a row of `width` (a model narrower than the tokenizer
    only in toy setups)."""
    return ids if width >= n_text else ids[ids < width]


class CharRule(LogitsProcessor):
    """Base of the rules: `banned(state, width)` gives the ids a rule bans after an answer prefix,
    `apply_` writes a row in place, `__call__` is the HF interface (rows of input_ids, scores)."""

    def __init__(self, prompt_len: int, masks: VocabMasks, tracker: AnswerTracker | None = None,
                 **params: int) -> None:
        self.prompt_len = prompt_len
        self.tracker = tracker if tracker is not None else AnswerTracker(masks, **params)

    def banned(self, state: AnswerState, width: int) -> np.ndarray:
        raise NotImplementedError

    def apply_(self, state: AnswerState, row: torch.Tensor) -> None:
        width = row.shape[-1]
        ban_(row, _below(self.banned(state, width), width, self.tracker.index.n_text))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        out = scores.clone()
        for b in range(input_ids.shape[0]):
            self.apply_(self.tracker.state(input_ids[b, self.prompt_len:].tolist()), out[b])
        return out


def _cached(state: AnswerState, key: str, make) -> np.ndarray:
    got = state.cache.get(key)
    if got is None:
        got = state.cache[key] = make()
    return got


class ContentRepetitionPenalty(CharRule):
    """HF `RepetitionPenaltyLogitsProcessor` semantics (positive logits divided, negative multiplied:
    F4) on the answer's CJK content tokens only (F9: never on punctuation). Written as HF's gather /
    where / scatter on the row in place, so it is bit-identical to HF's processor given the content
    history (a test checks) without HF's full-row pad and copy (~0.2 ms at 152k).

    On Qwen's tokens the history holds 音 once 音调 is written as 音/调, so 音量 and 音色 pay the
    penalty on their 音 (a logit of 12 becomes 10): a soft push, never a ban, which the cloud's or
    the edge's confidence in an attribute word outweighs; multi-character tokens (较快, 情绪) are
    penalised only when that very token repeats. Per-character penalties would have no HF
    counterpart to be checked against."""

    def __init__(self, penalty: float, prompt_len: int, masks: VocabMasks, tracker: AnswerTracker | None = None) -> None:
        super().__init__(prompt_len, masks, tracker)
        self.penalty = float(penalty)

    def history(self, state: AnswerState) -> tuple[int, ...]:
        return state.content

    def _ids(self, state: AnswerState) -> np.ndarray:
        """The penalised ids: the content history, less the one a doubling would repeat."""
        return _cached(state, "content", lambda: np.array([t for t in state.content if t != state.double], np.int64))

    def apply_np(self, state: AnswerState, view: np.ndarray) -> None:
        """The penalty on a numpy view of a CPU row. numpy's float32 ops with a Python scalar round
        exactly as torch's (checked bitwise against HF's processor in test_F4)."""
        if not state.content:
            return
        ids = _below(self._ids(state), view.shape[-1], self.tracker.index.n_text)
        score = view[ids]
        view[ids] = np.where(score < 0, score * self.penalty, score / self.penalty)

    def apply_(self, state: AnswerState, row: torch.Tensor) -> None:
        if not state.content or self.penalty == 1.0:
            return
        view = _np(row)
        if view is not None:
            self.apply_np(state, view)
        else:
            ids = _below(self._ids(state), row.shape[-1], self.tracker.index.n_text)
            index = torch.from_numpy(ids).to(row.device)
            score = row[index]
            row[index] = torch.where(score < 0, score * self.penalty, score / self.penalty)


class NeverEmit(CharRule):
    """Tokens no answer may hold, whatever came before: special and markup tokens other than the
    end-of-turn ids; partial UTF-8 tokens (U+FFFD: the rules are defined on characters, and a
    character split over tokens cannot be judged token by token; every character of a description
    is a whole token in Qwen's vocabulary); a sentence end with text after it (`。（`); tokens that
    break a rule inside themselves (`慢慢`, a 4-gram twice, two marks with < 4 characters between);
    rows past the tokenizer (Qwen2.5-Omni's 151,936 / 152,064 rows against 151,665 tokens)."""

    def __init__(self, prompt_len: int, masks: VocabMasks, eos_ids: Sequence[int],
                 tracker: AnswerTracker | None = None) -> None:
        super().__init__(prompt_len, masks, tracker)
        self.allowed = tuple(sorted(int(i) for i in eos_ids))

    def banned(self, state: AnswerState, width: int) -> np.ndarray:
        return self.tracker.index.static_for(width, self.allowed)


class PastTokenizerRows(CharRule):
    """Rows past the tokenizer (Qwen2.5-Omni's 151,936 / 152,064 rows against 151,665 tokens) are
    never real tokens: banned even when the constraints are off, because an id the edge's
    embedding does not have would crash its next step, and no text could decode it. With the
    constraints on, NeverEmit already bans them (this rule is then left out)."""

    def banned(self, state: AnswerState, width: int) -> np.ndarray:
        return np.arange(self.tracker.index.n_text, width, dtype=np.int64)


class ContentNoRepeatNGram(CharRule):
    """No n-gram of the CJK content character stream twice (F5 on characters: after `x y z`, every
    token starting with `w` is banned when `x y z w` occurred; punctuation is stripped, so
    `A，B，A，B` is caught as `ABAB`). A multi-character token is banned when any character it adds
    completes a repeated n-gram: one straddling the stream's end (`RuleIndex.starting_with`), one
    inside the token (`holding`), or one the token repeats itself (`triggers`)."""

    def __init__(self, n: int, prompt_len: int, masks: VocabMasks, tracker: AnswerTracker | None = None) -> None:
        super().__init__(prompt_len, masks, tracker, n=n)
        assert self.tracker.index.n == n, "the shared tracker indexes another n"

    def banned(self, state: AnswerState, width: int) -> np.ndarray:
        return _cached(state, "ngram", lambda: self._banned(state))

    def _banned(self, state: AnswerState) -> np.ndarray:
        index, s_ = self.tracker.index, state.stream
        n, length = index.n, len(state.stream)
        parts = [state.internal]
        for s in range(1, min(n - 1, length) + 1):
            tail = s_[-s:]
            trig = index.triggers.get(tail)
            if trig is not None:
                parts.append(trig)
            i = s_.find(tail)
            while i != -1 and i + n <= length:  # an earlier gram starting with the tail
                parts.append(index.starting_with(s_[i + s:i + n]))
                i = s_.find(tail, i + 1)
        parts = [p for p in parts if p.size]
        return np.concatenate(parts) if len(parts) > 1 else (parts[0] if parts else _EMPTY)


class NoImmediateRepeat(CharRule):
    """紧邻同字: no CJK character three times side by side. A character may double (慢慢, 断断续续,
    慢吞吞: reduplication), so after one 慢 the tokens starting with 慢慢 are banned, after 慢慢 every
    token starting with 慢 (at the seam; inside a token, NeverEmit). A mark between is fine: 女声，声音.
    Hand-written: HF has no rule about characters."""

    def banned(self, state: AnswerState, width: int) -> np.ndarray:
        if state.last == NO or not is_cjk(chr(state.last)):
            return _EMPTY
        if state.run >= 2:
            return self.tracker.index.first_char(state.last)
        return self.tracker.index.first_doubled(state.last)


class PunctuationGate(CharRule):
    """Against the punctuation flood (F8): a mark (，、：；… any punctuation but brackets, quotes and
    sentence ends) only once `comma_min_chars` CJK characters follow the last mark; a sentence end
    only once the answer holds `stop_min_chars` CJK characters (counting those before it in its own
    token). Characters, not tokens, so the rule means the same for 语速较快 as one token or four.
    Hand-written: no HF processor gates punctuation."""

    def __init__(self, prompt_len: int, masks: VocabMasks, comma_min_chars: int, stop_min_chars: int,
                 tracker: AnswerTracker | None = None) -> None:
        super().__init__(prompt_len, masks, tracker, comma_min=comma_min_chars, stop_min=stop_min_chars)
        index = self.tracker.index
        assert (index.comma_min, index.stop_min) == (comma_min_chars, stop_min_chars)

    def banned(self, state: AnswerState, width: int) -> np.ndarray:
        return _cached(state, "gate", lambda: self._banned(state))

    def _banned(self, state: AnswerState) -> np.ndarray:
        index = self.tracker.index
        parts = []
        if state.since_mark < index.comma_min:
            parts.append(index.comma_gate[state.since_mark])
        if len(state.stream) < index.stop_min:
            parts.append(index.end_gate[len(state.stream)])
        return np.concatenate(parts) if parts else _EMPTY


class SentenceEndCriteria(StoppingCriteria):
    """One sentence (F12): stop at a token holding 。！？ once the answer holds at least
    `min_chars` CJK characters before it. Characters, not tokens, so it means the same on every
    tokenizer; with the rules on, the punctuation gate makes every sentence end it allows a stop.
    Hand-written: HF's `StopStringCriteria` has no minimum length."""

    def __init__(self, prompt_len: int, masks: VocabMasks, min_chars: int, tracker: AnswerTracker | None = None) -> None:
        self.prompt_len = prompt_len
        self.tracker = tracker if tracker is not None else AnswerTracker(masks, stop_min=min_chars)
        assert self.tracker.index.stop_min == min_chars

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None = None, **kwargs) -> torch.BoolTensor:
        done = [self.tracker.state(row[self.prompt_len:].tolist()).stop for row in input_ids]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


# -- all rules of one clip -------------------------------------------------------------------------

_WARPERS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)


def warpers(cfg: DecodingConfig) -> list[LogitsProcessor]:
    """HF's sampling warpers for `cfg`, in the order `generate` applies them."""
    out: list[LogitsProcessor] = []
    if cfg.temperature != 1.0:
        out.append(TemperatureLogitsWarper(cfg.temperature))
    if cfg.top_k > 0:
        out.append(TopKLogitsWarper(cfg.top_k))
    if cfg.top_p < 1.0:
        out.append(TopPLogitsWarper(cfg.top_p))
    return out


@dataclass
class DecodingRules:
    """The processors and stopping criteria for one clip: what the edge may draft, what the cloud
    judges, and when to stop. The speculative loop and the baselines share one instance."""

    processors: LogitsProcessorList
    sentence_end: SentenceEndCriteria
    eos_ids: list[int]
    prompt_len: int
    max_new_tokens: int
    tracker: AnswerTracker

    @classmethod
    def build(cls, cfg: DecodingConfig, masks: VocabMasks, prompt_len: int, eos_ids: list[int]) -> DecodingRules:
        tracker = AnswerTracker(masks, cfg.no_repeat_ngram, cfg.comma_min_chars, cfg.stop_min_chars)
        procs = LogitsProcessorList()
        if cfg.constraints:
            procs.extend([
                ContentRepetitionPenalty(cfg.repetition_penalty, prompt_len, masks, tracker),
                NeverEmit(prompt_len, masks, eos_ids, tracker),
                ContentNoRepeatNGram(cfg.no_repeat_ngram, prompt_len, masks, tracker),
                NoImmediateRepeat(prompt_len, masks, tracker),
                PunctuationGate(prompt_len, masks, cfg.comma_min_chars, cfg.stop_min_chars, tracker),
            ])
        else:
            procs.append(PastTokenizerRows(prompt_len, masks, tracker))
        # HF's warpers after every rule, in generate's order: temperature once (F6), top-k, top-p.
        # Each is left out where it is the identity.
        procs.extend(warpers(cfg))
        end = SentenceEndCriteria(prompt_len, masks, cfg.stop_min_chars, tracker)
        return cls(procs, end, list(eos_ids), prompt_len, cfg.max_new_tokens, tracker)

    def __post_init__(self) -> None:
        # All three stop rules as HF objects. `generate` builds the first two itself from
        # max_new_tokens and eos_token_id, so the baselines pass it only `sentence_end`.
        self.stopping = StoppingCriteriaList([
            MaxLengthCriteria(self.prompt_len + self.max_new_tokens),
            EosTokenCriteria(self.eos_ids),
            self.sentence_end,
        ])
        self._eos = frozenset(self.eos_ids)
        procs = list(self.processors)
        rules = [p for p in procs if isinstance(p, CharRule)]
        # The fast path writes every ban of a row at once (one static and one per-prefix index
        # array): the same numbers as running the rules one by one, because a ban writes -inf and
        # the penalty maps -inf to -inf, so their order among themselves does not matter. HF's
        # own processors (temperature) must come after all of them, as build() puts them.
        self._fast = procs[:len(rules)] == rules
        self._penalty = next((p for p in rules if isinstance(p, ContentRepetitionPenalty)), None)
        self._never = next((p for p in rules if isinstance(p, NeverEmit)), None)
        self._dynamic = [p for p in rules if p is not self._penalty and p is not self._never]
        self._hf = procs[len(rules):]
        self._unwarped = [p for p in self._hf if not isinstance(p, _WARPERS)]

    @property
    def warps(self) -> bool:
        """Whether HF warpers (temperature, top-k, top-p) follow the rules."""
        return len(self._unwarped) != len(self._hf)

    def answer(self, ids: Sequence[int]) -> Sequence[int]:
        return ids[self.prompt_len:]

    def stops(self, ids: Sequence[int]) -> bool:
        """Whether generation ends with the last token of `ids` (prompt + answer): the three rules
        of `self.stopping`, read from the tracker instead of building tensors."""
        new = len(ids) - self.prompt_len
        if new >= self.max_new_tokens:
            return True
        return new > 0 and (ids[-1] in self._eos or self.tracker.state(ids[self.prompt_len:]).stop)

    def shows_loop(self, ids: Sequence[int], new_from: int) -> bool:
        """Whether a token of ids[new_from:] completes a tandem repeat of the answer's characters
        (unit >= 2) or token ids (unit >= 1): the loop gate, which sends the block to the cloud
        whatever the entropy (F10, F11)."""
        return self.tracker.loop_after(ids[self.prompt_len:], new_from - self.prompt_len)

    def _bans(self, state: AnswerState, width: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids banned after every prefix, ids banned after this one), each below `width`."""
        static = self._never.banned(state, width) if self._never is not None else _EMPTY

        def dynamic() -> np.ndarray:
            parts = [p.banned(state, width) for p in self._dynamic]
            parts = [p for p in parts if p.size]
            return np.concatenate(parts) if len(parts) > 1 else (parts[0] if parts else _EMPTY)

        return static, _below(_cached(state, f"bans{width}", dynamic), width, self.tracker.index.n_text)

    def banned(self, ids: Sequence[int], width: int) -> np.ndarray:
        """Every id the rules set to -inf after `ids` (ids may repeat)."""
        return np.concatenate(self._bans(self.tracker.state(ids[self.prompt_len:]), width))

    def banned_parts(self, ids: Sequence[int], width: int) -> tuple[np.ndarray, np.ndarray]:
        """`banned` as two arrays, not concatenated (the drafter's entropy reads them)."""
        return self._bans(self.tracker.state(ids[self.prompt_len:]), width)

    def changed_ids(self, ids: Sequence[int], width: int, warp: bool = True) -> np.ndarray | None:
        """Ids where the processed row after `ids` (without the warpers when not `warp`) may
        differ from the raw logits other than by a ban (-inf): the repetition penalty's history.
        None when another processor (temperature) rescales the whole row. The drafter's entropy
        reads it (drafter.pick)."""
        if not self._fast or (self._hf if warp else self._unwarped):
            return None
        if self._penalty is None or self._penalty.penalty == 1.0:
            return _EMPTY
        state = self.tracker.state(ids[self.prompt_len:])
        if not state.content:
            return _EMPTY
        return _below(self._penalty._ids(state), width, self.tracker.index.n_text)

    def _apply(self, ids: Sequence[int], row: torch.Tensor, warp: bool = True) -> torch.Tensor:
        state = self.tracker.state(ids[self.prompt_len:])
        if not self._fast:
            hf_only = self.processors if warp else [p for p in self.processors if not isinstance(p, _WARPERS)]
        else:
            view = _np(row)
            if view is None:  # an accelerator: the rules' own torch paths
                if self._penalty is not None:
                    self._penalty.apply_(state, row)
                for part in self._bans(state, row.shape[-1]):
                    ban_(row, part)
            else:  # the same writes on one numpy view of the CPU row (per-call overhead matters here)
                if self._penalty is not None and state.content and self._penalty.penalty != 1.0:
                    self._penalty.apply_np(state, view)
                for part in self._bans(state, row.shape[-1]):
                    if part.size:
                        view[part] = -np.inf
            hf_only = self._hf if warp else self._unwarped
        for processor in hf_only:
            if isinstance(processor, CharRule):
                processor.apply_(state, row)
            else:  # HF's own (temperature): its __call__, as `generate` runs it
                row = processor(torch.tensor([list(ids)]), row[None])[0]
        return row

    def process_ids(self, ids: Sequence[int], logits: torch.Tensor, warp: bool = True) -> torch.Tensor:
        """Processed scores (a new float32 tensor) for the position after `ids` (prompt + answer),
        logits (V,). Same objects, same order as `generate` runs them, so the same numbers.
        `warp=False`: the rules only, without HF's warpers (what the gate's entropy reads)."""
        return self._apply(ids, logits.to(torch.float32, copy=True), warp)

    def warp(self, ids: Sequence[int], scores: torch.Tensor) -> torch.Tensor:
        """HF's warpers alone on scores the rules already processed (`process_ids(..., warp=False)`):
        together, the same numbers as `process_ids(ids, logits)`."""
        for processor in self._hf:
            if isinstance(processor, _WARPERS):
                scores = processor(torch.tensor([list(ids)]), scores[None])[0]
        return scores

    def process(self, ids: torch.LongTensor, logits: torch.Tensor) -> torch.Tensor:
        """As `process_ids`, history as a (1, L) tensor."""
        return self.process_ids(ids[0].tolist(), logits)

    def process_block(self, sequence: Sequence[int], draft: Sequence[int], rows: torch.Tensor) -> torch.Tensor:
        """Processed scores for a verification block in one call: rows [n, V], row j predicting
        the token after sequence + draft[:j] (n = len(draft) + 1, the last the bonus position)."""
        out = rows.to(torch.float32, copy=True)
        seq = list(sequence)
        for j in range(out.shape[0]):
            row = out[j]
            done = self._apply(seq + list(draft[:j]), row)
            if done is not row:  # an HF processor (temperature) returned a new tensor
                row.copy_(done)
        return out
