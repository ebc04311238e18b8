"""ModelState: one model's view of one clip.

It owns the three things that must move together — the tokens the KV cache holds, the cache, and
the M-RoPE offset (`rope_deltas`) computed when the prompt runs — so they cannot drift apart:

* `start(inputs)`    — a new clip: remember its multimodal prompt, run nothing yet;
* `advance(tokens)`  — the only way tokens enter the cache (F3: nothing else advances it). On a
  state that holds nothing, the tokens start with the prompt and the first forward carries the
  audio features too: that is the prefill, eager or lazy alike;
* `rollback(length)` — the only way back, via `DynamicCache.crop` (F1).

`prefill(inputs)` is `start` + `advance(prompt)`: the eager form. A lazily started state (the
cloud, until the edge first asks) runs nothing at all until a caller needs its logits; then the
prompt, the answer accepted so far and the draft go through in one forward.

There is no "last token" variable (F2): what a model must consume next is always derived from the
accepted sequence (`pending(sequence)`), so the next input is by construction the tokens after
the ones the cache holds. After every call, cache length == tokens held is asserted.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel


@contextlib.contextmanager
def logits_for_last(model: torch.nn.Module, keep: int) -> Iterator[dict]:
    """Make the model's next forwards compute logits for their last `keep` positions only.

    Yields extra forward kwargs. Where the model's forward takes `logits_to_keep` (Qwen2 and most
    causal LMs in transformers 5.x) that is all it takes. The Qwen2.5-Omni thinker's forward in
    5.23 does not (it applies `lm_head` to every position: a 30 s clip's prefill at a 152k
    vocabulary is ~0.5 GB of logits of which one row is read), so there a forward pre-hook on the
    output embedding hands `lm_head` only the last `keep` hidden states; for a single-token step
    that is a no-op, so it is also safe around HF `generate`. Models with neither are left alone
    (the caller slices)."""
    if _takes_logits_to_keep(type(model)):
        yield {"logits_to_keep": keep}
        return
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is None:
        yield {}
        return
    handle = head.register_forward_pre_hook(lambda _m, args: (args[0][:, -keep:], *args[1:]))
    try:
        yield {}
    finally:
        handle.remove()


@functools.cache
def _takes_logits_to_keep(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


@dataclass
class Lent:
    """A sequence's cache and bookkeeping while a batch runs it (ModelState.lend / take_back)."""

    cache: DynamicCache          # [1, heads, len(ids), head_dim] per layer
    ids: list[int]
    delta: int                   # int(rope_deltas)
    last_logits: torch.Tensor | None
    prefill_tokens: int
    forwards: int
    tokens_fed: int
    all_forwards: int


class ModelState:
    def __init__(self, model: PreTrainedModel, name: str = "model") -> None:
        self.model = model
        self.name = name
        self.ids: list[int] = []
        self.cache: DynamicCache | None = None
        self.rope_deltas: torch.Tensor | None = None
        self._delta = 0  # int(rope_deltas): read once per clip, not per step (a device sync on GPU)
        # PreTrainedModel.device walks the parameters on every read: read once (the model does
        # not move during a clip).
        self.device = model.device
        self.last_logits: torch.Tensor | None = None  # (V,) prediction after ids[-1]; None after a crop
        self.prompt: dict[str, torch.Tensor] | None = None  # this clip's thinker inputs (start())
        self.prompt_ids: list[int] = []
        # Work counters, per clip. "After the prompt" is what the record calls after prefill.
        self.prefill_tokens = 0  # prompt tokens run (0 while the prompt has not run)
        self.forwards = 0        # forwards that fed tokens after the prompt
        self.tokens_fed = 0      # tokens fed after the prompt
        self.all_forwards = 0    # every forward, the prefill included
        # Qwen2.5-Omni thinkers use 3-D M-RoPE positions; plain causal LMs take 1-D positions.
        self._mrope = hasattr(getattr(model, "model", None), "get_rope_index")
        cfg = getattr(model, "config", None)
        # Token ids the thinker replaces by audio/image/video features wherever they occur in
        # input_ids; they cannot ride in the prompt's forward as ordinary answer tokens.
        self._placeholders = {getattr(cfg, a) for a in ("audio_token_id", "image_token_id", "video_token_id")
                              if isinstance(getattr(cfg, a, None), int)}

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def started(self) -> bool:
        """Whether the prompt has run (the cache holds something)."""
        return self.cache is not None

    # -- the ways the state changes -------------------------------------------------------------

    def start(self, inputs: Mapping[str, torch.Tensor]) -> None:
        """Begin a clip: keep its inputs, reset every per-clip field, run nothing. rope_deltas is
        reset too: the thinker keeps its own copy on the module, which a previous clip or a batched
        `generate` leaves stale (field notes), so we compute ours at the prefill and never read
        theirs."""
        input_ids = inputs["input_ids"]
        assert input_ids.shape[0] == 1, "one clip at a time"  # input_ids: [1, P]
        self.device = self.model.device
        # The prompt on this model's device: with the two models on two devices, the one place a
        # tensor crosses between them (once per clip; a no-op where it already lives). Everything
        # after it is token ids, built on this device, and logits rows, read on the CPU.
        self.prompt = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        self.prompt_ids = input_ids[0].tolist()
        self.ids, self.cache, self.rope_deltas, self.last_logits = [], None, None, None
        self._delta = 0
        self.prefill_tokens = self.forwards = self.tokens_fed = self.all_forwards = 0

    def prefill(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Eager prefill: start the clip and run its prompt now; (V,) logits predicting the first
        answer token (the only row computed)."""
        self.start(inputs)
        return self.advance(self.prompt_ids, keep=1)[-1]

    @torch.inference_mode()
    def advance(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        """Feed `tokens` after the ones held; return logits for the last `keep` of them (all when
        None), row i predicting the token after its token. Before the prompt has run, `tokens`
        must start with the prompt: prompt and the rest go in one forward with the audio.
        Incremental steps pass no attention mask (a 1x1 mask misplaces positions: F7); their
        positions are given explicitly, offset by this clip's rope_deltas."""
        tokens = [int(t) for t in tokens]
        n = len(tokens)
        assert n > 0, "advance needs tokens"
        keep = n if keep is None else keep
        assert 0 < keep <= n, f"{self.name}: cannot keep {keep} of {n} rows"
        if not self.started:
            return self._first_forward(tokens, keep)
        past = len(self.ids)
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self.device)  # [1, n]
        logits = self._forward(dict(input_ids=input_ids, position_ids=self._positions(past, n)), keep, n)
        self.ids.extend(tokens)
        self._count(after_prompt=n)
        return logits

    def rollback(self, length: int) -> None:
        """Cut the cache and the tokens back to the first `length` tokens (never into the prompt)."""
        remove = len(self.ids) - length
        assert 0 <= remove, f"{self.name}: cannot roll forward from {len(self.ids)} to {length}"
        assert not remove or length >= len(self.prompt_ids), f"{self.name}: cannot cut into the prompt"
        if remove:
            self.cache.crop(-remove)  # transformers 5.x: a negative count of tokens to drop
            del self.ids[length:]
            self.last_logits = None   # the logits at the new end were not kept
        self._check()

    def lend(self) -> Lent:
        """Move what this state owns for its sequence — cache, tokens, rope offset, kept logits,
        counters — out to a batch that runs it as one of its rows (`BatchState.adopt`; a server
        batching its sessions' verifications). Until `take_back` this state holds nothing, so the
        cache has one owner at a time. Only a state whose prompt has run can lend."""
        assert self.started, f"{self.name}: nothing to lend before the prompt has run"
        self._check()
        lent = Lent(self.cache, self.ids, self._delta, self.last_logits, self.prefill_tokens, self.forwards,
                    self.tokens_fed, self.all_forwards)
        self.ids, self.cache, self.rope_deltas, self.last_logits = [], None, None, None
        return lent

    def take_back(self, lent: Lent) -> None:
        """Own the sequence again after a batch gave it back (`BatchState.release`), or for the
        first time when its prompt ran in the batch (the lazy prefill of a row that joined)."""
        assert not self.started, f"{self.name}: holds a cache already"
        assert lent.ids[:len(self.prompt_ids)] == self.prompt_ids, f"{self.name}: not this clip's sequence"
        self.cache, self.ids, self._delta, self.last_logits = lent.cache, list(lent.ids), lent.delta, lent.last_logits
        self.rope_deltas = torch.tensor([[lent.delta]], device=self.device) if self._mrope else None
        self.prefill_tokens, self.forwards = lent.prefill_tokens, lent.forwards
        self.tokens_fed, self.all_forwards = lent.tokens_fed, lent.all_forwards
        self._check()

    # -- derived views --------------------------------------------------------------------------

    def pending(self, sequence: Sequence[int]) -> list[int]:
        """Tokens of `sequence` this model has not consumed yet (all of it, prompt included,
        before the prompt has run). The held tokens must be a prefix of `sequence`: anything else
        means a rollback was missed."""
        n = len(self.ids)
        assert len(sequence) >= n and list(sequence[:n]) == self.ids, (
            f"{self.name}: cache holds tokens that are not a prefix of the accepted sequence"
        )
        return list(sequence[n:])

    def logits_after(self, sequence: Sequence[int]) -> torch.Tensor:
        """(V,) logits predicting the token after `sequence`, catching up on pending tokens first
        (one forward for all of them, one logits row computed)."""
        pending = self.pending(sequence)
        if pending:
            return self.advance(pending, keep=1)[-1]
        assert self.last_logits is not None, f"{self.name}: no logits after a rollback without new tokens"
        return self.last_logits

    # -- internals ------------------------------------------------------------------------------

    def _first_forward(self, tokens: list[int], keep: int) -> torch.Tensor:
        """The prefill: the prompt (with its audio features) plus any tokens after it, in one
        forward. M-RoPE positions come from `get_rope_index` over the whole run, so the tokens
        after the prompt get exactly the positions incremental steps would give them (text after
        the last multimodal span continues at max position + 1; rope_deltas is the same)."""
        assert self.prompt is not None, f"{self.name}: start(inputs) first"
        p = len(self.prompt_ids)
        assert tokens[:p] == self.prompt_ids, f"{self.name}: the first forward must start with the prompt"
        extra = tokens[p:]
        if self._placeholders.intersection(extra):
            # An answer token equal to a placeholder id (only possible with the rules off) would be
            # taken for audio in the prompt's forward: run the prompt alone, then the rest.
            head = self._first_forward(self.prompt_ids, max(1, keep - len(extra)))
            tail = self.advance(extra, keep=min(keep, len(extra)))
            return torch.cat([head, tail])[-keep:]
        kwargs = dict(self.prompt)
        input_ids = self.prompt["input_ids"]
        if extra:
            input_ids = torch.tensor([tokens], dtype=torch.long, device=input_ids.device)  # [1, P + n]
            kwargs["input_ids"] = input_ids
            if "attention_mask" in kwargs:
                kwargs["attention_mask"] = torch.ones_like(input_ids)
        self.cache = DynamicCache()
        if self._mrope:
            fmask = kwargs.get("feature_attention_mask")
            positions, deltas = self.model.model.get_rope_index(
                input_ids, None, None, kwargs.get("attention_mask"), False,
                fmask.sum(-1) if fmask is not None else None, None,
            )
            self.rope_deltas = deltas  # [1, 1]; 0 for audio-only prompts, kept general anyway
            self._delta = int(deltas.view(-1)[0])
            kwargs["position_ids"] = positions  # [3, 1, P + n]
        logits = self._forward(kwargs, keep, len(tokens))
        self.ids = list(tokens)
        self.prefill_tokens = p
        self._count(after_prompt=len(extra))
        return logits

    def _forward(self, kwargs: dict, keep: int, n: int) -> torch.Tensor:
        """One forward of `n` positions on the cache; [keep, V] float logits on the CPU (token-level
        logic runs there: only the rows we read cross from the accelerator)."""
        with logits_for_last(self.model, keep) if keep < n else contextlib.nullcontext({}) as extra:
            out = self.model(**kwargs, **extra, past_key_values=self.cache, use_cache=True)
        logits = out.logits[0, -keep:].float().cpu()
        self.last_logits = logits[-1]
        return logits

    def _count(self, after_prompt: int) -> None:
        self.all_forwards += 1
        if after_prompt:
            self.forwards += 1
            self.tokens_fed += after_prompt
        self._check()

    def _positions(self, past: int, n: int) -> torch.Tensor:
        if self._mrope:
            pos = torch.arange(past + self._delta, past + self._delta + n, device=self.device)
            return pos.view(1, 1, n).expand(3, 1, n)  # [3, 1, n]: temporal, height, width
        return torch.arange(past, past + n, device=self.device).view(1, n)

    def _check(self) -> None:
        held = self.cache.get_seq_length() if self.cache is not None else 0
        assert held == len(self.ids), f"{self.name}: cache holds {held} positions but {len(self.ids)} tokens"
