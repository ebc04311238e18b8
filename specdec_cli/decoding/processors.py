"""Logits processors, stopping criteria and the vocabulary masks they use.

Every rule here is a transformers `LogitsProcessor` / `StoppingCriteria`, so the speculative loop
and the HF `generate` baselines run literally the same objects (seed failure F13). Processors are
pure functions of (input_ids, scores): they see the whole history they are given (F10), and the
loop gives them prompt + answer so far + the draft prefix for every position it scores.

Where HF has the processor we use it (`RepetitionPenaltyLogitsProcessor`,
`NoRepeatNGramLogitsProcessor`, `TemperatureLogitsWarper`, `EosTokenCriteria`,
`MaxLengthCriteria`) and only choose *which history* it sees: the answer's CJK content tokens,
not the prompt (the instruction text would otherwise ban the answer's own words) and not the
punctuation (F9: penalising marks fights the punctuation gate). The punctuation gate, the
immediate-repeat ban and the one-sentence stop have no HF equivalent and are written here.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field, fields

import torch
from transformers import (
    EosTokenCriteria,
    LogitsProcessor,
    LogitsProcessorList,
    MaxLengthCriteria,
    NoRepeatNGramLogitsProcessor,
    PreTrainedTokenizerBase,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
)

from .config import DecodingConfig

COMMA_LIKE = set("，、：；,:;")
SENTENCE_END = set("。！？")


def _is_cjk(ch: str) -> bool:
    return "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf" or "\uf900" <= ch <= "\ufaff"


def _is_punct(ch: str) -> bool:
    return unicodedata.category(ch).startswith("P")


@dataclass(frozen=True)
class VocabMasks:
    """Per-token facts, computed once per tokenizer by decoding each id once (never in the loop).

    content:      the token's text has a CJK character and no punctuation
    cjk_chars:    how many CJK characters its text holds
    punct:        its text holds punctuation
    comma_like:   it holds a comma-like mark (，、：；,:;)
    sentence_end: it holds 。！？
    """

    content: torch.Tensor
    cjk_chars: torch.Tensor
    punct: torch.Tensor
    comma_like: torch.Tensor
    sentence_end: torch.Tensor
    _copies: dict = field(default_factory=dict, compare=False, repr=False)

    def on(self, device: torch.device) -> VocabMasks:
        """These masks on `device` (the baselines run processors on the model's device), copied
        once per device."""
        if self.content.device == torch.device(device):
            return self
        key = str(device)
        if key not in self._copies:
            self._copies[key] = VocabMasks(*(getattr(self, f.name).to(device) for f in fields(self)
                                             if not f.name.startswith("_")))
        return self._copies[key]

    @classmethod
    def from_texts(cls, texts: list[str], vocab_size: int) -> VocabMasks:
        n = max(vocab_size, len(texts))
        content = torch.zeros(n, dtype=torch.bool)
        cjk = torch.zeros(n, dtype=torch.long)
        punct = torch.zeros(n, dtype=torch.bool)
        comma = torch.zeros(n, dtype=torch.bool)
        end = torch.zeros(n, dtype=torch.bool)
        for i, text in enumerate(texts):
            n_cjk = sum(_is_cjk(c) for c in text)
            has_punct = any(_is_punct(c) for c in text)
            cjk[i] = n_cjk
            punct[i] = has_punct
            content[i] = n_cjk > 0 and not has_punct
            comma[i] = any(c in COMMA_LIKE for c in text)
            end[i] = any(c in SENTENCE_END for c in text)
        return cls(content, cjk, punct, comma, end)

    @classmethod
    def for_tokenizer(cls, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> VocabMasks:
        """Masks sized to the model's vocabulary (which may exceed the tokenizer's), cached."""
        key = (id(tokenizer), len(tokenizer), vocab_size)
        if key not in _MASK_CACHE:
            texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=True)
            _MASK_CACHE[key] = cls.from_texts(texts, vocab_size)
        return _MASK_CACHE[key]


_MASK_CACHE: dict[tuple, VocabMasks] = {}


class _AnswerProcessor(LogitsProcessor):
    """Base for processors that look only at the answer: input_ids[:, prompt_len:]."""

    def __init__(self, prompt_len: int, masks: VocabMasks) -> None:
        self.prompt_len = prompt_len
        self.masks = masks

    def content_history(self, row: torch.Tensor) -> torch.Tensor:
        """The answer's CJK content tokens (punctuation stripped), shape (1, n)."""
        answer = row[self.prompt_len:]
        return answer[self.masks.on(row.device).content[answer]][None]


class ContentRepetitionPenalty(_AnswerProcessor):
    """HF `RepetitionPenaltyLogitsProcessor` (positive logits divided, negative multiplied: F4),
    applied to the answer's CJK content tokens only (F9)."""

    def __init__(self, penalty: float, prompt_len: int, masks: VocabMasks) -> None:
        super().__init__(prompt_len, masks)
        self.hf = RepetitionPenaltyLogitsProcessor(float(penalty))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows = [self.hf(self.content_history(ids), s[None]) for ids, s in zip(input_ids, scores, strict=True)]
        return torch.cat(rows)


class ContentNoRepeatNGram(_AnswerProcessor):
    """HF `NoRepeatNGramLogitsProcessor` (after `x`, ban every `y` such that `x y` occurred: F5)
    over the punctuation-stripped content history, so `A，B，A，B` is caught as `A B A B`."""

    def __init__(self, n: int, prompt_len: int, masks: VocabMasks) -> None:
        super().__init__(prompt_len, masks)
        self.hf = NoRepeatNGramLogitsProcessor(n)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows = [self.hf(self.content_history(ids), s[None].clone()) for ids, s in zip(input_ids, scores, strict=True)]
        return torch.cat(rows)


class NoImmediateRepeat(_AnswerProcessor):
    """Ban repeating the previous token when it is CJK content (`真想真想`, `音色音色`).
    Hand-written: HF has no processor for an immediate repeat restricted to some tokens."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.clone()
        for b, ids in enumerate(input_ids):
            if ids.shape[0] > self.prompt_len:
                last = int(ids[-1])
                if self.masks.on(ids.device).content[last]:
                    scores[b, last] = -float("inf")
        return scores


class PunctuationGate(_AnswerProcessor):
    """Against the punctuation flood (F8). Comma-like marks are banned until `comma_min_chars` CJK
    characters follow the last mark; a sentence end is discouraged (`stop_bias` subtracted) until
    the answer holds `stop_min_chars` CJK characters. Counts are characters, not tokens, so the
    rule means the same for a one-character vocabulary and for Qwen's multi-character tokens.
    Hand-written: no HF processor gates punctuation."""

    def __init__(self, prompt_len: int, masks: VocabMasks, comma_min_chars: int, stop_min_chars: int,
                 stop_bias: float) -> None:
        super().__init__(prompt_len, masks)
        self.comma_min_chars = comma_min_chars
        self.stop_min_chars = stop_min_chars
        self.stop_bias = stop_bias

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.clone()
        v = scores.shape[-1]
        masks = self.masks.on(scores.device)
        for b, ids in enumerate(input_ids):
            answer = ids[self.prompt_len:]
            chars = masks.cjk_chars[answer]
            marks = torch.nonzero(masks.punct[answer]).flatten()
            since_mark = int(chars[int(marks[-1]) + 1:].sum()) if marks.numel() else int(chars.sum())
            if since_mark < self.comma_min_chars:
                scores[b, masks.comma_like[:v]] = -float("inf")
            if int(chars.sum()) < self.stop_min_chars:
                scores[b, masks.sentence_end[:v]] -= self.stop_bias
        return scores


class SentenceEndCriteria(StoppingCriteria):
    """One sentence (F12): stop at a token holding 。！？ once at least `min_new_tokens` are out.
    Hand-written: HF's `StopStringCriteria` has no minimum length."""

    def __init__(self, prompt_len: int, masks: VocabMasks, min_new_tokens: int) -> None:
        self.prompt_len = prompt_len
        self.masks = masks
        self.min_new_tokens = min_new_tokens

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None = None, **kwargs) -> torch.BoolTensor:
        new = input_ids.shape[1] - self.prompt_len
        last = input_ids[:, -1]
        return self.masks.on(last.device).sentence_end[last] & (new >= self.min_new_tokens)


@dataclass
class DecodingRules:
    """The processors and stopping criteria for one clip: what the edge may draft, what the cloud
    judges, and when to stop. The speculative loop and the baselines share one instance."""

    processors: LogitsProcessorList
    sentence_end: SentenceEndCriteria
    eos_ids: list[int]
    prompt_len: int
    max_new_tokens: int

    @classmethod
    def build(cls, cfg: DecodingConfig, masks: VocabMasks, prompt_len: int, eos_ids: list[int]) -> DecodingRules:
        procs = LogitsProcessorList()
        if cfg.constraints:
            procs.extend([
                ContentRepetitionPenalty(cfg.repetition_penalty, prompt_len, masks),
                ContentNoRepeatNGram(cfg.no_repeat_ngram, prompt_len, masks),
                NoImmediateRepeat(prompt_len, masks),
                PunctuationGate(prompt_len, masks, cfg.comma_min_chars, cfg.stop_min_chars, cfg.stop_bias),
            ])
        # Temperature once, last (F6). With temperature 1 it is the identity and is left out.
        if cfg.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(cfg.temperature))
        return cls(procs, SentenceEndCriteria(prompt_len, masks, cfg.min_new_tokens), list(eos_ids), prompt_len,
                   cfg.max_new_tokens)

    def __post_init__(self) -> None:
        # All three stop rules as HF objects. `generate` builds the first two itself from
        # max_new_tokens and eos_token_id, so the baselines pass it only `sentence_end`.
        self.stopping = StoppingCriteriaList([
            MaxLengthCriteria(self.prompt_len + self.max_new_tokens),
            EosTokenCriteria(self.eos_ids),
            self.sentence_end,
        ])

    def stops(self, ids: list[int]) -> bool:
        """Whether generation ends with the last token of `ids` (prompt + answer)."""
        return bool(self.stopping(torch.tensor([ids]), None)[0])

    def process(self, ids: torch.LongTensor, logits: torch.Tensor) -> torch.Tensor:
        """Processed scores for one position: ids (1, L) is the full history, logits (V,)."""
        scores = logits[None].float()
        # Called directly rather than through LogitsProcessorList.__call__, which inspects every
        # processor's signature on every call (~40% of the loop's Python time); same order, same
        # objects, so the result is identical to what `generate` computes.
        for processor in self.processors:
            scores = processor(ids, scores)
        return scores[0]
