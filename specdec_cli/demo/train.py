"""Train one model of the v2 demo pair on the v2 corpus, CPU only, resumably.

    python -m specdec_cli.demo.train cloud            # start, or resume from demo-train/cloud/state.pt
    python -m specdec_cli.demo.train cloud --progress # held-out table of the latest checkpoint

The whole run is defined by the recipe (size, schedule, seed) and the corpus: the step count, not
wall time, ends it. State (weights, AdamW moments, scheduler, every RNG, the position in the batch
order, eval history) is written atomically (temporary file + `os.replace`) every few minutes and on
SIGTERM/SIGINT, so rerunning the same command continues exactly where it stopped; a state written
for another recipe, corpus or tokenizer is refused. The batch order of epoch e is a pure function of
(seed, e), so it is not stored.

Inputs are what inference feeds the thinker: `render_prompt()` with `<|AUDIO|>` expanded to one
placeholder per encoder frame, then the answer and `<|im_end|>`; loss on the answer only. With the
Qwen-style tokens an attribute is no longer one token (语/速/较快, 音/调/偏/高): its *decision
positions* are the answer positions where swapping its canonical phrase for another one of the same
attribute would change the token. Those positions are up-weighted, and at the first diverging
position the target is smoothed towards the alternatives' tokens (so edge entropy rises where it is
unsure of what it heard, which is what the speculative gate reads). Teacher-forced attribute accuracy
= every decision position of that attribute predicted right.

Speed on 2 shared cores (field notes): one torch thread per process; no attention dropout on the
text side (the eager path with dropout made steps ~2.6x dearer); length-bucketed batches.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..phrases import ATTRIBUTES
from ..processor import audio_token_count
from ..prompt import AUDIO, render_prompt
from .corpus import BUCKETS, CORPUS, REPO, TEMPLATES, WORK, describe, fingerprint
from .thinker_config import thinker_config
from .tokenizer import QWEN_DEMO_VOCAB, build_qwen_style_tokenizer

MODELS_DIR = Path(__file__).resolve().parent / "models"
RUNS = REPO / "demo-train"


@dataclass
class Recipe:
    """Size and schedule of one model. The edge is small and thin-eared (it must stay clearly weaker
    than the cloud); the cloud gets width and depth where listening happens (the audio encoder) and
    enough text depth to cost >= 3x the edge per generated token."""

    size: dict
    steps: int
    lr: float
    batch: int = 32
    warmup: int = 200
    phrase_weight: float = 3.0
    smooth: float = 0.1  # label smoothing towards the attribute's other phrases at decision points
    feat_noise: float = 0.03  # std of Gaussian noise on the (normalised) log-mel
    eval_every: int = 300
    seed: int = 0
    # Knowledge distillation from a bundled model (Distill below); None: labels only.
    distill: dict | None = None
    # The corpus it trains on: "v2" (corpus.py: espeak-ng's knob positions as labels) or "v4"
    # (corpus_v4.py: many voices, labels measured from the audio; demo contract v3).
    corpus: str = "v2"
    # Training-only supervision of the audio tower by the clip's measures (EarHead below; v4 corpora
    # only): {"weight": w}. None: the answer loss alone.
    ears: dict | None = None
    # Warm start: the run (a folder under demo-train/) whose committed weights (and ears) a fresh run
    # starts from, instead of random ones; its weights' hash is part of the identity. None: from scratch.
    init: str | None = None


RECIPES: dict[str, Recipe] = {
    # Batches of 16: on these CPUs a step costs ~linear in clip frames, and more, smaller steps
    # learned faster per CPU-second than fewer large ones in v1's pilots.
    "edge": Recipe(
        size=dict(hidden=64, layers=1, heads=4, kv_heads=2, ffn=192, audio_d=48, audio_layers=1, audio_heads=4,
                  audio_ffn=192, dropout=0.1, text_dropout=0.0),
        steps=3000, lr=2e-3, batch=16, eval_every=300,
    ),
    # The 3000-step edge reached 95.7% teacher-forced (step 2100): too close to what the cloud can
    # show (issue 11 wants the edge >= 5 points below). Same ears, a quarter of the schedule.
    "edge_short": Recipe(
        size=dict(hidden=64, layers=1, heads=4, kv_heads=2, ffn=192, audio_d=48, audio_layers=1, audio_heads=4,
                  audio_ffn=192, dropout=0.1, text_dropout=0.0),
        steps=1200, lr=2e-3, batch=16, eval_every=300,
    ),
    # Demo pair v3's edge (issue 34): the edge_short's ears and text side (so a generated token costs
    # what it did, well under half the cloud's), distilled from the bundled cloud as real drafters
    # are. A full cosine schedule to the end (an edge cut short guesses with confidence), no label
    # smoothing (the cloud's distribution is the soft target), and, from step 1000, one step in four
    # on the edge's own sampled answers scored by the cloud (DistillSpec, arXiv 2310.08461: on-policy
    # data aligns the draft best). See Distill.
    "edge_distill": Recipe(
        size=dict(hidden=64, layers=1, heads=4, kv_heads=2, ffn=192, audio_d=48, audio_layers=1, audio_heads=4,
                  audio_ffn=192, dropout=0.1, text_dropout=0.0),
        steps=2000, lr=2e-3, batch=16, eval_every=250, smooth=0.0,
        distill=dict(teacher="cloud", weight=0.5, temperature=2.0, top_k=16, onpolicy_from=1000,
                     round_every=200, round_clips=400, onpolicy_every=4),
    ),
    "cloud": Recipe(
        # Six thin text layers rather than four wide ones: same training FLOPs, but a generated
        # token's cost on CPU follows the layer count (per-op overhead), which puts the cloud at
        # >= 3x the edge per token (the demo shows the trade-off in wall time, not only calls).
        size=dict(hidden=128, layers=6, heads=4, kv_heads=2, ffn=256, audio_d=192, audio_layers=3, audio_heads=4,
                  audio_ffn=576, dropout=0.1, text_dropout=0.0),
        # ~4-10 s/step on the shared cores: 4000 steps is several sessions of resumed training.
        steps=4000, lr=1e-3, batch=16, eval_every=300,
    ),
    # Demo pair v4 (issue 41): trained on corpus v4, whose labels are measured from the audio of 32
    # voices of two synthesizers. Wider ears than v3's cloud (audio 256 wide, 3 layers: pitch must be
    # read against the speaker's gender and rate counted over phonation time, for voices it was not
    # trained on); the same text side, so a generated token costs what v3's did.
    "cloud_v4": Recipe(
        size=dict(hidden=128, layers=6, heads=4, kv_heads=2, ffn=256, audio_d=256, audio_layers=3, audio_heads=4,
                  audio_ffn=768, dropout=0.1, text_dropout=0.0),
        steps=5000, lr=1e-3, batch=16, warmup=300, eval_every=500, corpus="v4",
    ),
    # cloud_v4 with its ears supervised by the clip's measures (EarHead): cloud_v4's audio tower kept
    # no pitch (bench/ear_probe.py: a linear probe of its pooled output reads pitch at chance, 39-42 %,
    # where the same probe on the pooled log-mel reads 75-81 %), so the answer loss alone did not teach it.
    "cloud_v4e": Recipe(
        size=dict(hidden=128, layers=6, heads=4, kv_heads=2, ffn=256, audio_d=256, audio_layers=3, audio_heads=4,
                  audio_ffn=768, dropout=0.1, text_dropout=0.0),
        steps=5000, lr=1e-3, batch=16, warmup=300, eval_every=500, corpus="v4", ears=dict(weight=0.3),
    ),
    # v4's edge, distilled from cloud_v4e (--teacher) as v3's edge was from v3's cloud, with ears that
    # can count syllables: two audio layers 64 wide (v3's edge had one, 48 wide, and could not hear
    # rate), supervised by the clip's measures as cloud_v4e's are (the pilot: the answer loss alone
    # left a tower deaf to pitch), the same one-layer text side (its cost per token stays a fraction
    # of the cloud's).
    "edge_v4": Recipe(
        size=dict(hidden=64, layers=1, heads=4, kv_heads=2, ffn=192, audio_d=64, audio_layers=2, audio_heads=4,
                  audio_ffn=192, dropout=0.1, text_dropout=0.0),
        steps=2500, lr=2e-3, batch=16, eval_every=500, smooth=0.0, corpus="v4", ears=dict(weight=0.3),
        distill=dict(teacher="cloud", weight=0.5, temperature=2.0, top_k=16, onpolicy_from=1250,
                     round_every=250, round_clips=400, onpolicy_every=4),
    ),
    # Demo pair v5 (issue 51): corpus v5, where every clip comes through a channel (telephone lines,
    # codecs, rooms, microphones, noise) and formants move apart from F0 (demo contract v4). The same
    # model as cloud_v4e, warm-started from its weights: what it learned of the six attributes holds,
    # what it must learn is to hear them through a channel (and "female" below 4 kHz). Half the lr,
    # 1500 steps (2.4 passes over the 10,000 channel copies; ~3 s a step on a machine shared with other work).
    "cloud_v5": Recipe(
        size=dict(hidden=128, layers=6, heads=4, kv_heads=2, ffn=256, audio_d=256, audio_layers=3, audio_heads=4,
                  audio_ffn=768, dropout=0.1, text_dropout=0.0),
        steps=1500, lr=5e-4, batch=16, warmup=100, eval_every=500, corpus="v5", ears=dict(weight=0.3),
        init="cloud_v4e",
    ),
    # cloud_v5 continued (it heard pitch through a telephone line at 56-58 % teacher-forced at step
    # 1500, against 86-94 % clean, still rising): 1000 more steps from its weights, the ears' loss
    # doubled (the tower must keep F0 when the line has taken the fundamental away).
    "cloud_v5t": Recipe(
        size=dict(hidden=128, layers=6, heads=4, kv_heads=2, ffn=256, audio_d=256, audio_layers=3, audio_heads=4,
                  audio_ffn=768, dropout=0.1, text_dropout=0.0),
        steps=1000, lr=3e-4, batch=16, warmup=50, eval_every=500, corpus="v5", ears=dict(weight=0.6),
        init="cloud_v5", seed=1,
    ),
    # v5's edge: edge_v4 warm-started on corpus v5, distilled from cloud_v5 (--teacher), a shorter
    # schedule (edge_v4's full one left it above the 85-93 % band).
    "edge_v5": Recipe(
        size=dict(hidden=64, layers=1, heads=4, kv_heads=2, ffn=192, audio_d=64, audio_layers=2, audio_heads=4,
                  audio_ffn=192, dropout=0.1, text_dropout=0.0),
        steps=1500, lr=1e-3, batch=16, warmup=100, eval_every=500, smooth=0.0, corpus="v5", ears=dict(weight=0.3),
        distill=dict(teacher="cloud", weight=0.5, temperature=2.0, top_k=16, onpolicy_from=750,
                     round_every=150, round_clips=400, onpolicy_every=4),
        init="edge_v4",
    ),
}
CORPORA = {"v2": CORPUS, "v4": WORK / "corpus-v4", "v5": WORK / "corpus-v5"}
# The held-out splits evaluated during training (those the corpus has): v4 adds the held-out voices
# and the held-out synthesizer; their noisy copies are left to evaluate_pair (the eval is not free).
# v5 adds each held-out set through a telephone line, the channel v4 could not hear through.
EVAL_SPLITS = ("val", "val_noisy", "val_voices", "val_synth", "val_telephone", "val_voices_telephone",
               "val_synth_telephone")


# ---------------------------------------------------------------------------------------------
class AttributeSpans:
    """Per target description: the decision positions of each attribute (indices into the answer
    tokens) and, at each attribute's first diverging position, the alternatives' tokens."""

    def __init__(self, tok) -> None:
        self.tok = tok
        self._cache: dict[tuple[str, int], dict] = {}

    def answer_ids(self, text: str) -> list[int]:
        return self.tok(text + self.tok.eos_token, add_special_tokens=False)["input_ids"]

    def of(self, labels: dict[str, str], template: int) -> dict:
        key = (json.dumps(labels, sort_keys=True, ensure_ascii=False), template)
        if key not in self._cache:
            ids = self.answer_ids(describe(labels, template))
            spans: dict[str, list[int]] = {}
            alts: dict[str, tuple[int, list[int]]] = {}
            for attr, phrases in ATTRIBUTES.items():
                pos: set[int] = set()
                first, others = len(ids), []
                for p in phrases:
                    if p == labels[attr]:
                        continue
                    alt = self.answer_ids(describe({**labels, attr: p}, template))
                    pre = next(i for i in range(min(len(ids), len(alt))) if ids[i] != alt[i])
                    suf = 0
                    while suf < min(len(ids), len(alt)) - pre and ids[-1 - suf] == alt[-1 - suf]:
                        suf += 1
                    pos |= set(range(pre, len(ids) - suf))
                    if pre < first:
                        first, others = pre, []
                    if pre == first:
                        others.append(alt[pre])
                spans[attr] = sorted(pos)
                alts[attr] = (first, sorted(set(others) - {ids[first]}))
            self._cache[key] = {"ids": ids, "spans": spans, "alts": alts}
        return self._cache[key]


class Corpus:
    """One split of the v2 corpus: float16 log-mels memory-mapped from the shards, plus per clip the
    answer ids and attribute decision positions."""

    def __init__(self, split: str, tok, spans: AttributeSpans, root: Path = CORPUS) -> None:
        self.arrays: list[np.ndarray] = []
        self.index: list[tuple[int, int, int]] = []  # (array, offset, frames)
        self.meta: list[dict] = []
        for k, path in enumerate(sorted(root.glob(f"{split}-*.json"))):
            self.arrays.append(np.load(path.with_suffix(".npy"), mmap_mode="r"))
            for m in json.loads(path.read_text(encoding="utf-8")):
                self.index.append((k, m["offset"], m["frames"]))
                self.meta.append(m)
        if not self.meta:
            raise SystemExit(f"no {split} shards under {root}: build the corpus first (see demo-train/README.md)")
        # A held-out clip of corpus v5 may leave an ambiguous attribute out of its labels (demo
        # contract v4): its target text takes a stand-in phrase there, and that attribute is not scored.
        self.scored = [set(m["labels"]) for m in self.meta]
        pre, post = render_prompt().split(AUDIO)
        self.pre = tok(pre, add_special_tokens=False)["input_ids"]
        self.post = tok(post, add_special_tokens=False)["input_ids"]
        self.audio_id = tok.convert_tokens_to_ids(AUDIO)
        self.pad_id = tok.pad_token_id
        self.targets = [spans.of({a: m["labels"].get(a, phrases[0]) for a, phrases in ATTRIBUTES.items()},
                                 m["template"]) for m in self.meta]
        # The assembled prompt must equal what the processor builds at inference (same ids).
        n = audio_token_count(self.index[0][2])
        ref = tok(render_prompt().replace(AUDIO, AUDIO * n), add_special_tokens=False)["input_ids"]
        if ref != self.pre + [self.audio_id] * n + self.post:
            raise AssertionError("prompt assembly differs from the processor's")

    def __len__(self) -> int:
        return len(self.meta)

    def frames(self, i: int) -> int:
        return self.index[i][2]

    def features(self, i: int) -> torch.Tensor:
        k, off, n = self.index[i]
        return torch.from_numpy(np.ascontiguousarray(self.arrays[k][off:off + n].T)).float()

    def batch(self, idx: list[int], noise: float = 0.0, gen: torch.Generator | None = None,
              answers: list[list[int]] | None = None) -> dict:
        """Right-padded thinker inputs; labels -100 on prompt and padding; per-row answer start.
        `answers`: per row, answer ids to use instead of the clip's target (on-policy samples)."""
        seqs, starts = [], []
        for k, i in enumerate(idx):
            p = self.pre + [self.audio_id] * audio_token_count(self.frames(i)) + self.post
            seqs.append(p + (answers[k] if answers is not None else self.targets[i]["ids"]))
            starts.append(len(p))
        L, T = max(map(len, seqs)), max(self.frames(i) for i in idx)
        ids = torch.full((len(idx), L), self.pad_id, dtype=torch.long)
        lab = torch.full((len(idx), L), -100, dtype=torch.long)
        att = torch.zeros((len(idx), L), dtype=torch.long)
        feats = torch.zeros((len(idx), 128, T))
        fmask = torch.zeros((len(idx), T), dtype=torch.long)
        for b, (s, st, i) in enumerate(zip(seqs, starts, idx, strict=True)):
            ids[b, :len(s)] = torch.tensor(s)
            lab[b, st:len(s)] = torch.tensor(s[st:])
            att[b, :len(s)] = 1
            f = self.features(i)
            if noise:
                f = f + noise * torch.randn(f.shape, generator=gen)
            feats[b, :, :f.shape[1]] = f
            fmask[b, :f.shape[1]] = 1
        return {"input_ids": ids, "attention_mask": att, "input_features": feats,
                "feature_attention_mask": fmask, "labels": lab, "starts": starts, "clips": list(idx)}


def epoch_batches(data: Corpus, batch: int, seed: int, epoch: int) -> list[list[int]]:
    """Epoch `epoch`'s batches, a pure function of (seed, epoch): shuffle, sort by length inside
    windows of 50 batches (padding stays small), shuffle the batches, drop the ragged ones."""
    rng = random.Random(f"{seed}/epoch/{epoch}")
    order = list(range(len(data)))
    rng.shuffle(order)
    out, win = [], 50 * batch
    for k in range(0, len(order), win):
        chunk = sorted(order[k:k + win], key=data.frames)
        out += [chunk[j:j + batch] for j in range(0, len(chunk), batch)]
    rng.shuffle(out)
    return [b for b in out if len(b) == batch]


# ---------------------------------------------------------------------------------------------
MODEL_INPUTS = ("input_ids", "attention_mask", "input_features", "feature_attention_mask")


class EarHead(torch.nn.Module):
    """Training-only: a linear read-out of the clip's mean audio-tower output (what the text side
    attends to) predicting the clip's measures — its pitch in semitones from its gender's reference,
    log F0, rate, level, pause share, and its gender. Its loss makes the ears keep what the labels are
    made of; the head is not part of the exported model (a Qwen thinker as before). Hand-written: an
    auxiliary head on a submodule's output is a few lines no library packages."""

    SCALES = {"semitones": (0.0, 4.0), "log_f0": (math.log(165.0), 0.5), "rate": (4.4, 1.5),
              "level_dbfs": (-25.0, 8.0), "pause_share": (0.08, 0.1)}

    def __init__(self, model: torch.nn.Module, hidden: int) -> None:
        super().__init__()
        self.read = torch.nn.Linear(hidden, len(self.SCALES) + 1)
        tower = next(m for n, m in model.named_modules() if n.endswith("audio_tower"))
        self._out: torch.Tensor | None = None
        tower.register_forward_hook(self._keep)

    def _keep(self, module, args, output) -> None:  # noqa: ARG002 (hook signature)
        self._out = output.last_hidden_state

    @staticmethod
    def targets(meta: dict, references: dict[str, float]) -> list[float]:
        m, gender = meta["measures"], meta["labels"]["gender"]
        # corpus v5: the volume is the clip's as heard (after its channel), the rest the clean clip's
        level = meta.get("heard_level_dbfs", m["level_dbfs"])
        values = {"semitones": 12 * math.log2(m["f0_hz"] / references[gender]), "log_f0": math.log(m["f0_hz"]),
                  "rate": m["rate"], "level_dbfs": level, "pause_share": m["pause_share"]}
        return [(values[k] - mu) / sd for k, (mu, sd) in EarHead.SCALES.items()] + [float(gender == "女声")]

    def loss(self, b: dict, data: Corpus) -> torch.Tensor:
        """After the model's forward on batch `b`: mean squared error of the standardised measures
        plus the gender's cross-entropy."""
        from .measure import cut_points

        refs = cut_points()["references_hz"]
        counts = [audio_token_count(int(n)) for n in b["feature_attention_mask"].sum(1)]
        pooled = torch.stack([h.mean(0) for h in torch.split(self._out, counts)])
        pred = self.read(pooled)
        y = torch.tensor([self.targets(data.meta[i], refs) for i in b["clips"]])
        return F.mse_loss(pred[:, :-1], y[:, :-1]) + F.binary_cross_entropy_with_logits(pred[:, -1], y[:, -1])


def model_inputs(b: dict) -> dict:
    return {x: b[x] for x in MODEL_INPUTS}


def position_weights(target: dict, recipe: Recipe) -> torch.Tensor:
    """Per answer token: `phrase_weight` at the attributes' decision positions, else 1."""
    w = torch.ones(len(target["ids"]))
    for pos in target["spans"].values():
        w[pos] = recipe.phrase_weight
    return w


def answer_loss(logits: torch.Tensor, b: dict, data: Corpus, recipe: Recipe) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted, smoothed training loss, and the plain mean answer NLL (for the log)."""
    lp_all = F.log_softmax(logits[:, :-1].float(), dim=-1)
    terms, weights, nlls = [], [], []
    for row, (st, i) in enumerate(zip(b["starts"], b["clips"], strict=True)):
        t = data.targets[i]
        ids = torch.tensor(t["ids"])
        lp = lp_all[row, st - 1:st - 1 + len(ids)]  # position st-1 predicts answer token 0
        nll = -lp.gather(1, ids[:, None])[:, 0]
        loss = nll.clone()
        w = position_weights(t, recipe)
        for attr in t["spans"]:
            first, others = t["alts"][attr]
            if recipe.smooth and others:
                loss[first] = (1 - recipe.smooth) * nll[first] - recipe.smooth * lp[first, others].mean()
        terms.append(loss * w)
        weights.append(w)
        nlls.append(nll)
    return torch.cat(terms).sum() / torch.cat(weights).sum(), torch.cat(nlls).mean()


@torch.no_grad()
def evaluate_tf(model, data: Corpus, batch: int = 32) -> dict:
    """Teacher-forced held-out metrics: answer NLL; per attribute, the share of clips whose every
    decision position of that attribute is predicted right; per length bucket and overall."""
    was_training = model.training
    model.eval()
    tot, n_tok = 0.0, 0
    hits: dict[str, dict[str, list[int]]] = {}
    sure, right = [], []  # per clip: Σ log max p along the target; every attribute right
    order = sorted(range(len(data)), key=data.frames)
    for k in range(0, len(order), batch):
        b = data.batch(order[k:k + batch])
        logits = model(**model_inputs(b)).logits
        for row, (st, i) in enumerate(zip(b["starts"], b["clips"], strict=True)):
            t = data.targets[i]
            ids = torch.tensor(t["ids"])
            lp = F.log_softmax(logits[row, st - 1:st - 1 + len(ids)].float(), -1)
            tot += float(-lp.gather(1, ids[:, None]).sum())
            n_tok += len(ids)
            ok = (lp.argmax(-1) == ids).tolist()
            sure.append(float(lp.max(-1).values.sum()))
            scored = data.scored[i]
            right.append(all(ok[p] for a, pos in t["spans"].items() if a in scored for p in pos))
            for bucket in (data.meta[i]["bucket"], "all"):
                h = hits.setdefault(bucket, {a: [0, 0] for a in ATTRIBUTES})
                for attr, pos in t["spans"].items():
                    if attr in scored:
                        h[attr][0] += int(all(ok[p] for p in pos))
                        h[attr][1] += 1
    if was_training:
        model.train()
    acc = {bucket: {a: c / max(n, 1) for a, (c, n) in h.items()} for bucket, h in hits.items()}
    for v in acc.values():
        v["mean"] = sum(v[a] for a in ATTRIBUTES) / len(ATTRIBUTES)
    # clips scored per attribute (all clips, unless held-out clips left an ambiguous attribute out)
    scored_n = {a: n for a, (_, n) in hits.get("all", {}).items()}
    # A cheap, teacher-forced stand-in for bench/gate_signal.py's `confidence` AUC: does the model's
    # sureness along the target rank the clips it gets wholly right above the others?
    out = {"nll": tot / max(n_tok, 1), "acc": acc, "clips": len(data), "clip_auc": rank_auc(sure, right)}
    if any(n != len(data) for n in scored_n.values()):
        out["scored"] = scored_n
    return out


def rank_auc(scores: list[float], positive: list[bool]) -> float | None:
    """P(a positive scores above a negative), ties half (Mann-Whitney); None when a class is empty."""
    s, y = np.asarray(scores, dtype=float), np.asarray(positive, dtype=bool)
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        return None
    return float(((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum())
                 / (len(pos) * len(neg)))


# ---------------------------------------------------------------------------------------------
# Distillation (issue 34): the edge learns the cloud's token distribution. Teacher logits along the
# training targets are computed once per (teacher weights, corpus, k) and cached under .demo-work;
# on-policy rounds sample the edge's own answers and score them with the teacher as they come.
@dataclass(frozen=True)
class Distill:
    """`weight`: share of the KL term beside the label loss on the corpus's targets; `temperature`:
    both distributions are softened by it (Hinton et al.; the KL is scaled by T^2 to keep its
    gradient's size), so the cloud's margins, not only its argmax, reach the edge; `top_k`: the
    teacher's k largest logits per position are kept (the KL runs over them, renormalised);
    from step `onpolicy_from`, every `onpolicy_every`-th step trains on the edge's own sampled
    answers (KL only: they have no labels), drawn `round_clips` at a time every `round_every` steps."""

    teacher: str
    weight: float
    temperature: float
    top_k: int
    onpolicy_from: int | None = None
    round_every: int = 200
    round_clips: int = 400
    onpolicy_every: int = 4

    def onpolicy(self, step: int) -> bool:
        """Whether the step after `step` steps trains on on-policy samples."""
        return (self.onpolicy_from is not None and step >= self.onpolicy_from
                and step % self.onpolicy_every == self.onpolicy_every - 1)

    def round_of(self, step: int) -> int:
        return (step - (self.onpolicy_from or 0)) // self.round_every


def model_hash(folder: Path) -> str:
    """Identity of a model folder's weights."""
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()[:16]


def kl_topk(student_logits: torch.Tensor, top_val: torch.Tensor, top_idx: torch.Tensor,
            temperature: float) -> torch.Tensor:
    """Per position, T^2 · KL(teacher || student) at temperature T, the teacher's distribution being
    its top-k logits renormalised, the student's its full softmax read at those ids (so student mass
    off the teacher's top-k is penalised too)."""
    t = F.log_softmax(top_val.float() / temperature, -1)
    s = F.log_softmax(student_logits.float() / temperature, -1).gather(1, top_idx.long())
    return temperature ** 2 * (t.exp() * (t - s)).sum(-1)


def distill_loss(logits: torch.Tensor, b: dict, teacher_rows: list[tuple[torch.Tensor, torch.Tensor]],
                 weights: list[torch.Tensor], temperature: float) -> torch.Tensor:
    """Weighted mean over every answer token of the batch of kl_topk; row r's answer starts at
    b["starts"][r] and `teacher_rows[r]` / `weights[r]` hold one entry per answer token."""
    terms = []
    for row, st in enumerate(b["starts"]):
        val, idx = teacher_rows[row]
        terms.append(kl_topk(logits[row, st - 1:st - 1 + len(val)], val, idx, temperature))
    w = torch.cat(weights)
    return (torch.cat(terms) * w).sum() / w.sum()


def load_teacher(folder: Path):
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(folder)
    model.eval()
    return model


@torch.no_grad()
def teacher_topk(teacher, data: Corpus, clips: list[int], answers: list[list[int]] | None, top_k: int,
                 batch: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per clip, along its answer (the target, or `answers[j]`): the teacher's top-k logits (float32)
    and their ids (int16), one row per answer token. Clean features (no augmentation noise)."""
    out: list = [None] * len(clips)
    order = sorted(range(len(clips)), key=lambda j: data.frames(clips[j]))
    for k in range(0, len(order), batch):
        js = order[k:k + batch]
        b = data.batch([clips[j] for j in js], answers=[answers[j] for j in js] if answers is not None else None)
        teacher.model.rope_deltas = None  # per-call state on the model (field notes)
        logits = teacher(**model_inputs(b)).logits
        for row, j in enumerate(js):
            n = len(answers[j]) if answers is not None else len(data.targets[clips[j]]["ids"])
            st = b["starts"][row]
            val, idx = logits[row, st - 1:st - 1 + n].float().topk(top_k, -1)
            out[j] = (val.clone(), idx.to(torch.int16))
    return out


def gold_teacher(teacher_dir: Path, data: Corpus, top_k: int, corpus_fp: str, cache_dir: Path,
                 log=print) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """teacher_topk along every training target, cached in `cache_dir` under the teacher's hash, the
    corpus fingerprint and k (computed once: ~12k clips of cloud forwards)."""
    path = cache_dir / f"teacher-{model_hash(teacher_dir)}-{corpus_fp}-k{top_k}.pt"
    if path.exists():
        return torch.load(path, weights_only=False)
    log(f"computing the teacher's top-{top_k} logits on {len(data)} clips into {path}")
    t0 = time.time()
    rows = teacher_topk(load_teacher(teacher_dir), data, list(range(len(data))), None, top_k)
    cache_dir.mkdir(parents=True, exist_ok=True)
    save_atomic(rows, path)
    log(f"teacher cache written in {time.time() - t0:.0f} s")
    return rows


MAX_ANSWER = 60  # as evaluate_pair's greedy runs


@torch.no_grad()
def onpolicy_round(model, teacher, data: Corpus, d: Distill, seed: int, r: int, eos_id: int,
                   special: list[int]) -> dict:
    """Round r's pool: `d.round_clips` training clips (a pure function of (seed, r)), the edge's
    answer to each sampled at temperature 1 (from a generator seeded by (seed, r), so the dropout
    stream is untouched) with the special ids but end-of-turn suppressed (an audio placeholder in an
    answer would not match the clip's audio), and the teacher's top-k along each answer."""
    clips = random.Random(f"{seed}/onpolicy/{r}").sample(range(len(data)), d.round_clips)
    was_training = model.training
    model.eval()
    answers = []
    with torch.random.fork_rng():
        torch.manual_seed(1_000_003 * (seed + 1) + r)
        for i in clips:
            b = data.batch([i])
            n = b["starts"][0]
            inputs = {"input_ids": b["input_ids"][:, :n], "attention_mask": b["attention_mask"][:, :n],
                      "input_features": b["input_features"], "feature_attention_mask": b["feature_attention_mask"]}
            model.model.rope_deltas = None
            out = model.generate(**inputs, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=MAX_ANSWER, eos_token_id=eos_id, pad_token_id=data.pad_id,
                                 suppress_tokens=[t for t in special if t != eos_id])
            ans = out[0, n:].tolist()
            answers.append(ans[:ans.index(eos_id) + 1] if eos_id in ans else ans)
    model.train(was_training)
    return {"round": r, "clips": clips, "answers": answers,
            "teacher": teacher_topk(teacher, data, clips, answers, d.top_k), "pos": 0}


def n_params(model: torch.nn.Module) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    audio = sum(p.numel() for n, p in model.named_parameters() if ".audio_tower." in f".{n}")
    # "text" (the decoder + head) is what a generated token costs after the prefill.
    return {"total": total, "no_vision": total - vision, "text": total - vision - audio}


# ---------------------------------------------------------------------------------------------
def _tokenizer_hash() -> str:
    return hashlib.sha256(QWEN_DEMO_VOCAB.read_bytes()).hexdigest()[:16]


def init_weights(name: str, runs: Path = RUNS) -> tuple[dict, dict | None, str]:
    """A warm start's (model weights, ears weights or None, hash of the weights) from runs/name's state."""
    path = runs / name / "state.pt"
    if not path.exists():
        raise SystemExit(f"warm start: no {path} (the run this recipe starts from)")
    st = torch.load(path, weights_only=False)
    h = hashlib.sha256()
    for k in sorted(st["model"]):
        h.update(k.encode())
        h.update(st["model"][k].detach().contiguous().view(torch.uint8).numpy().tobytes())
    return st["model"], st.get("ears"), h.hexdigest()[:16]


def identity(recipe: Recipe, corpus_fp: str, teacher: str | None = None, init: str | None = None) -> dict:
    """What a state must match to be resumed. A recipe without distillation reads as before the
    field existed (so the committed cloud and edge_short states still resume); a distilled one adds
    the teacher's weights hash."""
    r = asdict(recipe)
    if r["distill"] is None:
        del r["distill"]
    if r["corpus"] == "v2":  # as before the field existed
        del r["corpus"]
    if r["ears"] is None:
        del r["ears"]
    if r["init"] is None:
        del r["init"]
    out = {"recipe": r, "corpus": corpus_fp, "tokenizer": _tokenizer_hash(), "templates": list(TEMPLATES)}
    if teacher is not None:
        out["teacher"] = teacher
    if init is not None:
        out["init"] = init
    return out


def save_atomic(obj: dict, path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def lr_lambda(recipe: Recipe):
    def f(step: int) -> float:
        if step < recipe.warmup:
            return (step + 1) / recipe.warmup
        t = min(1.0, (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup))
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t))
    return f


def build_model(recipe: Recipe, tok):
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    torch.manual_seed(recipe.seed)
    model = Qwen2_5OmniThinkerForConditionalGeneration(thinker_config(tok, **recipe.size))
    model.train()
    return model


class _Stop:
    """SIGTERM/SIGINT set a flag; the loop saves at the next step boundary and exits."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum, frame) -> None:  # noqa: ARG002 (signal handler signature)
        self.requested = True


def train(name: str, recipe: Recipe, run_dir: Path, corpus_root: Path | None = None, *, save_every_s: float = 300.0,
          stop_after: int | None = None, log=print, threads: int = 1, teacher_dir: Path | None = None,
          cache_dir: Path = WORK / "teacher", init_runs: Path = RUNS) -> dict:
    """Train (or resume) `name` into `run_dir`. `stop_after`: leave after this many steps of this
    invocation (a pause, as a signal would; used by the tests). `threads`: torch threads (1 when
    another job shares the cores; a resume may use another count: the numbers then differ in
    rounding only). A distilled recipe reads its teacher from `teacher_dir` (default: the bundled
    model its recipe names) and caches the teacher's logits in `cache_dir`. Returns the final
    state dict."""
    torch.set_num_threads(threads)
    corpus_root = corpus_root or CORPORA[recipe.corpus]
    tok = build_qwen_style_tokenizer()
    spans = AttributeSpans(tok)
    train_set = Corpus("train", tok, spans, corpus_root)
    val_sets = {split: Corpus(split, tok, spans, corpus_root) for split in EVAL_SPLITS
                if any(corpus_root.glob(f"{split}-*.json"))}
    corpus_fp = fingerprint(corpus_root)
    d = Distill(**recipe.distill) if recipe.distill else None
    teacher = gold = None
    if d is not None:
        teacher_dir = teacher_dir or MODELS_DIR / d.teacher
        gold = gold_teacher(teacher_dir, train_set, d.top_k, corpus_fp, cache_dir, log)
        teacher = load_teacher(teacher_dir) if d.onpolicy_from is not None else None
    warm = init_weights(recipe.init, init_runs) if recipe.init else None
    ident = identity(recipe, corpus_fp, model_hash(teacher_dir) if d is not None else None,
                     warm[2] if warm else None)
    run_dir.mkdir(parents=True, exist_ok=True)
    state_path = run_dir / "state.pt"
    model = build_model(recipe, tok)
    ears = EarHead(model, recipe.size["hidden"]) if recipe.ears else None
    if warm is not None and not state_path.exists():
        model.load_state_dict(warm[0])
        if ears is not None and warm[1] is not None:
            ears.load_state_dict(warm[1])
        log(f"{name}: warm start from {recipe.init} (weights {warm[2]})")
    opt = torch.optim.AdamW(list(model.parameters()) + (list(ears.parameters()) if ears else []), lr=recipe.lr,
                            weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(recipe))
    gen = torch.Generator().manual_seed(recipe.seed + 1)
    torch.manual_seed(recipe.seed + 2)  # dropout draws from the global generator
    step, epoch, pos, history, pool = 0, 0, 0, [], None
    if state_path.exists():
        st = torch.load(state_path, weights_only=False)
        for key in ident:
            if st["identity"].get(key) != ident[key]:
                raise SystemExit(f"{state_path} was trained with another {key}; move it away to start over "
                                 f"(or rebuild the corpus/recipe it was made with)")
        model.load_state_dict(st["model"])
        if ears is not None:
            ears.load_state_dict(st["ears"])
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        gen.set_state(st["rng"]["noise"])
        torch.set_rng_state(st["rng"]["torch"])
        step, epoch, pos, history, pool = st["step"], st["epoch"], st["pos"], st["history"], st.get("pool")
        log(f"resumed {name} at step {step} (epoch {epoch}, batch {pos})")
    params = n_params(model)

    def state() -> dict:
        return {"identity": ident, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "rng": {"noise": gen.get_state(), "torch": torch.get_rng_state()},
                "step": step, "epoch": epoch, "pos": pos, "history": history, "params": params, "pool": pool,
                "saved_at": time.time(), **({"ears": ears.state_dict()} if ears is not None else {})}

    stop = _Stop()
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    log_file = (run_dir / "log.jsonl").open("a", encoding="utf-8")

    def emit(rec: dict) -> None:
        log_file.write(json.dumps(rec, ensure_ascii=False) + "\n")
        log_file.flush()

    emit({"start": step, "params": params, "train": len(train_set), "time": time.time()})
    batches = epoch_batches(train_set, recipe.batch, recipe.seed, epoch)
    last_save, t0, done_here = time.time(), time.time(), 0
    run_loss = run_nll = run_kd = run_ear = 0.0
    run_n = run_gold = 0
    model.train()
    try:
        while step < recipe.steps and not stop.requested and (stop_after is None or done_here < stop_after):
            if d is not None and d.onpolicy(step):
                # The edge's own answers, scored by the teacher (KL only: a sample has no labels).
                if pool is None or pool["round"] != d.round_of(step):
                    t_round = time.time()
                    pool = onpolicy_round(model, teacher, train_set, d, recipe.seed, d.round_of(step),
                                          tok.convert_tokens_to_ids(tok.eos_token),
                                          sorted(set(tok.all_special_ids) | set(tok.added_tokens_decoder)))
                    emit({"step": step, "onpolicy_round": pool["round"], "seconds": round(time.time() - t_round, 1),
                          "mean_answer_tokens": round(float(np.mean([len(a) for a in pool["answers"]])), 2)})
                js = [(pool["pos"] + j) % len(pool["clips"]) for j in range(recipe.batch)]
                pool["pos"] += recipe.batch
                answers = [pool["answers"][j] for j in js]
                b = train_set.batch([pool["clips"][j] for j in js], recipe.feat_noise, gen, answers=answers)
                logits = model(**model_inputs(b)).logits
                loss = kd = distill_loss(logits, b, [pool["teacher"][j] for j in js],
                                         [torch.ones(len(a)) for a in answers], d.temperature)
                nll = None
            else:
                if pos >= len(batches):
                    epoch, pos = epoch + 1, 0
                    batches = epoch_batches(train_set, recipe.batch, recipe.seed, epoch)
                b = train_set.batch(batches[pos], recipe.feat_noise, gen)
                logits = model(**model_inputs(b)).logits
                loss, nll = answer_loss(logits, b, train_set, recipe)
                if ears is not None:
                    ear = ears.loss(b, train_set)
                    loss = loss + recipe.ears["weight"] * ear
                    run_ear += float(ear.detach())
                kd = None
                if d is not None:
                    kd = distill_loss(logits, b, [gold[i] for i in b["clips"]],
                                      [position_weights(train_set.targets[i], recipe) for i in b["clips"]],
                                      d.temperature)
                    loss = (1 - d.weight) * loss + d.weight * kd
                pos += 1
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step, done_here = step + 1, done_here + 1
            run_loss += float(loss.detach())
            run_n += 1
            if nll is not None:
                run_nll += float(nll.detach())
                run_gold += 1
            if kd is not None:
                run_kd += float(kd.detach())
            if step % 20 == 0:  # (after a resume the first window is shorter than 20 steps)
                rec = {"step": step, "loss": round(run_loss / run_n, 4), "nll": round(run_nll / max(run_gold, 1), 4),
                       "lr": sched.get_last_lr()[0], "s_per_step": round((time.time() - t0) / done_here, 3)}
                if d is not None:
                    rec["kd"] = round(run_kd / run_n, 4)
                if ears is not None:
                    rec["ears"] = round(run_ear / max(run_gold, 1), 4)
                emit(rec)
                run_loss = run_nll = run_kd = run_ear = 0.0
                run_n = run_gold = 0
            if step % recipe.eval_every == 0 or step == recipe.steps:
                ev = {"step": step, **{k: evaluate_tf(model, v) for k, v in val_sets.items()}}
                history.append(ev)
                emit({"eval": ev})
                log(progress_table(ev))
                # Weights at every eval (a few MB, not committed): lets the bundling step pick a
                # checkpoint without retraining.
                save_atomic({"step": step, "model": model.state_dict()}, run_dir / f"weights-{step:05d}.pt")
                save_atomic(state(), state_path)
                last_save = time.time()
            elif time.time() - last_save > save_every_s:
                save_atomic(state(), state_path)
                last_save = time.time()
    finally:
        save_atomic(state(), state_path)
        emit({"saved": step, "stopped_by_signal": stop.requested, "time": time.time()})
        log_file.close()
        for s, h in old.items():
            signal.signal(s, h)
    return state()


# ---------------------------------------------------------------------------------------------
def progress_table(ev: dict) -> str:
    """Markdown table: rows = held-out length buckets (clean), all clean, all noisy."""
    cols = [*ATTRIBUTES, "mean"]
    lines = [f"step {ev['step']} (teacher-forced, held-out sentences)",
             "| clips | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    rows = [(f"val {lo}-{hi} chars", "val", f"{lo}-{hi}") for lo, hi in BUCKETS]
    rows += [("val all", "val", "all"), ("val noisy 20-30 dB", "val_noisy", "all"),
             ("held-out voices", "val_voices", "all"), ("held-out synthesizer", "val_synth", "all"),
             ("val telephone", "val_telephone", "all"), ("held-out voices, telephone", "val_voices_telephone", "all"),
             ("held-out synthesizer, telephone", "val_synth_telephone", "all")]
    for label, split, bucket in rows:
        acc = ev.get(split, {}).get("acc", {}).get(bucket)
        if acc:
            lines.append(f"| {label} | " + " | ".join(f"{100 * acc[c]:.1f}" for c in cols) + " |")
    aucs = {split: ev[split]["clip_auc"] for split in EVAL_SPLITS
            if ev.get(split, {}).get("clip_auc") is not None}
    if aucs:
        lines.append("clip AUC (teacher-forced sureness vs every attribute right): "
                     + ", ".join(f"{k} {v:.3f}" for k, v in aucs.items()))
    return "\n".join(lines)


def progress(name: str, run_dir: Path, corpus_root: Path | None = None) -> str:
    """The held-out table of the latest checkpoint (evaluated now if its step has no eval yet)."""
    path = run_dir / "state.pt"
    if not path.exists():
        raise SystemExit(f"no checkpoint at {path}")
    st = torch.load(path, weights_only=False)
    if st["history"] and st["history"][-1]["step"] == st["step"]:
        ev = st["history"][-1]
    else:
        torch.set_num_threads(1)
        tok = build_qwen_style_tokenizer()
        spans = AttributeSpans(tok)
        recipe = Recipe(**st["identity"]["recipe"])
        corpus_root = corpus_root or CORPORA[recipe.corpus]
        model = build_model(recipe, tok)
        model.load_state_dict(st["model"])
        ev = {"step": st["step"]}
        for split in EVAL_SPLITS:
            if any(corpus_root.glob(f"{split}-*.json")):
                ev[split] = evaluate_tf(model, Corpus(split, tok, spans, corpus_root))
    return f"{name}: {st['params']}\n" + progress_table(ev)


def history(name: str, run_dir: Path) -> dict:
    """A run's held-out evaluations during training, as the docs quote them (bench/doc_tables.py's
    `training_curve` and `training_final`): its identity, size, step and every eval in its state."""
    path = run_dir / "state.pt"
    if not path.exists():
        raise SystemExit(f"no checkpoint at {path}")
    st = torch.load(path, weights_only=False)
    ident = st["identity"]
    where = path.resolve()
    where = where.relative_to(Path.cwd()) if where.is_relative_to(Path.cwd()) else where
    return {"about": f"held-out evaluations of `{name}` during training (teacher-forced, every clip of each "
                     f"set), from {where.as_posix()}: `python -m specdec_cli.demo.train {name} --history-json FILE`",
            "model": name, "step": st["step"], "steps": ident["recipe"]["steps"], "params": st["params"],
            "corpus": ident.get("corpus"), "evals": st["history"]}


def export(run_dir: Path, out: Path) -> dict:
    """Write the latest checkpoint as a model folder (thinker weights + tokenizer + feature
    extractor), loadable by `specdec --edge/--cloud` and `from_pretrained`; checked by a round trip."""
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    from ..processor import AudioTextProcessor
    from .corpus import _feature_extractor

    path = run_dir / "state.pt"
    if not path.exists():
        raise SystemExit(f"no checkpoint at {path}")
    st = torch.load(path, weights_only=False)
    tok = build_qwen_style_tokenizer()
    model = build_model(Recipe(**st["identity"]["recipe"]), tok)
    model.load_state_dict(st["model"])
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    AudioTextProcessor(tok, _feature_extractor()).save_pretrained(out)
    model.save_pretrained(out)
    again = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(out)
    for k, v in model.state_dict().items():
        if not torch.equal(v, again.state_dict()[k]):
            raise AssertionError(f"{k} changed in the round trip")
    return {"step": st["step"], "params": st["params"], "folder": str(out)}


def shortened(recipe: Recipe, steps: int) -> Recipe:
    """`recipe` on a schedule of `steps`: the cosine ends there, and a distilled recipe's on-policy
    phase starts at the same fraction of the schedule (else a short pilot would never reach it)."""
    distill = recipe.distill
    if distill and "onpolicy_from" in distill:
        frac = distill["onpolicy_from"] / recipe.steps
        distill = {**distill, "onpolicy_from": round(frac * steps),
                   "round_every": max(1, round(distill["round_every"] * steps / recipe.steps))}
    return dataclasses.replace(recipe, steps=steps, eval_every=min(recipe.eval_every, steps), distill=distill)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=list(RECIPES))
    ap.add_argument("--runs", type=Path, default=RUNS, help="folder holding <model>/state.pt and log.jsonl")
    ap.add_argument("--corpus", type=Path, default=None, help="corpus folder (default: the recipe's)")
    ap.add_argument("--teacher", type=Path, default=None, metavar="DIR",
                    help="a distilled recipe's teacher model folder (default: the bundled model its recipe names)")
    ap.add_argument("--progress", action="store_true", help="print the held-out table of the latest checkpoint")
    ap.add_argument("--history-json", type=Path, default=None, metavar="FILE",
                    help="write the run's held-out evaluations during training as JSON and exit")
    ap.add_argument("--save-every", type=float, default=300.0, help="seconds between checkpoints")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 2 when it has the machine)")
    ap.add_argument("--export", type=Path, default=None, metavar="DIR",
                    help="write the latest checkpoint as a model folder (processor + weights) and exit")
    ap.add_argument("--steps", type=int, default=None,
                    help="a shorter schedule than the recipe's (its cosine ends at this step): a pilot run "
                         "when the recipe's own does not fit the time at hand; say so wherever it is quoted")
    args = ap.parse_args(argv)
    run_dir = args.runs / args.model
    if args.export:
        print(json.dumps(export(run_dir, args.export)))
        return
    if args.history_json:
        args.history_json.write_text(json.dumps(history(args.model, run_dir), indent=1, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
        return
    if args.progress:
        print(progress(args.model, run_dir, args.corpus))
        return
    recipe = RECIPES[args.model]
    if args.steps is not None:
        recipe = shortened(recipe, args.steps)
    st = train(args.model, recipe, run_dir, args.corpus, save_every_s=args.save_every,
               log=lambda s: print(s, flush=True), threads=args.threads, teacher_dir=args.teacher)
    print(json.dumps({"model": args.model, "step": st["step"], "params": st["params"]}), flush=True)


if __name__ == "__main__":
    main()
