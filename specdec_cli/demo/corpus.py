"""Synthetic labelled Mandarin speech for the demo pair, version 2 (espeak-ng, `cmn-latn-pinyin`).

`python -m specdec_cli.demo.corpus [--train N] [--val N] [--seed S]` writes, under
`.demo-work/corpus-v2/` (gitignored, never committed; needs espeak-ng, which only this build does):
  - `{split}-NNN.npy`: log-mel features of a shard's clips, float16, shape (sum of frames, 128),
    clips one after another along time (valid frames only, not padded to 30 s);
  - `{split}-NNN.json`: per clip the offset/length into that array, the sentence, the espeak-ng
    parameters, padding, noise, labels and the target description;
  - `meta.json`: sizes, hours, build time, the sentence/clause split and a fingerprint that the
    trainer stores in its checkpoints (a state trained on another corpus is refused).

Splits: `train` (about half of the clips with additive white or pink noise at 15-35 dB SNR),
`val` (held-out clauses, clean) and `val_noisy` (the same val clips, 20-30 dB white noise).

What version 2 fixes (issue 11, demo-spec.md "What the demo must hear, not guess"): v1 spoke only
5-9-character sentences, so clip duration alone gave away the speaking rate. Here a clip's length
bucket (<= 8, 9-20, 21-40 characters) is drawn independently of its labels, clips run from under 1 s
to the 30 s feature window, 0-1 s of silence is padded around the speech, and mild noise is mixed
in. Held-out sentences are built only from clauses that never occur in training.
Deterministic: every clip's parameters come from `random.Random(f"{seed}/{split}/{i}")`, so the
same seed gives the same corpus with any number of workers.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import itertools
import json
import random
import subprocess
import time
from dataclasses import asdict, dataclass, field
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from ..phrases import ATTRIBUTES, predict

SAMPLE_RATE = 16_000
WINDOW_S = 30.0  # the Whisper feature extractor's window: the longest clip one prefill takes
VOICE = "cmn-latn-pinyin"  # not `cmn`: it spells hanzi as pinyin + English digits (docs/demo-pair.md)
REPO = Path(__file__).resolve().parents[2]
WORK = REPO / ".demo-work"
CORPUS = WORK / "corpus-v2"

# Label -> espeak-ng parameter range (docs/demo-pair.md, "The synthetic speech"). Values are drawn uniformly inside the range.
GENDER_VARIANTS = {"男声": [f"m{i}" for i in range(1, 8)], "女声": [f"f{i}" for i in range(1, 5)]}
RATE = {"语速较慢": (95, 125), "语速适中": (150, 180), "语速较快": (210, 260)}
PITCH = {"音调偏低": (5, 25), "音调适中": (40, 60), "音调偏高": (75, 95)}
VOLUME = {"音量较小": (25, 50), "音量适中": (80, 110), "音量较大": (150, 190)}
PAUSES = {"停顿较少": (0, 2), "停顿较多": (12, 25)}
BUCKETS = ((4, 8), (9, 20), (21, 40))  # spoken characters; the report's length buckets


def emotion_of(rate: str, pitch: str) -> str:
    """Emotion is derived, not sampled: fast and high -> 激动; slow and low -> 低落; else 平静."""
    if rate == "语速较快" and pitch == "音调偏高":
        return "情绪激动"
    if rate == "语速较慢" and pitch == "音调偏低":
        return "情绪低落"
    return "情绪平静"


def bucket_of(n_chars: int) -> str:
    for lo, hi in BUCKETS:
        if n_chars <= hi:
            return f"{lo}-{hi}"
    return f"{BUCKETS[-1][0]}-{BUCKETS[-1][1]}"


# ---------------------------------------------------------------------------------------------
# Target descriptions. Every template states each attribute through exactly one canonical phrase.
# The template is drawn at random for each clip, independently of the labels: v1 picked it from
# (gender, emotion), so the first answer token already committed to the emotion and teacher-forced
# accuracy credited phrases the template had given away. A random template makes every phrase a
# decision the model must take from the audio; the first tokens are then an honest coin flip.
# Every template passes the decoding rules it will be decoded under (tests/test_demo_targets.py):
# a v2.0 template opened with "{gender}，" (2 characters before a comma, which the punctuation gate
# refuses), so the model was trained on an answer the rules would not let it write.
TEMPLATES: tuple[str, ...] = (
    "说话人是{gender}，{rate}，{pitch}，{volume}，{pauses}，整体{emotion}。",
    "这是一位{gender}，{pitch}，{rate}，{pauses}，{volume}，听起来{emotion}。",
    "说话者为{gender}，{volume}，{rate}，{pitch}，{pauses}，整体听起来{emotion}。",
    "听起来是{gender}，{emotion}，{rate}，{pitch}，{volume}，{pauses}。",
    "录音里的说话人是{gender}，{pitch}，{volume}，{rate}，并且{pauses}，{emotion}。",
    "说话人为{gender}，{rate}而且{pitch}，{volume}，{pauses}，整体上{emotion}。",
    "这段话由{gender}说出，{volume}，{pitch}，{rate}，{pauses}，听起来{emotion}。",
    "这位说话者是{gender}，{rate}，{pitch}，{volume}，{pauses}，{emotion}。",
)


def describe(labels: dict[str, str], template: int) -> str:
    """The target sentence for a clip's labels (without the end-of-turn token)."""
    return TEMPLATES[template].format(**labels)


def label_combos() -> list[dict[str, str]]:
    """Every consistent label assignment (emotion derived from rate and pitch)."""
    out = []
    for g, r, p, v, pa in itertools.product(*(ATTRIBUTES[a] for a in ("gender", "rate", "pitch", "volume", "pauses"))):
        out.append({"gender": g, "rate": r, "pitch": p, "volume": v, "pauses": pa, "emotion": emotion_of(r, p)})
    return out


def all_descriptions(consistent: bool = True) -> list[str]:
    """Every target sentence: all templates x all label combinations. With `consistent=False`, also
    the emotions that the rule would not derive (what a wrong model may write; the tokenizer must
    split those like Qwen too)."""
    combos = label_combos()
    if not consistent:
        combos = [{**c, "emotion": e} for c in combos for e in ATTRIBUTES["emotion"]]
    return sorted({describe(c, t) for c in combos for t in range(len(TEMPLATES))})


def check_template(text: str) -> None:
    """Raise if a filled template is not a scorable one-sentence description."""
    labels = predict(text)
    if any(v is None for v in labels.values()):
        raise ValueError(f"not exactly one canonical phrase per attribute: {text}")
    if not (text.endswith("。") and text.count("。") == 1):
        raise ValueError(f"not one sentence: {text}")
    if set(c for c in text if not "\u4e00" <= c <= "\u9fff") - {"，", "。"}:
        raise ValueError(f"unexpected punctuation: {text}")


# ---------------------------------------------------------------------------------------------
# Spoken sentences: clauses composed from word lists, joined with ，and ended with 。. Held-out
# sentences use only held-out clauses (whole clauses, so accuracy measures listening, not text).
_SUBJ = ["我", "我们", "你", "你们", "他", "她们", "老师", "小王", "妈妈", "爸爸", "同学们", "奶奶", "医生",
         "邻居", "哥哥", "姐姐", "孩子们", "朋友", "经理", "司机"]
_TIME = ["今天", "明天", "昨天", "早上", "晚上", "周末", "下午", "现在", "刚才", "每天", "去年", "最近",
         "后天", "中午"]
_PLACE = ["公园里", "学校门口", "厨房里", "超市里", "车站", "办公室", "图书馆", "医院", "操场上", "湖边",
          "山脚下", "小区里", "火车上", "商店里"]
_ADV = ["想", "要", "会", "常常", "都", "也", "还在", "一起", "准备", "喜欢", "打算", "已经"]
_VO = ["去公园", "看电影", "喝绿茶", "买水果", "写作业", "打篮球", "做晚饭", "学英语", "坐地铁", "回老家",
       "听音乐", "去超市", "洗衣服", "看新闻", "种花草", "爬高山", "读小说", "开会", "唱歌", "寄包裹",
       "画风景", "修电脑", "找钥匙", "等公交", "吃面条", "跑步", "上班", "休息", "散步", "游泳",
       "打电话", "写信", "包饺子", "看医生", "学画画", "骑自行车", "打扫房间", "做实验", "练书法", "遛狗"]
_STATE = ["天气很好", "风有点大", "路上很堵", "外面下雨", "房间很亮", "水很干净", "花开得早", "人很多",
          "饭菜很香", "街道安静", "阳光明媚", "湖面平静", "山上很冷", "教室明亮", "空气新鲜", "树叶黄了",
          "灯还亮着", "天色很暗", "声音很小", "价格不贵", "时间不早", "雪下得很大"]
_FEEL = ["觉得", "知道", "听说", "发现", "相信"]


def clause_pool() -> list[str]:
    """Every distinct clause (3-14 characters), sorted."""
    pool: set[str] = set()
    for s in _SUBJ:
        for v in _VO:
            pool.add(f"{s}{v}")
            for a in _ADV:
                pool.add(f"{s}{a}{v}")
            for t in _TIME[::2]:
                pool.add(f"{t}{s}{v}")
            for p in _PLACE[::3]:
                pool.add(f"{s}在{p}{v}")
        for f in _FEEL:
            for st in _STATE[::2]:
                pool.add(f"{s}{f}{st}")
    for t in _TIME:
        for st in _STATE:
            pool.add(f"{t}{st}")
    for p in _PLACE:
        for st in _STATE:
            pool.add(f"{p}{st}")
    for st in _STATE:
        pool.add(st)
        pool.add(f"因为{st}")
        pool.add(f"所以{st[:2]}也好")
    return sorted(c for c in pool if 2 <= len(c) <= 14)


def split_clauses(seed: int, val_share: float = 0.12) -> tuple[list[str], list[str]]:
    """(train clauses, held-out clauses): a seeded shuffle, the held-out share taken first."""
    pool = clause_pool()
    random.Random(f"{seed}/clauses").shuffle(pool)
    n_val = round(val_share * len(pool))
    return pool[n_val:], pool[:n_val]


def make_sentence(rng: random.Random, clauses: list[str], by_len: dict[int, list[str]], lo: int, hi: int) -> str:
    """A sentence of lo..hi spoken characters: clauses joined by ，, ended by 。. The target length is
    drawn uniformly in the bucket, then clauses are added while they fit."""
    target = rng.randint(lo, hi)
    for _ in range(200):
        parts: list[str] = []
        n = 0
        while n < target:
            room = target - n
            fits = [k for k in by_len if k <= room]
            if not fits:
                break
            if room <= max(by_len):  # finish exactly at the target when a clause of that size exists
                k = room if room in by_len and rng.random() < 0.7 else rng.choice(fits)
            else:
                k = rng.choice(fits)
            parts.append(rng.choice(by_len[k]))
            n += k
        if lo <= n <= hi and parts:
            return "，".join(parts) + "。"
    raise RuntimeError(f"no sentence of {lo}-{hi} characters")


def n_spoken(sentence: str) -> int:
    return sum("\u4e00" <= c <= "\u9fff" for c in sentence)


# ---------------------------------------------------------------------------------------------
@dataclass
class ClipSpec:
    sentence: str
    variant: str
    speed: int
    pitch: int
    amplitude: int
    gap: int
    labels: dict[str, str]
    template: int = 0
    pad_lead_s: float = 0.0
    pad_trail_s: float = 0.0
    noise: dict = field(default_factory=dict)  # {"kind": "white"|"pink", "snr_db": x, "seed": n} or {}


def sample_labels(rng: random.Random) -> dict[str, str]:
    """Labels drawn uniformly per attribute (emotion derived)."""
    g, r, p, v, pa = (rng.choice(ATTRIBUTES[a]) for a in ("gender", "rate", "pitch", "volume", "pauses"))
    return {"gender": g, "rate": r, "pitch": p, "volume": v, "pauses": pa, "emotion": emotion_of(r, p)}


def synthesize_speech(spec: ClipSpec) -> np.ndarray:
    """espeak-ng's 16 kHz mono float32 waveform (no padding, no noise). Never loudness-normalised."""
    cmd = ["espeak-ng", "-v", f"{VOICE}+{spec.variant}", "-s", str(spec.speed), "-p", str(spec.pitch),
           "-a", str(spec.amplitude), "-g", str(spec.gap), "--stdout", spec.sentence]
    wav = subprocess.run(cmd, capture_output=True, check=True).stdout
    x, sr = sf.read(io.BytesIO(wav), dtype="float32")
    if x.ndim > 1:
        x = x.mean(axis=1)
    return soxr.resample(x, sr, SAMPLE_RATE).astype(np.float32)


def _noise(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    w = rng.standard_normal(n)
    if kind == "pink":  # 1/f power: shape white noise's spectrum by 1/sqrt(f)
        spec = np.fft.rfft(w)
        f = np.arange(len(spec), dtype=np.float64)
        f[0] = 1.0
        w = np.fft.irfft(spec / np.sqrt(f), n)
    return w / (np.sqrt(np.mean(w**2)) + 1e-12)


def finish(speech: np.ndarray, spec: ClipSpec) -> np.ndarray:
    """Pad with silence and mix in noise. The SNR is relative to the speech's own power (over the
    espeak-ng output), so the volume label stays the speech's."""
    lead, trail = (round(s * SAMPLE_RATE) for s in (spec.pad_lead_s, spec.pad_trail_s))
    x = np.concatenate([np.zeros(lead, np.float32), speech, np.zeros(trail, np.float32)])
    if spec.noise:
        p_speech = float(np.mean(speech.astype(np.float64) ** 2))
        rng = np.random.default_rng(spec.noise["seed"])
        scale = np.sqrt(p_speech / 10 ** (spec.noise["snr_db"] / 10))
        x = (x + scale * _noise(spec.noise["kind"], len(x), rng)).astype(np.float32)
    return x


def synthesize(spec: ClipSpec) -> np.ndarray:
    """The clip as the models hear it: speech, silence padding, noise."""
    return finish(synthesize_speech(spec), spec)


def sample_clip(rng: random.Random, clauses: list[str], by_len: dict[int, list[str]],
                noise_p: float, snr: tuple[float, float], kinds: tuple[str, ...]) -> tuple[ClipSpec, np.ndarray]:
    """Draw labels, parameters, a length bucket (uniform, independent of the labels) and a sentence
    in it; re-draw the sentence (same bucket, shorter) while the clip would not fit the window:
    slow speech with long pauses runs ~1.3 s per character."""
    labels = sample_labels(rng)
    lo, hi = rng.choice(BUCKETS)
    spec = ClipSpec(
        sentence="", variant=rng.choice(GENDER_VARIANTS[labels["gender"]]),
        speed=rng.randint(*RATE[labels["rate"]]), pitch=rng.randint(*PITCH[labels["pitch"]]),
        amplitude=rng.randint(*VOLUME[labels["volume"]]), gap=rng.randint(*PAUSES[labels["pauses"]]),
        labels=labels, template=rng.randrange(len(TEMPLATES)),
    )
    pad = rng.uniform(0.0, 1.0)
    spec.pad_lead_s = round(rng.uniform(0.0, pad), 3)
    spec.pad_trail_s = round(pad - spec.pad_lead_s, 3)
    if rng.random() < noise_p:
        spec.noise = {"kind": rng.choice(kinds), "snr_db": round(rng.uniform(*snr), 2), "seed": rng.randrange(2**31)}
    for _ in range(50):
        spec.sentence = make_sentence(rng, clauses, by_len, lo, hi)
        speech = synthesize_speech(spec)
        if len(speech) / SAMPLE_RATE + pad <= WINDOW_S - 0.05:
            return spec, speech
        hi = max(lo, n_spoken(spec.sentence) - 1)
    raise RuntimeError(f"no clip fits the window: {spec}")


# ---------------------------------------------------------------------------------------------
def _feature_extractor():
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(feature_size=128, sampling_rate=SAMPLE_RATE)


def log_mel(fe, audio: np.ndarray) -> np.ndarray:
    """(T, 128) float16 log-mel over the clip's own length, exactly as `AudioTextProcessor.features`
    computes it at inference."""
    from ..processor import AudioTextProcessor

    feats, mask = AudioTextProcessor(None, fe).features(audio)
    n = int(mask.sum())
    return feats[0, :, :n].T.numpy().astype(np.float16)


@dataclass
class ShardJob:
    path: str  # without extension
    split: str
    seed: int
    start: int
    count: int
    clauses: list[str]
    noise_p: float
    snr: tuple[float, float]
    kinds: tuple[str, ...]
    noisy_copy: tuple[float, float] | None = None  # val: also write the same clips with noise


def _write(path: str, feats: list[np.ndarray], metas: list[dict]) -> None:
    off = 0
    for m, f in zip(metas, feats, strict=True):
        m["offset"], m["frames"] = off, int(f.shape[0])
        off += f.shape[0]
    np.save(path + ".npy", np.concatenate(feats, axis=0))
    Path(path + ".json").write_text(json.dumps(metas, ensure_ascii=False), encoding="utf-8")


def make_shard(job: ShardJob) -> tuple[str, int, float, float]:
    """Worker: synthesise a shard's clips and store their log-mels. Returns (path, clips, speech
    seconds, clip seconds)."""
    import torch

    torch.set_num_threads(1)
    fe = _feature_extractor()
    by_len: dict[int, list[str]] = {}
    for c in job.clauses:
        by_len.setdefault(len(c), []).append(c)
    feats, metas, noisy_feats, noisy_metas = [], [], [], []
    speech_s = clip_s = 0.0
    for i in range(job.start, job.start + job.count):
        rng = random.Random(f"{job.seed}/{job.split}/{i}")
        spec, speech = sample_clip(rng, job.clauses, by_len, job.noise_p, job.snr, job.kinds)
        audio = finish(speech, spec)
        speech_s += len(speech) / SAMPLE_RATE
        clip_s += len(audio) / SAMPLE_RATE
        meta = {**asdict(spec), "index": i, "chars": n_spoken(spec.sentence), "seconds": round(len(audio) / SAMPLE_RATE, 3),
                "bucket": bucket_of(n_spoken(spec.sentence)), "target": describe(spec.labels, spec.template)}
        feats.append(log_mel(fe, audio))
        metas.append(meta)
        if job.noisy_copy:
            noisy = ClipSpec(**{**asdict(spec), "noise": {"kind": "white", "snr_db": round(rng.uniform(*job.noisy_copy), 2),
                                                          "seed": rng.randrange(2**31)}})
            noisy_feats.append(log_mel(fe, finish(speech, noisy)))
            noisy_metas.append({**meta, "noise": noisy.noise})
    _write(job.path, feats, metas)
    if job.noisy_copy:
        _write(job.path.replace(f"/{job.split}-", f"/{job.split}_noisy-"), noisy_feats, noisy_metas)
    return job.path, job.count, speech_s, clip_s


def fingerprint(root: Path) -> str:
    """Identity of a built corpus: a hash over every shard's clip list (offsets, sentences, labels,
    parameters). Cheap (no feature bytes read) and changes whenever the corpus would."""
    h = hashlib.sha256()
    for p in sorted(root.glob("*.json")):
        if p.name != "meta.json":
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


# The demo clips for samples/ (v2): every class of every attribute, both pause classes, all
# emotions, and ordinary sentence lengths (a few 15-30 characters), from held-out clauses only.
# (file, fixed labels, (min, max) characters, noise SNR in dB or None)
SAMPLES: tuple[tuple[str, dict[str, str], tuple[int, int], float | None], ...] = (
    ("f_fast_high.wav", {"gender": "女声", "rate": "语速较快", "pitch": "音调偏高", "volume": "音量适中", "pauses": "停顿较少"}, (15, 22), None),
    ("m_slow_low.wav", {"gender": "男声", "rate": "语速较慢", "pitch": "音调偏低", "volume": "音量较小", "pauses": "停顿较少"}, (6, 8), None),
    ("f_mid_mid_loud.wav", {"gender": "女声", "rate": "语速适中", "pitch": "音调适中", "volume": "音量较大", "pauses": "停顿较多"}, (9, 12), None),
    ("m_fast_high_pauses.wav", {"gender": "男声", "rate": "语速较快", "pitch": "音调偏高", "volume": "音量较大", "pauses": "停顿较多"}, (24, 30), None),
    ("f_slow_low_quiet.wav", {"gender": "女声", "rate": "语速较慢", "pitch": "音调偏低", "volume": "音量较小", "pauses": "停顿较多"}, (4, 6), None),
    ("m_mid_high.wav", {"gender": "男声", "rate": "语速适中", "pitch": "音调偏高", "volume": "音量适中", "pauses": "停顿较少"}, (18, 26), None),
    ("f_fast_low.wav", {"gender": "女声", "rate": "语速较快", "pitch": "音调偏低", "volume": "音量较小", "pauses": "停顿较少"}, (26, 32), None),
    ("m_slow_mid.wav", {"gender": "男声", "rate": "语速较慢", "pitch": "音调适中", "volume": "音量较大", "pauses": "停顿较多"}, (7, 10), None),
    ("f_mid_low_noisy.wav", {"gender": "女声", "rate": "语速适中", "pitch": "音调偏低", "volume": "音量适中", "pauses": "停顿较少"}, (12, 18), 25.0),
)


def write_samples(out: Path, seed: int) -> None:
    """The bundled demo clips (16-bit wav) and `labels.jsonl` (file, sentence, characters, noise,
    labels), built from the held-out clauses of the corpus with the same seed."""
    _, val_c = split_clauses(seed)
    by_len: dict[int, list[str]] = {}
    for c in val_c:
        by_len.setdefault(len(c), []).append(c)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for k, (name, fixed, (lo, hi), snr) in enumerate(SAMPLES):
        rng = random.Random(f"{seed}/samples/{k}")
        labels = {**fixed, "emotion": emotion_of(fixed["rate"], fixed["pitch"])}
        spec = ClipSpec(sentence=make_sentence(rng, val_c, by_len, lo, hi), variant=rng.choice(GENDER_VARIANTS[labels["gender"]]),
                        speed=rng.randint(*RATE[labels["rate"]]), pitch=rng.randint(*PITCH[labels["pitch"]]),
                        amplitude=rng.randint(*VOLUME[labels["volume"]]), gap=rng.randint(*PAUSES[labels["pauses"]]),
                        labels=labels, pad_lead_s=0.2, pad_trail_s=0.2,
                        noise={"kind": "white", "snr_db": snr, "seed": k} if snr else {})
        audio = synthesize(spec)
        sf.write(out / name, audio, SAMPLE_RATE, subtype="PCM_16")
        lines.append(json.dumps({"file": name, "sentence": spec.sentence, "chars": n_spoken(spec.sentence),
                                 "seconds": round(len(audio) / SAMPLE_RATE, 2), "noise_snr_db": snr, "labels": labels},
                                ensure_ascii=False))
    (out / "labels.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=12000, help="training clips")
    ap.add_argument("--val", type=int, default=600, help="held-out clips (written clean and noisy)")
    ap.add_argument("--shard", type=int, default=400)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=CORPUS)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--samples", type=Path, default=None, metavar="DIR",
                    help="only write the demo clips + labels.jsonl to DIR (from held-out clauses)")
    args = ap.parse_args(argv)
    if args.samples:
        write_samples(args.samples, args.seed)
        return
    for t in all_descriptions(consistent=False):
        check_template(t)
    train_c, val_c = split_clauses(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for old in [*args.out.glob("*.npy"), *args.out.glob("*.json")]:
        old.unlink()  # a partial older build must not mix into this one
    jobs = []
    for split, n, clauses, noise_p, snr, copy in (
        ("val", args.val, val_c, 0.0, (0.0, 0.0), (20.0, 30.0)),
        ("train", args.train, train_c, 0.5, (15.0, 35.0), None),
    ):
        for k in range(0, n, args.shard):
            jobs.append(ShardJob(str(args.out / f"{split}-{k // args.shard:03d}"), split, args.seed, k,
                                 min(args.shard, n - k), clauses, noise_p, snr, ("white", "white", "pink"), copy))
    t0 = time.time()
    hours: dict[str, list[float]] = {"train": [0.0, 0.0], "val": [0.0, 0.0]}
    with Pool(args.workers) as pool:
        for path, n, speech_s, clip_s in pool.imap_unordered(make_shard, jobs):
            split = Path(path).name.split("-")[0]
            hours[split][0] += speech_s / 3600
            hours[split][1] += clip_s / 3600
            print(f"{path}: {n} clips ({time.time() - t0:.0f}s)", flush=True)
    meta = {"version": 2, "seed": args.seed, "train_clips": args.train, "val_clips": args.val,
            "speech_hours": {k: round(v[0], 2) for k, v in hours.items()},
            "clip_hours": {k: round(v[1], 2) for k, v in hours.items()},
            "build_seconds": round(time.time() - t0, 1), "workers": args.workers,
            "train_clauses": len(train_c), "val_clauses": len(val_c), "templates": list(TEMPLATES),
            "fingerprint": fingerprint(args.out), "val_clause_list": val_c}
    (args.out / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
    print(json.dumps({k: v for k, v in meta.items() if k != "val_clause_list"}, ensure_ascii=False))


if __name__ == "__main__":
    main()
