"""Synthetic labelled Mandarin speech for the demo pair (espeak-ng, voice `cmn-latn-pinyin`).

`python -m specdec_cli.demo.corpus` writes, under `.demo-work/corpus/`:
  - `train-NNN.pt` / `val-NNN.pt` shards: log-mel features (float16, concatenated along time, with
    offsets) and per-clip metadata (sentence, espeak parameters, labels, target description);
  - `meta.json`: sizes, sentence split, templates.
and the 8 bundled demo clips in `samples/` (+ `samples/labels.jsonl`), taken from held-out sentences.

Why it is built this way (see shared/docs/field-notes.md): the cloud memorised a 600-clip corpus, so
we synthesise thousands of clips; whole sentences are held out so accuracy measures listening, not
text; features are computed once on the valid length (far cheaper than padding to 30 s) and kept as
float16 so a training run reads them straight from memory.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import subprocess
import time
from dataclasses import asdict, dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
import torch
from transformers import WhisperFeatureExtractor

from ..phrases import ATTRIBUTES
from ..processor import AudioTextProcessor

SAMPLE_RATE = 16_000
ESPEAK_RATE = 22_050
VOICE = "cmn-latn-pinyin"  # not `cmn`: it spells hanzi as pinyin + English digits (demo-spec.md)
REPO = Path(__file__).resolve().parents[2]
WORK = REPO / ".demo-work"

# Label -> espeak-ng parameter range (demo-spec.md). Values are drawn uniformly inside the range.
GENDER_VARIANTS = {"男声": [f"m{i}" for i in range(1, 8)], "女声": [f"f{i}" for i in range(1, 5)]}
RATE = {"语速较慢": (95, 125), "语速适中": (150, 180), "语速较快": (210, 260)}
PITCH = {"音调偏低": (5, 25), "音调适中": (40, 60), "音调偏高": (75, 95)}
VOLUME = {"音量较小": (25, 50), "音量适中": (80, 110), "音量较大": (150, 190)}
PAUSES = {"停顿较少": (0, 2), "停顿较多": (12, 25)}


def emotion_of(rate: str, pitch: str) -> str:
    """Emotion is derived, not sampled: fast and high -> 激动; slow and low -> 低落; else 平静."""
    if rate == "语速较快" and pitch == "音调偏高":
        return "情绪激动"
    if rate == "语速较慢" and pitch == "音调偏低":
        return "情绪低落"
    return "情绪平静"


# ---------------------------------------------------------------------------------------------
# Target descriptions. Each template states every attribute through exactly one canonical phrase
# (one token each). Hard rules the inference engine enforces, checked by `check_template`:
# >= 4 CJK chars between punctuation marks, >= 8 CJK chars before the final 。, no CJK token twice
# (so no filler character repeats), only ，and 。. The template is picked from (gender, emotion):
# a deterministic function of what is heard, so the first tokens are real, learnable choice points
# rather than coin flips that neither model could predict.
TEMPLATES: tuple[str, ...] = (
    "说话人是{gender}，{rate}，{pitch}，{volume}，{pauses}，整体{emotion}。",
    "听起来是一位{gender}，{emotion}，{rate}，{pitch}，{volume}，{pauses}。",
    "这段录音里的{gender}{rate}，{pitch}，{volume}，{pauses}，{emotion}。",
    "说话者为{gender}，{pitch}，{rate}，{pauses}，{volume}，听起来{emotion}。",
    "{rate}的{gender}，{volume}，{pitch}，{pauses}，整体上{emotion}。",
    "说话人{emotion}，{gender}音色，{rate}，{pitch}，{volume}，{pauses}。",
)
TEMPLATE_FOR = {
    (g, e): i
    for i, (g, e) in enumerate(
        [(g, e) for g in ATTRIBUTES["gender"] for e in ("情绪平静", "情绪激动", "情绪低落")]
    )
}


def describe(labels: dict[str, str]) -> str:
    """The target sentence for a clip's labels (without the end-of-turn token)."""
    return TEMPLATES[TEMPLATE_FOR[(labels["gender"], labels["emotion"])]].format(**labels)


def _is_cjk(ch: str) -> bool:
    return "\u4e00" <= ch <= "\u9fff"


def check_template(text: str, phrases: tuple[str, ...]) -> None:
    """Raise if `text` (a filled template) breaks a rule the decoder enforces."""
    units: list[str] = []  # phrase tokens count as one unit of len(phrase) CJK chars
    i = 0
    while i < len(text):
        for p in phrases:
            if text.startswith(p, i):
                units.append(p)
                i += len(p)
                break
        else:
            units.append(text[i])
            i += 1
    assert set("".join(u for u in units if not all(_is_cjk(c) for c in u))) <= {"，", "。"}, text
    assert text.endswith("。") and text.count("。") == 1, text
    seg = 0
    for u in units:
        if u in "，。":
            assert seg >= 4, f"segment with {seg} CJK chars in {text}"
            seg = 0
        else:
            seg += len(u)
    assert sum(len(u) for u in units if u not in "，。") >= 8, text
    cjk = [u for u in units if u not in "，。"]
    assert len(cjk) == len(set(cjk)), f"repeated token in {text}"
    bigrams = list(zip(cjk, cjk[1:], strict=False))
    assert len(bigrams) == len(set(bigrams)), text


def all_descriptions() -> list[str]:
    """Every target sentence (for the tokenizer's vocabulary and the template checks)."""
    import itertools

    out = []
    for combo in itertools.product(*ATTRIBUTES.values()):
        labels = dict(zip(ATTRIBUTES, combo, strict=True))
        if labels["emotion"] != emotion_of(labels["rate"], labels["pitch"]):
            continue
        out.append(describe(labels))
    return out


# ---------------------------------------------------------------------------------------------
# Spoken sentences: short (5-9 characters keeps slow clips with long pauses under ~8 s, which
# bounds the audio sequence length and so training cost), composed from word lists.
_SUBJ = ["我", "我们", "你们", "他", "她们", "老师", "小王", "妈妈", "爸爸", "同学", "奶奶", "医生", "邻居", "哥哥"]
_TIME = ["今天", "明天", "昨天", "早上", "晚上", "周末", "下午", "现在", "刚才", "每天"]
_VO = ["去公园", "看电影", "喝绿茶", "买水果", "写作业", "打篮球", "做晚饭", "学英语", "坐地铁", "回老家",
       "听音乐", "去超市", "洗衣服", "看新闻", "种花草", "爬高山", "读小说", "开会议", "唱首歌", "寄包裹",
       "画风景", "修电脑", "找钥匙", "等公交", "吃面条", "跑步", "上班", "休息", "散步", "游泳"]
_ADV = ["想", "要", "会", "常", "都", "也", "还在", "一起", "准备", "喜欢"]
_STATE = ["天气很好", "风有点大", "路上很堵", "外面下雨", "房间很亮", "水很干净", "花开得早", "车站人多",
          "饭菜很香", "街道安静", "阳光明媚", "湖面平静", "山上很冷", "教室明亮"]


def sentence_pool(seed: int = 7) -> list[str]:
    """A few hundred distinct, natural short sentences, in a fixed (seeded) order."""
    pool: set[str] = set()
    for s in _SUBJ:
        for v in _VO:
            for a in _ADV:
                pool.add(f"{s}{a}{v}")
            for t in _TIME:
                pool.add(f"{t}{s}{v}")
    for t in _TIME:
        for st in _STATE:
            pool.add(f"{t}{st}")
    pool = {p for p in pool if 5 <= len(p) <= 9}
    ordered = sorted(pool)
    rng = random.Random(seed)
    rng.shuffle(ordered)
    return ordered[:900]


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


def sample_spec(rng: random.Random, sentence: str, fixed: dict[str, str] | None = None) -> ClipSpec:
    """Draw labels uniformly per attribute, then parameters uniformly inside each label's range."""
    fixed = fixed or {}
    g = fixed.get("gender") or rng.choice(list(GENDER_VARIANTS))
    r = fixed.get("rate") or rng.choice(list(RATE))
    p = fixed.get("pitch") or rng.choice(list(PITCH))
    v = fixed.get("volume") or rng.choice(list(VOLUME))
    pa = fixed.get("pauses") or rng.choice(list(PAUSES))
    labels = {"gender": g, "rate": r, "pitch": p, "volume": v, "pauses": pa, "emotion": emotion_of(r, p)}
    return ClipSpec(
        sentence=sentence,
        variant=rng.choice(GENDER_VARIANTS[g]),
        speed=rng.randint(*RATE[r]),
        pitch=rng.randint(*PITCH[p]),
        amplitude=rng.randint(*VOLUME[v]),
        gap=rng.randint(*PAUSES[pa]),
        labels=labels,
    )


def synthesize(spec: ClipSpec) -> np.ndarray:
    """16 kHz mono float32 waveform. Never loudness-normalised: volume is a label."""
    cmd = ["espeak-ng", "-v", f"{VOICE}+{spec.variant}", "-s", str(spec.speed), "-p", str(spec.pitch),
           "-a", str(spec.amplitude), "-g", str(spec.gap), "--stdout", spec.sentence]
    wav = subprocess.run(cmd, capture_output=True, check=True).stdout
    x, sr = sf.read(io.BytesIO(wav), dtype="float32")
    if x.ndim > 1:
        x = x.mean(axis=1)
    return soxr.resample(x, sr, SAMPLE_RATE).astype(np.float32)


def _feature_extractor() -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor(feature_size=128, sampling_rate=SAMPLE_RATE)


def processor() -> AudioTextProcessor:
    """The shared audio+text processor (same tokenizer for both models, vocabulary = templates)."""
    from .tokenizer import build_tokenizer

    return AudioTextProcessor(build_tokenizer(texts=all_descriptions()), _feature_extractor())


def _make_shard(job: tuple[str, list[dict]]) -> tuple[str, int, float]:
    """Worker: synthesise a shard's clips and store their log-mels (float16, time-concatenated)."""
    path, specs = job
    torch.set_num_threads(1)
    proc = processor()
    feats, lengths, total_s = [], [], 0.0
    for d in specs:
        audio = synthesize(ClipSpec(**d))
        total_s += len(audio) / SAMPLE_RATE
        f, mask = proc.features(audio)
        n = int(mask.sum())
        feats.append(f[0, :, :n].to(torch.float16))
        lengths.append(n)
    torch.save({"features": torch.cat(feats, dim=1), "lengths": torch.tensor(lengths),
                "meta": [{**d, "target": describe(d["labels"])} for d in specs]}, path)
    return path, len(specs), total_s


SAMPLES = [  # (file, fixed labels): both genders, every rate/pitch/volume, both pause classes, all emotions
    ("f_fast_high.wav", {"gender": "女声", "rate": "语速较快", "pitch": "音调偏高", "volume": "音量适中", "pauses": "停顿较少"}),
    ("m_slow_low.wav", {"gender": "男声", "rate": "语速较慢", "pitch": "音调偏低", "volume": "音量较小", "pauses": "停顿较少"}),
    ("f_mid_mid_loud.wav", {"gender": "女声", "rate": "语速适中", "pitch": "音调适中", "volume": "音量较大", "pauses": "停顿较多"}),
    ("m_fast_high_pauses.wav", {"gender": "男声", "rate": "语速较快", "pitch": "音调偏高", "volume": "音量较大", "pauses": "停顿较多"}),
    ("f_slow_low_quiet.wav", {"gender": "女声", "rate": "语速较慢", "pitch": "音调偏低", "volume": "音量较小", "pauses": "停顿较多"}),
    ("m_mid_high.wav", {"gender": "男声", "rate": "语速适中", "pitch": "音调偏高", "volume": "音量适中", "pauses": "停顿较少"}),
    ("f_fast_low.wav", {"gender": "女声", "rate": "语速较快", "pitch": "音调偏低", "volume": "音量较小", "pauses": "停顿较少"}),
    ("m_slow_mid.wav", {"gender": "男声", "rate": "语速较慢", "pitch": "音调适中", "volume": "音量较大", "pauses": "停顿较多"}),
]


def write_samples(val_sentences: list[str], out: Path, seed: int = 11) -> None:
    """The bundled demo clips: short held-out sentences (16-bit wav stays < 150 KB)."""
    rng = random.Random(seed)
    short = sorted((s for s in val_sentences if len(s) <= 6), key=lambda s: (len(s), s))
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (name, fixed) in enumerate(SAMPLES):
        for k in range(len(short)):  # slow clips with long pauses: take a shorter sentence if needed
            spec = sample_spec(rng, short[(i + k) % len(short)], fixed)
            audio = synthesize(spec)
            if len(audio) < 4.4 * SAMPLE_RATE:  # 16-bit mono: < 150 KB
                break
        sf.write(out / name, audio, SAMPLE_RATE, subtype="PCM_16")
        lines.append(json.dumps({"file": name, "labels": spec.labels}, ensure_ascii=False))
    (out / "labels.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=16000, help="training clips")
    ap.add_argument("--val", type=int, default=600, help="validation clips (held-out sentences)")
    ap.add_argument("--shard", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=WORK / "corpus")
    ap.add_argument("--samples", type=Path, default=REPO / "samples")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)

    for t in all_descriptions():
        check_template(t, tuple(p for ps in ATTRIBUTES.values() for p in ps))
    sentences = sentence_pool()
    n_val = round(0.15 * len(sentences))  # whole sentences held out
    val_s, train_s = sentences[:n_val], sentences[n_val:]
    rng = random.Random(args.seed)
    jobs = []
    args.out.mkdir(parents=True, exist_ok=True)
    for split, n, pool in (("val", args.val, val_s), ("train", args.train, train_s)):
        specs = [asdict(sample_spec(rng, rng.choice(pool))) for _ in range(n)]
        for k in range(0, n, args.shard):
            jobs.append((str(args.out / f"{split}-{k // args.shard:03d}.pt"), specs[k:k + args.shard]))
    t0 = time.time()
    seconds = {"train": 0.0, "val": 0.0}
    with Pool(args.workers) as pool:
        for path, n, secs in pool.imap_unordered(_make_shard, jobs):
            seconds["train" if "/train-" in path else "val"] += secs
            print(f"{path}: {n} clips ({time.time() - t0:.0f}s)", flush=True)
    meta = {"train_clips": args.train, "val_clips": args.val, "train_sentences": len(train_s),
            "val_sentences": len(val_s), "val_sentence_list": val_s, "templates": list(TEMPLATES),
            "audio_hours": {k: v / 3600 for k, v in seconds.items()}, "seed": args.seed,
            "build_seconds": time.time() - t0}
    (args.out / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
    write_samples(val_s, args.samples)
    print(json.dumps({k: v for k, v in meta.items() if k != "val_sentence_list"}, ensure_ascii=False))


if __name__ == "__main__":
    main()
