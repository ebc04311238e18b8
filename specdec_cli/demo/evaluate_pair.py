"""Evaluate a demo pair on the held-out clips and write `REPORT.md` + `report.json` next to it.

    python -m specdec_cli.demo.train edge_v4 --export DIR/edge
    python -m specdec_cli.demo.train cloud_v4 --export DIR/cloud
    python -m specdec_cli.demo.evaluate_pair --models DIR [--corpus .demo-work/corpus-v4]

On corpus v4 (demo contract v3: labels measured from the audio) every held-out set is evaluated:
held-out sentences of the training voices (`val`), the held-out voices (`val_voices`) and the
held-out synthesizer (`val_synth`), each clean and with 20-30 dB white noise, per attribute and per
voice group (synthesizer and gender). `accuracy`/`noisy`/`mean_accuracy` stay those of `val`.

On corpus v5 (demo contract v4) each held-out set is also evaluated through every channel family
the corpus wrote it through (telephone, low bit-rate codec, room, noisy far field: `<set>_<family>`),
and an attribute a clip leaves out (ambiguous) is scored over the clips labelled for it: each table
says how many clips were scored per attribute.

Everything goes through the model folders and the inference path: `from_pretrained`, and HF greedy
`model.generate(**inputs, do_sample=False)`. The held-out inputs are the corpus's stored log-mels,
which `corpus.log_mel` computed with `AudioTextProcessor.features` itself, and the prompt ids are
checked against the processor's when the split is loaded, so they are what `specdec` would feed.

Measured (issue 11's bar):
  - per-attribute accuracy (`phrases.predict`: exactly one phrase of the attribute, the labelled
    one), per length bucket (<= 8, 9-20, 21-40 characters) and on the same clips with 20-30 dB noise;
  - ms per generated token (greedy, batch 1, prefill excluded: generate(n) - generate(1));
  - held-out teacher-forced NLL and accuracy;
  - the edge's uncertainty vs the cloud: teacher-forced along the edge's own greedy output, per token
    the edge entropy (nats) and whether the cloud's argmax at the same prefix differs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Qwen2_5OmniThinkerForConditionalGeneration

from ..phrases import ATTRIBUTES, predict
from ..processor import AudioTextProcessor
from .corpus import BUCKETS
from .train import CORPORA, MODELS_DIR, AttributeSpans, Corpus, evaluate_tf, n_params

MAX_NEW = 60


def load(folder: Path) -> tuple[Qwen2_5OmniThinkerForConditionalGeneration, AudioTextProcessor]:
    model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(folder)
    model.eval()
    return model, AudioTextProcessor.from_pretrained(folder)


def inputs_of(data: Corpus, i: int) -> dict[str, torch.Tensor]:
    """Thinker inputs of held-out clip i, as the processor builds them (prompt without the answer)."""
    b = data.batch([i])
    n = b["starts"][0]
    return {"input_ids": b["input_ids"][:, :n], "attention_mask": b["attention_mask"][:, :n],
            "input_features": b["input_features"], "feature_attention_mask": b["feature_attention_mask"]}


@torch.no_grad()
def greedy(model, inputs: dict, max_new: int = MAX_NEW) -> list[int]:
    model.model.rope_deltas = None  # per-clip state kept on the model (field notes)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


@torch.no_grad()
def ms_per_token(model, inputs: dict, n: int = 30, reps: int = 3) -> float:
    """Decode cost per generated token: (generate n) - (generate 1), forced to n tokens."""
    def run(k: int) -> float:
        model.model.rope_deltas = None
        t = time.perf_counter()
        model.generate(**inputs, do_sample=False, max_new_tokens=k, min_new_tokens=k)
        return time.perf_counter() - t
    run(2)
    return min(1000 * (run(n + 1) - run(1)) / n for _ in range(reps))


SPEED_ROUNDS = 5


def paired_speeds(edge, cloud, inputs: dict, rounds: int = SPEED_ROUNDS) -> dict[str, float]:
    """ms per generated token of both models, measured in turns (edge, cloud, edge, cloud, …) and
    the best of `rounds` kept for each: on a shared machine the load changes over minutes, and the
    report's claim is a ratio (the edge costs at most half the cloud per token), so both are measured
    under the same load rather than one after the other's whole evaluation."""
    best = {"edge": float("inf"), "cloud": float("inf")}
    for _ in range(rounds):
        for name, model in (("edge", edge), ("cloud", cloud)):
            best[name] = min(best[name], ms_per_token(model, inputs, reps=1))
    return best


@torch.no_grad()
def entropy_disagreement(edge, cloud, inputs: dict, answer: list[int]) -> tuple[list[float], list[int]]:
    """Teacher-forced along `answer` (the edge's greedy tokens): per token the edge's entropy and
    whether the cloud's argmax differs from the edge's token."""
    n = len(answer)
    ids = torch.cat([inputs["input_ids"], torch.tensor([answer])], dim=1)
    feed = {**inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for m in (edge, cloud):
        m.model.rope_deltas = None
    le = edge(**feed).logits[0, -n - 1:-1].float()
    lc = cloud(**feed).logits[0, -n - 1:-1].float()
    lp = F.log_softmax(le, -1)
    ent = (-(lp.exp() * lp).sum(-1)).tolist()
    dis = (lc.argmax(-1) != torch.tensor(answer)).int().tolist()
    return ent, dis


def curve(ent: list[float], dis: list[int], buckets: int = 10) -> dict:
    """Disagreement rate by edge-entropy decile (low to high), and top-decile / bottom-half ratio."""
    e, d = np.asarray(ent), np.asarray(dis, dtype=float)
    order = np.argsort(e, kind="stable")
    e, d = e[order], d[order]
    parts = np.array_split(np.arange(len(e)), buckets)
    rows = [{"decile": i + 1, "entropy_min": float(e[p].min()), "entropy_max": float(e[p].max()),
             "tokens": len(p), "disagree_rate": float(d[p].mean())} for i, p in enumerate(parts) if len(p)]
    half = d[: len(d) // 2].mean() if len(d) > 1 else 0.0
    top = d[parts[-1]].mean() if len(parts[-1]) else 0.0
    return {"deciles": rows, "bottom_half_rate": float(half), "top_decile_rate": float(top),
            "ratio": float(top / half) if half > 0 else None, "tokens": len(e), "overall_rate": float(d.mean())}


HELD_OUT = {"val": "held-out sentences, training voices", "val_voices": "held-out voices",
            "val_synth": "held-out synthesizer"}
# The copies of each held-out set: "" is the clean set; v4 corpora have the noisy copy alone.
COPIES = {"": "clean", "_noisy": "20-30 dB", "_telephone": "telephone", "_codec": "codec", "_room": "room",
          "_far_field": "far field"}


def voice_group(meta: dict) -> str:
    """A clip's voice group: its synthesizer and its speaker's gender."""
    synth = meta.get("synth") or "espeak-ng"
    return f"{synth} {meta['labels']['gender']}"


def greedy_accuracy(model, tok, data: Corpus, clips: list[int]) -> tuple[dict, list[dict]]:
    """Per bucket, per voice group (v4) and "all": per-attribute greedy accuracy; plus a few examples."""
    hits: dict[str, dict[str, list[int]]] = {}
    examples = []
    for i in clips:
        text = tok.decode(greedy(model, inputs_of(data, i)), skip_special_tokens=True)
        pred, gold = predict(text), data.meta[i]["labels"]
        keys = [data.meta[i]["bucket"], "all"] + (["group:" + voice_group(data.meta[i])] if "voice" in data.meta[i] else [])
        for bucket in keys:
            h = hits.setdefault(bucket, {a: [0, 0] for a in ATTRIBUTES})
            for a in ATTRIBUTES:
                if a in gold:  # corpus v5's held-out clips leave an ambiguous attribute out
                    h[a][0] += int(pred[a] == gold[a])
                    h[a][1] += 1
        if len(examples) < 5:
            examples.append({"sentence": data.meta[i]["sentence"], "target": data.meta[i]["target"], "output": text,
                             **({"voice": data.meta[i]["voice"]} if "voice" in data.meta[i] else {})})
    # an attribute no clip of the group was labelled for has no score (None), and the mean is over
    # the attributes that have one
    acc = {b: {a: c / n if n else None for a, (c, n) in h.items()} for b, h in hits.items()}
    for b, v in acc.items():
        scored = [v[a] for a in ATTRIBUTES if v[a] is not None]
        v["mean"] = sum(scored) / len(scored) if scored else None
        v["clips"] = hits[b]["gender"][1]
        v["scored"] = {a: n for a, (_, n) in hits[b].items()}
    return acc, examples


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=MODELS_DIR, help="folder with edge/ and cloud/")
    ap.add_argument("--corpus", type=Path, default=CORPORA["v4"])
    ap.add_argument("--limit", type=int, default=None, help="evaluate only every n-th held-out clip up to N clips")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", choices=("cloud", "edge"), default=None,
                    help="evaluate one model (its greedy accuracy per set and channel) into --json, not the "
                         "pair's REPORT.md (a before/after of one model costs half the time)")
    ap.add_argument("--json", type=Path, default=None, help="with --only: where to write its figures")
    ap.add_argument("--speed", action="store_true",
                    help="measure only the ms per token of both models again (in turns, best of 5) into the "
                         "existing report.json and REPORT.md of --models, e.g. on a quieter machine")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.only:
        only(args)
        return
    if args.speed:
        speed_only(args)
        return

    edge, proc = load(args.models / "edge")
    cloud, proc_c = load(args.models / "cloud")
    if proc.tokenizer.get_vocab() != proc_c.tokenizer.get_vocab():
        raise SystemExit("the pair must share a tokenizer")
    tok = proc.tokenizer
    spans = AttributeSpans(tok)
    names = [s for s in HELD_OUT if any(args.corpus.glob(f"{s}-*.json"))]
    copies = [c for c in COPIES if all(any(args.corpus.glob(f"{n}{c}-*.json")) for n in names)]
    sets = {f"{n}{c}": Corpus(f"{n}{c}", tok, spans, args.corpus) for n in names for c in copies}

    def pick(n: int) -> list[int]:
        return list(range(n)) if not args.limit else list(range(0, n, max(1, n // args.limit)))[: args.limit]

    clips = {n: pick(len(sets[n])) for n in names}
    res: dict = {"models": {}, "eval_clips": len(clips["val"]), "sets": {n: len(c) for n, c in clips.items()}}
    probe = inputs_of(sets["val"], min(range(len(sets["val"])), key=lambda i: abs(sets["val"].frames(i) - 600)))
    for name, model in (("edge", edge), ("cloud", cloud)):
        per_set = {}
        for n in names:
            acc, examples = greedy_accuracy(model, tok, sets[n], clips[n])
            per_set[n] = {"clean": acc, "examples": examples}
            for c in copies[1:]:
                per_set[n][COPIES[c] if c != "_noisy" else "noisy"] = greedy_accuracy(model, tok, sets[f"{n}{c}"],
                                                                                       clips[n])[0]
        tf = evaluate_tf(model, sets["val"])
        val = per_set["val"]
        res["models"][name] = {"params": n_params(model), "accuracy": val["clean"], "noisy": val["noisy"]["all"],
                               "mean_accuracy": val["clean"]["all"]["mean"], "ms_per_token": None,
                               "heldout_nll": tf["nll"], "teacher_forced": tf["acc"], "examples": val["examples"],
                               "sets": per_set}
        print(name, json.dumps({n: {k: round(x["all"]["mean"], 4) for k, x in v.items() if k != "examples"}
                                for n, v in per_set.items()}), flush=True)
    set_speeds(res, paired_speeds(edge, cloud, probe))
    ent_all: list[float] = []
    dis_all: list[int] = []
    for n in names:
        for i in clips[n]:
            inputs = inputs_of(sets[n], i)
            e, d = entropy_disagreement(edge, cloud, inputs, greedy(edge, inputs))
            ent_all += e
            dis_all += d
    res["entropy_curve"] = curve(ent_all, dis_all)
    meta_file = args.corpus / "meta.json"  # written when the whole corpus is built
    meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.exists() else {}
    res["corpus"] = {k: v for k, v in meta.items() if k not in ("val_clause_list", "cut_points", "templates")}
    (args.models / "report.json").write_text(json.dumps(res, ensure_ascii=False, indent=1), encoding="utf-8")
    (args.models / "REPORT.md").write_text(render_md(res), encoding="utf-8")
    print(render_md(res))


def set_speeds(res: dict, speeds: dict[str, float]) -> None:
    for name, ms in speeds.items():
        res["models"][name]["ms_per_token"] = ms
    res["speed"] = {"method": f"ms per generated token, edge and cloud in turns, best of {SPEED_ROUNDS} rounds",
                    "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def speed_only(args: argparse.Namespace) -> None:
    """--speed: the pair's ms per token measured again (nothing else), written into its report."""
    report = args.models / "report.json"
    res = json.loads(report.read_text(encoding="utf-8"))
    edge, proc = load(args.models / "edge")
    cloud, _ = load(args.models / "cloud")
    val = Corpus("val", proc.tokenizer, AttributeSpans(proc.tokenizer), args.corpus)
    probe = inputs_of(val, min(range(len(val)), key=lambda i: abs(val.frames(i) - 600)))
    set_speeds(res, paired_speeds(edge, cloud, probe))
    report.write_text(json.dumps(res, ensure_ascii=False, indent=1), encoding="utf-8")
    (args.models / "REPORT.md").write_text(render_md(res), encoding="utf-8")
    print(json.dumps({n: round(m["ms_per_token"], 3) for n, m in res["models"].items()}))


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def only(args: argparse.Namespace) -> None:
    """--only MODEL: one model's greedy accuracy on every held-out set and copy, as JSON."""
    model, proc = load(args.models / args.only)
    tok = proc.tokenizer
    spans = AttributeSpans(tok)
    names = [s for s in HELD_OUT if any(args.corpus.glob(f"{s}-*.json"))]
    copies = [c for c in COPIES if all(any(args.corpus.glob(f"{n}{c}-*.json")) for n in names)]
    out: dict = {"model": str(args.models / args.only), "corpus": str(args.corpus), "sets": {},
                 "command": "python -m specdec_cli.demo.evaluate_pair --models " + str(args.models)
                 + f" --corpus {args.corpus} --only {args.only}"}
    for n in names:
        for c in copies:
            data = Corpus(f"{n}{c}", tok, spans, args.corpus)
            n_clips = len(data)
            pick = list(range(n_clips)) if not args.limit else list(range(0, n_clips, max(1, n_clips // args.limit)))[:args.limit]
            acc, _ = greedy_accuracy(model, tok, data, pick)
            out["sets"].setdefault(n, {})[COPIES[c] if c != "_noisy" else "noisy"] = acc
            print(n, COPIES[c], round(acc["all"]["mean"], 4), flush=True)
    text = json.dumps(out, ensure_ascii=False, indent=1)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)


def render_md(r: dict) -> str:
    """The human-readable report: per-bucket and noisy tables, cost, uncertainty."""
    e, c = r["models"]["edge"], r["models"]["cloud"]
    cols = [*ATTRIBUTES, "mean"]
    rows = [f"{lo}-{hi}" for lo, hi in BUCKETS] + ["all"]

    def table(m: dict) -> list[str]:
        out = ["| held-out clips | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for b in rows:
            if b in m["accuracy"]:
                label = "all (clean)" if b == "all" else f"{b} characters"
                out.append(f"| {label} | " + " | ".join(_pct(m['accuracy'][b][x]) for x in cols) + " |")
        out.append("| all, 20-30 dB noise | " + " | ".join(_pct(m['noisy'][x]) for x in cols) + " |")
        return out

    def sets_table(m: dict) -> list[str]:
        if "sets" not in m:
            return []
        out = ["| held-out set | channel | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
        left_out = []
        for n, v in m["sets"].items():
            for kind in (k for k in v if k != "examples"):
                a = v[kind]["all"]
                out.append(f"| {HELD_OUT[n]} | {'20-30 dB' if kind == 'noisy' else kind} | "
                           + " | ".join(_pct(a[x]) for x in cols) + " |")
                if any(a.get("scored", {}).get(x, a["clips"]) != a["clips"] for x in ATTRIBUTES):
                    left_out.append(f"{HELD_OUT[n]}, {kind}: " + ", ".join(
                        f"{x} {a['clips'] - a['scored'][x]}" for x in ATTRIBUTES if a["scored"][x] != a["clips"]))
        if left_out:
            out += ["", "Clips left out of an attribute's score (its measure fell in a gap between bands): "
                    + "; ".join(left_out) + "."]
        out += ["", "Per voice group (synthesizer, gender), clean / noisy mean:", "",
                "| held-out set | voice group | clips | " + " | ".join(cols) + " | noisy mean |",
                "|---|---|---|" + "---|" * len(cols) + "---|"]
        for n, v in m["sets"].items():
            for g in sorted(k for k in v["clean"] if k.startswith("group:")):
                c, z = v["clean"][g], v["noisy"].get(g, {})
                out.append(f"| {HELD_OUT[n]} | {g[6:]} | {c.get('clips', '')} | " + " | ".join(_pct(c[x]) for x in cols)
                           + f" | {_pct(z.get('mean'))} |")
        return out

    ec = r["entropy_curve"]
    cp = r["corpus"]
    return "\n".join([
        "# Demo pair: held-out evaluation",
        "",
        "Generated by `python -m specdec_cli.demo.evaluate_pair` (measured, not edited).",
        "",
        (f"- Corpus v{cp['version']} (demo contract v{cp['contract']}, labels measured from the audio): "
         + (f"{cp['sizes']['train']} training clips" if cp["sizes"]["train"] else
            "held-out sets built alone (evaluating needs no training clips)") + "; held-out sets "
         + ", ".join(f"{HELD_OUT[n]} {k}" for n, k in r.get("sets", {}).items())
         + (" clips, clean, with 20-30 dB white noise and through a telephone line, a low bit-rate codec, a "
            "room and a noisy far field (demo contract v4: the channel is part of the clip)"
            if cp.get("contract", 0) >= 4 else " clips, clean and with 20-30 dB white noise.") if "sizes" in cp else
         "- Corpus: (its meta.json was not written yet)" if not cp else
         f"- Corpus v2: {cp['train_clips']} training clips ({cp['clip_hours']['train']:.1f} h), "
         f"{cp['val_clips']} held-out clips from held-out clauses, clean and with 20-30 dB white noise."),
        f"- Evaluated: {r['eval_clips']} held-out clips of the training voices, HF greedy generate.",
        "",
        "| | edge | cloud |",
        "|---|---|---|",
        f"| params (without the unused vision tower) | {e['params']['no_vision']:,} | {c['params']['no_vision']:,} |",
        f"| ms per generated token (batch 1{', ' + r['speed']['method'].split(', ', 1)[1] if 'speed' in r else ''}) "
        f"| {e['ms_per_token']:.2f} | {c['ms_per_token']:.2f} |",
        f"| held-out NLL per answer token | {e['heldout_nll']:.4f} | {c['heldout_nll']:.4f} |",
        "",
        "## Cloud", "", *table(c), "", *sets_table(c), "", "## Edge", "", *table(e), "", *sets_table(e), "",
        "## Edge uncertainty vs cloud disagreement", "",
        "| entropy decile | entropy range (nats) | tokens | cloud disagrees |", "|---|---|---|---|",
        *[f"| {d['decile']} | {d['entropy_min']:.3f}-{d['entropy_max']:.3f} | {d['tokens']} | {d['disagree_rate']:.1%} |"
          for d in ec["deciles"]],
        "",
        f"Top decile {ec['top_decile_rate']:.1%}, bottom half {ec['bottom_half_rate']:.2%}, ratio "
        + (f"{ec['ratio']:.1f}x" if ec["ratio"] is not None else "unbounded (no bottom-half disagreement)"),
        "",
        "## Examples (held-out)", "",
        *[f"- {x['sentence']}  \n  edge: {x['output']}  \n  cloud: {y['output']}  \n  gold: {x['target']}"
          for x, y in zip(e["examples"], c["examples"], strict=True)],
        "",
    ])


if __name__ == "__main__":
    main()
