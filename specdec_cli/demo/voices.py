"""The demo corpus's voices (demo contract v3): three free synthesizers from Debian main, their
voices surveyed, gender declared, and whole voices and one whole synthesizer held out.

- **espeak-ng** (`apt-get install espeak-ng`): the voice variants of `espeak-ng-data/voices/!v` that
  declare a gender in their file (a variant without the line would only be espeak's default, not a
  declaration), speaking Mandarin (`cmn-latn-pinyin`) or English. espeak-ng renders an unknown
  variant name silently as the base voice (field notes), so the survey checks each variant's audio
  differs from the base voice's.
- **festival** (`festival` and its `festvox-*` voices): diphone, cluster-unit and HTS voices recorded
  from real people, each speaking its own language.
- **flite** (`flite`): CMU's small engine with its built-in voices, English. Held out whole: it
  appears only in held-out sets. (Its `kal` and `slt` are the speakers of festival's `kal_diphone`
  and `cmu_us_slt_arctic_hts`, so those two festival voices are held out as well: no flite speaker is
  heard in training.)

A voice is used only if its median F0 at its default pitch lies in its declared gender's range
(85-165 Hz male, 165-300 Hz female). `python -m specdec_cli.demo.voices --survey` surveys every
candidate (needs the three synthesizers) and writes `voices.json` beside this module: per voice its
synthesizer, language, declared gender, measured F0 and speaking rate at the default settings, and
its split (train / held-out voice / held-out synthesizer). The corpus reads that file, so it is
committed and the survey is rerun only when the candidates change.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

SAMPLE_RATE = 16_000
VOICES_FILE = Path(__file__).resolve().parent / "voices.json"
ESPEAK_VARIANTS = Path("/usr/lib/x86_64-linux-gnu/espeak-ng-data/voices/!v")
GENDER_F0_HZ = {"男声": (85.0, 165.0), "女声": (165.0, 300.0)}

# festival voices: name -> (language, declared gender). The Indic voices (hindi/marathi/telugu NSK)
# are left out: their text would have to be written in scripts we cannot check here.
FESTIVAL = {
    "kal_diphone": ("en", "男声"), "ked_diphone": ("en", "男声"), "cmu_us_slt_arctic_hts": ("en", "女声"),
    "lp_diphone": ("it", "女声"), "pc_diphone": ("it", "男声"), "upc_ca_ona_hts": ("ca", "女声"),
    "czech_dita": ("cs", "女声"), "czech_machac": ("cs", "男声"), "czech_ph": ("cs", "男声"),
    "suo_fi_lj_diphone": ("fi", "女声"), "hy_fi_mv_diphone": ("fi", "男声"), "msu_ru_nsh_clunits": ("ru", "男声"),
}
FLITE = {"kal": ("en", "男声"), "kal16": ("en", "男声"), "awb": ("en", "男声"), "rms": ("en", "男声"),
         "slt": ("en", "女声")}
HELD_OUT_SYNTH = "flite"
# festival voices whose speakers flite also speaks with (see the module docstring)
HELD_OUT_FESTIVAL = ("kal_diphone", "cmu_us_slt_arctic_hts")
HELD_OUT_ESPEAK_PER_GENDER = 6  # espeak variants held out per gender (a seeded draw)


@dataclass(frozen=True)
class Voice:
    """One voice: `synth` espeak-ng | festival | flite, `ident` its name there, `langs` what it speaks."""

    name: str
    synth: str
    ident: str
    langs: tuple[str, ...]
    gender: str
    split: str = "train"  # train | heldout_voice | heldout_synth
    f0_hz: float = 0.0  # surveyed at the default settings
    rate: float = 0.0  # syllable nuclei per second of phonation, surveyed at the default settings


@dataclass(frozen=True)
class Controls:
    """The synthesizer's own knobs for one rendering: `speed` is a tempo factor (1 = default; 2 =
    twice as fast), `pitch_st` a shift of the voice's base pitch in semitones where the synthesizer
    can move it natively (espeak-ng, flite), else 0."""

    speed: float = 1.0
    pitch_st: float = 0.0


def _read_wav(data: bytes) -> np.ndarray:
    x, sr = sf.read(io.BytesIO(data), dtype="float32")
    if x.ndim > 1:
        x = x.mean(axis=1)
    return soxr.resample(x, sr, SAMPLE_RATE).astype(np.float32) if sr != SAMPLE_RATE else x


def _espeak_lang(lang: str) -> str:
    return {"zh": "cmn-latn-pinyin", "en": "en-us"}[lang]


def espeak_args(voice: Voice, text: str, lang: str, c: Controls) -> list[str]:
    # espeak-ng's -s is words per minute (default 175); above ~270 some variants render erratically
    # (Andrea at 280 spoke longer than at 175), so faster speech is left to sox's tempo. -p 0-99
    # (default 50) moves F0 by about 0.2 semitone per step (m1: 84 -> 111 Hz for +25), so the shift
    # is mapped at 5 steps per semitone, kept off the knob's ends (m1 at -p 0 falls under 60 Hz).
    speed = int(round(min(270, max(80, 175 * c.speed))))
    pitch = int(round(min(95, max(5, 50 + 5 * c.pitch_st))))
    return ["espeak-ng", "-v", f"{_espeak_lang(lang)}+{voice.ident}", "-s", str(speed), "-p", str(pitch),
            "-a", "100", "--stdout", text]


def render_espeak(voice: Voice, text: str, lang: str, c: Controls) -> np.ndarray:
    return _read_wav(subprocess.run(espeak_args(voice, text, lang, c), capture_output=True, check=True).stdout)


def render_flite(voice: Voice, text: str, c: Controls) -> np.ndarray:
    with tempfile.NamedTemporaryFile(suffix=".wav") as f:
        cmd = ["flite", "-voice", voice.ident, "-t", text, "-o", f.name, "--setf", f"duration_stretch={1 / c.speed:.4f}"]
        if c.pitch_st:
            cmd += ["--setf", f"int_f0_target_mean={voice.f0_hz * 2 ** (c.pitch_st / 12):.1f}"]
        subprocess.run(cmd, capture_output=True, check=True)
        return _read_wav(Path(f.name).read_bytes())


def _scheme_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _festival_script(ident: str, jobs: list[tuple[int, str, Controls]], folder: str) -> str:
    lines = [f"(voice_{ident})"]
    for k, text, c in jobs:
        lines.append(f"(Parameter.set 'Duration_Stretch {1 / c.speed:.4f})")
        lines.append(f"(utt.save.wave (utt.synth (Utterance Text {_scheme_string(text)})) \"{folder}/{k}.wav\" 'riff)")
    return "\n".join(lines) + "\n"


def _run_festival(ident: str, jobs: list[tuple[int, str, Controls]], folder: str) -> bool:
    script = Path(folder) / f"{ident}-{jobs[0][0]}.scm"
    script.write_text(_festival_script(ident, jobs, folder), encoding="utf-8")
    done = subprocess.run(["festival", "-b", str(script)], capture_output=True, timeout=600)
    return done.returncode == 0 and all((Path(folder) / f"{k}.wav").exists() for k, _, _ in jobs)


def render_festival(jobs: list[tuple[Voice, str, Controls]]) -> list[np.ndarray | None]:
    """Several festival renderings, one festival process per voice (its start-up costs ~0.5 s; one
    process switching between voices failed on some sequences). A process that fails (festival's
    diphone voices abort on a few word sequences, with nothing on stderr) is retried one utterance
    per process; an utterance that still fails is None, and the caller draws that clip again."""
    out: list[np.ndarray | None] = [None] * len(jobs)
    by_voice: dict[str, list[tuple[int, str, Controls]]] = {}
    for k, (voice, text, c) in enumerate(jobs):
        by_voice.setdefault(voice.ident, []).append((k, text, c))
    with tempfile.TemporaryDirectory() as tmp:
        for ident, vjobs in by_voice.items():
            if not _run_festival(ident, vjobs, tmp):
                for job in vjobs:
                    if not (Path(tmp) / f"{job[0]}.wav").exists():
                        _run_festival(ident, [job], tmp)
            for k, _, _ in vjobs:
                wav = Path(tmp) / f"{k}.wav"
                out[k] = _read_wav(wav.read_bytes()) if wav.exists() else None
    return out


def render(voice: Voice, text: str, lang: str, c: Controls) -> np.ndarray:
    """One utterance at 16 kHz (festival: one process for it; batch with render_festival)."""
    if voice.synth == "espeak-ng":
        return render_espeak(voice, text, lang, c)
    if voice.synth == "flite":
        return render_flite(voice, text, c)
    audio = render_festival([(voice, text, c)])[0]
    if audio is None:
        raise RuntimeError(f"festival's {voice.ident} could not render {text!r}")
    return audio


# ---------------------------------------------------------------------------------------------
def _declared_gender(path: Path) -> str | None:
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split()
        if parts and parts[0].lower() == "gender" and len(parts) > 1:
            return {"male": "男声", "female": "女声"}.get(parts[1].lower())
    return None


def candidates() -> list[Voice]:
    """Every voice the survey considers (no measurements yet)."""
    out = []
    for path in sorted(ESPEAK_VARIANTS.iterdir()):
        g = _declared_gender(path)
        if g is not None:
            out.append(Voice(f"espeak-ng:{path.name}", "espeak-ng", path.name, ("zh", "en"), g))
    for ident, (lang, g) in FESTIVAL.items():
        out.append(Voice(f"festival:{ident}", "festival", ident, (lang,), g))
    for ident, (lang, g) in FLITE.items():
        out.append(Voice(f"flite:{ident}", "flite", ident, (lang,), g))
    return out


SURVEY_TEXT = {
    "zh": ["今天天气很好，我们一起去公园散步。", "老师在学校门口等公交，路上很堵。"],
    "en": ["The old man carried a cup of tea to the kitchen window.", "We wanted to visit the market square today."],
    "it": ["Il maestro porta il giornale, mia madre compra il pane."],
    "ca": ["El mestre porta el diari, la mare compra el pa."],
    "cs": ["Ucitel nese noviny, moje matka koupil chleba."],
    "fi": ["Opettaja tuo lehden, aiti ostaa leipaa tanaan."],
    "ru": ["Учитель несёт газету, моя мама покупает хлеб."],
}


def survey(log=print) -> list[Voice]:
    """Measure every candidate at its default settings and keep those whose F0 fits their declared
    gender; assign the splits. Needs espeak-ng, festival (with the FESTIVAL voices) and flite."""
    from .measure import measure

    for tool in ("espeak-ng", "festival", "flite"):
        if shutil.which(tool) is None:
            raise SystemExit(f"the survey needs {tool}: apt-get install espeak-ng festival flite "
                             "festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts ... (demo-train/README.md)")
    base = {lang: _read_wav(subprocess.run(["espeak-ng", "-v", _espeak_lang(lang), "--stdout", SURVEY_TEXT[lang][0]],
                                           capture_output=True, check=True).stdout) for lang in ("zh", "en")}
    kept = []
    for v in candidates():
        lang = v.langs[0]
        audio = [render(v, t, lang, Controls()) for t in SURVEY_TEXT[lang]]
        if v.synth == "espeak-ng" and len(audio[0]) == len(base[lang]) and np.array_equal(audio[0], base[lang]):
            log(f"{v.name}: renders as the base voice (unknown variant); left out")
            continue
        ms = [measure(a, SAMPLE_RATE) for a in audio]
        f0s = [m.f0_hz for m in ms if m.f0_hz]
        rates = [m.rate for m in ms if m.rate]
        if not f0s or not rates:
            log(f"{v.name}: no voiced speech measured; left out")
            continue
        f0, rate = float(np.median(f0s)), float(np.median(rates))
        lo, hi = GENDER_F0_HZ[v.gender]
        if not lo <= f0 <= hi:
            log(f"{v.name}: declared {v.gender} but F0 {f0:.0f} Hz is outside {lo:.0f}-{hi:.0f}; left out")
            continue
        kept.append(Voice(**{**asdict(v), "f0_hz": round(f0, 1), "rate": round(rate, 2)}))
        log(f"{v.name}: {v.gender} F0 {f0:.0f} Hz, {rate:.2f} syllables/s")
    return assign_splits(kept)


def family(voice: Voice) -> str:
    """espeak-ng variants that are one voice with another finish share a family, held out together:
    `steph2`/`steph3` keep `steph`'s formant frequencies, `anikaRobot` is `anika` with an echo,
    `AnxiousAndy` is `Andy` pitched up."""
    if voice.synth != "espeak-ng":
        return voice.name
    core = re.sub(r"(?i)robot|anxious", "", voice.ident).rstrip("0123456789").lower()
    return f"espeak-ng:{core or voice.ident.lower()}"


def assign_splits(voices: list[Voice], seed: int = 4) -> list[Voice]:
    """flite held out whole; festival's voices of flite's speakers held out; of espeak-ng's, a
    seeded draw of HELD_OUT_ESPEAK_PER_GENDER voices per gender held out, whole families at a time."""
    rng = random.Random(f"{seed}/voices")
    held: set[str] = set()
    for g in ("男声", "女声"):
        fams: dict[str, int] = {}
        for v in voices:
            if v.synth == "espeak-ng" and v.gender == g:
                fams[family(v)] = fams.get(family(v), 0) + 1
        order = sorted(fams)
        rng.shuffle(order)
        n = 0
        for f in order:
            if n >= HELD_OUT_ESPEAK_PER_GENDER or n + fams[f] > sum(fams.values()) // 3:
                continue
            held.add(f)
            n += fams[f]
    out = []
    for v in voices:
        if v.synth == HELD_OUT_SYNTH:
            split = "heldout_synth"
        elif family(v) in held or (v.synth == "festival" and v.ident in HELD_OUT_FESTIVAL):
            split = "heldout_voice"
        else:
            split = "train"
        out.append(Voice(**{**asdict(v), "split": split}))
    return out


@cache
def catalogue(path: Path = VOICES_FILE) -> tuple[Voice, ...]:
    """The surveyed voices (voices.json)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return tuple(Voice(**{**v, "langs": tuple(v["langs"])}) for v in data["voices"])


def voices(split: str) -> list[Voice]:
    return [v for v in catalogue() if v.split == split]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--survey", action="store_true", help=f"survey the candidates and write {VOICES_FILE.name}")
    ap.add_argument("--resplit", action="store_true", help=f"reassign the splits of {VOICES_FILE.name}'s voices")
    args = ap.parse_args(argv)
    if args.survey or args.resplit:
        kept = survey() if args.survey else assign_splits(list(catalogue()))
        VOICES_FILE.write_text(json.dumps({"version": 1, "voices": [asdict(v) for v in kept]}, ensure_ascii=False,
                                          indent=1) + "\n", encoding="utf-8")
        by = {}
        for v in kept:
            by.setdefault((v.synth, v.split, v.gender), []).append(v.ident)
        for k, names in sorted(by.items()):
            print(*k, len(names), " ".join(names))
        return
    for v in catalogue():
        print(v.name, v.gender, v.split, v.f0_hz, v.rate)


if __name__ == "__main__":
    main()
