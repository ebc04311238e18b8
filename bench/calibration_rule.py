"""How often calibrate's rule for "within N points" picks a setting that is not (issue 41 item 5),
against the plain rule and the one-standard-error rule it replaced, on synthetic sweeps whose truth
is known. No model runs: a Monte Carlo of calibration_objective.select.

    python bench/calibration_rule.py [--clips 48,96,192] [--ks 2] [--points 1] [--reps 2000] [--json out.json]

The synthetic sweep: `--ks` block lengths, each a chain of thresholds from 0 (every block verified:
cloud-only's answers) up, costing fewer cloud calls per token and losing one attribute on a growing
share of clips (LOSS_SHARE, a little more per block length; nested: a clip a threshold loses is lost
by every higher one), and winning one back on a fifth as many (so the true mean gap of threshold j
is -100 / 6 x 0.8 x its loss share, in points). Each repetition draws `--clips` clips, halves them
as calibrate does (1st, 3rd, ... / 2nd, 4th, ...) and chooses by:

* plain: the cheapest whose calibration half's mean gap is >= -points (calibrate's quality and
  fluent before issue 41);
* se1: the cheapest whose mean gap less one sample standard error is >= -points, every setting
  alone (frugal before issue 41);
* rule: calibration_objective.select at --margin 1 with calibrate.sweep_chains' order and the check
  half (today's calibrate for every preset).

Per rule and clip count: how often the choice is truly outside the budget, its mean true gap, its
mean calls per token, and how often nothing was shown within (the rule's fallback: threshold 0). A
synthetic truth cannot say what a real pair does; it says whether the rule keeps the error rate its
margin claims, and what it costs in cloud calls, at each set size. The real measurement is a
calibration on one set and `specdec eval` on another (docs/calibrate.md).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/calibration_rule.py` from a checkout
    sys.path.insert(0, str(REPO))

from specdec_cli.calibration_objective import ClipCost, call_rate_key, quality_gap, select  # noqa: E402

# Per threshold of a chain, safest first: the share of clips on which it loses one attribute, and
# its cloud calls per output token.
LOSS_SHARE = (0.0, 0.0, 0.01, 0.03, 0.06, 0.09, 0.12, 0.18, 0.25, 0.35, 0.45)
CALLS = (0.13, 0.12, 0.11, 0.10, 0.09, 0.085, 0.08, 0.07, 0.06, 0.05, 0.04)
TOKENS = 1000  # per clip: calls per token to 3 decimals


def truth(k: int, j: int) -> float:
    """The true mean gap of threshold j of block length k, in points (losses less a fifth back)."""
    return -100.0 / 6 * min(1.0, LOSS_SHARE[j] * (1 + 0.1 * k)) * 0.8


def draw(n: int, ks: int, rng: random.Random) -> dict[str, list[ClipCost]]:
    """Every setting's clips (and cloud-only's) on n fresh clips; cloud-only wrong on one attribute
    of every clip, so that a setting can win one back as well as lose one."""
    lose = [rng.random() for _ in range(n)]
    win = [rng.random() for _ in range(n)]
    out = {"cloud-only": [ClipCost(5 / 6, TOKENS, 965, 1) for _ in range(n)]}
    for k in range(ks):
        for j, share in enumerate(LOSS_SHARE):
            p = min(1.0, share * (1 + 0.1 * k))
            calls = round(CALLS[j] * TOKENS) - k
            out[f"k{k} t{j}"] = [ClipCost(5 / 6 - (u < p) / 6 + (v < p / 5) / 6, TOKENS, calls, 1)
                                 for u, v in zip(lose, win, strict=True)]
    return out


def choose_by(rule: str, cal: dict[str, list[ClipCost]], chk: dict[str, list[ClipCost]], ks: int,
              points: float) -> tuple[str, bool]:
    names = [n for n in cal if n != "cloud-only"]
    cands = [(n, cal[n]) for n in names]
    if rule == "rule":
        chains = [[f"k{k} t{j}" for j in range(len(LOSS_SHARE))] for k in range(ks)]
        sel = select(cands, cal["cloud-only"], points, 1.0, chains=chains, key=call_rate_key,
                     check=([(n, chk[n]) for n in names], chk["cloud-only"]))
        return sel.name, sel.met
    z = 0.0 if rule == "plain" else 1.0
    fits = []
    for n in names:
        mean, se = quality_gap(cal[n], cal["cloud-only"])
        if mean - z * se >= -points - 1e-9:
            fits.append(n)
    if not fits:
        return "k0 t0", False
    return min(fits, key=lambda n: (sum(c.calls for c in cal[n]), names.index(n))), True


def run(clips: int, ks: int, points: float, reps: int, seed: int) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    found: dict[str, list[tuple[float, float, bool]]] = {r: [] for r in ("plain", "se1", "rule")}
    for _ in range(reps):
        clipset = draw(clips, ks, rng)
        cal = {n: c[0::2] for n, c in clipset.items()}
        chk = {n: c[1::2] for n, c in clipset.items()}
        for rule, got in found.items():
            name, met = choose_by(rule, cal, chk, ks, points)
            k, j = (int(x[1:]) for x in name.split())
            got.append((truth(k, j), CALLS[j], met))
    return {rule: {"outside": sum(g < -points for g, _, _ in got) / reps,
                   "true_gap": statistics.mean(g for g, _, _ in got),
                   "calls_per_token": statistics.mean(c for _, c, _ in got),
                   "fallback": sum(not m for _, _, m in got) / reps}
            for rule, got in found.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", default="48,96,192", help="clip counts (both halves together), comma list")
    ap.add_argument("--ks", type=int, default=2, help="block lengths (chains)")
    ap.add_argument("--points", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    result = {"ks": args.ks, "points": args.points, "reps": args.reps,
              "truth": [round(truth(0, j), 2) for j in range(len(LOSS_SHARE))], "runs": {}}
    print(f"true gaps along chain k0 (points): {result['truth']}", file=sys.stderr)
    print(f"{'clips':>5} {'rule':<6} {'outside':>8} {'true gap':>9} {'calls/tok':>9} {'fallback':>9}", file=sys.stderr)
    for n in (int(x) for x in args.clips.split(",")):
        rows = run(n, args.ks, args.points, args.reps, args.seed)
        result["runs"][str(n)] = rows
        for rule, r in rows.items():
            print(f"{n:>5} {rule:<6} {100 * r['outside']:>7.1f}% {r['true_gap']:>+9.2f} {r['calls_per_token']:>9.3f} "
                  f"{100 * r['fallback']:>8.1f}%", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
