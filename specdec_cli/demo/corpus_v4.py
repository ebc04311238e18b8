"""Demo pair v4's corpus (demo contract version 3): many voices, labels measured from the audio.

    python -m specdec_cli.demo.corpus_v4 [--train N] [--val N] [--seed S] [--workers W]

writes `.demo-work/corpus-v4/` in the shard format of version 2 (`corpus.py`: float16 log-mels per
shard, a JSON list of clips, `meta.json` with the fingerprint the trainer checks), so the trainer
reads it unchanged. Needs espeak-ng, festival with its voices, flite and sox (Debian main; see
demo-train/README.md) and praat-parselmouth.

Each clip: a voice (voices.json: 50 voices of espeak-ng, festival and flite, by split), a sentence in
its language (texts.py), and target bands drawn uniformly per attribute. The targets are reached
independently of the voice: the synthesizer's own speed and pitch knobs, then sox's `tempo` (tempo
without pitch) and Praat's PSOLA (`Change gender` with the formants kept: pitch without tempo and
without timbre; sox's `pitch` moves the formants with the pitch, so a man shifted up six semitones
sounds like a woman and his declared gender would be a wrong label), clauses rendered apart and
joined by inserted silences (pauses), a gain (level), silence padding and, for half of the training clips, white or
pink noise at 15-35 dB SNR. The finished clean clip is then **measured** (measure.py) and its
labels are what the measures say; a clip with any measure inside a gap between bands is drawn
again (its random stream is a pure function of (seed, split, index, attempt)), so every kept clip is
clear of the gaps. Noise is mixed in after measuring: labels are the speech's, not the mix's.

Splits (voices.json's `split`): `train` and `val` (held-out sentences) use the training voices;
`val_voices` the held-out voices; `val_synth` the held-out synthesizer (flite). Every held-out split
is written clean and with 20-30 dB white noise (`<split>_noisy`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import time
from dataclasses import asdict, dataclass, field
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from ..phrases import ATTRIBUTES
from .corpus import (
    TEMPLATES,
    WINDOW_S,
    WORK,
    _feature_extractor,
    _noise,
    _write,
    describe,
    fingerprint,
    log_mel,
)
from .measure import Measures, cut_points, labels_of, measure
from .texts import BUCKETS_WORDS, BUCKETS_ZH, clause_split, join, sentence, units
from .voices import SAMPLE_RATE, Controls, Voice, render_espeak, render_festival, render_flite, voices

CORPUS_V4 = WORK / "corpus-v4"
VERSION = 4
# The held-out sets and the voices they draw from (train/val: the training voices, other sentences).
SPLITS = {"train": "train", "val": "train", "val_voices": "heldout_voice", "val_synth": "heldout_synth"}
# How often each synthesizer is drawn where it has voices (espeak-ng has most voices, festival most
# languages): by synthesizer first, then a voice, so festival's few voices are not drowned out.
SYNTH_WEIGHT = {"espeak-ng": 0.55, "festival": 0.45, "flite": 1.0}
ESPEAK_ZH_SHARE = 0.75  # espeak-ng voices speak Mandarin, else English
MAX_ATTEMPTS = 60
# A draw is kept only where its measured rate and pitch are the bands it aimed at: the measures do
# not follow the knobs linearly (de Jong & Wempe's nuclei split long slow vowels and merge fast
# syllables), so without this, slow speech would be rare; the labels stay the measured ones.
AIMED = ("rate", "pitch")
BUCKET_NAMES = ("4-8", "9-20", "21-40")  # the report's length buckets (characters, or the word buckets)

# Where the targets are drawn, beyond the cut points' outer bands (the bands themselves are read
# from cut_points.json, with a margin inside each so that few draws land in a gap).
OUTER = {"pitch": (-7.5, 7.5), "rate": (1.5, 7.5), "volume": (-44.0, -10.0), "pauses": (0.0, 0.45)}
MARGIN = {"pitch": 0.5, "rate": 0.15, "volume": 1.5, "pauses": 0.02}
PSOLA_PITCH_MAX_ST = 4.0  # PSOLA's share where the synthesizer has a pitch knob (larger shifts sound worse)
FESTIVAL_PSOLA_PITCH_MAX_ST = 6.5  # festival's voices have no pitch knob here: PSOLA does it all
PEAK_MAX = 0.98


@dataclass
class Plan:
    """Everything a clip is made from (a pure function of its random stream)."""

    voice: str
    lang: str
    parts: list[str]
    bucket: int
    targets: dict[str, str]  # the bands aimed at (the labels are measured afterwards)
    controls: dict  # synthesizer knobs: speed, pitch_st
    sox_tempo: float
    psola_pitch_st: float
    gain_target_db: float
    pause_s: list[float]  # silences inserted between the parts (empty: one utterance)
    pad_lead_s: float
    pad_trail_s: float
    template: int
    noise: dict = field(default_factory=dict)


def _target_value(rng: random.Random, attr: str, phrase: str) -> float:
    lo, hi = cut_points()["bands"][attr]["bands"][phrase]
    out_lo, out_hi = OUTER[attr]
    m = MARGIN[attr]
    lo = out_lo if lo is None else lo + m
    hi = out_hi if hi is None else hi - m
    return rng.uniform(lo, max(lo, hi))


def _semitones_of(voice: Voice) -> float:
    ref = cut_points()["references_hz"][voice.gender]
    return 12 * math.log2(voice.f0_hz / ref)


def aims(rng: random.Random) -> dict[str, str]:
    """The bands a clip aims at, uniform per attribute (drawn once per clip: a redraw keeps them, so
    hard aims such as slow speech are not traded for easy ones)."""
    return {a: rng.choice(ATTRIBUTES[a]) for a in ("rate", "pitch", "volume", "pauses")}


def plan_clip(rng: random.Random, targets: dict[str, str], split: str, pool: dict[str, list[Voice]], seed: int,
              noise_p: float, snr: tuple[float, float]) -> Plan:
    synth = rng.choices(sorted(pool), weights=[SYNTH_WEIGHT[s] for s in sorted(pool)])[0]
    voice = rng.choice(pool[synth])
    lang = voice.langs[0] if len(voice.langs) == 1 else ("zh" if rng.random() < ESPEAK_ZH_SHARE else voice.langs[1])
    train_c, held_c = clause_split(lang, seed)
    bucket = rng.randrange(3)
    parts = sentence(rng, lang, train_c if split == "train" else held_c, bucket)
    # pitch: the shift from the voice's own pitch, by the synthesizer's knob where it has one
    # (festival's voices have none here), and partly by PSOLA
    shift = _target_value(rng, "pitch", targets["pitch"]) - _semitones_of(voice)
    if voice.synth == "festival":
        psola, native = max(-FESTIVAL_PSOLA_PITCH_MAX_ST, min(FESTIVAL_PSOLA_PITCH_MAX_ST, shift)), 0.0
    else:
        psola = max(-PSOLA_PITCH_MAX_ST, min(PSOLA_PITCH_MAX_ST, shift * rng.uniform(0.0, 0.4)))
        native = shift - psola
    # rate: the factor from the voice's own rate, split between the knob and sox's tempo
    factor = max(0.35, min(2.2, _target_value(rng, "rate", targets["rate"]) / voice.rate))
    tempo = math.exp(math.log(factor) * rng.uniform(0.0, 0.6))
    speed = factor / tempo
    # pauses: 较多 renders the clauses (or pieces of a one-clause sentence) apart, silences between
    pause_s: list[float] = []
    if targets["pauses"] == "停顿较多":
        if len(parts) == 1:
            words = list(parts[0]) if lang == "zh" else parts[0].split()
            k = min(len(words) - 1, rng.randint(1, 3))
            cuts = sorted(rng.sample(range(1, len(words)), k)) if k > 0 else []
            sep = "" if lang == "zh" else " "
            parts = [sep.join(words[a:b]) for a, b in zip([0, *cuts], [*cuts, len(words)], strict=True)]
        n = len(parts) - 1
        chosen = set(rng.sample(range(n), rng.randint(max(1, n // 2), n))) if n else set()
        pause_s = [round(rng.uniform(0.35, 1.1), 3) if j in chosen else 0.0 for j in range(n)]
    pad = rng.uniform(0.0, 1.0)
    lead = round(rng.uniform(0.0, pad), 3)
    noise = {}
    if rng.random() < noise_p:
        noise = {"kind": rng.choice(("white", "white", "pink")), "snr_db": round(rng.uniform(*snr), 2),
                 "seed": rng.randrange(2**31)}
    return Plan(voice=voice.name, lang=lang, parts=parts, bucket=bucket, targets=targets,
                controls={"speed": round(speed, 4), "pitch_st": round(native, 3)}, sox_tempo=round(tempo, 4),
                psola_pitch_st=round(psola, 3), gain_target_db=round(_target_value(rng, "volume", targets["volume"]), 2),
                pause_s=pause_s, pad_lead_s=lead, pad_trail_s=round(pad - lead, 3),
                template=rng.randrange(len(TEMPLATES)), noise=noise)


def utterances(plan: Plan) -> list[str]:
    """The texts rendered: the whole sentence, or its parts one by one when silences are inserted."""
    if not plan.pause_s:
        return [join(plan.parts, plan.lang)]
    # parts before an inserted silence end without punctuation: the silence is the pause
    return [join([p], plan.lang) if k == len(plan.parts) - 1 else p for k, p in enumerate(plan.parts)]


def sox_tempo(x: np.ndarray, tempo: float) -> np.ndarray:
    """sox's `tempo -s` (WSOLA tuned for speech: tempo without pitch, formants kept), on raw float32
    through a pipe."""
    if abs(tempo - 1.0) <= 1e-3:
        return x
    fmt = ["-t", "f32", "-r", str(SAMPLE_RATE), "-c", "1"]
    out = subprocess.run(["sox", *fmt, "-", *fmt, "-", "tempo", "-s", f"{tempo:.4f}"],
                         input=x.astype(np.float32).tobytes(), capture_output=True, check=True).stdout
    return np.frombuffer(out, dtype=np.float32).copy()


def psola_pitch(x: np.ndarray, semitones: float) -> np.ndarray:
    """Pitch moved by `semitones` without tempo and without timbre: Praat's `Change gender` (PSOLA)
    with a formant shift ratio of 1, to the clip's median F0 (the measure's own pitch settings)
    times 2^(semitones/12)."""
    if abs(semitones) <= 1e-3:
        return x
    import parselmouth
    from parselmouth.praat import call, run

    from .measure import PITCH_CEILING_HZ, PITCH_FLOOR_HZ

    snd = parselmouth.Sound(x.astype(np.float64), sampling_frequency=SAMPLE_RATE)
    f0 = snd.to_pitch_ac(time_step=0.01, pitch_floor=PITCH_FLOOR_HZ, pitch_ceiling=PITCH_CEILING_HZ)
    hz = f0.selected_array["frequency"]
    if not np.any(hz > 0):
        return x
    target = float(np.median(hz[hz > 0])) * 2 ** (semitones / 12)
    # Praat's overlap-add fills unvoiced stretches from its random generator, seeded from the clock
    # at start-up: unseeded, the same clip came out different in every process (CI caught it).
    # Seeded before each call, the result is a pure function of (x, semitones).
    run("random_initializeWithSeedUnsafelyButPredictably (4)\n")
    out = call(snd, "Change gender", PITCH_FLOOR_HZ, PITCH_CEILING_HZ, 1.0, target, 1.0, 1.0)
    return out.values[0].astype(np.float32)


def assemble(plan: Plan, rendered: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(clean clip at unit gain, speech part without padding)."""
    pieces = []
    for k, r in enumerate(rendered):
        pieces.append(r)
        if k < len(plan.pause_s) and plan.pause_s[k] > 0:
            pieces.append(np.zeros(round(plan.pause_s[k] * SAMPLE_RATE), np.float32))
    speech = psola_pitch(sox_tempo(np.concatenate(pieces), plan.sox_tempo), plan.psola_pitch_st)
    lead, trail = (round(s * SAMPLE_RATE) for s in (plan.pad_lead_s, plan.pad_trail_s))
    return np.concatenate([np.zeros(lead, np.float32), speech, np.zeros(trail, np.float32)]), speech


def with_gain(m: Measures, x: np.ndarray, target_db: float) -> tuple[Measures, np.ndarray, float]:
    """Scale the clip to put its speech level at `target_db` (less if its peak would clip). Every
    other measure is unchanged by a gain (the silence threshold is relative to the clip's own
    intensity), so the level is moved by the gain instead of measuring again."""
    if m.level_dbfs is None:
        return m, x, 0.0
    gain = target_db - m.level_dbfs
    peak = float(np.max(np.abs(x))) or 1.0
    gain = min(gain, 20 * math.log10(PEAK_MAX / peak))
    y = (x * 10 ** (gain / 20)).astype(np.float32)
    return Measures(**{**asdict(m), "level_dbfs": round(m.level_dbfs + gain, 2)}), y, gain


def add_noise(x: np.ndarray, speech: np.ndarray, gain_db: float, noise: dict) -> np.ndarray:
    """Noise at `noise["snr_db"]` below the speech's power (over the speech, padding excluded)."""
    if not noise:
        return x
    p_speech = float(np.mean(speech.astype(np.float64) ** 2)) * 10 ** (gain_db / 10)
    rng = np.random.default_rng(noise["seed"])
    scale = math.sqrt(p_speech / 10 ** (noise["snr_db"] / 10))
    return (x + scale * _noise(noise["kind"], len(x), rng)).astype(np.float32)


def render_plans(plans: list[Plan], by_name: dict[str, Voice]) -> list[list[np.ndarray | None]]:
    """Every plan's utterances; festival's in one process per voice for the whole list (None: an
    utterance festival could not render)."""
    out: list[list[np.ndarray] | None] = [None] * len(plans)
    fest_jobs, fest_where = [], []
    for k, p in enumerate(plans):
        v = by_name[p.voice]
        c = Controls(**p.controls)
        if v.synth == "festival":
            for u in utterances(p):
                fest_jobs.append((v, u, c))
                fest_where.append(k)
            out[k] = []
        elif v.synth == "flite":
            out[k] = [render_flite(v, u, c) for u in utterances(p)]
        else:
            out[k] = [render_espeak(v, u, p.lang, c) for u in utterances(p)]
    if fest_jobs:
        for k, audio in zip(fest_where, render_festival(fest_jobs), strict=True):
            out[k].append(audio)
    return out  # type: ignore[return-value]


@dataclass
class Clip:
    plan: Plan
    measures: Measures
    labels: dict[str, str]
    gain_db: float
    audio: np.ndarray  # clean, at its gain
    speech: np.ndarray  # for the noise level
    attempt: int
    index: int
    split: str

    def meta(self) -> dict:
        p = self.plan
        n = sum(units(x, p.lang) for x in p.parts)
        return {"index": self.index, "split": self.split, "attempt": self.attempt, "voice": p.voice,
                "synth": p.voice.split(":")[0], "lang": p.lang, "sentence": join(p.parts, p.lang), "units": n,
                "bucket": BUCKET_NAMES[p.bucket], "labels": self.labels, "template": p.template,
                "target": describe(self.labels, p.template), "aimed": p.targets, "measures": asdict(self.measures),
                "controls": p.controls, "sox_tempo": p.sox_tempo, "psola_pitch_st": p.psola_pitch_st,
                "gain_db": round(self.gain_db, 2), "pause_s": p.pause_s, "pad_lead_s": p.pad_lead_s,
                "pad_trail_s": p.pad_trail_s, "noise": p.noise, "seconds": round(len(self.audio) / SAMPLE_RATE, 3)}


def make_clips(split: str, indices: list[int], seed: int, noise_p: float, snr: tuple[float, float],
               log=None) -> list[Clip]:
    """The clips of `indices` in `split`, each drawn again until every measure is clear of the gaps
    (and the clip fits the feature window)."""
    pool: dict[str, list[Voice]] = {}
    for v in voices(SPLITS[split]):
        pool.setdefault(v.synth, []).append(v)
    by_name = {v.name: v for vs in pool.values() for v in vs}
    done: dict[int, Clip] = {}
    pending = {i: 0 for i in indices}
    while pending:
        plans = {i: plan_clip(random.Random(f"{seed}/{split}/{i}/{a}"), aims(random.Random(f"{seed}/{split}/{i}/aims")),
                              split, pool, seed, noise_p, snr)
                 for i, a in pending.items()}
        order = sorted(plans)
        rendered = render_plans([plans[i] for i in order], by_name)
        nxt = {}
        for i, r in zip(order, rendered, strict=True):
            plan, attempt = plans[i], pending[i]
            ok = all(u is not None for u in r)  # a festival voice may fail on an utterance: draw again
            if ok:
                x, speech = assemble(plan, r)
                ok = len(x) / SAMPLE_RATE <= WINDOW_S - 0.05
            if ok:
                m = measure(x, SAMPLE_RATE)
                m, y, gain = with_gain(m, x, plan.gain_target_db)
                labels, ambiguous = labels_of(m, by_name[plan.voice].gender)
                ok = (not ambiguous and len(labels) == len(ATTRIBUTES)
                      and all(labels[a] == plan.targets[a] for a in AIMED))
            if ok:
                done[i] = Clip(plan, m, labels, gain, y, speech, attempt, i, split)
            elif attempt + 1 >= MAX_ATTEMPTS:
                raise RuntimeError(f"{split} clip {i}: {MAX_ATTEMPTS} draws, none clear of the gaps")
            else:
                nxt[i] = attempt + 1
        pending = nxt
    return [done[i] for i in indices]


@dataclass
class ShardJob:
    path: str  # without extension
    split: str
    seed: int
    start: int
    count: int
    noise_p: float
    snr: tuple[float, float]
    noisy_copy: tuple[float, float] | None = None


def make_shard(job: ShardJob) -> tuple[str, int, float, dict]:
    """Worker: a shard's clips, their log-mels and metadata. Returns (path, clips, seconds, attempts)."""
    import torch

    torch.set_num_threads(1)
    fe = _feature_extractor()
    clips = make_clips(job.split, list(range(job.start, job.start + job.count)), job.seed, job.noise_p, job.snr)
    feats, metas, nfeats, nmetas = [], [], [], []
    seconds = 0.0
    for c in clips:
        meta = c.meta()
        audio = add_noise(c.audio, c.speech, c.gain_db, c.plan.noise)
        seconds += len(audio) / SAMPLE_RATE
        feats.append(log_mel(fe, audio))
        metas.append(meta)
        if job.noisy_copy:
            rng = random.Random(f"{job.seed}/{job.split}/{c.index}/noisy")
            noise = {"kind": "white", "snr_db": round(rng.uniform(*job.noisy_copy), 2), "seed": rng.randrange(2**31)}
            nfeats.append(log_mel(fe, add_noise(c.audio, c.speech, c.gain_db, noise)))
            nmetas.append({**meta, "noise": noise})
    _write(job.path, feats, metas)
    if job.noisy_copy:
        _write(job.path.replace(f"/{job.split}-", f"/{job.split}_noisy-"), nfeats, nmetas)
    return job.path, len(clips), seconds, {"draws": sum(c.attempt + 1 for c in clips)}


def shard_jobs(out: Path, seed: int, sizes: dict[str, int], shard: int) -> list[ShardJob]:
    jobs = []
    for split, n in sizes.items():
        train = split == "train"
        for k in range(0, n, shard):
            jobs.append(ShardJob(str(out / f"{split}-{k // shard:03d}"), split, seed, k, min(shard, n - k),
                                 0.5 if train else 0.0, (15.0, 35.0), None if train else (20.0, 30.0)))
    return jobs


# The bundled samples/ (v4): every class of every attribute, all emotions, ordinary lengths, several
# voices of each split (held-out sentences of training voices, held-out voices, the held-out
# synthesizer). (file, split, gender, aimed bands (rate, pitch, volume, pauses), length bucket,
# noise SNR in dB or None). The names are v2's, so every page that plays them still reads right.
SAMPLES: tuple[tuple[str, str, str, tuple[str, str, str, str], int, float | None], ...] = (
    ("f_fast_high.wav", "val", "女声", ("语速较快", "音调偏高", "音量适中", "停顿较少"), 1, None),
    ("m_slow_low.wav", "val", "男声", ("语速较慢", "音调偏低", "音量较小", "停顿较少"), 0, None),
    ("f_mid_mid_loud.wav", "val_voices", "女声", ("语速适中", "音调适中", "音量较大", "停顿较多"), 1, None),
    ("m_fast_high_pauses.wav", "val", "男声", ("语速较快", "音调偏高", "音量较大", "停顿较多"), 2, None),
    ("f_slow_low_quiet.wav", "val_voices", "女声", ("语速较慢", "音调偏低", "音量较小", "停顿较多"), 0, None),
    ("m_mid_high.wav", "val_synth", "男声", ("语速适中", "音调偏高", "音量适中", "停顿较少"), 1, None),
    ("f_fast_low.wav", "val", "女声", ("语速较快", "音调偏低", "音量较小", "停顿较少"), 2, None),
    ("m_slow_mid.wav", "val_voices", "男声", ("语速较慢", "音调适中", "音量较大", "停顿较多"), 0, None),
    ("f_mid_low_noisy.wav", "val_synth", "女声", ("语速适中", "音调偏低", "音量适中", "停顿较少"), 1, 25.0),
)


def write_samples(out: Path, seed: int) -> None:
    """The bundled demo clips (16-bit WAV, 16 kHz) and `labels.jsonl`: each drawn until its measured
    labels are every one the sample is named for (a clip's labels are still what it measures)."""
    import soundfile as sf

    out.mkdir(parents=True, exist_ok=True)
    by_name = {v.name: v for v in voices("train") + voices("heldout_voice") + voices("heldout_synth")}
    lines = []
    for k, (name, split, gender, aimed, bucket, snr) in enumerate(SAMPLES):
        pool: dict[str, list[Voice]] = {}
        for v in voices(SPLITS[split]):
            if v.gender == gender:
                pool.setdefault(v.synth, []).append(v)
        targets = dict(zip(("rate", "pitch", "volume", "pauses"), aimed, strict=True))
        for attempt in range(400):
            rng = random.Random(f"{seed}/samples/{k}/{attempt}")
            plan = plan_clip(rng, targets, split, pool, seed, 0.0, (0.0, 0.0))
            plan.bucket, plan.pad_lead_s, plan.pad_trail_s = bucket, 0.2, 0.2
            plan.parts = sentence(rng, plan.lang, clause_split(plan.lang, seed)[1], bucket)
            if targets["pauses"] == "停顿较多" and len(plan.parts) > 1:
                plan.pause_s = [round(rng.uniform(0.4, 0.9), 3) for _ in plan.parts[1:]]
            elif targets["pauses"] == "停顿较少":
                plan.pause_s = []
            rendered = render_plans([plan], by_name)[0]
            if any(u is None for u in rendered):
                continue
            x, speech = assemble(plan, rendered)
            m = measure(x, SAMPLE_RATE)
            m, y, gain = with_gain(m, x, plan.gain_target_db)
            labels, ambiguous = labels_of(m, gender)
            if not ambiguous and len(labels) == len(ATTRIBUTES) and all(labels[a] == t for a, t in targets.items()):
                break
        else:
            raise RuntimeError(f"sample {name}: no draw measured as named")
        noise = {"kind": "white", "snr_db": snr, "seed": k} if snr else {}
        audio = add_noise(y, speech, gain, noise)
        sf.write(out / name, audio, SAMPLE_RATE, subtype="PCM_16")
        lines.append(json.dumps({"file": name, "labels": labels, "split": split, "voice": plan.voice,
                                 "lang": plan.lang, "sentence": join(plan.parts, plan.lang),
                                 "seconds": round(len(audio) / SAMPLE_RATE, 2), "noise_snr_db": snr,
                                 "measures": asdict(m)}, ensure_ascii=False))
    (out / "labels.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=16000, help="training clips")
    ap.add_argument("--val", type=int, default=600, help="held-out clips of the training voices")
    ap.add_argument("--val-voices", type=int, default=400, help="held-out clips of the held-out voices")
    ap.add_argument("--val-synth", type=int, default=300, help="held-out clips of the held-out synthesizer")
    ap.add_argument("--shard", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=CORPUS_V4)
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--samples", type=Path, default=None, metavar="DIR",
                    help="only write the bundled demo clips + labels.jsonl to DIR (held-out sentences and voices)")
    args = ap.parse_args(argv)
    if args.samples:
        write_samples(args.samples, args.seed)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = {"val": args.val, "val_voices": args.val_voices, "val_synth": args.val_synth, "train": args.train}
    jobs = shard_jobs(args.out, args.seed, sizes, args.shard)
    # Resumable: a shard whose files exist is kept (a shard is written whole, features then list).
    todo = [j for j in jobs if not Path(j.path + ".json").exists()]
    t0 = time.time()
    draws = 0
    with Pool(args.workers) as pool:
        for path, n, seconds, stats in pool.imap_unordered(make_shard, todo):
            draws += stats["draws"]
            print(f"{path}: {n} clips, {seconds / 60:.1f} min of audio, {stats['draws']} draws "
                  f"({time.time() - t0:.0f}s)", flush=True)
    meta = {"version": VERSION, "contract": 3, "seed": args.seed, "sizes": sizes, "build_seconds": round(time.time() - t0, 1),
            "draws_this_run": draws, "cut_points": cut_points(), "templates": list(TEMPLATES),
            "buckets": {"zh": BUCKETS_ZH, "words": BUCKETS_WORDS}, "fingerprint": fingerprint(args.out)}
    (args.out / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
    print(json.dumps({k: meta[k] for k in ("sizes", "build_seconds", "fingerprint")}, ensure_ascii=False))


if __name__ == "__main__":
    main()
