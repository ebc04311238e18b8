"""Does the edge know when its answer is wrong? The bound on any gate that reads the edge (issue 26).

A clip can stay on the device only on the edge's word. Whatever the gate computes from the edge
(token entropies, the meaning gate's mass, a learned head), it ranks clips by how sure the edge is;
keeping the surest n % on the device costs, in accuracy, what the edge gets wrong on those clips.
This bench measures that bound directly, with no gate thresholds in between:

    python bench/gate_signal.py [--work DIR] [--clips 48] [--cal-clips N] [--cal-start 200] [--meas-start 300]
                                [--edge DIR | --noised-edge SCALE] [--json out.json]

For each clip of two held-out sets (`python -m specdec_cli.demo.heldout`, as bench/gate.py makes
them): the edge's greedy answer and cloud-only's, both scored against the labels; and three
edge-side signals of how sure the edge is of its answer, higher = surer:

* `confidence`: the answer's greedy log-likelihood under the rules, Σ_j log max_v p_j(v);
* `value_confidence`: the same sum over the attribute-value positions only (value_positions: the
  tokens that choose one canonical phrase of an attribute over its siblings, e.g. 较快 after 语速),
  leaving out the template and connective tokens, where the cloud's own wording varies;
* `value_min`: the least sure attribute's value log-likelihood (min over attributes of the sum
  over its positions): a clip is as good as cloud-only's only if every attribute is right;
* `meaning`: minus the answer's meaning mass Σ_j m_j under the pair's fitted `[gate]` table
  (decoding/gate.py; absent when the presets files hold none that applies);
* `probe`: a linear head (logistic regression, fit_probe) on the mean of the edge's last hidden
  states over its answer, its confidence and its length, trained to tell the clips whose answer is
  as accurate as cloud-only's: fitted on the calibration set (or on `--probe-clips` other held-out
  clips) and scored on the measurement set; on the calibration set, 8-fold cross-validated;
* `value_probe`: the same head on per-attribute features instead: each attribute's value
  log-likelihood and value entropy (12 numbers), so the head can weigh an attribute whose
  confidence means little (fitted and cross-validated as `probe`);
* `consistency`: the share of 4 perturbed copies of the clip (white noise at 30 dB SNR, twice;
  10–100 ms of leading silence, twice: changes that leave every attribute as it was) on which the
  edge's answer says the same (gate_fit.text_outcome) — semantic entropy over inputs, not samples.

Per set and signal: the AUC for "the edge's answer is as accurate as cloud-only's" (0.5 = the
signal knows nothing) with its standard error, and the frontier: keep the surest 10 / 20 / 30 % of clips on the edge
(their answer is the edge's, every other clip's is cloud-only's — the best a lossless escalation
can give them) and report the accuracy against cloud-only, in points; `oracle` ranks by the truth.
Per set also `attributes`: per attribute, the edge's accuracy, the AUC of its value
log-likelihood for "this attribute is right" (where an edge-side signal fails, which ear it is),
and `value_confidence`'s AUC had the edge known exactly when that attribute is wrong
(known_attribute_auc: what fixing that one ear's self-knowledge would buy).
A gate cannot do better than its signal's frontier; issue 26's goal needs ≥ 20 % kept within 1
point. `--noised-edge SCALE` measures the noised pair of bench/link.py instead of the bundled one
(the cloud's weights plus SCALE x each tensor's std of noise: an edge whose doubts are the cloud's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gate import ClipSet, bench_pair, decode, text_of  # noqa: E402  (bench/gate.py, beside this file)

from specdec_cli.calibrate import label_accuracy  # noqa: E402
from specdec_cli.decoding import DecodingConfig  # noqa: E402
from specdec_cli.decoding.batch_loop import generate_batch  # noqa: E402
from specdec_cli.decoding.gate import MeaningGate  # noqa: E402
from specdec_cli.decoding.processors import DecodingRules  # noqa: E402
from specdec_cli.decoding.state import ModelState  # noqa: E402
from specdec_cli.demo.heldout import write_heldout  # noqa: E402
from specdec_cli.evaluate import score  # noqa: E402
from specdec_cli.gate_fit import text_outcome  # noqa: E402
from specdec_cli.gate_presets import load_gate  # noqa: E402
from specdec_cli.models import ModelPair  # noqa: E402
from specdec_cli.phrases import ATTRIBUTES  # noqa: E402
from specdec_cli.prompt import render_prompt  # noqa: E402
from specdec_cli.remote.wire import tokenizer_fingerprint  # noqa: E402

SHARES = (0.1, 0.2, 0.3)


def auc(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """P(a positive clip scores above a negative one), ties counting half (Mann-Whitney); None when
    one class is empty."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(positive, dtype=bool)
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        return None
    above = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(above / (len(pos) * len(neg)))


def auc_se(value: float | None, positives: int, negatives: int) -> float | None:
    """The AUC's standard error (Hanley & McNeil 1982, Radiology 143:29, eq. 1; by hand: three
    lines, no dependency has it): how far a second set of as many clips could move it."""
    if value is None:
        return None
    q1, q2 = value / (2 - value), 2 * value ** 2 / (1 + value)
    var = (value * (1 - value) + (positives - 1) * (q1 - value ** 2) + (negatives - 1) * (q2 - value ** 2)) \
        / (positives * negatives)
    return float(np.sqrt(var))


def rated(scores: Sequence[float], good: Sequence[bool], edge_acc: Sequence[float],
          cloud_acc: Sequence[float]) -> dict[str, Any]:
    """One signal's part of the JSON: its AUC, the AUC's standard error and its frontier."""
    value, n = auc(scores, good), int(sum(good))
    return {"auc": value, "auc_se": auc_se(value, n, len(good) - n),
            "kept_vs_cloud_points": frontier(scores, edge_acc, cloud_acc)}


def frontier(scores: Sequence[float], edge_acc: Sequence[float], cloud_acc: Sequence[float],
             shares: Sequence[float] = SHARES) -> dict[str, float]:
    """Accuracy against cloud-only, in points, when the surest round(share·n) clips keep the edge's
    answer and every other clip gets cloud-only's (ties: the earlier clip first)."""
    edge, cloud = np.asarray(edge_acc, dtype=float), np.asarray(cloud_acc, dtype=float)
    order = sorted(range(len(edge)), key=lambda i: (-scores[i], i))
    out = {}
    for share in shares:
        kept = order[:round(share * len(edge))]
        mixed = cloud.copy()
        mixed[kept] = edge[kept]
        out[f"{share:.0%}"] = round(100 * float(mixed.mean() - cloud.mean()), 2)
    return out


def value_positions(ends: Sequence[int], text: str) -> dict[str, list[int]]:
    """Per attribute, the answer positions that choose its value: the tokens covering the characters
    of the stated canonical phrase after the prefix its phrases share (语速 of 语速较快 / 语速适中 /
    语速较慢; none for gender's 男声 / 女声). `ends[j]`: the length of the text the first j + 1 tokens
    decode to, `text` the whole answer's. An attribute stated by no phrase, or by two, gets none."""
    out: dict[str, list[int]] = {}
    for attr, phrases in ATTRIBUTES.items():
        hits = [(text.find(p), p) for p in phrases if p in text]
        if len(hits) != 1:
            out[attr] = []
            continue
        at, phrase = hits[0]
        lo, hi = at + len(os.path.commonprefix(list(phrases))), at + len(phrase)
        out[attr] = [j for j, end in enumerate(ends) if (ends[j - 1] if j else 0) < hi and end > lo]
    return out


# An attribute the answer does not state (or states twice) is wrong whatever the edge thinks: its
# value features get the floor (probability e^-10, the entropy of a uniform choice among its phrases).
MISSING_LOGP = -10.0


def attribute_features(logp: Sequence[float], entropy: Sequence[float],
                       positions: dict[str, list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per attribute (ATTRIBUTES' order): the sum of log max p and of the entropy over its value
    positions (the floor when it has none)."""
    lp = [sum(logp[j] for j in positions[a]) if positions[a] else MISSING_LOGP for a in ATTRIBUTES]
    ent = [sum(entropy[j] for j in positions[a]) if positions[a] else float(np.log(len(ATTRIBUTES[a])))
           for a in ATTRIBUTES]
    return np.array(lp), np.array(ent)


def known_attribute_auc(attr_logp: np.ndarray, right: np.ndarray, good: Sequence[bool]) -> dict[str, float | None]:
    """Per attribute a: the AUC `value_confidence` would reach if the edge knew exactly when a is
    wrong (a wrong answer to a ranks below every right one; the other attributes' value
    log-likelihoods rank within). Which attribute's missing self-knowledge holds the signal back.
    `attr_logp`, `right`: clips x attributes (ATTRIBUTES' order)."""
    out = {}
    for k, attr in enumerate(ATTRIBUTES):
        rest = attr_logp.sum(1) - attr_logp[:, k]
        # the rest's spread is below 1e6 nats: the known attribute orders first
        out[attr] = auc(right[:, k] * 1e6 + rest, good)
    return out


class AnswerSignals(NamedTuple):
    """Per position of the edge's answer: log max p, the entropy and the meaning mass (None without
    a gate), all under the rules; and the mean of the edge's last hidden states over the answer."""

    logp: np.ndarray
    entropy: np.ndarray
    mass: np.ndarray | None
    states: np.ndarray


@torch.inference_mode()
def answer_signals(pair: ModelPair, inputs: Any, answer: list[int], cfg: DecodingConfig,
                   gate: MeaningGate | None) -> AnswerSignals:
    """The edge's own view of its answer, teacher-forced (one forward), under the rules."""
    edge = ModelState(pair.edge, "edge")
    hidden: list[torch.Tensor] = []  # per forward, the LM head's inputs: the rows its logits come from
    hook = pair.edge.get_output_embeddings().register_forward_hook(lambda _m, a, _o: hidden.append(a[0][0]))
    try:
        first = edge.prefill(inputs)
        prompt = list(edge.ids)
        rows = torch.cat([first[None], edge.advance(answer)]) if answer else first[None]
    finally:
        hook.remove()
    # the prefill's last row predicts answer[0], the answer's rows the rest (its last row: what follows)
    states = torch.cat([hidden[0][-1:], *hidden[1:]])[: max(len(answer), 1)].float().mean(0).numpy()
    rules = DecodingRules.build(cfg, pair.masks, len(prompt), pair.eos_ids)
    logp, entropy, mass = [], [], []
    for j, token in enumerate(answer):
        p = torch.softmax(rules.process_ids(prompt + answer[:j], rows[j], warp=False).double(), dim=-1)
        logp.append(float(torch.log(p.max())))
        entropy.append(float(torch.special.entr(p).sum()))
        if gate is not None:
            mass.append(gate.score(p.numpy(), token))
    return AnswerSignals(np.array(logp), np.array(entropy), np.array(mass) if gate is not None else None, states)


def decoded_ends(pair: ModelPair, answer: list[int]) -> list[int]:
    """value_positions' `ends`: the decoded length of each prefix of the answer (decoding prefixes,
    not tokens one by one, so a character split across tokens lands on the token that completes it)."""
    return [len(pair.tokenizer.decode(answer[: j + 1], skip_special_tokens=True)) for j in range(len(answer))]


def fit_probe(features: np.ndarray, good: Sequence[bool], l2: float = 1.0) -> Any:
    """A linear head on clip features (Judge Decoding's idea at clip level): logistic regression
    with an L2 penalty of `l2` per clip, fitted with torch's L-BFGS; returns features -> score.
    (scikit-learn would do the same; it is not a dependency, and this is ten lines.)"""
    mu, sd = features.mean(0), features.std(0) + 1e-6
    x = torch.tensor((features - mu) / sd, dtype=torch.float64)
    y = torch.tensor(np.asarray(good, dtype=float))
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=300)

    def loss() -> torch.Tensor:
        opt.zero_grad()
        value = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y) + l2 * (w ** 2).sum() / len(y)
        value.backward()
        return value

    opt.step(loss)
    weights, bias = w.detach().numpy(), float(b.detach())
    return lambda f: ((f - mu) / sd) @ weights + bias


def perturbed(audio: np.ndarray, rate: int, seed: int) -> list[np.ndarray]:
    """Four copies that say the same about the speaker: white noise at 30 dB SNR (two seeds), and
    10–100 ms of leading silence (two lengths)."""
    rng = np.random.default_rng(seed)
    power = float(np.mean(audio.astype(np.float64) ** 2)) or 1e-12
    noisy = [(audio + rng.standard_normal(len(audio)) * np.sqrt(power / 1e3)).astype(np.float32) for _ in range(2)]
    shifted = [np.concatenate([np.zeros(int(rng.integers(rate // 100, rate // 10)), np.float32), audio])
               for _ in range(2)]
    return noisy + shifted


def cross_validated(features: np.ndarray, good: Sequence[bool], folds: int = 8) -> list[float]:
    """Out-of-fold probe scores: each clip scored by a head fitted on the other folds (clips dealt
    round-robin), so the calibration set's figure is not the head's fit to itself."""
    scores = [0.0] * len(good)
    for fold in range(folds):
        test = list(range(fold, len(good), folds))
        train = [i for i in range(len(good)) if i % folds != fold]
        if not test or len({good[i] for i in train}) < 2:
            continue
        head = fit_probe(features[train], [good[i] for i in train])
        for i, value in zip(test, head(features[test]), strict=True):
            scores[i] = float(value)
    return scores


PROBES = ("probe", "value_probe")  # the learned signals: fitted on one set, scored on another


class Measured(NamedTuple):
    """One set's figures (the JSON's part), and per clip: each probe's features, whether the edge's
    answer is as accurate as cloud-only's, and both accuracies."""

    report: dict[str, Any]
    features: dict[str, np.ndarray]
    good: list[bool]
    edge_acc: list[float]
    cloud_acc: list[float]


def measure(pair: ModelPair, directory: Path, gate: MeaningGate | None, batch: int,
            probes: dict[str, Any] | None = None) -> Measured:
    """One set of clips. `probes`: fitted heads (fit_probe on another set) by name, scored as more
    signals."""
    cfg = DecodingConfig()
    clips = ClipSet(pair, directory)
    edge = decode(pair, clips, cfg.with_(mode="edge"), None, batch)
    cloud = decode(pair, clips, cfg.with_(mode="cloud"), None, batch)
    edge_text = [text_of(pair, r.tokens) for r in edge]
    edge_acc = [label_accuracy(t, lab) for t, lab in zip(edge_text, clips.labels, strict=True)]
    cloud_acc = [label_accuracy(text_of(pair, r.tokens), lab) for r, lab in zip(cloud, clips.labels, strict=True)]
    signals: dict[str, list[float]] = {"confidence": [], "value_confidence": [], "value_min": [], "meaning": []}
    features: dict[str, list[np.ndarray]] = {name: [] for name in PROBES}
    attr_logp = []
    for inputs, r in zip(clips.inputs, edge, strict=True):
        answer = [int(t) for t in r.tokens]
        got = answer_signals(pair, inputs, answer, cfg, gate)
        positions = value_positions(decoded_ends(pair, answer),
                                    pair.tokenizer.decode(answer, skip_special_tokens=True))
        lp, ent = attribute_features(got.logp, got.entropy, positions)
        attr_logp.append(lp)
        conf = float(got.logp.sum())
        signals["confidence"].append(conf)
        signals["value_confidence"].append(float(lp.sum()))
        signals["value_min"].append(float(lp.min()))
        signals["meaning"].append(-float(got.mass.sum()) if got.mass is not None else float("nan"))
        features["probe"].append(np.concatenate([got.states, [conf, len(answer)]]))
        features["value_probe"].append(np.concatenate([lp, ent]))
    if gate is None:
        del signals["meaning"]
    # consistency: the edge on perturbed copies, batched like the edge-only run
    rate = pair.processor.sampling_rate
    copies = [(i, c, pair.processor(a, render_prompt()).to(pair.edge.device))
              for i, audio in enumerate(clips.audios) for c, a in enumerate(perturbed(audio, rate, i))]
    said = {key: text_outcome(text_of(pair, r.tokens))
            for key, r in generate_batch(pair.edge, [((i, c), x) for i, c, x in copies], cfg.with_(mode="edge"),
                                         pair.masks, pair.eos_ids, batch)}
    signals["consistency"] = [sum(said[(i, c)] == text_outcome(edge_text[i]) for c in range(4)) / 4
                              for i in range(len(clips.audios))]
    good = [e >= c for e, c in zip(edge_acc, cloud_acc, strict=True)]
    matrices = {name: np.array(rows) for name, rows in features.items()}
    for name, head in (probes or {}).items():
        signals[name] = [float(v) for v in head(matrices[name])]
    oracle = [e - c for e, c in zip(edge_acc, cloud_acc, strict=True)]
    right = [score(t, lab)["correct"] for t, lab in zip(edge_text, clips.labels, strict=True)]
    known = known_attribute_auc(np.array(attr_logp), np.array([[r[a] for a in ATTRIBUTES] for r in right]), good)
    report = {
        "clips": len(good),
        "edge_accuracy": round(100 * float(np.mean(edge_acc)), 2),
        "cloud_accuracy": round(100 * float(np.mean(cloud_acc)), 2),
        "edge_as_good_as_cloud": int(sum(good)),
        "signals": {name: rated(s, good, edge_acc, cloud_acc) for name, s in signals.items()},
        "oracle": {"kept_vs_cloud_points": frontier(oracle, edge_acc, cloud_acc)},
        "attributes": {attr: {"edge_accuracy": round(100 * float(np.mean([r[attr] for r in right])), 2),
                              "value_confidence_auc": auc([lp[k] for lp in attr_logp], [r[attr] for r in right]),
                              "value_confidence_auc_if_known": known[attr]}
                       for k, attr in enumerate(ATTRIBUTES)},
    }
    return Measured(report, matrices, good, edge_acc, cloud_acc)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, help="folder for the clips (default: a temporary one)")
    ap.add_argument("--clips", type=int, default=48)
    ap.add_argument("--cal-clips", type=int, help="clips in the calibration set (default: --clips)")
    ap.add_argument("--cal-start", type=int, default=200)
    ap.add_argument("--meas-start", type=int, default=300)
    ap.add_argument("--edge", type=Path, help="an edge checkpoint folder instead of the bundled demo edge")
    ap.add_argument("--cloud", type=Path, help="a cloud checkpoint folder instead of the bundled demo cloud")
    ap.add_argument("--noised-edge", type=float, metavar="SCALE", help="the noised pair (bench/link.py's)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--probe-clips", type=int, default=0,
                    help="fit the probes on this many other held-out clips instead of the calibration set")
    ap.add_argument("--probe-start", type=int, default=400)
    ap.add_argument("--json", type=Path, help="write the results here (JSON; default: stdout)")
    ap.add_argument("--label", help="a name for the pair in the JSON (e.g. v3, v4; the docs tables' column)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        dirs = {"calibration": work / "cal", "measurement": work / "meas"}
        for directory, n, start in ((dirs["calibration"], args.cal_clips or args.clips, args.cal_start),
                                    (dirs["measurement"], args.clips, args.meas_start)):
            if not (directory / "labels.jsonl").is_file():
                write_heldout(directory, n, start)
        pair = bench_pair(args.edge, args.noised_edge, Path(tmp), args.cloud)
        gate = load_gate(pair.presets_file, tokenizer_fingerprint(pair.tokenizer))
        result = {**({"label": args.label} if args.label else {}),
                  "edge": (f"the bundled cloud plus noise x{args.noised_edge} of each tensor's std"
                           if args.noised_edge is not None else f"the edge in {args.edge}" if args.edge
                           else "the bundled demo edge"),
                  "cloud": f"the cloud in {args.cloud}" if args.cloud else "the bundled demo cloud",
                  "gate": "the presets file's [gate] table" if gate is not None else None,
                  "sets": {name: f"held-out clips from {start}, as many as {directory}/labels.jsonl lists"
                           for (name, directory), start in zip(dirs.items(), (args.cal_start, args.meas_start),
                                                               strict=True)},
                  "probe": (f"both probes fitted on {args.probe_clips} other held-out clips from {args.probe_start}"
                            if args.probe_clips else "both probes fitted on the calibration set's clips")
                  + ", scored on the measurement set's; on the calibration set: 8-fold cross-validated"}
        cal = measure(pair, dirs["calibration"], gate, args.batch_size)
        for name in PROBES:
            folds = cross_validated(cal.features[name], cal.good)
            cal.report["signals"][name] = rated(folds, cal.good, cal.edge_acc, cal.cloud_acc)
        train = cal
        if args.probe_clips:
            probe_dir = work / "probe"
            if not (probe_dir / "labels.jsonl").is_file():
                write_heldout(probe_dir, args.probe_clips, args.probe_start)
            train = measure(pair, probe_dir, gate, args.batch_size)
        heads = {name: fit_probe(train.features[name], train.good) for name in PROBES}
        meas = measure(pair, dirs["measurement"], gate, args.batch_size, heads)
        result["calibration"], result["measurement"] = cal.report, meas.report
    text = json.dumps(result, indent=1, ensure_ascii=False)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
