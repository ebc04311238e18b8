"""A bigram "table" language model with a real DynamicCache: its next-token logits are a fixed
row per previous token. It lets a test script exactly what the edge and the cloud believe
(confident loops, disagreements, sentence ends) without training anything."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn


class TableLM(nn.Module):
    def __init__(self, vocab_size: int, default: int = 0, confidence: float = 12.0) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.table = torch.zeros(vocab_size, vocab_size)
        self.table[:, default] = confidence
        self.confidence = confidence
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the module a device

    def set(self, prev: int, nxt: int, confidence: float | None = None) -> TableLM:
        """After `prev`, predict `nxt` (with a logit margin of `confidence`)."""
        self.table[prev] = 0.0
        self.table[prev, nxt] = self.confidence if confidence is None else confidence
        return self

    @property
    def device(self) -> torch.device:
        return self.anchor.device

    def forward(self, input_ids: torch.Tensor, past_key_values=None, **kwargs) -> SimpleNamespace:
        b, n = input_ids.shape
        if past_key_values is not None:
            kv = torch.zeros(b, 1, n, 1)
            past_key_values.update(kv, kv, 0)
        return SimpleNamespace(logits=self.table[input_ids].clone())
