#!/usr/bin/env python3
"""Several inferloopd boxes behind vLLM's router (`vllm-router`), on one machine.

Starts --boxes daemons (one thread, --slots 4, own port, own --state-dir and own copy of the
x86 thermal fixture tree as --sysfs-root, so that any box can be made thermally critical) and,
per policy in --policies, a fresh `vllm-router` in front of them. The boxes are restarted with
fresh state dirs for every policy, so each policy starts with cold prompt caches.

Per policy it runs the "apps" workload: --prompts distinct system prompts (~300-600 tokens of
text generated from a fixed seed), --clients concurrent clients each sending --requests streamed
chat requests, each with a system prompt picked at random (fixed seed) and a short question.
It reports TTFT (to the first chunk with non-empty content, not the opening role chunk)
median/p95, the prefix-cache hit rate summed over the boxes (from their /metrics), requests
refused (429/503) and failed (other statuses, broken streams), and throughput.

Then, on --fault-policy (default the last policy), faults under continuous load:
  kill     `kill -9` one box; errors must be <= its in-flight requests (its /get_load just
           before the kill) and zero from --kill-grace seconds after the kill;
  rejoin   restart it; time from its /health turning 200 to its first admitted request
           (target <= 5 s), with one-token probes through the router every
           --rejoin-probe-s beside the load;
  thermal  set its fake x86_pkg_temp zone to 95 °C (critical at 90): requests it admits after
           the router has had a health check to see its 503 must be 0;
  drain    SIGTERM one box; no request may fail.

Writes --out (default bench/results/lan.json) and prints a table. The full mode judges the
issue's targets (cache-aware TTFT median <= 0.5x round-robin's, hit rate >= 2x) and the fault
targets; --smoke judges only the fault targets (TTFT and hit rate are reported, not judged,
as a shared CI machine makes them noise). Exit status 1 when a judged target fails.

Usage: bench/lan.py [--boxes 3] [--policies round_robin power_of_two cache_aware]
                    [--prompts 12] [--clients 6] [--requests 8] [--faults kill,rejoin,thermal,drain]
                    [--smoke] [--out bench/results/lan.json]
Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# The same Prometheus text parser as the soak's (bench/ is this script's directory).
from soak import parse_metrics

REPO = Path(__file__).resolve().parents[1]
MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"
THERMAL_FIXTURE = REPO / "thermal/tests/fixtures/x86/sys"
# The x86 fixture's package zone: the one the daemon reports as its hottest sensor.
THERMAL_ZONE = "devices/virtual/thermal/thermal_zone1"
HOT_C, CRITICAL_C = 70, 90
POLICIES = ("round_robin", "power_of_two", "cache_aware", "kv_aware")
# kv_aware routes on the boxes' published KV events: each box then runs with --kv-events on
# its own port (the router finds it through /kv_event_sources).
KV_EVENTS_POLICY = "kv_aware"
FAULTS = ("kill", "rejoin", "thermal", "drain")
CHAT_ROUTE = "/v1/chat/completions"
# Router settings the demo runs with (what a gateway in front of boxes should use), each
# because the router's default broke a fault case when measured:
# - health every second, one failure to mark unhealthy, one success to return (defaults
#   60 s / 3 / 2: a dead box would get work for ~2 minutes);
# - 8 attempts starting at 100 ms (~3 s in all): a retry re-runs selection without excluding
#   the worker that failed, so cache_aware keeps picking a dead or draining box until the
#   health check marks it; the default 5 attempts from 50 ms span ~0.4 s, less than one check;
# - circuit breaker open for 2 s, not 60: a killed box trips it (10 connection errors in well
#   under a second), and with 60 s the restarted box got no work for a minute and a drain of
#   the other box left no worker at all ("No available workers").
# --router-arg overrides any of them (the last occurrence of a flag wins).
ROUTER_FLAGS = (
    "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
    "--health-success-threshold", "1", "--health-check-timeout-secs", "2",
    "--retry-max-retries", "8", "--retry-initial-backoff-ms", "100",
    "--cb-timeout-duration-secs", "2",
)

# --- the workload (pure: tests/python/test_bench_lan.py) --------------------------------------

_NOUNS = (
    "invoice ledger parcel route sensor harvest recipe clinic ticket garden orchard battery "
    "warehouse tractor library museum bakery studio pharmacy kennel marina vineyard bridge "
    "turbine greenhouse festival workshop observatory archive kitchen stadium lighthouse "
    "quarry apiary foundry tannery brewery ferry glacier canyon meadow river harbor pantry"
).split()
_ADJS = (
    "careful seasonal urgent regional quiet detailed weekly fragile organic local coastal "
    "northern rural digital manual spare overdue modest formal friendly brief metric annual "
    "nightly hourly shared private public historic electric wooden copper granite"
).split()
_VERBS = (
    "check record confirm schedule estimate compare summarize refuse escalate translate "
    "round list verify explain measure update cancel archive label notify inspect price"
).split()
_NAMES = (
    "Aldra Bexley Corvin Dunmore Elsworth Farrow Gideon Halvard Isolde Jarrow Kestrel Lunet "
    "Marlow Norwen Ostrava Pellam Quorra Rendell Sorrel Tamsin Ulric Vesna Wystan Yarrow"
).split()
QUESTIONS = (
    "What can you help me with today?",
    "Give me one tip for a busy morning.",
    "How should I phrase a polite reminder?",
    "What is the first thing to check?",
    "Summarize your role in one sentence.",
    "Which detail matters most here?",
    "How do I report a problem?",
    "What should I prepare before calling?",
)


def make_system_prompts(n: int, seed: int, min_words: int = 230, max_words: int = 420) -> list[str]:
    """`n` distinct system prompts of `min_words`..`max_words` words (about 300-600 tokens for
    SmolLM2's tokenizer), deterministic in `seed`. Each starts with its own app name, so that
    two prompts share no prefix beyond the chat template's first tokens."""
    if n < 1 or min_words < 20 or max_words < min_words:
        raise ValueError("need n >= 1 and 20 <= min_words <= max_words")
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        name = f"{rng.choice(_NAMES)}-{i + 1}"
        topic = rng.choice(_NOUNS)
        words: list[str] = (
            f"You are {name}, the assistant of the {rng.choice(_ADJS)} {topic} app number "
            f"{i + 1}. Follow these house rules exactly."
        ).split()
        target = rng.randint(min_words, max_words)
        rule = 1
        while len(words) < target:
            sentence = (
                f"Rule {rule}: when a user asks about the {rng.choice(_ADJS)} {rng.choice(_NOUNS)}, "
                f"{rng.choice(_VERBS)} the {rng.choice(_NOUNS)} and {rng.choice(_VERBS)} its "
                f"{rng.choice(_ADJS)} {rng.choice(_NOUNS)} before you {rng.choice(_VERBS)} "
                f"anything for {rng.choice(_NAMES)}."
            )
            words.extend(sentence.split())
            rule += 1
        prompts.append(" ".join(words[:target]))
    return prompts


def make_schedule(clients: int, requests: int, prompts: int, seed: int) -> list[list[tuple[int, int]]]:
    """Per client, `requests` (prompt index, question index) pairs from a fixed seed."""
    rng = random.Random(seed)
    return [
        [(rng.randrange(prompts), rng.randrange(len(QUESTIONS))) for _ in range(requests)]
        for _ in range(clients)
    ]


def chat_body(system: str, question: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL_ID,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


# --- parsing (pure) ------------------------------------------------------------------------------


def chat_ok_count(metrics: dict[str, float]) -> float:
    """Chat requests a box answered 200 (admitted and served)."""
    return metrics.get(f'inferloop_requests_total{{route="{CHAT_ROUTE}",code="200"}}', 0.0)


def cache_counters(metrics: dict[str, float]) -> dict[str, float]:
    """The counters the hit rate is computed from: prompt tokens looked up, tokens that needed
    no prefill (`inferloop_prefix_cache_hit_tokens_total`: kept in KV cells, shared from
    another slot, or restored from the prompt cache's RAM/disk tiers, all counted there), and
    of those the tokens restored from the tiers."""
    tiers = sum(v for k, v in metrics.items() if k.startswith("inferloop_prompt_cache_hit_tokens_total"))
    return {
        "lookup": metrics.get("inferloop_prefix_cache_lookup_tokens_total", 0.0),
        "hit": metrics.get("inferloop_prefix_cache_hit_tokens_total", 0.0),
        "tier_hit": tiers,
        "prompt": metrics.get("inferloop_prompt_tokens_total", 0.0),
    }


def hit_rates(before: list[dict[str, float]], after: list[dict[str, float]]) -> dict[str, float | None]:
    """Hit rates summed over boxes between two scrapes of each box's cache_counters: `total`
    (tokens not prefilled), split into `resident` (kept or shared KV) and `from_tiers`
    (restored). A box restarted in between (counters went down) counts from zero."""
    tot = {"lookup": 0.0, "hit": 0.0, "tier_hit": 0.0}
    for b, a in zip(before, after):
        for k in tot:
            d = a[k] - b[k]
            tot[k] += a[k] if d < 0 else d
    if tot["lookup"] <= 0:
        return {"total": None, "resident": None, "from_tiers": None, "lookup_tokens": 0.0}
    return {
        "total": tot["hit"] / tot["lookup"],
        "resident": (tot["hit"] - tot["tier_hit"]) / tot["lookup"],
        "from_tiers": tot["tier_hit"] / tot["lookup"],
        "lookup_tokens": tot["lookup"],
    }


def sse_event(line: str) -> dict[str, Any] | str | None:
    """One SSE line: the decoded JSON chunk, "DONE" for the terminator, None otherwise."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return "DONE"
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def chunk_content(chunk: dict[str, Any]) -> str:
    """The text a chat chunk carries ('' for the role chunk, the usage chunk and errors)."""
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    delta = choices[0].get("delta") or {}
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in [0, 100]; None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclasses.dataclass
class Result:
    """One request as the client saw it. `outcome`: ok, refused (429/503), failed."""

    start: float
    end: float
    outcome: str
    status: int | None = None
    ttft: float | None = None
    completion_tokens: int = 0
    error: str = ""
    # The system prompt it carried (apps workload), -1 when not tracked.
    prompt: int = -1


def classify(status: int | None, done: bool, error: str) -> str:
    if status == 200 and done and not error:
        return "ok"
    if status in (429, 503):
        return "refused"
    return "failed"


def summarize(results: list[Result], wall_s: float) -> dict[str, Any]:
    ttfts = [r.ttft for r in results if r.outcome == "ok" and r.ttft is not None]
    ok = [r for r in results if r.outcome == "ok"]
    return {
        "requests": len(results),
        "ok": len(ok),
        "refused": sum(r.outcome == "refused" for r in results),
        "failed": sum(r.outcome == "failed" for r in results),
        "ttft_median_s": statistics.median(ttfts) if ttfts else None,
        "ttft_p95_s": percentile(ttfts, 95),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else None,
        "completion_tokens_per_s": sum(r.completion_tokens for r in ok) / wall_s if wall_s > 0 else None,
        "repeat_ttft_median_s": repeat_ttft_median(results),
    }


def repeat_ttft_median(results: list[Result]) -> float | None:
    """TTFT median of the requests that could reuse a prefix: sent after an earlier request
    with the same system prompt had been answered. What a router's choice changes; the other
    requests prefill their prompt wherever they go."""
    answered: dict[int, float] = {}
    for r in sorted(results, key=lambda r: r.end):
        if r.outcome == "ok" and r.prompt >= 0:
            answered.setdefault(r.prompt, r.end)
    ttfts = [r.ttft for r in results if r.outcome == "ok" and r.ttft is not None
             and r.prompt in answered and r.start >= answered[r.prompt]]
    return statistics.median(ttfts) if ttfts else None


# --- judging (pure) ------------------------------------------------------------------------------


def judge_kill(results: list[Result], t_kill: float, in_flight: int, grace_s: float,
               t_end: float) -> dict[str, Any]:
    """kill -9: errors ending after the kill must be <= the box's in-flight requests, and none
    may end `grace_s` or more after it (up to `t_end`, the restart)."""
    errs = [r for r in results if r.outcome != "ok" and t_kill <= r.end < t_end]
    late = [r for r in errs if r.end >= t_kill + grace_s]
    return {
        "in_flight_at_kill": in_flight,
        "errors": len(errs),
        "errors_after_grace": len(late),
        "grace_s": grace_s,
        "checked_after_grace_s": max(0.0, t_end - (t_kill + grace_s)),
        # the requests whose outcome the "zero after grace" check actually saw
        "requests_ended_after_grace": sum(1 for r in results if t_kill + grace_s <= r.end < t_end),
        "pass": len(errs) <= in_flight and not late,
    }


def judge_rejoin(t_ready: float | None, t_first: float | None, target_s: float) -> dict[str, Any]:
    if t_ready is None or t_first is None:
        return {"ready_to_work_s": None, "target_s": target_s, "pass": False}
    delay = max(0.0, t_first - t_ready)
    return {"ready_to_work_s": delay, "target_s": target_s, "pass": delay <= target_s}


def judge_thermal(served_after_marked: float | None, errors: int) -> dict[str, Any]:
    ok = served_after_marked is not None and served_after_marked == 0 and errors == 0
    return {"served_after_marked": served_after_marked, "errors": errors, "pass": ok}


def judge_drain(results: list[Result], t_term: float, t_end: float) -> dict[str, Any]:
    window = [r for r in results if r.end >= t_term and r.start < t_end]
    failed = [r for r in window if r.outcome != "ok"]
    return {"requests": len(window), "failed": len(failed), "pass": not failed}


def judge_policies(table: dict[str, dict[str, Any]], baseline: str = "round_robin",
                   smart: tuple[str, ...] = ("cache_aware", "kv_aware")) -> dict[str, Any]:
    """The issue's targets: a cache-aware policy's TTFT median <= 0.5x round-robin's and its
    hit rate >= 2x round-robin's. Missing data is a fail, not a pass."""
    out: dict[str, Any] = {}
    base = table.get(baseline)
    for name in smart:
        row = table.get(name)
        if not base or not row:
            continue
        bt, st = base.get("ttft_median_s"), row.get("ttft_median_s")
        bh, sh = (base.get("hit_rate") or {}).get("total"), (row.get("hit_rate") or {}).get("total")
        ttft_ratio = st / bt if bt and st is not None else None
        hit_ratio = sh / bh if bh else (math.inf if sh else None)
        out[name] = {
            "ttft_ratio_vs_round_robin": ttft_ratio,
            "hit_ratio_vs_round_robin": hit_ratio,
            "ttft_pass": ttft_ratio is not None and ttft_ratio <= 0.5,
            "hit_pass": hit_ratio is not None and hit_ratio >= 2.0,
        }
    return out


# --- processes -----------------------------------------------------------------------------------


def http_get(url: str, timeout: float = 2.0) -> tuple[int | None, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as e:
        return None, str(e)


def wait_until(pred, timeout: float, step: float = 0.1) -> float | None:
    """Polls `pred` until true; returns the monotonic time it turned true, None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic()
        time.sleep(step)
    return None


class Box:
    def __init__(self, idx: int, port: int, root: Path, args: argparse.Namespace,
                 kv_events_port: int | None = None):
        self.idx, self.port, self.args = idx, port, args
        self.kv_events_port = kv_events_port
        self.url = f"http://127.0.0.1:{port}"
        self.dir = root / f"box{idx}"
        self.state = self.dir / "state"
        self.sys = self.dir / "sys"
        self.state.mkdir(parents=True)
        shutil.copytree(THERMAL_FIXTURE, self.sys)
        self.proc: subprocess.Popen | None = None
        self.log = None

    def start(self) -> None:
        self.log = open(self.dir / "daemon.log", "ab")
        cmd = [
            str(self.args.daemon), "serve", "--model", str(self.args.model), "--host", "127.0.0.1",
            "--port", str(self.port), "--threads", "1", "--slots", str(self.args.slots),
            "--state-dir", str(self.state), "--sysfs-root", str(self.sys),
            "--thermal-interval-ms", "200", "--hot-celsius", str(HOT_C),
            "--critical-celsius", str(CRITICAL_C), *self.args.box_arg,
        ]
        if self.kv_events_port:
            cmd += ["--kv-events", f"127.0.0.1:{self.kv_events_port}"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        return http_get(self.url + "/health", 1.0)[0] == 200

    def wait_ready(self, timeout: float = 60.0) -> float:
        t = wait_until(lambda: self.ready() or (self.proc is not None and self.proc.poll() is not None), timeout)
        if t is None or not self.ready():
            raise RuntimeError(f"box {self.idx} on :{self.port} did not become ready; see {self.dir}/daemon.log")
        return t

    def metrics(self) -> dict[str, float] | None:
        status, text = http_get(self.url + "/metrics", 2.0)
        return parse_metrics(text) if status == 200 else None

    def load(self) -> int | None:
        status, text = http_get(self.url + "/get_load", 1.0)
        try:
            return int(json.loads(text)["load"]) if status == 200 else None
        except (ValueError, KeyError, TypeError):
            return None

    def set_celsius(self, c: float) -> None:
        zone = self.sys / THERMAL_ZONE
        tmp = zone / "temp.new"
        tmp.write_text(f"{int(c * 1000)}\n")
        os.replace(tmp, zone / "temp")  # renamed over, so the sampler never reads half a file

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.log:
            self.log.close()
            self.log = None


class Router:
    def __init__(self, policy: str, port: int, prom_port: int, workers: list[str], root: Path, args):
        self.policy, self.port = policy, port
        self.url = f"http://127.0.0.1:{port}"
        self.logpath = root / f"router-{policy}.log"
        self.log = open(self.logpath, "ab")
        cmd = [
            str(args.router), "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--worker-startup-check-interval", "1", "--prometheus-port", str(prom_port),
            *ROUTER_FLAGS, "--log-level", "warning",
            *args.router_arg, "--worker-urls", *workers,
        ]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        ok = wait_until(lambda: http_get(self.url + "/readiness", 1.0)[0] == 200 or self.proc.poll() is not None,
                        timeout, 0.25)
        if ok is None or self.proc.poll() is not None:
            raise RuntimeError(f"router ({self.policy}) did not start; see {self.logpath}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


# --- the client ----------------------------------------------------------------------------------


def one_request(port: int, body: dict[str, Any], timeout: float) -> Result:
    start = time.monotonic()
    status, done, ttft, tokens, chunks, error = None, False, None, 0, 0, ""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", CHAT_ROUTE, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        status = resp.status
        if status != 200:
            error = resp.read(500).decode("utf-8", "replace")
        else:
            while True:
                raw = resp.readline()
                if not raw:
                    break
                ev = sse_event(raw.decode("utf-8", "replace").strip())
                if ev == "DONE":
                    done = True
                    break
                if not isinstance(ev, dict):
                    continue
                if "error" in ev:
                    error = json.dumps(ev["error"])[:300]
                if chunk_content(ev):
                    chunks += 1
                    if ttft is None:
                        ttft = time.monotonic() - start
                usage = ev.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    tokens = usage["completion_tokens"]
            if not done and not error:
                error = "stream ended without [DONE]"
    except (OSError, http.client.HTTPException) as e:
        error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return Result(start, time.monotonic(), classify(status, done, error), status, ttft,
                  tokens or chunks, error)


def run_workload(port: int, prompts: list[str], schedule, max_tokens: int,
                 timeout: float) -> tuple[list[Result], float]:
    results: list[Result] = []
    lock = threading.Lock()

    def client(plan):
        for p, q in plan:
            r = one_request(port, chat_body(prompts[p], QUESTIONS[q], max_tokens), timeout)
            r.prompt = p
            with lock:
                results.append(r)

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(plan,)) for plan in schedule]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.monotonic() - t0


class Load:
    """Clients that send requests in a loop until stopped (the load the faults happen under)."""

    def __init__(self, port: int, prompts: list[str], clients: int, max_tokens: int, seed: int, timeout: float):
        self.results: list[Result] = []
        self.stop_ev = threading.Event()
        self.lock = threading.Lock()
        self.threads = []
        for c in range(clients):
            rng = random.Random(seed * 1000 + c)
            self.threads.append(threading.Thread(
                target=self._loop, args=(port, prompts, rng, max_tokens, timeout), daemon=True))

    def _loop(self, port, prompts, rng, max_tokens, timeout):
        while not self.stop_ev.is_set():
            body = chat_body(rng.choice(prompts), rng.choice(QUESTIONS), max_tokens)
            r = one_request(port, body, timeout)
            with self.lock:
                self.results.append(r)

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self) -> list[Result]:
        self.stop_ev.set()
        for t in self.threads:
            t.join(120)
        with self.lock:
            return list(self.results)


class Probes:
    """One-token requests through the router every `every_s` seconds, each with its own
    system prompt (no cached prefix draws it to a box), until stopped."""

    def __init__(self, port: int, every_s: float, timeout: float):
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._loop, args=(port, every_s, timeout), daemon=True)

    def _loop(self, port: int, every_s: float, timeout: float) -> None:
        n = 0
        while not self.stop_ev.is_set():
            n += 1
            # Each probe on its own thread: one slow answer must not delay the next probe.
            body = chat_body(f"Rejoin probe {n}.", "Say yes.", 1)
            threading.Thread(target=one_request, args=(port, body, timeout), daemon=True).start()
            self.stop_ev.wait(every_s)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_ev.set()
        self.thread.join(5)


# --- the run -------------------------------------------------------------------------------------


def start_boxes(boxes: list[Box]) -> None:
    for b in boxes:
        b.start()
    for b in boxes:
        b.wait_ready()


def run_faults(args, boxes: list[Box], router: Router, prompts: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    victim = boxes[-1]
    load = Load(router.port, prompts, args.clients, args.max_tokens, args.seed + 7, args.timeout)
    load.start()
    time.sleep(args.warm_s)
    marks: dict[str, float] = {}
    try:
        if "kill" in args.faults:
            in_flight = victim.load() or 0
            marks["kill"] = time.monotonic()
            victim.signal(signal.SIGKILL)
            victim.proc.wait(10)
            time.sleep(args.kill_hold_s)
            marks["kill_end"] = time.monotonic()
            out["kill"] = {"box": victim.idx, "in_flight": in_flight}
        if "rejoin" in args.faults and "kill" in args.faults:
            victim.stop()
            victim.start()
            t_ready = wait_until(victim.ready, 60, 0.05)
            base = chat_ok_count(victim.metrics() or {}) if t_ready else 0
            t_first = None
            if t_ready is not None:
                # Probes through the router beside the load: the load's requests arrive only as
                # the surviving box finishes one (about one a second here), so without them the
                # wait measured when the load happened to send, not when the router let the box
                # serve again (one smoke run of three took 7.2 s that way).
                probes = Probes(router.port, args.rejoin_probe_s, args.timeout)
                probes.start()
                # the box's own count of 200-answered chat requests: the router's first one
                t_first = wait_until(lambda: chat_ok_count(victim.metrics() or {}) > base or
                                     (victim.load() or 0) > 0, args.rejoin_wait_s, 0.05)
                probes.stop()
            out["rejoin"] = judge_rejoin(t_ready, t_first, args.rejoin_target_s)
            time.sleep(1.0)
        if "thermal" in args.faults:
            hot = boxes[0]
            base_m = hot.metrics() or {}
            marks["thermal"] = time.monotonic()
            hot.set_celsius(95.0)
            t_503 = wait_until(lambda: http_get(hot.url + "/health", 1.0)[0] == 503, 10, 0.05)
            # After one more health-check interval (1 s, plus a check's time) the router has seen it.
            time.sleep(2.0)
            marked_m = hot.metrics() or {}
            time.sleep(args.thermal_hold_s)
            end_m = hot.metrics() or {}
            hot.set_celsius(50.0)
            marks["thermal_end"] = time.monotonic()
            served_while = chat_ok_count(end_m) - chat_ok_count(base_m)
            served_after = chat_ok_count(end_m) - chat_ok_count(marked_m) if t_503 else None
            wait_until(hot.ready, 15, 0.1)
            out["thermal"] = {"box": hot.idx, "critical_to_503_s": (t_503 - marks["thermal"]) if t_503 else None,
                              "served_since_critical": served_while, "served_after_marked": served_after}
        if "drain" in args.faults:
            drainee = boxes[1] if len(boxes) > 2 else boxes[0]
            marks["drain"] = time.monotonic()
            drainee.signal(signal.SIGTERM)
            try:
                drainee.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
            time.sleep(args.drain_hold_s)
            marks["drain_end"] = time.monotonic()
            out["drain"] = {"box": drainee.idx, "exited": drainee.proc.poll() is not None,
                            "exit_code": drainee.proc.poll()}
    finally:
        results = load.stop()
    if "kill" in out:
        out["kill"].update(judge_kill(results, marks["kill"], out["kill"]["in_flight"],
                                      args.kill_grace_s, marks["kill_end"]))
    if "thermal" in out:
        errs = sum(1 for r in results if r.outcome != "ok" and marks["thermal"] <= r.end < marks["thermal_end"])
        out["thermal"].update(judge_thermal(out["thermal"]["served_after_marked"], errs))
    if "drain" in out:
        out["drain"].update(judge_drain(results, marks["drain"], marks["drain_end"]))
    out["load"] = summarize(results, max(1e-9, max((r.end for r in results), default=0) -
                                         min((r.start for r in results), default=0)))
    out["error_samples"] = sorted({r.error[:160] for r in results if r.outcome != "ok"})[:8]
    return out


def run_policy(args, policy: str, i: int, root: Path, prompts, schedule, faults: bool) -> dict[str, Any]:
    kv = policy == KV_EVENTS_POLICY
    boxes = [Box(b, args.base_port + 1 + b, root / policy, args,
                 kv_events_port=args.base_port + 50 + b if kv else None)
             for b in range(args.boxes)]
    router = None
    try:
        start_boxes(boxes)
        router = Router(policy, args.base_port, args.prom_port + i, [b.url for b in boxes], root, args)
        router.wait_ready()
        before = [cache_counters(b.metrics() or {}) for b in boxes]
        served_before = [chat_ok_count(b.metrics() or {}) for b in boxes]
        results, wall = run_workload(args.base_port, prompts, schedule, args.max_tokens, args.timeout)
        after_m = [b.metrics() or {} for b in boxes]
        row = summarize(results, wall)
        row["hit_rate"] = hit_rates(before, [cache_counters(m) for m in after_m])
        row["served_per_box"] = [chat_ok_count(m) - s for m, s in zip(after_m, served_before)]
        row["error_samples"] = sorted({r.error[:160] for r in results if r.outcome != "ok"})[:5]
        if kv:
            # Whether the router found the prompt's blocks on a box: proof it used the events.
            row["router_kv_lookups"] = router_kv_lookups(args.prom_port + i)
        print(f"  {policy}: {row['ok']}/{row['requests']} ok in {wall:.1f} s", flush=True)
        if faults:
            row["faults"] = run_faults(args, boxes, router, prompts)
        return row
    finally:
        if router:
            router.stop()
        for b in boxes:
            b.stop()


def hit_ceiling(schedule: list[list[tuple[int, int]]], rr_hit: float | None) -> dict[str, Any]:
    """An upper bound on any policy's hit rate on this workload: the first request of each
    distinct system prompt has nothing to reuse (anywhere), so at most the other requests
    hit (and not even all of their tokens: the question after the system prompt is new). With
    round_robin's measured rate, the most any policy could reach against it."""
    asked = [p for plan in schedule for p, _ in plan]
    ceiling = 1 - len(set(asked)) / len(asked) if asked else 0.0
    return {"ceiling": ceiling,
            "max_ratio_vs_round_robin": ceiling / rr_hit if rr_hit else None}


def router_kv_lookups(prom_port: int) -> dict[str, float]:
    """vllm-router's kv_aware placement lookups by result (hit, miss, missing_tokens)."""
    status, text = http_get(f"http://127.0.0.1:{prom_port}/metrics", 2.0)
    out: dict[str, float] = {}
    if status != 200:
        return out
    for line in text.splitlines():
        if line.startswith("vllm_router_kv_placement_lookups_total{"):
            labels, _, value = line.rpartition(" ")
            result = labels.split('result="', 1)[-1].split('"', 1)[0]
            out[result] = out.get(result, 0.0) + float(value)
    return out


def fmt(v, spec=".3f", none="-"):
    return none if v is None else format(v, spec)


def print_table(table: dict[str, dict[str, Any]]) -> None:
    print(f"\n{'policy':<14}{'TTFT med':>9}{'p95':>8}{'repeat':>8}{'hit':>7}{'(tiers)':>8}{'refused':>8}{'failed':>7}"
          f"{'req/s':>7}{'tok/s':>7}  served per box")
    for name, r in table.items():
        h = r.get("hit_rate") or {}
        print(f"{name:<14}{fmt(r['ttft_median_s']):>9}{fmt(r['ttft_p95_s']):>8}"
              f"{fmt(r.get('repeat_ttft_median_s')):>8}"
              f"{fmt(h.get('total'), '.0%'):>7}{fmt(h.get('from_tiers'), '.0%'):>8}"
              f"{r['refused']:>8}{r['failed']:>7}{fmt(r['requests_per_s'], '.2f'):>7}"
              f"{fmt(r['completion_tokens_per_s'], '.1f'):>7}  {[int(x) for x in r.get('served_per_box', [])]}"
              + (f"  router KV lookups {r['router_kv_lookups']}" if "router_kv_lookups" in r else ""))


def verdict_lines(report: dict[str, Any], smoke: bool) -> tuple[list[str], bool]:
    lines, ok = [], True
    for name, row in report["policies"].items():
        f = row.get("faults") or {}
        for case in FAULTS:
            if case in f:
                c = f[case]
                passed = bool(c.get("pass"))
                ok &= passed
                detail = {k: v for k, v in c.items() if k != "pass"}
                lines.append(f"{'PASS' if passed else 'FAIL'}  {case} ({name}): {json.dumps(detail)}")
    for name, j in report["targets"].items():
        for key, what in (("ttft_pass", "TTFT median <= 0.5x round_robin"),
                          ("hit_pass", "hit rate >= 2x round_robin")):
            ratio = j["ttft_ratio_vs_round_robin" if key == "ttft_pass" else "hit_ratio_vs_round_robin"]
            tag = ("PASS" if j[key] else "FAIL") if not smoke else "info"
            if not smoke:
                ok &= j[key]
            lines.append(f"{tag}  {name}: {what} (ratio {fmt(ratio, '.2f')})")
    return lines, ok


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--daemon", type=Path, default=REPO / "target/release/inferloopd")
    p.add_argument("--model", type=Path, default=REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--router", type=Path, default=REPO / ".venv-router/bin/vllm-router")
    p.add_argument("--boxes", type=int, default=3)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--requests", type=int, default=8, help="per client")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=32)
    p.add_argument("--faults", type=lambda s: [x for x in s.split(",") if x] if s != "none" else [],
                   default=list(FAULTS), help="comma list of kill,rejoin,thermal,drain, or none")
    p.add_argument("--fault-policy", default=None, help="policy the faults run under (default: cache_aware when run, else the last)")
    p.add_argument("--smoke", action="store_true", help="CI mode: fault targets judged, TTFT/hit reported only")
    p.add_argument("--base-port", type=int, default=18640, help="router; boxes take the next ports")
    p.add_argument("--prom-port", type=int, default=29140, help="router metrics, one port per policy")
    p.add_argument("--router-arg", action="append", default=[], help="extra router flag (repeatable)")
    p.add_argument("--box-arg", action="append", default=[],
                   help="extra `inferloopd serve` flag (repeatable), e.g. --box-arg=--prompt-cache-ram-mb=0")
    p.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    p.add_argument("--warm-s", type=float, default=3.0)
    p.add_argument("--kill-grace-s", type=float, default=5.0)
    p.add_argument("--kill-hold-s", type=float, default=15.0,
                   help="load kept on the survivors after the kill before the restart")
    p.add_argument("--rejoin-target-s", type=float, default=5.0)
    p.add_argument("--rejoin-wait-s", type=float, default=30.0)
    p.add_argument("--rejoin-probe-s", type=float, default=0.5,
                   help="one-token probes through the router this often while the restarted box rejoins")
    p.add_argument("--thermal-hold-s", type=float, default=6.0)
    p.add_argument("--drain-hold-s", type=float, default=3.0)
    p.add_argument("--keep-logs", action="store_true", help="keep the temp dir (logs, state) after a pass")
    p.add_argument("--out", type=Path, default=REPO / "bench/results/lan.json")
    args = p.parse_args(argv)
    bad = [f for f in args.faults if f not in FAULTS]
    if bad:
        p.error(f"unknown fault case(s) {bad}; choose from {','.join(FAULTS)}")
    if args.fault_policy is None:
        # The policy deploy/vllm-router ships; else the last one named.
        args.fault_policy = "cache_aware" if "cache_aware" in args.policies else args.policies[-1]
    elif args.fault_policy not in args.policies:
        p.error(f"--fault-policy {args.fault_policy} is not among --policies")
    if args.boxes < 2:
        p.error("--boxes must be at least 2 (a router in front of one box proves nothing)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    for path, what in ((args.daemon, "daemon (make build)"), (args.model, "model (make model)"),
                       (args.router, "router (make .venv-router)")):
        if not path.exists():
            print(f"lan.py: no {what} at {path}", file=sys.stderr)
            return 2
    prompts = make_system_prompts(args.prompts, args.seed)
    schedule = make_schedule(args.clients, args.requests, args.prompts, args.seed)
    report: dict[str, Any] = {
        "mode": "smoke" if args.smoke else "full",
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "router_flags": list(ROUTER_FLAGS) + args.router_arg,
        "caches": "cold per policy: boxes restarted with fresh state dirs before each policy",
        "policies": {},
    }
    root = Path(tempfile.mkdtemp(prefix="inferloop-lan-"))
    try:
        for i, policy in enumerate(args.policies):
            faults = bool(args.faults) and policy == args.fault_policy
            print(f"policy {policy}: {args.boxes} boxes, {args.clients} clients x {args.requests} requests"
                  f"{', then faults ' + ','.join(args.faults) if faults else ''}", flush=True)
            report["policies"][policy] = run_policy(args, policy, i, root, prompts, schedule, faults)
        report["targets"] = judge_policies(report["policies"])
        print_table(report["policies"])
        lines, ok = verdict_lines(report, args.smoke)
        rr = report["policies"].get("round_robin", {})
        report["hit_ceiling"] = hit_ceiling(schedule, (rr.get("hit_rate") or {}).get("total"))
        print()
        for line in lines:
            print(line)
        if report["hit_ceiling"]:
            c = report["hit_ceiling"]
            print(f"info  hit-rate ceiling: below {c['ceiling']:.0%} (each distinct prompt's first request "
                  f"cannot hit), i.e. at most {fmt(c['max_ratio_vs_round_robin'], '.2f')}x round_robin's")
        report["pass"] = ok
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        if ok and not args.keep_logs:
            shutil.rmtree(root, ignore_errors=True)  # the boxes' disk tiers: ~70 MB each
            print(f"\nwrote {args.out}")
        else:
            print(f"\nwrote {args.out}; logs (daemons, routers) under {root}")
        return 0 if ok else 1
    except Exception:
        print(f"lan.py: failed; logs under {root}", file=sys.stderr)
        raise


if __name__ == "__main__":
    sys.exit(main())
