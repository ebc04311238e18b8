"""Audio + text processor: the checkpoint's tokenizer and its Whisper feature extractor.

`Qwen2_5OmniProcessor` would do this, but it insists on image and video processors, which need
torchvision (no wheel matches torch 2.13.0+cpu), and `AutoProcessor` silently returns just the
tokenizer for an audio-only folder (field notes). So we assemble the two pieces we need from the
same folder ourselves. It accepts real Qwen2.5-Omni checkpoints and the bundled demo pair alike.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoFeatureExtractor, AutoTokenizer, BatchFeature, PreTrainedTokenizerBase

from .prompt import AUDIO, render_prompt


def audio_token_count(n_frames: int) -> int:
    """Placeholders the Qwen2.5-Omni audio encoder emits for `n_frames` mel frames: two stride-2
    stages (the conv, then the pooling). Same formula as `_get_feat_extract_output_lengths`."""
    return ((n_frames - 1) // 2 + 1 - 2) // 2 + 1


class AudioTextProcessor:
    """Turns (prompt text with one `<|AUDIO|>`, waveform) into thinker inputs."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, feature_extractor) -> None:
        self.tokenizer = tokenizer
        self.feature_extractor = feature_extractor
        self.audio_token = getattr(tokenizer, "audio_token", None) or AUDIO

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs) -> AudioTextProcessor:
        return cls(
            AutoTokenizer.from_pretrained(str(path), **kwargs),
            AutoFeatureExtractor.from_pretrained(str(path), **kwargs),
        )

    def save_pretrained(self, path: str | Path) -> None:
        self.tokenizer.save_pretrained(str(path))
        self.feature_extractor.save_pretrained(str(path))

    @property
    def sampling_rate(self) -> int:
        return int(self.feature_extractor.sampling_rate)

    @property
    def max_seconds(self) -> float:
        """Longest clip one prefill takes: the feature extractor's window (30 s for Whisper)."""
        return float(self.feature_extractor.n_samples) / self.sampling_rate

    def features(self, audio: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-mel features over the clip's own length (not padded to 30 s: that is ~10x slower
        and the thinker only attends to the valid frames anyway). Returns (1, mels, T), (1, T)."""
        out = self.feature_extractor(
            audio,
            sampling_rate=self.sampling_rate,
            padding="longest",
            truncation=False,
            return_attention_mask=True,
            return_tensors="pt",
        )
        return out["input_features"], out["attention_mask"].long()

    def __call__(self, audio: np.ndarray, prompt: str | None = None) -> BatchFeature:
        """Thinker inputs for one clip: input_ids, attention_mask, input_features,
        feature_attention_mask. The single `<|AUDIO|>` in the prompt becomes one placeholder per
        encoder output frame."""
        prompt = render_prompt() if prompt is None else prompt
        if prompt.count(self.audio_token) != 1:
            raise ValueError(f"the prompt must hold exactly one {self.audio_token}")
        input_features, feature_mask = self.features(audio)
        n_audio = audio_token_count(int(feature_mask.sum()))
        text = prompt.replace(self.audio_token, self.audio_token * n_audio)
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        return BatchFeature(
            {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "input_features": input_features,
                "feature_attention_mask": feature_mask,
            }
        )

    def text_inputs(self, prompt: str) -> BatchFeature:
        """Inputs for a text-only prompt (plain causal LMs)."""
        ids = self.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        return BatchFeature({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
