// The page of `specdec ui`: plain JavaScript, no library. It records (MediaRecorder) or takes a file,
// sends the clip's bytes to /api/describe and draws the JSON lines that come back as they come:
// the sentence so far, one trace line per block, then the record. Text from the server is always
// set as text (textContent), never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
let info = null;
let recorder = null;   // the MediaRecorder while recording
let decoding = false;  // a clip is being described

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = text;
  return node;
}

function showError(message) {
  const box = $("error");
  box.textContent = "error: " + message;
  box.hidden = false;
}

function note(message) {
  $("notes").append(el("li", null, "note: " + message));
}

// One clip at a time: while recording or decoding, only the record button (to stop) answers.
function controls() {
  $("preset").disabled = decoding || recorder !== null;
  $("file").disabled = decoding || recorder !== null;
  $("record").disabled = decoding;
}

function presetAbout() {
  const p = info.presets.find((x) => x.name === $("preset").value);
  if (!p) return;
  const parts = [];
  if (p.mode && p.mode !== "spec") parts.push("mode " + p.mode);
  if (p.threshold !== undefined) parts.push("threshold " + (p.threshold === "inf" ? "∞" : p.threshold));
  if (p.k !== undefined) parts.push("k " + p.k);
  if (p.verify !== undefined) parts.push("verify " + p.verify);
  $("preset-about").textContent = [p.description, parts.join(" · ")].filter(Boolean).join(" — ");
}

async function start() {
  try {
    const response = await fetch("/api/info");
    info = await response.json();
  } catch (err) {
    showError("the page could not reach its server (" + err.message + "); is `specdec ui` still running?");
    return;
  }
  const where = info.cloud_url ? " (" + info.cloud + ")" : " (in this process)";
  $("pair").textContent = info.edge_label + " · " + info.cloud_label + where +
    (info.cloud_down ? " · cloud down: the edge alone" : "");
  $("pair").title = "edge " + info.edge + "\ncloud " + (info.cloud_url || info.cloud);
  for (const p of info.presets) {
    const option = el("option", null, p.name);
    option.value = p.name;
    $("preset").append(option);
  }
  $("preset").value = info.default_preset;
  $("preset").addEventListener("change", presetAbout);
  presetAbout();
  $("limits").textContent = "WAV, FLAC, OGG, MP3, M4A or WebM, at most " + info.max_seconds +
    " s, with speech in it; a recording stops by itself at " + info.max_seconds + " s.";
  controls();
}

// -- recording -------------------------------------------------------------------------------------

async function toggleRecord() {
  if (recorder) {
    recorder.stop();
    return;
  }
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia || !window.MediaRecorder) {
    showError("this browser gives the page no microphone here: recording needs the page on http://127.0.0.1 " +
      "or http://localhost (or https); upload a file instead");
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (err) {
    showError("the microphone could not be opened (" + err.name + "): allow it for this page, or upload a file");
    return;
  }
  $("error").hidden = true;
  const chunks = [];
  recorder = new MediaRecorder(stream);
  const began = performance.now();
  const limit = info.max_seconds - 0.5;  // under the window: the container adds a little
  const tick = setInterval(() => {
    const s = (performance.now() - began) / 1000;
    $("rec-time").textContent = s.toFixed(1) + " s";
    if (s >= limit && recorder && recorder.state === "recording") recorder.stop();
  }, 100);
  recorder.ondataavailable = (e) => { if (e.data.size) chunks.push(e.data); };
  recorder.onstop = () => {
    clearInterval(tick);
    stream.getTracks().forEach((t) => t.stop());
    const type = recorder.mimeType || "audio/webm";
    const suffix = type.includes("ogg") ? "ogg" : type.includes("mp4") ? "m4a" : "webm";
    recorder = null;
    $("record").textContent = "● Record";
    $("record").classList.remove("recording");
    const blob = new Blob(chunks, { type });
    $("playback").src = URL.createObjectURL(blob);
    $("playback").hidden = false;
    describe(blob, "recording." + suffix);
  };
  recorder.start(250);
  $("record").textContent = "■ Stop";
  $("record").classList.add("recording");
  controls();
}

// -- describing ------------------------------------------------------------------------------------

function reset(name) {
  $("error").hidden = true;
  $("notes").replaceChildren();
  $("blocks").replaceChildren();
  $("summary").replaceChildren();
  $("rule").textContent = "";
  $("sentence").textContent = "";
  $("sentence").dataset.state = "decoding";
  $("running").textContent = "";
  $("clip").textContent = name;
  $("status").textContent = "decoding…";
  $("result").hidden = false;
  $("trace").hidden = true;
  $("record-card").hidden = true;
}

async function describe(blob, name) {
  if (decoding) return;
  decoding = true;
  controls();
  reset(name);
  const query = new URLSearchParams({ preset: $("preset").value, name });
  const tally = { blocks: 0, calls: 0, drafted: 0, accepted: 0, tokens: 0 };
  try {
    const response = await fetch("/api/describe?" + query, {
      method: "POST", body: blob, headers: { "Content-Type": "application/octet-stream" },
    });
    if (!response.ok) {
      let message = response.status + " " + response.statusText;
      try { message = (await response.json()).error || message; } catch (_) { /* not JSON */ }
      fail(message);
      return;
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let pending = "";
    let ended = false;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = pending.indexOf("\n")) >= 0) {
        const line = pending.slice(0, cut);
        pending = pending.slice(cut + 1);
        if (line.trim()) ended = handle(JSON.parse(line), tally) || ended;
      }
    }
    if (!ended) fail("the server stopped before the description ended");
  } catch (err) {
    fail("the page lost its server (" + err.message + ")");
  } finally {
    decoding = false;
    controls();
  }
}

function fail(message, record) {
  showError(message);
  if (!$("blocks").children.length) $("trace").hidden = true;
  $("sentence").dataset.state = "error";
  $("status").textContent = "failed";
  if (record) showRecord(record);
}

// One event of the stream; true when it ends the description.
function handle(event, tally) {
  switch (event.type) {
    case "wait":
      $("status").textContent = event.message;
      return false;
    case "start":
      $("status").textContent = "decoding with " + event.preset + "…";
      if (event.rule) {
        $("rule").textContent = event.rule;
        $("trace").hidden = false;
      }
      return false;
    case "note":
      note(event.message);
      return false;
    case "block":
      drawBlock(event, tally);
      return false;
    case "done":
      $("sentence").textContent = event.sentence;
      $("sentence").dataset.state = "done";
      $("status").textContent = "done";
      summarize(JSON.parse(event.record));
      showRecord(event.record);
      return true;
    case "error":
      fail(event.message, event.record);
      return true;
    default:
      return false;
  }
}

function drawBlock(b, tally) {
  $("sentence").textContent = b.sentence;
  const li = el("li", "block " + b.where);
  li.dataset.where = b.where;
  const head = el("div", "head");
  head.append(el("span", "n", String(b.index)));
  head.append(el("span", "gate " + (b.over ? "over" : "under"), b.gate));
  if (b.limit !== null && b.limit > 0 && b.score !== null) {
    // The score against the limit: the limit is the line in the middle, the bar fills to 2x it.
    const meter = el("span", "meter " + (b.over ? "over" : "under"));
    meter.title = b.label + " " + b.score.toFixed(2) + " against " + b.limit;
    const fill = el("span", "fill");
    fill.style.width = Math.min(b.score / b.limit / 2, 1) * 100 + "%";
    meter.append(fill, el("span", "limit"));
    head.append(meter);
  }
  head.append(el("span", "went " + b.where, b.went));
  li.append(head);
  const tokens = el("div", "tokens");
  for (const t of b.tokens) {
    const tok = el("span", "tok " + t.verdict);
    tok.title = t.verdict === "unverified" ? "kept on the edge, not checked by the cloud" : t.verdict;
    tok.append(el("b", null, t.text), el("small", "h " + t.level, t.h.toFixed(2)));
    if (t.m !== undefined) tok.append(el("small", "h " + t.m_level, "/" + t.m.toFixed(2)));
    tok.append(el("i", null, t.mark));
    tokens.append(tok);
  }
  if (b.correction) {
    const tok = el("span", "tok correction");
    tok.title = "the cloud's own token (" + b.correction.kind + ")";
    tok.append(el("i", null, "+"), el("b", null, b.correction.text), el("small", null, b.correction.kind));
    tokens.append(tok);
  }
  li.append(tokens);
  $("blocks").append(li);
  tally.blocks += 1;
  tally.tokens = b.tokens_so_far;
  if (b.where === "cloud") {
    tally.calls += 1;
    tally.drafted += b.tokens.length;
    tally.accepted += b.tokens.filter((t) => t.verdict === "accepted").length;
  }
  const rate = tally.drafted ? Math.round(100 * tally.accepted / tally.drafted) + "% (" + tally.accepted + "/" +
    tally.drafted + ")" : "–";
  $("running").textContent = tally.blocks + " blocks · cloud calls " + tally.calls + " · acceptance " + rate +
    " · " + tally.tokens + " tokens";
}

function size(n) {
  if (n < 1000) return n + " B";
  if (n < 1e6) return (n / 1000).toFixed(1) + " kB";
  return (n / 1e6).toFixed(1) + " MB";
}

function summarize(r) {
  const rows = [];
  const fixed = (v, d) => (typeof v === "number" ? v.toFixed(d) : "–");
  rows.push(["mode", r.mode + (r.mode === "spec" && r.preset ? " (preset " + r.preset + ")" : "")]);
  if (r.mode === "spec") rows.push(["threshold · k · verify", r.threshold + " · " + r.k + " · " + r.verify]);
  rows.push(["cloud calls", r.cloud_calls + " (" + fixed(r.cloud_call_rate, 2) + " per token)" +
    (r.mode === "spec" && r.cloud_free ? " · never reached: every block stayed on the edge" : "")]);
  if (r.mode === "spec") {
    const rate = typeof r.acceptance_rate === "number" ? Math.round(100 * r.acceptance_rate) + "%" : "–";
    rows.push(["acceptance", rate + " of verified drafts · " + r.accepted_tokens + "/" + r.drafted_tokens +
      " drafts kept overall"]);
  }
  rows.push(["tokens", String(r.tokens)]);
  rows.push(["latency", fixed(r.latency_s, 2) + " s · " + fixed(r.tokens_per_s, 1) + " tokens/s"]);
  if (r.cloud_url) {
    rows.push(["cloud link", r.cloud_url + ": " + r.round_trips + " round trips · " + size(r.uplink_bytes) + " up · " +
      size(r.downlink_bytes) + " down · " + fixed(r.cloud_wait_s, 2) + " s waiting"]);
  } else if (r.mode !== "edge") {
    rows.push(["cloud link", "none: the cloud runs in this process (start with --cloud URL for a real link)"]);
  }
  if (r.fallback) {
    rows.push(["cloud failed", r.fallback + ": the edge went on alone after " + r.fallback_at_tokens + " tokens"]);
  }
  if (r.band_limited) {
    note("the record marks this clip band-limited (band_limited: " + JSON.stringify(r.band_limited) + "): " +
      "telephone-like audio; the description may differ from a full-band recording of the same voice");
  }
  const dl = $("summary");
  for (const [k, v] of rows) dl.append(el("dt", null, k), el("dd", null, v));
}

function showRecord(line) {
  $("record-json").textContent = JSON.stringify(JSON.parse(line), null, 2);
  $("record-json").dataset.line = line;
  $("record-card").hidden = false;
}

async function copyRecord() {
  const line = $("record-json").dataset.line || "";
  try {
    await navigator.clipboard.writeText(line);
    $("copy").textContent = "Copied";
  } catch (_) {
    // No clipboard for this page: select the record, for Ctrl-C.
    const range = document.createRange();
    range.selectNodeContents($("record-json"));
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    $("copy").textContent = "Selected: press Ctrl-C";
  }
  setTimeout(() => { $("copy").textContent = "Copy JSON"; }, 2000);
}

document.addEventListener("DOMContentLoaded", () => {
  $("record").addEventListener("click", toggleRecord);
  $("file").addEventListener("change", () => {
    const file = $("file").files[0];
    if (file) describe(file, file.name);
    $("file").value = "";  // the same file chosen again describes it again
  });
  $("copy").addEventListener("click", copyRecord);
  start();
});
