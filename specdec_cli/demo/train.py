"""Train the bundled demo pair (edge, then cloud) on the synthetic corpus, CPU only.

`python -m specdec_cli.demo.train` (after `python -m specdec_cli.demo.corpus`) writes
`specdec_cli/demo/models/{edge,cloud}/` (processor + weights) and a training log per model under
`.demo-work/`. Fixed seeds; the step count, not wall time, ends a run, so a rerun is reproducible.

Inputs are exactly what inference feeds the thinker: `render_prompt()` with `<|AUDIO|>` expanded to
one placeholder per encoder frame (as `AudioTextProcessor.__call__` does), then the answer and
`<|im_end|>`. Loss only on the answer. What helps these tiny models (field notes + pilots):
  - canonical-phrase tokens carry the whole task, so their loss is up-weighted;
  - label smoothing *within an attribute* at phrase positions (the target keeps 1-eps, the other
    phrases of the same attribute share eps): the model's entropy then rises exactly where it is
    unsure about what it heard, which is what the speculative gate reads, while filler tokens stay
    confident; plus dropout and log-mel noise; the best held-out checkpoint is kept (early stopping);
  - length-bucketed batches (right padding) so padding does not dominate CPU time;
  - AdamW, linear warmup then cosine decay.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Qwen2_5OmniThinkerForConditionalGeneration

from ..phrases import ATTRIBUTES
from ..processor import AudioTextProcessor, audio_token_count
from ..prompt import AUDIO, render_prompt
from .corpus import WORK, processor
from .thinker_config import thinker_config

MODELS_DIR = Path(__file__).resolve().parent / "models"


@dataclass
class Recipe:
    """Size and schedule of one model. The edge is deliberately small, thin-eared and short-trained
    (it must stay clearly weaker than the cloud); the cloud gets the width, depth and steps."""

    size: dict
    steps: int
    lr: float
    batch: int = 32
    warmup: int = 150
    phrase_weight: float = 3.0
    first_weight: float = 1.0  # weight of the first answer token: the template, i.e. gender + emotion
    smooth: float = 0.1  # within-attribute label smoothing at phrase positions
    feat_noise: float = 0.05  # std of Gaussian noise added to the (normalised) log-mel
    eval_every: int = 200
    seed: int = 0
    init_from: str | None = None  # warm start from this model's saved folder (a second stage)
    out_name: str | None = None  # folder to write (default: the recipe's name)
    extra: dict = field(default_factory=dict)


RECIPES: dict[str, Recipe] = {
    "edge": Recipe(
        size=dict(hidden=64, layers=2, heads=4, kv_heads=2, audio_d=48, audio_layers=1, audio_heads=4, dropout=0.1),
        steps=600, lr=2e-3, eval_every=100,
    ),
    "cloud": Recipe(
        # Width goes to the ears (the audio encoder): the text side only has to copy templates.
        size=dict(hidden=128, layers=3, heads=4, kv_heads=2, ffn=384, audio_d=160, audio_layers=3, audio_heads=4,
                  audio_ffn=640, dropout=0.1),
        steps=1000, lr=1e-3, eval_every=125,
    ),
    # Second stage for the cloud (a warm restart of the cosine schedule from stage 1's best
    # checkpoint): pitch is the slow attribute for the larger model (field notes; after stage 1 greedy
    # pitch was 84%, and the first answer token -- the template, which encodes gender and emotion --
    # was the other weak decision, so it is up-weighted here).
    "cloud_ft": Recipe(
        size=dict(hidden=128, layers=3, heads=4, kv_heads=2, ffn=384, audio_d=160, audio_layers=3, audio_heads=4,
                  audio_ffn=640, dropout=0.1),
        steps=1000, lr=6e-4, warmup=50, eval_every=125, seed=1, init_from="cloud", out_name="cloud",
        first_weight=3.0,
    ),
}


# ---------------------------------------------------------------------------------------------
class Corpus:
    """Clips of one split held in memory: float16 log-mels (views into each shard) + token ids."""

    def __init__(self, split: str, proc: AudioTextProcessor, root: Path = WORK / "corpus") -> None:
        tok = proc.tokenizer
        self.feats: list[torch.Tensor] = []
        self.meta: list[dict] = []
        for path in sorted(root.glob(f"{split}-*.pt")):
            shard = torch.load(path)
            off = 0
            for n, m in zip(shard["lengths"].tolist(), shard["meta"], strict=True):
                self.feats.append(shard["features"][:, off:off + n])
                self.meta.append(m)
                off += n
        pre, post = render_prompt().split(AUDIO)
        self.pre = tok(pre, add_special_tokens=False)["input_ids"]
        self.post = tok(post, add_special_tokens=False)["input_ids"]
        self.audio_id = tok.convert_tokens_to_ids(proc.audio_token)
        cache: dict[str, list[int]] = {}
        self.answers = [cache.setdefault(m["target"], tok(m["target"] + tok.eos_token,
                                                           add_special_tokens=False)["input_ids"])
                        for m in self.meta]
        # The split prompt must equal what the processor builds at inference (same ids).
        n = audio_token_count(int(self.feats[0].shape[1])) if self.feats else 1
        ref = tok(render_prompt().replace(AUDIO, AUDIO * n), add_special_tokens=False)["input_ids"]
        assert ref == self.pre + [self.audio_id] * n + self.post, "prompt assembly differs from processor"

    def __len__(self) -> int:
        return len(self.feats)

    def prompt_len(self, i: int) -> int:
        return len(self.pre) + audio_token_count(int(self.feats[i].shape[1])) + len(self.post)

    def batch(self, idx: list[int], pad_id: int, noise: float = 0.0,
              gen: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Right-padded batch; labels are -100 on the prompt and the padding."""
        seqs, labels = [], []
        for i in idx:
            p = self.pre + [self.audio_id] * audio_token_count(int(self.feats[i].shape[1])) + self.post
            seqs.append(p + self.answers[i])
            labels.append([-100] * len(p) + self.answers[i])
        L = max(map(len, seqs))
        T = max(int(self.feats[i].shape[1]) for i in idx)
        ids = torch.full((len(idx), L), pad_id, dtype=torch.long)
        lab = torch.full((len(idx), L), -100, dtype=torch.long)
        att = torch.zeros((len(idx), L), dtype=torch.long)
        feats = torch.zeros((len(idx), 128, T))
        fmask = torch.zeros((len(idx), T), dtype=torch.long)
        for b, (s, y, i) in enumerate(zip(seqs, labels, idx, strict=True)):
            ids[b, :len(s)] = torch.tensor(s)
            lab[b, :len(y)] = torch.tensor(y)
            att[b, :len(s)] = 1
            f = self.feats[i].float()
            if noise:
                f = f + noise * torch.randn(f.shape, generator=gen)
            feats[b, :, :f.shape[1]] = f
            fmask[b, :f.shape[1]] = 1
        return {"input_ids": ids, "attention_mask": att, "input_features": feats,
                "feature_attention_mask": fmask, "labels": lab}


def bucketed_batches(data: Corpus, batch: int, rng: random.Random) -> list[list[int]]:
    """One epoch of batches: shuffle, sort by length inside windows of 50 batches, shuffle batches."""
    order = list(range(len(data)))
    rng.shuffle(order)
    out = []
    win = 50 * batch
    for k in range(0, len(order), win):
        chunk = sorted(order[k:k + win], key=data.prompt_len)
        out += [chunk[j:j + batch] for j in range(0, len(chunk), batch)]
    rng.shuffle(out)
    return [b for b in out if len(b) == batch]


# ---------------------------------------------------------------------------------------------
class PhraseTable:
    """Token ids of the canonical phrases, grouped by attribute."""

    def __init__(self, tok) -> None:
        self.attr_ids = {a: [tok.convert_tokens_to_ids(p) for p in ps] for a, ps in ATTRIBUTES.items()}
        self.attr_of = {i: a for a, ids in self.attr_ids.items() for i in ids}


def answer_loss(logits: torch.Tensor, labels: torch.Tensor, table: PhraseTable, phrase_weight: float,
                smooth: float, first_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted training loss, and the plain (unsmoothed, unweighted) mean NLL for logging."""
    logits = logits[:, :-1]
    tgt = labels[:, 1:]
    mask = tgt != -100
    # First answer position of each row (right padding: the prompt precedes it).
    first = (mask.cumsum(1) == 1) & mask
    lp = F.log_softmax(logits[mask].float(), dim=-1)
    y = tgt[mask]
    nll = -lp.gather(1, y[:, None])[:, 0]
    loss_tok = nll.clone()
    weight = torch.ones_like(nll)
    weight[first[mask]] = first_weight
    for ids in table.attr_ids.values():
        ids_t = torch.tensor(ids)
        at = torch.isin(y, ids_t)
        if not at.any():
            continue
        weight[at] = phrase_weight
        if smooth:
            # Cross-entropy against (1-eps)*onehot + eps*uniform(other phrases of this attribute).
            others = -lp[at][:, ids_t]  # (n, k)
            is_tgt = y[at][:, None] == ids_t[None, :]
            other_mean = (others * (~is_tgt)).sum(1) / (len(ids) - 1)
            loss_tok[at] = (1 - smooth) * nll[at] + smooth * other_mean
    return (loss_tok * weight).sum() / weight.sum(), nll.mean()


@torch.no_grad()
def evaluate_tf(model: Qwen2_5OmniThinkerForConditionalGeneration, data: Corpus, table: PhraseTable, pad_id: int, batch: int = 32) -> dict:
    """Teacher-forced held-out metrics: mean answer NLL, and per-attribute accuracy of the argmax at
    each phrase position (a cheap, close proxy of greedy accuracy: the template is fixed by gender
    and emotion, so the gold prefix is what a right greedy run would have produced)."""
    model.eval()
    tot_nll, n_tok = 0.0, 0
    hits = {a: [0, 0] for a in ATTRIBUTES}
    order = sorted(range(len(data)), key=data.prompt_len)
    for k in range(0, len(order), batch):
        b = data.batch(order[k:k + batch], pad_id)
        lab = b.pop("labels")
        logits = model(**b).logits[:, :-1]
        tgt = lab[:, 1:]
        mask = tgt != -100
        lp = F.log_softmax(logits[mask].float(), -1)
        y = tgt[mask]
        tot_nll += float(-lp.gather(1, y[:, None]).sum())
        n_tok += len(y)
        pred = lp.argmax(-1)
        for yi, pi in zip(y.tolist(), pred.tolist(), strict=True):
            a = table.attr_of.get(yi)
            if a:
                hits[a][0] += int(yi == pi)
                hits[a][1] += 1
    model.train()
    acc = {a: h / max(n, 1) for a, (h, n) in hits.items()}
    return {"nll": tot_nll / n_tok, "acc": acc, "mean_acc": sum(acc.values()) / len(acc)}


def n_params(model: torch.nn.Module) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    return {"total": total, "no_vision": total - vision}


def train(name: str, recipe: Recipe, out_dir: Path, log_path: Path, threads: int = 2,
          max_train: int | None = None, max_minutes: float | None = None) -> dict:
    """Train one model; keep the best held-out checkpoint; save processor + weights to `out_dir`."""
    torch.set_num_threads(threads)
    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    np.random.seed(recipe.seed)
    gen = torch.Generator().manual_seed(recipe.seed + 1)
    proc = processor()
    tok = proc.tokenizer
    pad_id = tok.pad_token_id
    table = PhraseTable(tok)
    train_set, val_set = Corpus("train", proc), Corpus("val", proc)
    if max_train:
        train_set.feats, train_set.meta = train_set.feats[:max_train], train_set.meta[:max_train]
        train_set.answers = train_set.answers[:max_train]
    if recipe.init_from:
        model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(out_dir.parent / recipe.init_from)
    else:
        model = Qwen2_5OmniThinkerForConditionalGeneration(thinker_config(tok, **recipe.size))
    model.train()
    params = n_params(model)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < recipe.warmup:
            return (step + 1) / recipe.warmup
        t = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    log = log_path.open("w", encoding="utf-8")

    def emit(rec: dict) -> None:
        log.write(json.dumps(rec, ensure_ascii=False) + "\n")
        log.flush()

    emit({"model": name, "params": params, "recipe": recipe.__dict__, "train": len(train_set), "val": len(val_set)})
    batches: list[list[int]] = []
    best: dict = {"mean_acc": -1.0, "nll": float("inf")}
    best_state = None
    history = []
    t0 = time.time()
    run_loss = run_nll = 0.0
    if recipe.init_from:  # the warm-start checkpoint stays a candidate for early stopping
        best = evaluate_tf(model, val_set, table, pad_id)
        best.update(step=0, elapsed=0.0)
        best_state = copy.deepcopy(model.state_dict())
        history.append(best)
        emit({"eval": best, "best_step": 0})
    for step in range(recipe.steps):
        if not batches:
            batches = bucketed_batches(train_set, recipe.batch, rng)
        b = train_set.batch(batches.pop(), pad_id, recipe.feat_noise, gen)
        lab = b.pop("labels")
        logits = model(**b).logits
        loss, nll = answer_loss(logits, lab, table, recipe.phrase_weight, recipe.smooth, recipe.first_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        run_loss += float(loss.detach())
        run_nll += float(nll.detach())
        if (step + 1) % 20 == 0:
            emit({"step": step + 1, "loss": run_loss / 20, "nll": run_nll / 20, "lr": sched.get_last_lr()[0],
                  "elapsed": round(time.time() - t0, 1)})
            run_loss = run_nll = 0.0
        # Safety net for a shared machine: stop at a wall-clock cap (with a final eval); the step
        # count, not this cap, is what the shipped recipe is defined by.
        out_of_time = max_minutes is not None and time.time() - t0 > 60 * max_minutes
        if (step + 1) % recipe.eval_every == 0 or step + 1 == recipe.steps or out_of_time:
            ev = evaluate_tf(model, val_set, table, pad_id)
            ev.update(step=step + 1, elapsed=round(time.time() - t0, 1))
            history.append(ev)
            # Early stopping: best held-out attribute accuracy, ties broken by lower NLL (calibration).
            better = (ev["mean_acc"] > best["mean_acc"] + 1e-9
                      or (abs(ev["mean_acc"] - best["mean_acc"]) <= 1e-9 and ev["nll"] < best["nll"]))
            if better:
                best = ev
                best_state = copy.deepcopy(model.state_dict())
            emit({"eval": ev, "best_step": best["step"]})
            if out_of_time:
                emit({"stopped_at_wall_cap": step + 1})
                break
    wall = time.time() - t0
    model.load_state_dict(best_state)
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    proc.save_pretrained(out_dir)
    model.save_pretrained(out_dir)
    # Round trip: what ships must load with the classes inference uses.
    again = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(out_dir)
    AudioTextProcessor.from_pretrained(out_dir)
    for (k, v), (k2, v2) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2), k
    summary = {"model": name, "params": params, "steps": step + 1, "planned_steps": recipe.steps, "best_step": best["step"],
               "wall_s": round(wall, 1), "threads": threads, "best_eval": best, "history": history,
               "recipe": recipe.__dict__, "train_clips": len(train_set), "val_clips": len(val_set)}
    (out_dir.parent / f"train_{name}.json").write_text(json.dumps(summary, ensure_ascii=False, indent=1),
                                                       encoding="utf-8")
    emit({"done": True, "wall_s": wall, "best_step": best["step"]})
    log.close()
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["edge", "cloud", "cloud_ft"], choices=list(RECIPES))
    ap.add_argument("--out", type=Path, default=MODELS_DIR)
    ap.add_argument("--steps", type=int, default=None, help="override (pilots)")
    ap.add_argument("--max-train", type=int, default=None, help="use only the first N training clips")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-minutes", type=float, default=None, help="wall-clock cap per model (safety net)")
    ap.add_argument("--tag", default="", help="log/output suffix (pilots)")
    args = ap.parse_args(argv)
    for name in args.models:
        recipe = copy.deepcopy(RECIPES[name])
        if args.steps:
            recipe.steps = args.steps
            recipe.eval_every = min(recipe.eval_every, args.steps)
        s = train(name, recipe, args.out / (recipe.out_name or name), WORK / f"train_{name}{args.tag}.log", args.threads,
                  args.max_train, args.max_minutes)
        print(json.dumps({k: s[k] for k in ("model", "params", "best_step", "wall_s", "best_eval")},
                         ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
