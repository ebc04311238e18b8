"""Demo pair v5's corpus (demo contract version 4): every clip comes through a channel.

    python -m specdec_cli.demo.corpus_v5 [--train N] [--val N] [--val-voices N] [--val-synth N]

writes `.demo-work/corpus-v5/` in the shard format the trainer reads (`corpus.py`: float16 log-mels
per shard, a JSON list of clips, `meta.json` with the fingerprint). The speech is made as corpus v4
makes it (`corpus_v4.py`: 50 voices of three synthesizers, targets reached with the synthesizers'
knobs, sox's tempo, Praat's PSOLA, inserted silences and a gain; labels measured), with two changes:

- **formants move apart from F0**: on 70 % of the training clips Praat's `Change gender` also scales
  the formants by a ratio drawn log-uniformly in [0.92, 1.09], independently of the pitch shift, so
  that no voice gives its gender away by the formants alone (nor by F0 alone: the pitch targets
  were already drawn independently of the voice);
- **the channel** (`channel.py`): each training clip is written twice, each copy through a channel
  drawn at random (clean is one of the draws: source rates, telephone lines with G.711 / GSM,
  Opus / MP3 / AAC, rooms, microphones, white / pink / babble noise, clipping); each held-out clip
  is written through every evaluation family (clean, telephone, low bit-rate codec, room, noisy far
  field) and, as before, with 20-30 dB white noise.

Labels (demo contract v4): gender is the voice's declared one; rate, pitch and pauses are measured on
the clean clip, before its channel (a line does not change how fast or how high someone speaks);
volume is measured on the clip as heard, after its channel (`measure.measure_level`). The copy's gain
is set after the channel so that the heard level lands on the level the clip aimed at (a telephone
band loses ~5 dB, a room gains some), capped by the peak.

Training clips are clear of every gap (a draw with an ambiguous measure is drawn again, as in v4; a
copy whose heard level falls in a gap draws its channel again). **Held-out clips keep their ambiguous
attributes**: such an attribute is left out of the clip's `labels` and listed under `ambiguous`, and
evaluation scores each attribute over the clips labelled for it.

Splits as v4's: `train`, `val` (held-out sentences of the training voices), `val_voices` (held-out
voices), `val_synth` (the held-out synthesizer, flite); each held-out split `S` is written as
`S` (clean), `S_telephone`, `S_codec`, `S_room`, `S_far_field` and `S_noisy`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from ..phrases import ATTRIBUTES
from . import channel
from .corpus import TEMPLATES, WINDOW_S, WORK, _feature_extractor, _write, describe, fingerprint, log_mel
from .corpus_v4 import (
    AIMED,
    BUCKET_NAMES,
    MAX_ATTEMPTS,
    PEAK_MAX,
    SPLITS,
    Plan,
    aims,
    plan_clip,
    render_plans,
    sox_tempo,
)
from .measure import (
    PITCH_CEILING_HZ,
    PITCH_FLOOR_HZ,
    Measures,
    band,
    cut_points,
    labels_of,
    measure,
    measure_level,
)
from .texts import BUCKETS_WORDS, BUCKETS_ZH, join, units
from .voices import SAMPLE_RATE, Voice, voices

CORPUS_V5 = WORK / "corpus-v5"
VERSION = 5
CONTRACT = 4
TRAIN_COPIES = 2  # channel copies of each training clip (the speech is the dear part; a copy is cheap)
FORMANT_SHARE = 0.7
FORMANT_RANGE = (0.92, 1.09)
CHANNEL_ATTEMPTS = 8
HELDOUT_COPIES = (*channel.EVAL_FAMILIES, "noisy")  # "noisy": v4's 20-30 dB white noise
LABELLED = ("rate", "pitch", "pauses")  # measured before the channel; volume after it


def formant_ratio(rng: random.Random, split: str) -> float:
    """The formant shift of a clip: training clips only (held-out voices are heard as they are)."""
    if split != "train" or rng.random() >= FORMANT_SHARE:
        return 1.0
    lo, hi = FORMANT_RANGE
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))), 4)


def change_gender(x: np.ndarray, semitones: float, formants: float) -> np.ndarray:
    """Praat's `Change gender` (PSOLA): pitch moved by `semitones` (to the clip's median F0 times
    2^(semitones/12)) and formants scaled by `formants`, tempo kept. corpus_v4.psola_pitch with a
    formant ratio (there always 1)."""
    if abs(semitones) <= 1e-3 and abs(formants - 1.0) <= 1e-4:
        return x
    import parselmouth
    from parselmouth.praat import call, run

    snd = parselmouth.Sound(x.astype(np.float64), sampling_frequency=SAMPLE_RATE)
    hz = snd.to_pitch_ac(time_step=0.01, pitch_floor=PITCH_FLOOR_HZ, pitch_ceiling=PITCH_CEILING_HZ
                         ).selected_array["frequency"]
    if not np.any(hz > 0):
        return x
    target = float(np.median(hz[hz > 0])) * 2 ** (semitones / 12)
    run("random_initializeWithSeedUnsafelyButPredictably (4)\n")  # see corpus_v4.psola_pitch
    out = call(snd, "Change gender", PITCH_FLOOR_HZ, PITCH_CEILING_HZ, formants, target, 1.0, 1.0)
    return out.values[0].astype(np.float32)


def assemble(plan: Plan, rendered: list[np.ndarray], formants: float) -> tuple[np.ndarray, np.ndarray]:
    """(clean clip at unit gain, speech part without padding): corpus_v4.assemble with formants."""
    pieces = []
    for k, r in enumerate(rendered):
        pieces.append(r)
        if k < len(plan.pause_s) and plan.pause_s[k] > 0:
            pieces.append(np.zeros(round(plan.pause_s[k] * SAMPLE_RATE), np.float32))
    speech = change_gender(sox_tempo(np.concatenate(pieces), plan.sox_tempo), plan.psola_pitch_st, formants)
    lead, trail = (round(s * SAMPLE_RATE) for s in (plan.pad_lead_s, plan.pad_trail_s))
    return np.concatenate([np.zeros(lead, np.float32), speech, np.zeros(trail, np.float32)]), speech


@dataclass
class Clean:
    """A clip before its channel: the speech, its measures and the labels measured before the channel."""

    plan: Plan
    formants: float
    gender: str
    measures: Measures
    audio: np.ndarray  # unit gain, padded
    speech_power: float  # mean power of the unpadded speech at unit gain
    labels: dict[str, str]  # gender, rate, pitch, pauses (those clear of the gaps)
    ambiguous: list[str]
    attempt: int
    index: int
    split: str


@dataclass
class Copy:
    """A clip as heard through one channel."""

    audio: np.ndarray
    channel: list[dict]
    gain_db: float
    level_dbfs: float | None
    labels: dict[str, str]
    ambiguous: list[str]


def _clean_labels(m: Measures, gender: str) -> tuple[dict[str, str], list[str]]:
    labels, ambiguous = labels_of(m, gender)
    keep = {"gender", *LABELLED}
    return {a: p for a, p in labels.items() if a in keep}, [a for a in ambiguous if a in keep]


def make_clean(split: str, indices: list[int], seed: int) -> list[Clean]:
    """The clean clips of `indices` in `split`: each drawn again until its rate and pitch land where
    they aimed (or, held out, in a gap next to it) and, for training, every measure before the
    channel is clear of the gaps."""
    pool: dict[str, list[Voice]] = {}
    for v in voices(SPLITS[split]):
        pool.setdefault(v.synth, []).append(v)
    by_name = {v.name: v for vs in pool.values() for v in vs}
    train = split == "train"
    done: dict[int, Clean] = {}
    pending = {i: 0 for i in indices}
    while pending:
        plans, ratios = {}, {}
        for i, a in pending.items():
            rng = random.Random(f"{seed}/{split}/{i}/{a}")
            plans[i] = plan_clip(rng, aims(random.Random(f"{seed}/{split}/{i}/aims")), split, pool, seed, 0.0, (0, 0))
            ratios[i] = formant_ratio(rng, split)
        order = sorted(plans)
        rendered = render_plans([plans[i] for i in order], by_name)
        nxt = {}
        for i, r in zip(order, rendered, strict=True):
            plan, attempt = plans[i], pending[i]
            ok = all(u is not None for u in r)
            if ok:
                x, speech = assemble(plan, r, ratios[i])
                ok = len(x) / SAMPLE_RATE <= WINDOW_S - 0.05 and bool(np.any(speech))
            if ok:
                m = measure(x, SAMPLE_RATE)
                gender = by_name[plan.voice].gender
                labels, ambiguous = _clean_labels(m, gender)
                aimed = all(labels.get(a) == plan.targets[a] or (not train and a in ambiguous) for a in AIMED)
                ok = aimed and m.level_dbfs is not None and (not train or not ambiguous)
            if ok:
                power = float(np.mean(speech.astype(np.float64) ** 2))
                done[i] = Clean(plan, ratios[i], gender, m, x, power, labels, ambiguous, attempt, i, split)
            elif attempt + 1 >= MAX_ATTEMPTS:
                raise RuntimeError(f"{split} clip {i}: {MAX_ATTEMPTS} draws, none as aimed")
            else:
                nxt[i] = attempt + 1
        pending = nxt
    return [done[i] for i in indices]


def hear(c: Clean, steps: list[dict], babble) -> Copy:
    """`c` through the channel `steps`, its gain set after the channel so that the heard level is the
    level the clip aimed at (capped by the peak), and its labels: the clean ones plus volume and
    emotion."""
    from .measure import emotion_of

    y = channel.apply(c.audio, steps, c.speech_power, babble)
    heard = measure_level(y, SAMPLE_RATE)
    gain = 0.0
    if heard is not None:
        peak = float(np.max(np.abs(y))) or 1.0
        gain = min(c.plan.gain_target_db - heard, 20 * math.log10(PEAK_MAX / peak))
        if any(s["op"] == "clip" for s in steps):
            gain = min(gain, 0.0)  # a clipped copy stays at full scale
        if band("volume", heard + gain) is None and gain < c.plan.gain_target_db - heard:
            # the peak kept the level from its aim, in a gap: settle just inside the band below (a
            # gap the aim itself leaves stays ambiguous; the cap is this corpus's doing, not the clip's)
            below = [hi for _, hi in cut_points()["bands"]["volume"]["bands"].values()
                     if hi is not None and hi < heard + gain]
            if below:
                gain = max(below) - 0.5 - heard
        y = (y * 10 ** (gain / 20)).astype(np.float32)
        heard += gain
    labels, ambiguous = dict(c.labels), list(c.ambiguous)
    vol = band("volume", heard)
    if vol is None:
        ambiguous.append("volume")
    else:
        labels["volume"] = vol
    emo = emotion_of(labels.get("rate"), labels.get("pitch"))
    if emo is None:
        ambiguous.append("emotion")
    else:
        labels["emotion"] = emo
    order = list(ATTRIBUTES)
    labels = {a: labels[a] for a in order if a in labels}
    ambiguous = sorted(set(ambiguous), key=order.index)
    return Copy(y, steps, round(gain, 2), None if heard is None else round(heard, 2), labels, ambiguous)


def _babble_from(clips: list[Clean], k: int):
    """Babble for clip k: 3-6 other clips of the shard, each at a random offset, looped to length."""
    others = [c for j, c in enumerate(clips) if j != k and c.plan.voice != clips[k].plan.voice] or \
        [c for j, c in enumerate(clips) if j != k]

    def make(n: int, rng: np.random.Generator) -> np.ndarray:
        out = np.zeros(n, np.float64)
        if not others:
            return rng.standard_normal(n)
        for j in rng.choice(len(others), size=min(len(others), int(rng.integers(3, 7))), replace=False):
            s = others[int(j)].audio.astype(np.float64)
            s = s / (np.sqrt(np.mean(s**2)) + 1e-12)
            rolled = np.roll(np.resize(s, n), int(rng.integers(0, max(1, len(s)))))
            out += rolled
        return out
    return make


def meta(c: Clean, cp: Copy, copy: int) -> dict:
    p = c.plan
    n = sum(units(x, p.lang) for x in p.parts)
    complete = len(cp.labels) == len(ATTRIBUTES)
    return {"index": c.index, "split": c.split, "copy": copy, "attempt": c.attempt, "voice": p.voice,
            "synth": p.voice.split(":")[0], "lang": p.lang, "sentence": join(p.parts, p.lang), "units": n,
            "bucket": BUCKET_NAMES[p.bucket], "labels": cp.labels, "ambiguous": cp.ambiguous,
            "template": p.template, "target": describe(cp.labels, p.template) if complete else None,
            "aimed": p.targets, "measures": asdict(c.measures), "heard_level_dbfs": cp.level_dbfs,
            "channel": cp.channel, "family": channel.family_of(cp.channel),
            "band_limited": channel.band_limited(cp.channel), "formant_ratio": c.formants,
            "controls": p.controls, "sox_tempo": p.sox_tempo, "psola_pitch_st": p.psola_pitch_st,
            "gain_target_db": p.gain_target_db, "gain_db": cp.gain_db, "pause_s": p.pause_s,
            "pad_lead_s": p.pad_lead_s, "pad_trail_s": p.pad_trail_s,
            "seconds": round(len(cp.audio) / SAMPLE_RATE, 3)}


@dataclass
class ShardJob:
    path: str  # without extension: <out>/<split>-NNN
    split: str
    seed: int
    start: int
    count: int


def make_shard(job: ShardJob) -> tuple[str, int, float, dict]:
    """Worker: a shard's clean clips, their channel copies' log-mels and metadata."""
    import torch

    torch.set_num_threads(1)
    fe = _feature_extractor()
    clips = make_clean(job.split, list(range(job.start, job.start + job.count)), job.seed)
    train = job.split == "train"
    out: dict[str, tuple[list, list]] = {}
    seconds, redraws = 0.0, 0
    for k, c in enumerate(clips):
        babble = _babble_from(clips, k)
        if train:
            copies = []
            for copy in range(TRAIN_COPIES):
                for a in range(CHANNEL_ATTEMPTS):
                    rng = random.Random(f"{job.seed}/{job.split}/{c.index}/channel/{copy}/{a}")
                    cp = hear(c, channel.draw(rng), babble)
                    if not cp.ambiguous:
                        break
                    redraws += 1
                else:
                    continue  # no channel left the heard level clear of a gap: the copy is dropped
                copies.append(("train", cp, copy))
        else:
            copies = []
            for copy, family in enumerate(HELDOUT_COPIES):
                rng = random.Random(f"{job.seed}/{job.split}/{c.index}/channel/{family}")
                if family == "noisy":
                    steps = [{"op": "family", "name": "noisy"},
                             {"op": "noise", "kind": "white", "snr_db": round(rng.uniform(20.0, 30.0), 2),
                              "seed": rng.randrange(2**31)}]
                else:
                    steps = channel.draw(rng, family)
                name = job.split if family == "clean" else f"{job.split}_{family}"
                copies.append((name, hear(c, steps, babble), copy))
        for name, cp, copy in copies:
            feats, metas = out.setdefault(name, ([], []))
            feats.append(log_mel(fe, cp.audio))
            metas.append(meta(c, cp, copy))
            seconds += len(cp.audio) / SAMPLE_RATE
    # the shard's own name last: its list is what marks the shard done (see main)
    for name, (feats, metas) in sorted(out.items(), key=lambda kv: (kv[0] == job.split, kv[0])):
        _write(job.path.replace(f"/{job.split}-", f"/{name}-"), feats, metas)
    return job.path, len(clips), seconds, {"draws": sum(c.attempt + 1 for c in clips), "channel_redraws": redraws}


def shard_jobs(out: Path, seed: int, sizes: dict[str, int], shard: int) -> list[ShardJob]:
    return [ShardJob(str(out / f"{split}-{k // shard:03d}"), split, seed, k, min(shard, n - k))
            for split, n in sizes.items() for k in range(0, n, shard)]


# The telephone sample (samples/, with v4's nine): a held-out voice, a woman, on a G.711 μ-law line,
# written as the 8 kHz file a telephone recording is. (file, split, gender, aimed bands (rate, pitch,
# volume, pauses), length bucket, telephone codec)
PHONE_SAMPLES = (("f_telephone.wav", "val_voices", "女声", ("语速适中", "音调适中", "音量适中", "停顿较少"), 1, "u-law"),)


def write_samples(out: Path, seed: int = 4) -> None:
    """samples/: corpus v4's nine clips (`corpus_v4.write_samples`, unchanged) and the telephone
    sample(s), each drawn until its labels (rate, pitch, pauses before the line; volume as heard
    through it) are every one it is named for; labels.jsonl lists them all."""
    import soundfile as sf

    from .corpus_v4 import write_samples as write_v4
    from .measure import emotion_of

    write_v4(out, seed)
    lines = (out / "labels.jsonl").read_text(encoding="utf-8").splitlines()
    by_name = {v.name: v for v in voices("heldout_voice") + voices("train") + voices("heldout_synth")}
    for k, (name, split, gender, aimed, bucket, codec) in enumerate(PHONE_SAMPLES):
        pool: dict[str, list[Voice]] = {}
        for v in voices(SPLITS[split]):
            if v.gender == gender:
                pool.setdefault(v.synth, []).append(v)
        targets = dict(zip(("rate", "pitch", "volume", "pauses"), aimed, strict=True))
        for attempt in range(400):
            rng = random.Random(f"{seed}/phone-samples/{k}/{attempt}")
            plan = plan_clip(rng, targets, split, pool, seed, 0.0, (0.0, 0.0))
            plan.bucket, plan.pad_lead_s, plan.pad_trail_s, plan.pause_s = bucket, 0.2, 0.2, []
            rendered = render_plans([plan], by_name)[0]
            if any(u is None for u in rendered):
                continue
            x, speech = assemble(plan, rendered, 1.0)
            m = measure(x, SAMPLE_RATE)
            labels, ambiguous = _clean_labels(m, gender)
            if ambiguous or any(labels[a] != targets[a] for a in ("rate", "pitch", "pauses")):
                continue
            clean = Clean(plan, 1.0, gender, m, x, float(np.mean(speech.astype(np.float64) ** 2)), labels, [],
                          attempt, k, split)
            cp = hear(clean, [{"op": "family", "name": "telephone"}, {"op": "telephone", "codec": codec}], None)
            if not cp.ambiguous and cp.labels["volume"] == targets["volume"]:
                break
        else:
            raise RuntimeError(f"sample {name}: no draw measured as named")
        from ..audio import resample

        # the file a telephone line leaves: 8 kHz (what the line carries), 16-bit
        sf.write(out / name, resample(cp.audio, SAMPLE_RATE, 8000), 8000, subtype="PCM_16")
        assert cp.labels["emotion"] == emotion_of(labels["rate"], labels["pitch"])
        lines.append(json.dumps({"file": name, "labels": cp.labels, "split": split, "voice": plan.voice,
                                 "lang": plan.lang, "sentence": join(plan.parts, plan.lang),
                                 "seconds": round(len(cp.audio) / SAMPLE_RATE, 2), "noise_snr_db": None,
                                 "channel": cp.channel, "band_limited": True, "measures": asdict(m),
                                 "heard_level_dbfs": cp.level_dbfs}, ensure_ascii=False))
    (out / "labels.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=3200, help="training clips (each written in two channels)")
    ap.add_argument("--val", type=int, default=300, help="held-out clips of the training voices")
    ap.add_argument("--val-voices", type=int, default=300, help="held-out clips of the held-out voices")
    ap.add_argument("--val-synth", type=int, default=200, help="held-out clips of the held-out synthesizer")
    ap.add_argument("--shard", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=CORPUS_V5)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--samples", type=Path, default=None, metavar="DIR",
                    help="only write the bundled demo clips + labels.jsonl to DIR (v4's nine and a telephone clip)")
    args = ap.parse_args(argv)
    if args.samples:
        write_samples(args.samples)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = {"val": args.val, "val_voices": args.val_voices, "val_synth": args.val_synth, "train": args.train}
    jobs = shard_jobs(args.out, args.seed, sizes, args.shard)
    # Resumable: a shard whose own list exists is kept (make_shard writes it last, features first).
    todo = [j for j in jobs if not Path(j.path + ".json").exists()]
    t0 = time.time()
    draws = 0
    with Pool(args.workers) as pool:
        for path, n, seconds, stats in pool.imap_unordered(make_shard, todo):
            draws += stats["draws"]
            print(f"{path}: {n} clips, {seconds / 60:.1f} min of audio, {stats['draws']} draws, "
                  f"{stats['channel_redraws']} channel redraws ({time.time() - t0:.0f}s)", flush=True)
    meta_out = {"version": VERSION, "contract": CONTRACT, "seed": args.seed, "sizes": sizes,
                "train_copies": TRAIN_COPIES, "heldout_copies": list(HELDOUT_COPIES),
                "train_channel_weights": channel.TRAIN_WEIGHTS, "formants": {"share": FORMANT_SHARE,
                                                                            "range": list(FORMANT_RANGE)},
                "build_seconds": round(time.time() - t0, 1), "draws_this_run": draws, "cut_points": cut_points(),
                "templates": list(TEMPLATES), "buckets": {"zh": BUCKETS_ZH, "words": BUCKETS_WORDS},
                "fingerprint": fingerprint(args.out)}
    (args.out / "meta.json").write_text(json.dumps(meta_out, ensure_ascii=False, indent=1), encoding="utf-8")
    print(json.dumps({k: meta_out[k] for k in ("sizes", "build_seconds", "fingerprint")}, ensure_ascii=False))


if __name__ == "__main__":
    main()
