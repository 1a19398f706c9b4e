// The page on the box: polls the box's own API every REFRESH_MS and streams chats from it.
// The API key, when one is needed, lives only in `apiKey` below: never stored, never sent
// anywhere but this origin's /v1 routes.
"use strict";

const REFRESH_MS = 2000;
/** Samples kept per temperature and clock trend (two minutes at REFRESH_MS). */
const TREND_LEN = 60;
const SVG_NS = "http://www.w3.org/2000/svg";

let apiKey = null;
let keyRequired = false;
let modelId = null;
let trendsSeeded = false;
const trends = new Map();
const chat = { messages: [], abort: null };

const $ = (id) => document.getElementById(id);
const setText = (id, text) => { $(id).textContent = text; };

function authHeaders(extra) {
  const h = Object.assign({}, extra);
  if (apiKey !== null) h.Authorization = "Bearer " + apiKey;
  return h;
}

// ---- Prometheus text ----

/** Parses the exposition into [{name, labels, value}]; comments and malformed lines are skipped. */
function parseMetrics(text) {
  const out = [];
  const line = /^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/;
  const label = /(\w+)="((?:[^"\\]|\\.)*)"/g;
  for (const l of text.split("\n")) {
    if (l === "" || l.startsWith("#")) continue;
    const m = line.exec(l);
    if (!m) continue;
    const labels = {};
    for (const lm of (m[2] || "").matchAll(label)) {
      labels[lm[1]] = lm[2].replace(/\\n/g, "\n").replace(/\\(.)/g, "$1");
    }
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

const series = (ms, name) => ms.filter((s) => s.name === name);
const scalar = (ms, name) => { const s = series(ms, name); return s.length ? s[0].value : null; };

/** A histogram's buckets as [{le, count}] (not cumulative), plus its sum and count. */
function histogram(ms, base) {
  const cum = series(ms, base + "_bucket")
    .map((s) => ({ le: s.labels.le === "+Inf" ? Infinity : Number(s.labels.le), n: s.value }))
    .sort((a, b) => a.le - b.le);
  const buckets = cum.map((b, i) => ({ le: b.le, count: b.n - (i ? cum[i - 1].n : 0) }));
  return { buckets, sum: scalar(ms, base + "_sum") || 0, count: scalar(ms, base + "_count") || 0 };
}

// ---- formatting ----

function duration(s) {
  if (!isFinite(s)) return "–";
  const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
  if (d) return `${d}d ${h}h ${m}m`;
  if (h) return `${h}h ${m}m`;
  return m ? `${m}m ${Math.floor(s % 60)}s` : `${Math.floor(s)}s`;
}

function seconds(s) {
  if (!isFinite(s)) return "∞";
  return s < 1 ? `${+(s * 1000).toPrecision(3)} ms` : `${+s.toPrecision(3)} s`;
}

const rate = (tps) => (tps >= 100 ? tps.toFixed(0) : +tps.toPrecision(2)) + " tok/s";

// ---- drawing ----

function svg(tag, attrs, parent) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (parent) parent.appendChild(el);
  return el;
}

/** A sparkline of `values`, scaled to their own range. */
function sparkline(values) {
  const w = 120, h = 24;
  const root = svg("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, class: "spark" });
  if (values.length < 2) return root;
  const lo = Math.min(...values), hi = Math.max(...values);
  // A steady value draws a level line across the middle.
  const y = (v) => (hi > lo ? h - 2 - ((v - lo) / (hi - lo)) * (h - 4) : h / 2);
  const step = w / (TREND_LEN - 1), x0 = w - step * (values.length - 1);
  const pts = values.map((v, i) => `${(x0 + i * step).toFixed(1)},${y(v).toFixed(1)}`);
  const t = svg("title", {}, root);
  t.textContent = `last ${values.length} samples: ${+lo.toPrecision(4)} to ${+hi.toPrecision(4)}`;
  svg("polyline", { points: pts.join(" "), fill: "none" }, root);
  return root;
}

/** Bars for `bars` ([{label, count}]), each bar's count above it, its label slanted below. */
function barChart(bars) {
  const w = 320, h = 110, pad = 12, axis = 44, n = Math.max(bars.length, 1);
  const bw = w / n, max = Math.max(1, ...bars.map((b) => b.count));
  // The slanted labels reach left of the first bar: the view box starts before 0.
  const root = svg("svg", { viewBox: `${-axis} 0 ${w + axis} ${h + pad + axis}`, class: "bars" });
  bars.forEach((b, i) => {
    const bh = (b.count / max) * h;
    const x = i * bw;
    svg("rect", { x: x + 1, y: pad + h - bh, width: Math.max(bw - 2, 1), height: bh }, root);
    const title = svg("title", {}, root.lastChild);
    title.textContent = `${b.label}: ${b.count}`;
    if (b.count) svg("text", { x: x + bw / 2, y: pad + h - bh - 3, class: "count" }, root).textContent = b.count;
    const lx = x + bw / 2, ly = pad + h + 8;
    svg("text", { x: lx, y: ly, class: "axis", transform: `rotate(-40 ${lx} ${ly})` }, root).textContent = b.label;
  });
  return root;
}

function trend(key, value) {
  let t = trends.get(key);
  if (!t) trends.set(key, (t = []));
  t.push(value);
  if (t.length > TREND_LEN) t.shift();
  return t;
}

/** Fills `tbody` with one row per sample: name, formatted value, trend. */
function seriesRows(tbody, rows) {
  tbody.replaceChildren(...rows.map(({ key, name, value, text }) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.textContent = name;
    const td = document.createElement("td");
    td.textContent = text;
    td.className = key.startsWith("temp:") ? "temp" : "clock";
    const sp = document.createElement("td");
    sp.appendChild(sparkline(trend(key, value)));
    tr.append(th, td, sp);
    return tr;
  }));
}

// ---- rendering ----

const STATES = ["normal", "hot", "critical"];

function renderMetrics(ms) {
  const active = scalar(ms, "inferloop_active_slots");
  if (active !== null && !$("slots").dataset.fromStatus) setText("slots", `${active} busy`);
  const queue = scalar(ms, "inferloop_queue_depth");
  if (queue !== null && !$("queue").dataset.fromStatus) setText("queue", `${queue} waiting`);
  const lookup = scalar(ms, "inferloop_prefix_cache_lookup_tokens_total") || 0;
  const hit = scalar(ms, "inferloop_prefix_cache_hit_tokens_total") || 0;
  setText("prefix", lookup ? `${(100 * hit / lookup).toFixed(1)} % (${hit} of ${lookup} prompt tokens)` : "no prompts yet");
  const gen = scalar(ms, "inferloop_generated_tokens_total");
  if (gen !== null) setText("generated", String(gen));

  seriesRows($("temps"), series(ms, "inferloop_temperature_celsius").map((s) => ({
    key: "temp:" + s.labels.zone, name: s.labels.zone, value: s.value, text: `${s.value.toFixed(1)} °C`,
  })));
  seriesRows($("clocks"), clockRows(series(ms, "inferloop_clock_hz")).map(({ name, hz }) => ({
    key: "clock:" + name, name, value: hz, text: `${(hz / 1e6).toFixed(0)} MHz`,
  })));
  if (!$("temps").children.length) {
    const tr = document.createElement("tr");
    tr.textContent = "no temperature sensors read on this box";
    $("temps").replaceChildren(tr);
  }
  const state = STATES[scalar(ms, "inferloop_thermal_state") || 0] || "normal";
  const st = $("thermal-state");
  st.textContent = state;
  st.className = "pill " + state;
  const causes = series(ms, "inferloop_throttled").filter((s) => s.value === 1).map((s) => s.labels.cause);
  setText("throttle", causes.length ? "throttled: " + causes.join(", ") : "not throttled");
  $("throttle").className = "throttle" + (causes.length ? " on" : "");

  const ttft = histogram(ms, "inferloop_ttft_seconds");
  const ttftBars = ttft.buckets.map((b, i) => ({
    label: isFinite(b.le) || !i ? "≤" + seconds(b.le) : ">" + seconds(ttft.buckets[i - 1].le), count: b.count,
  }));
  drawHist("ttft-hist", ttftBars, ttft.count ? `${ttft.count} requests, mean ${seconds(ttft.sum / ttft.count)}` : "no requests yet");
  // Decode speed is the inverse of the time between tokens: the fastest bucket is the
  // shortest gap, so the inter-token buckets are drawn in reverse.
  const itl = histogram(ms, "inferloop_inter_token_seconds");
  const speedBars = itl.buckets.map((b, i) => ({
    label: isFinite(b.le) || !i ? "≥" + rate(1 / b.le) : "<" + rate(1 / itl.buckets[i - 1].le), count: b.count,
  })).reverse();
  drawHist("speed-hist", speedBars, itl.count ? `${itl.count} token gaps, mean ${rate(itl.count / itl.sum)}` : "no tokens yet");
}

/** One row per clock domain, except the CPU cores (`cpu0`..`cpuN`): one row, their mean. */
function clockRows(clocks) {
  const cores = clocks.filter((c) => /^cpu\d+$/.test(c.labels.domain));
  const rows = clocks.filter((c) => !cores.includes(c)).map((c) => ({ name: c.labels.domain, hz: c.value }));
  if (cores.length) {
    const mean = cores.reduce((a, c) => a + c.value, 0) / cores.length;
    rows.push({ name: `cpu (mean of ${cores.length})`, hz: mean });
  }
  return rows;
}

function drawHist(id, bars, caption) {
  const p = document.createElement("p");
  p.className = "caption";
  p.textContent = caption;
  $(id).replaceChildren(barChart(bars.length ? bars : [{ label: "–", count: 0 }]), p);
}

function renderStatus(s) {
  setText("version", s.version || "–");
  setText("uptime", duration(s.uptime_s));
  const ready = $("ready");
  ready.textContent = s.ready ? "ready" : "loading";
  ready.className = "pill " + (s.ready ? "normal" : "hot");
  if (s.model) {
    modelId = s.model.id;
    setText("model-id", s.model.id);
  }
  const i = s.integrity || {};
  setText("model-sha", i.weights_sha256_observed || i.weights_sha256 || "hashing…");
  const b = s.backend || {};
  setText("backend", [b.name, b.device && "on " + b.device, b.gpu && `(${b.gpu})`].filter(Boolean).join(" ") || "–");
  setText("board", s.board ? `${s.board.name} — ${s.board.description}` : "none detected");
  const sl = s.slots || {};
  setText("slots", `${sl.active} busy, ${sl.idle} free of ${sl.total}`);
  $("slots").dataset.fromStatus = "1";
  $("slots-bar").style.width = sl.total ? `${(100 * sl.active) / sl.total}%` : "0";
  const q = s.queue || {};
  setText("queue", `${q.depth} waiting (room for ${q.capacity})`);
  $("queue").dataset.fromStatus = "1";
}

/**
 * Seeds the trends from the box's own thermal history (`/v1/thermal`, behind the key), so
 * they start full instead of empty: the last TREND_LEN readings, one per REFRESH_MS.
 */
async function seedTrends() {
  const r = await fetch("/v1/thermal", { headers: authHeaders(), cache: "no-store" });
  if (!r.ok) return;
  const t = await r.json();
  const every = Math.max(1, Math.round(REFRESH_MS / (t.interval_ms || REFRESH_MS)));
  const picked = [];
  const history = t.history || [];
  for (let i = history.length - 1; i >= 0 && picked.length < TREND_LEN; i -= every) picked.unshift(history[i]);
  const seeded = new Map();
  const add = (key, v) => { if (!seeded.has(key)) seeded.set(key, []); seeded.get(key).push(v); };
  for (const reading of picked) {
    for (const z of reading.zones || []) add("temp:" + z.name, z.celsius);
    const clocks = (reading.clocks || []).map((c) => ({ labels: { domain: c.domain }, value: c.hz }));
    for (const c of clockRows(clocks)) add("clock:" + c.name, c.hz);
  }
  // The samples taken since load are newer than the history: they stay at the end.
  for (const [key, values] of seeded) trends.set(key, values.concat(trends.get(key) || []).slice(-TREND_LEN));
}

// ---- polling ----

function showKeyPanel(message) {
  $("key-panel").hidden = false;
  setText("key-error", message || "");
  $("chat-send").disabled = true;
}

async function refresh() {
  try {
    const m = await fetch("/metrics", { cache: "no-store" });
    if (m.ok) renderMetrics(parseMetrics(await m.text()));
    if (!keyRequired || apiKey !== null) {
      const r = await fetch("/v1/status", { headers: authHeaders(), cache: "no-store" });
      if (r.status === 401) {
        apiKey = null;
        showKeyPanel("The box refused that key.");
      } else if (r.ok) {
        renderStatus(await r.json());
        if (!trendsSeeded) {
          trendsSeeded = true;
          await seedTrends();
        }
      }
    }
    setText("updated", "updated " + new Date().toLocaleTimeString());
  } catch (e) {
    setText("updated", "box unreachable: " + e.message);
  }
}

async function start() {
  try {
    const r = await fetch("/ui/config", { cache: "no-store" });
    keyRequired = r.ok && (await r.json()).api_key_required === true;
  } catch (e) {
    keyRequired = false;
  }
  if (keyRequired) showKeyPanel();
  await refresh();
  setInterval(refresh, REFRESH_MS);
}

$("key-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const k = $("key-input").value.trim();
  if (!k) return;
  apiKey = k;
  $("key-input").value = "";
  $("key-panel").hidden = true;
  $("chat-send").disabled = false;
  await refresh();
});

// ---- chat ----

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("chat-log").appendChild(div);
  $("chat-log").scrollTop = $("chat-log").scrollHeight;
  return div;
}

/** The message of an OpenAI-shaped error body, or the raw text. */
function errorText(status, text) {
  try {
    const e = JSON.parse(text).error;
    if (e && e.message) return `${status}: ${e.message}` + (e.code ? ` (${e.code})` : "");
  } catch (_) { /* not JSON */ }
  return `${status}: ${text || "no body"}`;
}

/** Reads an SSE body, calling `onData` with each event's parsed `data` until `[DONE]`. */
async function readSse(body, onData) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      onData(JSON.parse(data));
    }
  }
}

async function send(text) {
  setText("chat-error", "");
  chat.messages.push({ role: "user", content: text });
  bubble("user", text);
  const out = bubble("assistant streaming", "");
  const body = {
    messages: chat.messages,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: Number($("chat-max").value) || 128,
    temperature: Number($("chat-temp").value),
  };
  if (modelId) body.model = modelId;
  chat.abort = new AbortController();
  $("chat-send").disabled = true;
  $("chat-stop").disabled = false;
  const t0 = performance.now();
  let answer = "", note = "";
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
      signal: chat.abort.signal,
    });
    if (!r.ok) {
      if (r.status === 401) { apiKey = null; showKeyPanel("The box refused that key."); }
      throw new Error(errorText(r.status, await r.text()));
    }
    await readSse(r.body, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message || "stream error");
      const c = (chunk.choices || [])[0];
      if (c && c.delta && c.delta.content) {
        answer += c.delta.content;
        out.textContent = answer;
        $("chat-log").scrollTop = $("chat-log").scrollHeight;
      }
      if (c && c.finish_reason) note = c.finish_reason;
      if (chunk.usage) {
        const secs = (performance.now() - t0) / 1000;
        note += ` · ${chunk.usage.completion_tokens} tokens in ${secs.toFixed(1)} s`;
      }
    });
  } catch (e) {
    if (e.name === "AbortError") note = "stopped";
    else {
      setText("chat-error", e.message);
      chat.abort.abort(); // an error event mid-stream: stop reading the rest
    }
  } finally {
    out.classList.remove("streaming");
    if (answer) chat.messages.push({ role: "assistant", content: answer });
    else chat.messages.pop();
    if (note) bubble("note", note);
    chat.abort = null;
    $("chat-stop").disabled = true;
    $("chat-send").disabled = keyRequired && apiKey === null;
  }
}

$("chat-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text || chat.abort) return;
  $("chat-input").value = "";
  send(text);
});
$("chat-input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("chat-form").requestSubmit();
  }
});
$("chat-stop").addEventListener("click", () => { if (chat.abort) chat.abort.abort(); });
$("chat-clear").addEventListener("click", () => {
  if (chat.abort) return;
  chat.messages = [];
  $("chat-log").replaceChildren();
  setText("chat-error", "");
});

start();
