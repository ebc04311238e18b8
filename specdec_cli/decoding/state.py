"""ModelState: one model's view of one clip.

It owns the three things that must move together — the tokens the KV cache holds, the cache, and
the M-RoPE offset (`rope_deltas`) computed at prefill — so they cannot drift apart:

* `prefill(inputs)`  — the multimodal prompt, once per clip;
* `advance(tokens)`  — the only way tokens enter the cache (F3: nothing else advances it);
* `rollback(length)` — the only way back, via `DynamicCache.crop` (F1).

There is no "last token" variable (F2): what a model must consume next is always derived from the
accepted sequence (`pending(sequence)`), so the next input is by construction the tokens after
the ones the cache holds. After every call, cache length == tokens held is asserted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel


class ModelState:
    def __init__(self, model: PreTrainedModel, name: str = "model") -> None:
        self.model = model
        self.name = name
        self.ids: list[int] = []
        self.cache: DynamicCache | None = None
        self.rope_deltas: torch.Tensor | None = None
        self.last_logits: torch.Tensor | None = None  # (V,) prediction after ids[-1]; None after a crop
        self.forwards = 0      # forward passes after prefill
        self.tokens_fed = 0    # tokens fed after prefill
        # Qwen2.5-Omni thinkers use 3-D M-RoPE positions; plain causal LMs take 1-D positions.
        self._mrope = hasattr(getattr(model, "model", None), "get_rope_index")

    def __len__(self) -> int:
        return len(self.ids)

    # -- the three ways the state changes ------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Run the whole prompt (text + audio features) through the model; return (V,) logits
        predicting the first answer token. Resets every per-clip field, rope_deltas included:
        the thinker keeps its own copy on the module, which a previous clip or a batched
        `generate` leaves stale (field notes), so we compute ours and never read theirs."""
        input_ids = inputs["input_ids"]
        assert input_ids.shape[0] == 1, "one clip at a time"  # input_ids: [1, P]
        self.cache = DynamicCache()
        self.forwards = self.tokens_fed = 0
        kwargs = dict(inputs)
        if self._mrope:
            fmask = inputs.get("feature_attention_mask")
            positions, deltas = self.model.model.get_rope_index(
                input_ids, None, None, inputs.get("attention_mask"), False,
                fmask.sum(-1) if fmask is not None else None, None,
            )
            self.rope_deltas = deltas  # [1, 1]; 0 for audio-only prompts, kept general anyway
            kwargs["position_ids"] = positions  # [3, 1, P]
        out = self.model(**kwargs, past_key_values=self.cache, use_cache=True)
        self.ids = input_ids[0].tolist()
        # Token-level logic (processors, entropies, acceptance, the sampler's generator) runs on the
        # CPU: only the rows we read cross from the accelerator, never the whole prompt's logits.
        self.last_logits = out.logits[0, -1].float().cpu()
        self._check()
        return self.last_logits

    @torch.inference_mode()
    def advance(self, tokens: Sequence[int]) -> torch.Tensor:
        """Feed `tokens` after the ones held; return (n, V) logits, row i predicting the token
        after tokens[i]. No attention mask is passed (a 1x1 mask misplaces positions: F7); the
        positions are given explicitly, offset by this clip's rope_deltas."""
        n = len(tokens)
        assert n > 0 and self.cache is not None, "advance needs a prefilled state and tokens"
        past = len(self.ids)
        input_ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.model.device)  # [1, n]
        out = self.model(input_ids=input_ids, position_ids=self._positions(past, n),
                         past_key_values=self.cache, use_cache=True)
        self.ids.extend(int(t) for t in tokens)
        self.forwards += 1
        self.tokens_fed += n
        logits = out.logits[0].float().cpu()  # [n, V]
        self.last_logits = logits[-1]
        self._check()
        return logits

    def rollback(self, length: int) -> None:
        """Cut the cache and the tokens back to the first `length` tokens."""
        remove = len(self.ids) - length
        assert 0 <= remove, f"{self.name}: cannot roll forward from {len(self.ids)} to {length}"
        if remove:
            self.cache.crop(-remove)  # transformers 5.x: a negative count of tokens to drop
            del self.ids[length:]
            self.last_logits = None   # the logits at the new end were not kept
        self._check()

    # -- derived views --------------------------------------------------------------------------

    def pending(self, sequence: Sequence[int]) -> list[int]:
        """Tokens of `sequence` this model has not consumed yet. The held tokens must be a prefix
        of `sequence`: anything else means a rollback was missed."""
        n = len(self.ids)
        assert len(sequence) >= n and list(sequence[:n]) == self.ids, (
            f"{self.name}: cache holds tokens that are not a prefix of the accepted sequence"
        )
        return list(sequence[n:])

    def logits_after(self, sequence: Sequence[int]) -> torch.Tensor:
        """(V,) logits predicting the token after `sequence`, catching up on pending tokens first
        (one forward for all of them)."""
        pending = self.pending(sequence)
        if pending:
            return self.advance(pending)[-1]
        assert self.last_logits is not None, f"{self.name}: no logits after a rollback without new tokens"
        return self.last_logits

    def _positions(self, past: int, n: int) -> torch.Tensor:
        pos = torch.arange(past, past + n, device=self.model.device)
        if self._mrope:
            pos = pos + self.rope_deltas.to(pos.device).view(-1)[0]
            return pos.view(1, 1, n).expand(3, 1, n)  # [3, 1, n]: temporal, height, width
        return pos.view(1, n)

    def _check(self) -> None:
        held = self.cache.get_seq_length() if self.cache is not None else 0
        assert held == len(self.ids), f"{self.name}: cache holds {held} positions but {len(self.ids)} tokens"
