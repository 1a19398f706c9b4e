#!/usr/bin/env python3
"""Soak inferloopd: hours of mixed traffic at a steady rate while its resources are sampled.

Starts `inferloopd serve` (2 slots, a queue of 4, so that bursts go past it) or attaches to a
running one (--base-url with --pid), and sends, at --rate requests a second: chat and
completions, streamed and not, `response_format` json_schema, tools with a forced
`tool_choice`, streams the client drops after a few chunks, `/metrics` scrapes, and every
--burst-every seconds a burst of more requests than the slots and the queue hold (their 429s
are expected). Every --sample-every seconds it records the daemon's RSS, open fds and threads
(/proc/PID) and, from /metrics, the KV cells reserved, the queue depth, the active slots and
the prompt caches. When the load stops it waits for the daemon to go idle again.

It fails when, after --warmup, a gauge trends upward (a least-squares slope, reported per
hour; see `Gauge` and `judge_trend` for when a slope counts), when the KV cells, the queue or
the slots do not return to 0 or the fds and threads to their idle baseline within --grace
seconds of the load stopping, on any 5xx, on any transport error or unexpected status, and
when the daemon dies.

Writes, under --out (default out/soak/): series.json (every sample, rewritten after each one,
so a run cut short still leaves its series), summary.json (slopes per hour, the verdict,
requests by kind and outcome, answer times), soak.svg (one panel per gauge over time),
requests.jsonl (every request: kind, start, end, outcome) and daemon.log (when it started it).

Usage: bench/soak.py [--duration 2h] [--rate 1] [--sample-every 10] [--warmup 15m]
                     [--out out/soak] [--base-url URL --pid PID] [--pause-while /tmp/QUIET]
       bench/soak.py --report DIR   (the slopes of a run still going or cut short, from its
                                     series.json: DIR/report.json, report.svg)
Needs the openai package (the repo's .venv) for the traffic; the verdict logic does not.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime as dt
import json
import math
import os
import random
import re
import signal
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"
MIB = 1024 * 1024


# --- gauges and the verdict (pure functions: tests/python/test_bench_soak.py) ------------------


@dataclasses.dataclass(frozen=True)
class Gauge:
    """One sampled series and when its trend counts as a leak.

    A post-warm-up slope fails only when all three hold: it is above `min_slope_per_h`, the
    rise it predicts over the fitted window is above both `min_rise` and three standard
    deviations of the residuals (a trend the noise cannot explain), and the second half of the
    window still climbs at least half as fast (a leak keeps growing; a one-off step, such as
    the allocator taking a new arena, levels off). `min_rise` is what keeps a 5-minute run from
    failing on noise: over a few minutes only a rise that large is told apart from the
    sample-to-sample jumps, while over 2 hours the slope threshold decides.
    `idle` is what the gauge must return to once the load stops: "zero", "baseline" (at most
    `idle_slack` above the value measured idle before the load) or None (not checked).
    `judged` False: plotted and its slope reported, but no verdict (bounded caches)."""

    name: str
    label: str
    unit: str  # "bytes" or "count"
    min_slope_per_h: float
    min_rise: float
    idle: str | None
    idle_slack: float = 0.0
    judged: bool = True


GAUGES: tuple[Gauge, ...] = (
    # RSS less the prompt cache's RAM tier (the bytes /metrics says it holds). The tier fills
    # up to its budget (180 MiB by default) over the first minutes, faster or slower with the
    # rate, and then evicts: a bounded climb that a 5-minute run cannot tell from a leak, so
    # it is taken out. The daemon fixes glibc's mmap threshold (daemon/src/heap.rs), so
    # buffers of a few MiB are given back when freed; before it did, what was left moved in
    # steps of 5-15 MiB without any leak (a CI run's 23 MiB rise over 4 minutes). 16 MiB is
    # still the floor, for allocators that keep more. 4 MiB/h is ~100 MiB a day, a leak that
    # takes a 16 GiB board down within weeks; over a 2-hour run's 105 fitted minutes the
    # 16 MiB floor makes the threshold ~9 MiB/h. RSS need not fall back when idle (the allocator keeps its pages).
    Gauge("rss_less_cache_bytes", "RSS less prompt cache", "bytes", 4 * MIB, 16 * MIB, None),
    # Raw RSS, for the record: after warm-up it is the above plus a full tier.
    Gauge("rss_bytes", "RSS", "bytes", 0, 0, None, judged=False),
    # fds and threads count the connections and blocking tasks in flight at the instant of the
    # sample (up to slots + queue + a burst), so single samples jump by ~10; a leak shows as a
    # climb of the floor, and as a failure to come back to the idle baseline. The slack of 2
    # allows a connection the kernel has not finished closing and a tokio blocking thread
    # still inside its 10 s keep-alive when the grace period ends.
    Gauge("fds", "open fds", "count", 2, 8, "baseline", idle_slack=2),
    Gauge("threads", "threads", "count", 2, 4, "baseline", idle_slack=2),
    # Occupancy: cells reserved by running requests (prompt + max_tokens each, up to a few
    # hundred here), requests queued, slots decoding. Sampled under load they jump between 0
    # and their capacity, so only a climb of a couple of requests' worth that the noise cannot
    # explain counts (the box falling behind the offered rate); a reservation or a slot never
    # given back shows sharply as a non-zero value once the load stops.
    Gauge("kv_reserved_cells", "KV cells reserved", "count", 64, 512, "zero"),
    Gauge("queue_depth", "queue depth", "count", 1, 2, "zero"),
    Gauge("active_slots", "active slots", "count", 1, 1, "zero"),
    # Bounded by design (the slots' cells, the RAM tier's budget): they fill during warm-up
    # and stay full, so an upward slope is their filling, not a leak. Shown, not judged.
    Gauge("prefix_retained_cells", "KV cells kept for prefix reuse", "count", 0, 0, None,
          judged=False),
    Gauge("prompt_cache_ram_bytes", "prompt cache RAM tier", "bytes", 0, 0, None, judged=False),
)
GAUGE_BY_NAME = {g.name: g for g in GAUGES}

# Fewer post-warm-up samples than this fit no slope worth a verdict.
MIN_FIT_SAMPLES = 6
# Outcomes that are not failures: a 200, and a 429 (a burst past the queue, or the steady
# traffic meeting a full queue, is refused by design).
OK_OUTCOMES = {"200"}
EXPECTED_OUTCOMES = {"429"}


def parse_duration(text: str) -> float:
    """Seconds from `2h`, `90m`, `1h30m`, `300s` or a bare number of seconds."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", text)
    if not text or not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (say 2h, 90m, 1h30m, 300s)")
    h, mi, s = (float(x) if x else 0.0 for x in m.groups())
    return h * 3600 + mi * 60 + s


def default_warmup(duration_s: float) -> float:
    """A fifth of the run, at least a minute and at most 15: the prompt caches fill and the
    allocator reaches its working set in the first minutes at 1 request/s."""
    return min(900.0, max(60.0, duration_s / 5))


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {"name" or "name{labels}": value}; comments skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def linear_fit(ts: list[float], ys: list[float]) -> dict[str, float] | None:
    """Least squares y = a + b t: slope b (per unit of t), intercept, residual standard
    deviation and the slope's standard error; None for fewer than 3 points or no spread in t."""
    n = len(ts)
    if n < 3 or n != len(ys):
        return None
    mt, my = sum(ts) / n, sum(ys) / n
    sxx = sum((t - mt) ** 2 for t in ts)
    if sxx <= 0:
        return None
    sxy = sum((t - mt) * (y - my) for t, y in zip(ts, ys))
    slope = sxy / sxx
    intercept = my - slope * mt
    ss_res = sum((y - intercept - slope * t) ** 2 for t, y in zip(ts, ys))
    resid_sd = math.sqrt(ss_res / (n - 2))
    return {"n": n, "slope": slope, "intercept": intercept, "resid_sd": resid_sd,
            "slope_se": resid_sd / math.sqrt(sxx)}


def judge_trend(gauge: Gauge, ts: list[float], ys: list[float]) -> dict[str, Any]:
    """The slope of one gauge over the post-warm-up load samples (ts in seconds) and whether
    it fails; the rule is `Gauge`'s docstring."""
    pts = [(t, y) for t, y in zip(ts, ys) if y is not None]
    res: dict[str, Any] = {"gauge": gauge.name, "unit": gauge.unit, "n": len(pts),
                           "judged": gauge.judged, "fail": False}
    fit = linear_fit([p[0] for p in pts], [p[1] for p in pts]) if len(pts) >= 3 else None
    if fit is None or len(pts) < MIN_FIT_SAMPLES:
        res["reason"] = f"{len(pts)} samples after warm-up: too few to fit (need {MIN_FIT_SAMPLES})"
        return res
    span = pts[-1][0] - pts[0][0]
    half = [p for p in pts if p[0] >= pts[0][0] + span / 2]
    late = linear_fit([p[0] for p in half], [p[1] for p in half])
    slope_h = fit["slope"] * 3600
    late_h = late["slope"] * 3600 if late else None
    rise = fit["slope"] * span
    noise = 3 * fit["resid_sd"]
    res.update(slope_per_h=slope_h, late_slope_per_h=late_h, rise=rise, noise_3sd=noise,
               span_s=span, first=pts[0][1], last=pts[-1][1],
               min_slope_per_h=gauge.min_slope_per_h, min_rise=gauge.min_rise)
    if not gauge.judged:
        res["reason"] = "bounded cache: reported, not judged"
        return res
    steep = slope_h > gauge.min_slope_per_h
    beyond_noise = rise > max(gauge.min_rise, noise)
    persists = late_h is not None and late_h > gauge.min_slope_per_h / 2
    res["fail"] = steep and beyond_noise and persists
    if res["fail"]:
        res["reason"] = (f"climbs {fmt_value(gauge, slope_h)}/h (over {fmt_value(gauge, gauge.min_slope_per_h)}/h), "
                         f"{fmt_value(gauge, rise)} over {span / 60:.0f} min (over "
                         f"{fmt_value(gauge, max(gauge.min_rise, noise))}), still "
                         f"{fmt_value(gauge, late_h or 0)}/h in the second half")
    elif not steep:
        res["reason"] = f"slope under {fmt_value(gauge, gauge.min_slope_per_h)}/h"
    elif not beyond_noise:
        res["reason"] = (f"rise {fmt_value(gauge, rise)} within max(min rise "
                         f"{fmt_value(gauge, gauge.min_rise)}, 3 sd {fmt_value(gauge, noise)})")
    else:
        res["reason"] = "levels off: the second half's slope is under half the threshold"
    return res


def judge_idle(baseline: dict[str, float | None], after: dict[str, float | None]) -> list[str]:
    """What did not return to idle: the gauges with idle "zero" above 0, those with "baseline"
    more than their slack above the baseline. Missing readings count as not returned."""
    problems = []
    for g in GAUGES:
        if g.idle is None:
            continue
        v = after.get(g.name)
        if v is None:
            problems.append(f"{g.name}: no reading after the load")
            continue
        if g.idle == "zero" and v != 0:
            problems.append(f"{g.name} is {fmt_value(g, v)}, not 0")
        elif g.idle == "baseline":
            base = baseline.get(g.name)
            if base is None:
                problems.append(f"{g.name}: no idle baseline")
            elif v > base + g.idle_slack:
                problems.append(f"{g.name} is {fmt_value(g, v)}, idle baseline "
                                f"{fmt_value(g, base)} (+{fmt_value(g, g.idle_slack)} allowed)")
    return problems


def classify(outcome: str) -> str:
    """ok | expected | 5xx | error (transport errors, in-stream errors, other statuses)."""
    if outcome in OK_OUTCOMES:
        return "ok"
    if outcome in EXPECTED_OUTCOMES:
        return "expected"
    if outcome.isdigit() and 500 <= int(outcome) <= 599:
        return "5xx"
    return "error"


def verdict(trends: list[dict[str, Any]], idle_problems: list[str],
            counts: dict[str, dict[str, int]], daemon_problem: str | None) -> list[str]:
    """Every reason the soak fails; empty when it passes."""
    reasons = []
    for t in trends:
        if t.get("fail"):
            reasons.append(f"{t['gauge']} trends upward: {t['reason']}")
    reasons += [f"not idle after the load: {p}" for p in idle_problems]
    by_class: collections.Counter[str] = collections.Counter()
    detail: dict[str, list[str]] = collections.defaultdict(list)
    for kind, outcomes in counts.items():
        for outcome, n in outcomes.items():
            c = classify(outcome)
            by_class[c] += n
            if c in ("5xx", "error"):
                detail[c].append(f"{kind} {outcome} x{n}")
    if by_class["5xx"]:
        reasons.append(f"{by_class['5xx']} responses with a 5xx: {', '.join(detail['5xx'])}")
    if by_class["error"]:
        reasons.append(f"{by_class['error']} requests failed otherwise: {', '.join(detail['error'])}")
    if daemon_problem:
        reasons.append(daemon_problem)
    return reasons


def merge_counts(*parts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """{kind: {outcome: n}} summed over `parts`."""
    total: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for part in parts:
        for kind, outcomes in part.items():
            total[kind].update(outcomes)
    return {k: dict(sorted(v.items())) for k, v in sorted(total.items())}


def fmt_value(g: Gauge, v: float) -> str:
    if g.unit == "bytes":
        return f"{v / MIB:.1f} MiB"
    return f"{v:.1f}" if abs(v - round(v)) > 1e-9 else f"{v:.0f}"


# --- the plot --------------------------------------------------------------------------------


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def minute_ticks(t0: float, t1: float) -> list[float]:
    """Tick times (s) at whole minutes, at most 7 of them, a step of 1, 2, 5, 10, 15, 30 or 60."""
    span_min = max((t1 - t0) / 60, 1e-9)
    step = next((m for m in (1, 2, 5, 10, 15, 30, 60) if span_min / m <= 6), 60 * math.ceil(span_min / 360))
    first = math.ceil(t0 / 60 / step) * step
    return [m * 60.0 for m in range(int(first), int(t1 / 60) + 1, step)]


def render_svg(samples: list[dict[str, Any]], trends: dict[str, dict[str, Any]],
               warmup_s: float, load_s: float | None, title: str,
               notes: list[str] | None = None) -> str:
    """One panel per gauge over time (minutes): the series, warm-up shaded grey, the time after
    the load shaded blue, the post-warm-up fit as a dashed line, the slope per hour on top;
    `notes` (the verdict's reasons) under the title."""
    notes = notes or []
    pw, ph, cols, ml, mr, mt, mb = 440, 170, 2, 64, 14, 30, 30
    rows = math.ceil(len(GAUGES) / cols)
    top = 40 + 14 * len(notes)
    width, height = cols * pw, rows * ph + top
    ts = [s["t"] for s in samples]
    t0, t1 = (min(ts), max(ts)) if ts else (0.0, 1.0)
    if t1 <= t0:
        t1 = t0 + 1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="22" font-size="14" font-weight="bold">{_esc(title)}</text>']
    out += [f'<text x="10" y="{38 + 14 * k}" fill="#c00">{_esc(n[:150])}</text>'
            for k, n in enumerate(notes)]
    for i, g in enumerate(GAUGES):
        ox, oy = (i % cols) * pw, top + (i // cols) * ph
        x0, x1, y0, y1 = ox + ml, ox + pw - mr, oy + mt, oy + ph - mb
        pts = [(s["t"], s.get(g.name)) for s in samples if s.get(g.name) is not None]
        vals = [v for _, v in pts]
        lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
        if hi <= lo:
            hi = lo + (abs(lo) * 0.01 or 1.0)
        pad = (hi - lo) * 0.08
        lo, hi = lo - pad, hi + pad

        def X(t: float) -> float:
            return x0 + (t - t0) / (t1 - t0) * (x1 - x0)

        def Y(v: float) -> float:
            return y1 - (v - lo) / (hi - lo) * (y1 - y0)

        tr = trends.get(g.name, {})
        state = "" if not g.judged else (" FAIL" if tr.get("fail") else " ok")
        slope = tr.get("slope_per_h")
        head = f"{g.label}" + (f": {fmt_value(g, slope)}/h" if slope is not None else "") + state
        color = "#c00" if tr.get("fail") else "#222"
        out.append(f'<text x="{x0}" y="{oy + 18}" font-weight="bold" fill="{color}">{_esc(head)}</text>')
        if warmup_s > t0:
            out.append(f'<rect x="{X(t0):.1f}" y="{y0}" width="{X(min(warmup_s, t1)) - X(t0):.1f}" '
                       f'height="{y1 - y0}" fill="#eee"/>')
        if load_s is not None and load_s < t1:
            out.append(f'<rect x="{X(load_s):.1f}" y="{y0}" width="{x1 - X(load_s):.1f}" '
                       f'height="{y1 - y0}" fill="#e6f0ff"/>')
        out.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" fill="none" '
                   f'stroke="#888"/>')
        for v in (lo + pad, hi - pad):
            out.append(f'<text x="{x0 - 4}" y="{Y(v) + 4:.1f}" text-anchor="end">'
                       f'{_esc(fmt_value(g, v))}</text>')
        for t in minute_ticks(t0, t1):
            out.append(f'<text x="{X(t):.1f}" y="{y1 + 14}" text-anchor="middle">{t / 60:.0f}m</text>')
        if pts:
            poly = " ".join(f"{X(t):.1f},{Y(v):.1f}" for t, v in pts)
            out.append(f'<polyline points="{poly}" fill="none" stroke="#1f5fbf" stroke-width="1.2"/>')
        if slope is not None and "intercept" in tr:
            a, b = tr["intercept"], tr["slope_per_h"] / 3600
            fa, fb = tr["fit_from"], tr["fit_to"]
            out.append(f'<line x1="{X(fa):.1f}" y1="{Y(a + b * fa):.1f}" x2="{X(fb):.1f}" '
                       f'y2="{Y(a + b * fb):.1f}" stroke="#d33" stroke-dasharray="5,3"/>')
    out.append(f'<text x="10" y="{height - 6}" fill="#555">grey: warm-up (not fitted); blue: '
               f'after the load stopped; dashed: least-squares fit after warm-up</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def trends_for(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, dict[str, Any]]:
    """judge_trend for every gauge on the load samples after warm-up (paused ones included:
    the daemon must not grow while idle either)."""
    fit = [s for s in samples if s["phase"] == "load" and s["t"] >= warmup_s]
    res = {}
    for g in GAUGES:
        ts = [s["t"] for s in fit if s.get(g.name) is not None]
        ys = [s[g.name] for s in fit if s.get(g.name) is not None]
        tr = judge_trend(g, ts, ys)
        f = linear_fit(ts, ys) if len(ts) >= 3 else None
        if f and "slope_per_h" in tr:
            tr.update(intercept=f["intercept"], fit_from=ts[0], fit_to=ts[-1])
        res[g.name] = tr
    return res


# --- the daemon's side -----------------------------------------------------------------------


def proc_sample(pid: int) -> dict[str, float | None]:
    """RSS, threads (/proc/PID/status) and open fds (entries of /proc/PID/fd)."""
    out: dict[str, float | None] = {"rss_bytes": None, "threads": None, "fds": None}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["rss_bytes"] = float(line.split()[1]) * 1024
                elif line.startswith("Threads:"):
                    out["threads"] = float(line.split()[1])
        out["fds"] = float(len(os.listdir(f"/proc/{pid}/fd")))
    except OSError:
        pass
    return out


def metrics_sample(base_url: str, api_key: str | None) -> dict[str, float | None]:
    keys = {
        "kv_reserved_cells": "inferloop_kv_reserved_cells",
        "queue_depth": "inferloop_queue_depth",
        "active_slots": "inferloop_active_slots",
        "prefix_retained_cells": "inferloop_prefix_cache_retained_cells",
        "prompt_cache_ram_bytes": 'inferloop_prompt_cache_bytes{tier="ram"}',
        "cancelled_total": "inferloop_cancelled_total",
        "generated_tokens_total": "inferloop_generated_tokens_total",
    }
    try:
        m = parse_metrics(http_get(base_url, "/metrics", api_key, timeout=10))
    except OSError:  # URLError and timeouts included: a gap in the series, not a crash
        return {k: None for k in keys}
    out = {k: m.get(v) for k, v in keys.items()}
    if out["prompt_cache_ram_bytes"] is None:  # the RAM tier is off (--prompt-cache-ram-mb 0)
        out["prompt_cache_ram_bytes"] = 0.0
    return out


def with_derived(r: dict[str, float | None]) -> dict[str, float | None]:
    """Adds rss_less_cache_bytes (None when either reading is missing)."""
    rss, cache = r.get("rss_bytes"), r.get("prompt_cache_ram_bytes")
    r["rss_less_cache_bytes"] = rss - cache if rss is not None and cache is not None else None
    return r


def http_get(base_url: str, path: str, api_key: str | None, timeout: float = 10) -> str:
    req = urllib.request.Request(base_url + path)
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode("utf-8", errors="replace")


# --- traffic ---------------------------------------------------------------------------------

TOPICS = ["cats", "rivers", "bread", "trains", "the moon", "gardens", "bicycles", "owls",
          "winter", "maps", "tea", "volcanoes", "libraries", "bees", "lighthouses", "chess"]
SYSTEM = "You are a concise assistant. Answer in one or two sentences."
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "city": {"type": "string"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
# Steady traffic: kind -> weight. Bursts come on their own clock.
MIX = {"chat": 3, "chat_stream": 3, "completion": 2, "completion_stream": 2,
       "structured": 2, "tools": 2, "drop": 2, "metrics": 2}


class Traffic:
    """The client side: one openai client (no retries: a 429 must be seen, not retried),
    a thread per request, outcomes counted by kind."""

    def __init__(self, base_url: str, model: str, api_key: str | None, seed: int,
                 max_in_flight: int, log: Path | None = None) -> None:
        import openai  # the venv's; imported here so the verdict logic needs no venv

        self.openai = openai
        self.base_url, self.model, self.api_key = base_url, model, api_key
        self.client = openai.OpenAI(base_url=base_url + "/v1", api_key=api_key or "unused",
                                    max_retries=0, timeout=180)
        self.rng = random.Random(seed)
        self.rng_lock = threading.Lock()
        self.lock = threading.Lock()
        self.counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.failures: list[dict[str, Any]] = []
        self.seconds: dict[str, list[float]] = collections.defaultdict(list)  # answered, by kind
        self.in_flight = 0
        self.max_in_flight = max_in_flight
        self.sent = 0
        self.skipped = 0
        self.seq = 0
        self.threads: list[threading.Thread] = []
        # One line a request (kind, start, end, outcome): what was in flight around an error
        # in the daemon's log.
        self.log = open(log, "a", encoding="utf-8") if log else None

    # Every request's prompt differs (a sequence number and a topic), so the prefix and prompt
    # caches keep saving, evicting and restoring, as they would under real traffic; half share
    # a system prompt, which the prefix cache reuses.
    def _pick(self) -> tuple[int, str, int, float, bool]:
        with self.rng_lock:
            self.seq += 1
            return (self.seq, self.rng.choice(TOPICS), self.rng.randint(8, 48),
                    self.rng.choice([0.0, 0.7]), self.rng.random() < 0.5)

    def _messages(self, seq: int, topic: str, system: bool) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": SYSTEM}] if system else []
        return msgs + [{"role": "user", "content": f"Note {seq}: tell me one thing about {topic}."}]

    def run(self, kind: str) -> None:
        """Start one request of `kind` in its own thread (skipped, and counted, when too many
        are already in flight: the daemon is not keeping up)."""
        with self.lock:
            if self.in_flight >= self.max_in_flight:
                self.skipped += 1
                return
            self.in_flight += 1
            self.sent += 1
        th = threading.Thread(target=self._one, args=(kind,), daemon=True)
        th.start()
        self.threads = [t for t in self.threads if t.is_alive()] + [th]

    def _one(self, kind: str) -> None:
        t0, start = time.monotonic(), time.time()
        try:
            outcome = getattr(self, "_" + kind)()
        except self.openai.APIStatusError as e:
            outcome, detail = str(e.status_code), str(e)[:300]
        except self.openai.APITimeoutError as e:
            outcome, detail = "timeout", str(e)[:300]
        except self.openai.APIConnectionError as e:
            outcome, detail = "connection_error", repr(e.__cause__ or e)[:300]
        except self.openai.APIError as e:  # an error frame inside a stream
            outcome, detail = "stream_error", str(e)[:300]
        except urllib.error.HTTPError as e:  # the /metrics scrape
            outcome, detail = str(e.code), repr(e)[:300]
        except OSError as e:  # the /metrics scrape (URLError is an OSError)
            outcome, detail = "connection_error", repr(e)[:300]
        except Exception as e:  # noqa: BLE001 - a malformed answer is a finding, not a crash
            outcome, detail = f"client_{type(e).__name__}", repr(e)[:300]
        else:
            detail = None
        with self.lock:
            self.counts[kind][outcome] += 1
            self.in_flight -= 1
            if outcome == "200":
                self.seconds[kind].append(time.monotonic() - t0)
            if self.log:
                self.log.write(json.dumps({"kind": kind, "start": round(start, 3),
                                           "end": round(time.time(), 3), "outcome": outcome,
                                           **({"detail": detail} if detail else {})}) + "\n")
                self.log.flush()
            if classify(outcome) in ("5xx", "error") and len(self.failures) < 50:
                self.failures.append({"kind": kind, "outcome": outcome, "detail": detail,
                                      "at": time.time(), "seconds": time.monotonic() - t0})

    def _chat(self, stream: bool = False) -> str:
        seq, topic, n, temp, system = self._pick()
        kw = dict(model=self.model, messages=self._messages(seq, topic, system), max_tokens=n,
                  temperature=temp)
        if not stream:
            r = self.client.chat.completions.create(**kw)
            if not r.choices:
                raise ValueError("no choices")
            return "200"
        done = False
        for chunk in self.client.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, **kw):
            if chunk.usage is not None:
                done = True
        if not done:
            raise ValueError("stream ended without its usage chunk")
        return "200"

    def _chat_stream(self) -> str:
        return self._chat(stream=True)

    def _completion(self, stream: bool = False) -> str:
        seq, topic, n, temp, _ = self._pick()
        kw = dict(model=self.model, prompt=f"Note {seq}. A few facts about {topic}:",
                  max_tokens=n, temperature=temp)
        if not stream:
            r = self.client.completions.create(**kw)
            if not r.choices:
                raise ValueError("no choices")
            return "200"
        chunks = sum(1 for _ in self.client.completions.create(stream=True, **kw))
        if chunks == 0:
            raise ValueError("empty stream")
        return "200"

    def _completion_stream(self) -> str:
        return self._completion(stream=True)

    def _structured(self) -> str:
        seq, topic, _, _, system = self._pick()
        fmt = {"type": "json_schema",
               "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}}
        kw = dict(model=self.model, max_tokens=64, temperature=0.0, response_format=fmt,
                  messages=self._messages(seq, f"a person who likes {topic}; reply as JSON", system))
        if seq % 2:
            r = self.client.chat.completions.create(**kw)
            text = r.choices[0].message.content or ""
            finish = r.choices[0].finish_reason
        else:
            parts, finish = [], None
            for chunk in self.client.chat.completions.create(stream=True, **kw):
                if chunk.choices:
                    parts.append(chunk.choices[0].delta.content or "")
                    finish = chunk.choices[0].finish_reason or finish
            text = "".join(parts)
        # Constrained decoding: a finished answer is the schema's JSON (one cut by max_tokens
        # is a prefix of it).
        if finish == "stop":
            obj = json.loads(text)
            if set(obj) != set(PERSON_SCHEMA["required"]):
                raise ValueError(f"json_schema answer with keys {sorted(obj)}")
        elif not text.startswith("{"):
            raise ValueError(f"json_schema answer {text[:40]!r}")
        return "200"

    def _tools(self) -> str:
        seq, topic, _, _, _ = self._pick()
        choice = "required" if seq % 2 else {"type": "function", "function": {"name": "get_weather"}}
        kw = dict(model=self.model, max_tokens=64, temperature=0.0, tools=[WEATHER_TOOL],
                  tool_choice=choice, parallel_tool_calls=False,
                  messages=[{"role": "user", "content": f"Note {seq}: what is the weather in "
                                                        f"the city of {topic}?"}])
        if seq % 3:
            r = self.client.chat.completions.create(**kw)
            c = r.choices[0]
            if c.finish_reason == "tool_calls" and c.message.tool_calls:
                json.loads(c.message.tool_calls[0].function.arguments)
            elif c.finish_reason != "length":
                raise ValueError(f"forced tool_choice finished {c.finish_reason!r}")
        else:
            for _ in self.client.chat.completions.create(stream=True, **kw):
                pass
        return "200"

    def _drop(self) -> str:
        """A stream the client leaves after 1-3 chunks: the daemon must notice and free the
        slot and its KV cells (inferloop_cancelled_total counts it)."""
        seq, topic, _, temp, system = self._pick()
        keep = 1 + seq % 3
        if seq % 2:
            stream = self.client.chat.completions.create(
                model=self.model, messages=self._messages(seq, topic, system), max_tokens=200,
                temperature=temp, stream=True)
        else:
            stream = self.client.completions.create(
                model=self.model, prompt=f"Note {seq}. A long essay about {topic}:",
                max_tokens=200, temperature=temp, stream=True)
        for i, _ in enumerate(stream):
            if i + 1 >= keep:
                break
        stream.close()  # closes the connection mid-stream
        return "200"

    def _metrics(self) -> str:
        http_get(self.base_url, "/metrics", self.api_key)
        return "200"

    def _burst(self) -> str:
        seq, topic, _, _, _ = self._pick()
        self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": f"Burst {seq}: {topic}?"}],
            max_tokens=8, temperature=0.0)
        return "200"

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {k: dict(sorted(v.items())) for k, v in sorted(self.counts.items())}

    def latency(self) -> dict[str, dict[str, float]]:
        """Seconds to answer (the whole stream; for `drop`, until it was left), by kind."""
        with self.lock:
            return {k: {"n": len(v), "median": round(statistics.median(v), 3),
                        "p95": round(sorted(v)[int(0.95 * (len(v) - 1))], 3),
                        "max": round(max(v), 3)} for k, v in sorted(self.seconds.items()) if v}

    def wait(self, timeout: float) -> bool:
        """Wait for the requests in flight; False when some are still running at `timeout`."""
        deadline = time.monotonic() + timeout
        for th in list(self.threads):
            th.join(max(0.0, deadline - time.monotonic()))
        with self.lock:
            return self.in_flight == 0

    def close(self) -> None:
        # Closes the pooled keep-alive connections, so that the daemon's fds can go back to idle.
        self.client.close()
        if self.log:
            with self.lock:
                self.log.close()
                self.log = None


def traffic_loop(traffic: Traffic, rate: float, stop: threading.Event, burst_every: float,
                 burst_size: int, seed: int, pause_file: str | None, paused: list[float]) -> None:
    """Steady arrivals every 1/rate s (a fixed clock, not a feedback loop: a slow daemon gets
    the same offered load) and a burst of `burst_size` at once every `burst_every` s."""
    rng = random.Random(seed + 1)
    kinds, weights = list(MIX), list(MIX.values())
    start = time.monotonic()
    next_at, next_burst = start, start + burst_every
    while not stop.is_set():
        now = time.monotonic()
        if pause_file and os.path.exists(pause_file):
            # Another job needs the CPU quiet: send nothing while the file exists (the samples
            # go on, marked paused).
            stop.wait(1.0)
            paused[0] += time.monotonic() - now
            next_at, next_burst = time.monotonic(), time.monotonic() + burst_every
            continue
        if now >= next_burst:
            for _ in range(burst_size):
                traffic.run("burst")
            next_burst += burst_every
        if now >= next_at:
            traffic.run(rng.choices(kinds, weights)[0])
            next_at += 1.0 / rate
            if next_at < now - 5:  # the loop itself fell behind (a stalled box): don't catch up
                next_at = now
        stop.wait(max(0.0, min(next_at, next_burst) - time.monotonic()))


# --- the run ---------------------------------------------------------------------------------


def write_json(path: Path, doc: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def idle_reading(pid: int, base_url: str, api_key: str | None) -> dict[str, float | None]:
    return with_derived({**proc_sample(pid), **metrics_sample(base_url, api_key)})


def wait_idle(pid: int, base_url: str, api_key: str | None, baseline: dict[str, float | None],
              grace: float, on_poll: Callable[[dict[str, float | None]], None] | None = None
              ) -> tuple[dict[str, float | None], list[str], float]:
    """Poll once a second until nothing is left over (judge_idle is empty) or `grace` runs
    out: the last reading, what is still not idle, and the seconds it took."""
    t0 = time.monotonic()
    while True:
        r = idle_reading(pid, base_url, api_key)
        problems = judge_idle(baseline, r)
        if on_poll:
            on_poll(r)
        waited = time.monotonic() - t0
        if not problems or waited >= grace:
            return r, problems, waited
        time.sleep(1.0)


def idle_baseline(pid: int, base_url: str, api_key: str | None, seconds: float) -> dict[str, float | None]:
    """The fewest fds and threads seen idle over `seconds` (tokio's blocking threads linger
    10 s after the priming requests; the floor is the idle state)."""
    best: dict[str, float | None] = {}
    deadline = time.monotonic() + seconds
    while True:
        r = idle_reading(pid, base_url, api_key)
        for k, v in r.items():
            if v is not None and (best.get(k) is None or v < best[k]):  # type: ignore[operator]
                best[k] = v
        if time.monotonic() >= deadline:
            return best
        time.sleep(1.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=parse_duration, default=parse_duration("2h"),
                    help="how long the load runs (2h, 5m, 300s; default 2h)")
    ap.add_argument("--rate", type=float, default=1.0, help="steady requests per second (default 1)")
    ap.add_argument("--sample-every", type=parse_duration, default=10.0,
                    help="seconds between samples (default 10)")
    ap.add_argument("--warmup", type=parse_duration, default=None,
                    help="load time not fitted (default a fifth of --duration, 1 to 15 min)")
    ap.add_argument("--grace", type=parse_duration, default=60.0,
                    help="seconds after the load for the gauges to return to idle (default 60)")
    ap.add_argument("--burst-every", type=parse_duration, default=47.0,
                    help="seconds between bursts (default 47: not a multiple of the sampling)")
    ap.add_argument("--burst-size", type=int, default=None,
                    help="requests per burst (default slots + queue + 4, read from /v1/status)")
    ap.add_argument("--out", type=Path, default=REPO / "out/soak")
    ap.add_argument("--daemon", default=str(REPO / "target/release/inferloopd"))
    ap.add_argument("--model", default=str(REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--queue", type=int, default=4, help="the daemon's queue (small: bursts pass it)")
    ap.add_argument("--ctx", type=int, default=2048)
    # One llama.cpp thread: on a 2-core box shared with other work, two OpenMP threads spin at
    # every barrier while the other is descheduled, and requests take 5-10x longer.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="an extra `serve` argument (repeatable)")
    ap.add_argument("--base-url", help="attach to this running daemon instead of starting one")
    ap.add_argument("--pid", type=int, help="its process id (with --base-url), for /proc")
    ap.add_argument("--api-key", default=os.environ.get("SOAK_API_KEY"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-in-flight", type=int, default=64)
    ap.add_argument("--pause-while", metavar="FILE",
                    help="send no traffic while FILE exists (e.g. /tmp/QUIET on a shared box)")
    args = ap.parse_args(argv)
    if (args.base_url is None) != (args.pid is None):
        ap.error("--base-url and --pid go together")
    if args.rate <= 0 or args.duration <= 0 or args.sample_every <= 0:
        ap.error("--rate, --duration and --sample-every must be positive")
    if args.warmup is None:
        args.warmup = default_warmup(args.duration)
    if args.warmup >= args.duration:
        ap.error(f"--warmup ({args.warmup:.0f} s) must be shorter than --duration ({args.duration:.0f} s)")
    return args


def print_trends(trends: dict[str, dict[str, Any]]) -> None:
    print("\nslopes after warm-up (per hour):")
    for g in GAUGES:
        t = trends[g.name]
        if "slope_per_h" in t:
            mark = "-" if not g.judged else ("FAIL" if t["fail"] else "ok")
            print(f"  {g.name:24} {fmt_value(g, t['slope_per_h']):>12}/h  {mark:4}  {t['reason']}")
        else:
            print(f"  {g.name:24} {'-':>12}    {t['reason']}")


def report(out: Path) -> int:
    """The trends of a run's series.json so far (a run still going, or cut short): slopes per
    hour and each trend's verdict, outcomes from requests.jsonl; writes report.json and
    report.svg beside it. No idle check: that needs the load to have stopped."""
    try:
        doc = json.loads((out / "series.json").read_text())
    except (OSError, ValueError) as e:
        print(f"soak: cannot read {out}/series.json: {e}", file=sys.stderr)
        return 2
    samples, warmup = doc["samples"], doc["meta"]["warmup_s"]
    trends = trends_for(samples, warmup)
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    try:
        for line in (out / "requests.jsonl").read_text().splitlines():
            r = json.loads(line)
            counts[r["kind"]][r["outcome"]] += 1
    except (OSError, ValueError):
        pass
    by_kind = merge_counts(counts)
    reasons = verdict(list(trends.values()), [], by_kind, None)
    load = [s["t"] for s in samples if s["phase"] == "load"]
    span = (max(load) if load else 0.0) / 60
    write_json(out / "report.json", {
        "load_min_so_far": round(span, 1), "samples": len(samples), "reasons": reasons,
        "slopes_per_hour_text": {g.name: f"{fmt_value(g, trends[g.name]['slope_per_h'])}/h"
                                 for g in GAUGES if "slope_per_h" in trends[g.name]},
        "trends": trends, "requests_by_kind": by_kind})
    title = f"inferloopd soak {doc['meta']['started']}: {doc['meta']['rate']:g} req/s, {span:.0f} min so far"
    (out / "report.svg").write_text(render_svg(samples, trends, warmup, None, title, reasons))
    print(f"{out}: {span:.0f} min of load, {len(samples)} samples")
    print_trends(trends)
    print(f"requests: {dict(by_kind)}")
    print(f"wrote {out}/report.json, report.svg")
    if reasons:
        print("so far:\n  " + "\n  ".join(reasons))
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--report"]:
        if len(argv) != 2:
            print("usage: bench/soak.py --report DIR", file=sys.stderr)
            return 2
        return report(Path(argv[1]))
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    # SIGTERM or ^C ends the load early; the drain, the idle check and the summary still run.
    stop = threading.Event()
    interrupted: list[str] = []

    def on_signal(signum: int, _frame: Any) -> None:
        interrupted.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    daemon = None
    if args.base_url:
        base_url, pid = args.base_url.rstrip("/"), args.pid
        if not Path(f"/proc/{pid}").is_dir():
            print(f"soak: no process {pid} (--pid)", file=sys.stderr)
            return 2
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench import BenchError, Daemon  # noqa: E402

        for path, what in ((args.daemon, "daemon binary (make build)"), (args.model, "model (make model)")):
            if not Path(path).is_file():
                print(f"soak: {what} {path} not found", file=sys.stderr)
                return 2
        argv_d = [args.daemon, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", "0",
                  "--slots", str(args.slots), "--queue", str(args.queue), "--ctx", str(args.ctx),
                  "--threads", str(args.threads), *args.serve_arg]
        daemon = Daemon(argv_d, out / "daemon.log")
        try:
            base_url = daemon.wait_ready(180)
        except BenchError as e:
            print(f"soak: {e}", file=sys.stderr)
            daemon.stop()
            return 1
        pid = daemon.proc.pid
    try:
        return soak(args, base_url, pid, daemon, stop, interrupted)
    finally:
        if daemon is not None and daemon.proc.poll() is None:  # an exception on the way out
            daemon.stop(timeout=60)


def soak(args: argparse.Namespace, base_url: str, pid: int, daemon: Any, stop: threading.Event,
         interrupted: list[str]) -> int:
    out: Path = args.out
    wall0 = time.monotonic()
    try:
        status = json.loads(http_get(base_url, "/v1/status", args.api_key))
    except (OSError, ValueError) as e:
        print(f"soak: GET {base_url}/v1/status: {e}", file=sys.stderr)
        return 2
    model = (status.get("model") or {}).get("id") or MODEL_ID
    slots, queue = status["slots"]["total"], status["queue"]["capacity"]
    burst = args.burst_size or slots + queue + 4
    print(f"soak: {base_url} pid {pid}, {slots} slots, queue {queue}; {args.rate:g} req/s for "
          f"{args.duration / 60:.1f} min (warm-up {args.warmup / 60:.1f}), bursts of {burst} every "
          f"{args.burst_every:.0f} s, a sample every {args.sample_every:.0f} s -> {out}/", flush=True)

    # Priming: one request of every kind, then the idle floor of fds and threads.
    (out / "requests.jsonl").unlink(missing_ok=True)
    prime = Traffic(base_url, model, args.api_key, args.seed + 100, args.max_in_flight,
                    out / "requests.jsonl")
    for kind in [*MIX, "burst"]:
        if stop.is_set():
            break
        prime.run(kind)
        prime.wait(180)
    prime.close()
    baseline = idle_baseline(pid, base_url, args.api_key, 15.0)
    print("soak: idle baseline " + ", ".join(
        f"{g.name} {fmt_value(g, baseline[g.name])}" for g in GAUGES
        if baseline.get(g.name) is not None), flush=True)

    traffic = Traffic(base_url, model, args.api_key, args.seed, args.max_in_flight,
                      out / "requests.jsonl")
    paused = [0.0]
    loader = threading.Thread(
        target=traffic_loop, daemon=True,
        args=(traffic, args.rate, stop, args.burst_every, burst, args.seed, args.pause_while, paused))
    samples: list[dict[str, Any]] = []
    meta = {"started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "base_url": base_url, "pid": pid, "model": model, "slots": slots, "queue": queue,
            "rate": args.rate, "duration_s": args.duration, "warmup_s": args.warmup,
            "sample_every_s": args.sample_every, "burst_every_s": args.burst_every,
            "burst_size": burst, "mix": MIX, "idle_baseline": baseline,
            "gauges": [dataclasses.asdict(g) for g in GAUGES]}
    t_load = time.monotonic()

    def record(phase: str) -> None:
        s: dict[str, Any] = {"t": round(time.monotonic() - t_load, 2), "at": time.time(),
                             "phase": phase,
                             "paused": bool(args.pause_while and os.path.exists(args.pause_while))}
        s.update(idle_reading(pid, base_url, args.api_key))
        with traffic.lock:
            s.update(sent=traffic.sent, in_flight=traffic.in_flight, skipped=traffic.skipped)
        samples.append(s)
        write_json(out / "series.json", {"meta": meta, "samples": samples})

    loader.start()
    n = 0
    daemon_problem = None
    last_print = 0.0
    while not stop.is_set():
        record("load")
        n += 1
        if not Path(f"/proc/{pid}").is_dir() or (daemon and daemon.proc.poll() is not None):
            daemon_problem = "the daemon died during the load"
            break
        el = time.monotonic() - t_load
        if el - last_print >= min(300.0, max(60.0, args.duration / 10)) or el < args.sample_every:
            last_print = el
            s = samples[-1]
            print(f"soak: {el / 60:5.1f} min  rss {(s['rss_bytes'] or 0) / MIB:.0f} MiB  fds {s['fds']}  "
                  f"threads {s['threads']}  kv {s['kv_reserved_cells']}  queue {s['queue_depth']}  "
                  f"sent {s['sent']}", flush=True)
        if el >= args.duration:
            break
        stop.wait(max(0.0, t_load + n * args.sample_every - time.monotonic()))
    load_s = time.monotonic() - t_load
    stop.set()
    loader.join(10)

    # After the load: the requests in flight finish, the pool closes, then every gauge must
    # come back to idle within the grace period (sampled at the usual pace meanwhile).
    drained = traffic.wait(180)
    traffic.close()
    record("drain")
    last = [time.monotonic()]

    def on_poll(_r: dict[str, float | None]) -> None:
        if time.monotonic() - last[0] >= args.sample_every:
            last[0] = time.monotonic()
            record("drain")

    after, idle_problems, idle_s = (None, ["the daemon is gone"], 0.0) if daemon_problem else \
        wait_idle(pid, base_url, args.api_key, baseline, args.grace, on_poll)
    if not drained:
        idle_problems.append("client requests still running 180 s after the load stopped")
    if after is not None:
        record("drain")

    exit_code = None
    if daemon is not None:
        exit_code = daemon.stop(timeout=60)
        if exit_code != 0 and daemon_problem is None:
            daemon_problem = f"the daemon exited with status {exit_code} on SIGTERM"

    trends = trends_for(samples, args.warmup)
    counts = merge_counts(prime.snapshot(), traffic.snapshot())
    reasons = verdict(list(trends.values()), idle_problems, counts, daemon_problem)
    if interrupted:
        reasons.append(f"interrupted by {interrupted[0]} after {load_s / 60:.1f} min of load")
    by_class: collections.Counter[str] = collections.Counter()
    for outcomes in counts.values():
        for o, k in outcomes.items():
            by_class[classify(o)] += k
    summary = {
        **{k: meta[k] for k in ("started", "model", "slots", "queue", "rate", "duration_s",
                                "warmup_s", "sample_every_s", "burst_every_s", "burst_size")},
        "pass": not reasons,
        "reasons": reasons,
        "load_s": round(load_s, 1),
        "wall_s": round(time.monotonic() - wall0, 1),
        "paused_s": round(paused[0], 1),
        "samples": len(samples),
        "slopes_per_hour": {g: t.get("slope_per_h") for g, t in trends.items()},
        "slopes_per_hour_text": {g.name: f"{fmt_value(g, trends[g.name]['slope_per_h'])}/h"
                                 for g in GAUGES if "slope_per_h" in trends[g.name]},
        "trends": trends,
        "idle_baseline": baseline,
        "after_load": after,
        "idle_within_s": round(idle_s, 1),
        "idle_problems": idle_problems,
        "requests": {"by_kind": counts, "by_class": dict(by_class),
                     "sent": prime.sent + traffic.sent, "priming": prime.sent,
                     "skipped_client_busy": traffic.skipped, "seconds": traffic.latency()},
        "failures": prime.failures + traffic.failures,
        "daemon_exit": exit_code,
    }
    write_json(out / "summary.json", summary)
    title = (f"inferloopd soak {meta['started']}: {args.rate:g} req/s, {load_s / 60:.0f} min - "
             + ("PASS" if not reasons else "FAIL"))
    (out / "soak.svg").write_text(render_svg(samples, trends, args.warmup, load_s, title, reasons))

    print_trends(trends)
    print(f"requests: {dict(by_class)} ({prime.sent} priming + {traffic.sent} sent, "
          f"{traffic.skipped} skipped); "
          f"idle again within {idle_s:.0f} s")
    print(f"wrote {out}/series.json, summary.json, soak.svg")
    if reasons:
        print("SOAK FAILED:\n  " + "\n  ".join(reasons), file=sys.stderr)
        return 1
    print("soak passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
