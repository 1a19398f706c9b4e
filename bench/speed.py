#!/usr/bin/env python3
"""Speculative decoding and KV types: decode speed, inferloopd vs llama-server, in one run.

Three workloads (bench/speed_workloads.py): grounded (answers that quote a long handbook),
code (return a given function with one change) and chat (open questions, where drafts rarely
hit). Streaming chat completions, temperature 0, --max-tokens, same GGUF, --threads and
--slots x --ctx for every configuration (llama-server: -np SLOTS -c SLOTS*CTX, and the GGUF's
chat template as inferloopd uses it, so both see the same prompt tokens):

  ours-off             inferloopd --spec off
  ours-ngram           inferloopd --spec ngram (its default)
  ours-ngram-q8kv      inferloopd --spec ngram --kv-type q8_0
  ours-draft           inferloopd --spec draft --draft-model PATH     (with --draft-model)
  peer-off             llama-server, no speculation
  peer-ngram-simple    llama-server --spec-type ngram-simple
  peer-ngram-map-k     llama-server --spec-type ngram-map-k
  peer-q8kv            llama-server -ctk q8_0 -ctv q8_0 -fa on (a quantized V needs flash
                       attention; inferloopd turns it on itself)
  peer-draft           llama-server --spec-type draft-simple --model-draft PATH (with --draft-model)
  ours-ngram-ab        another inferloopd build (--ab-daemon BIN) with --spec ngram: an A/B

With --draft-model the main model defaults to the Q8_0 copy (make model-q8) and the draft is
the file given (the Q4_1 default model). A configuration whose server refuses to start (for
instance a draft model with another vocabulary) is reported as unavailable and the run goes on.

Every configuration's server is started at the start (each warmed up on a short request) and
they take turns: per workload, each of --prompts requests goes to every server in turn (one
request at a time on the machine, the order rotated by one per prompt) before the next prompt,
then each of --rounds rounds of --streams requests released together likewise. Drift over the
run (a shared host's neighbours, thermal state) thus falls on every configuration alike,
instead of on whichever ran last. Prompt reuse is off in both servers (inferloopd
--prefix-cache off --prompt-cache-ram-mb 0, llama-server --no-cache-prompt --cache-ram 0), so
every request is a full prefill, repeats included. Measured the same way for both servers:

* decode tok/s of a request = the server's `timings.predicted_per_second`: both compute it
  as (generated tokens - 1) / (last token's time - first token's time), inside the server,
  so how late the client reads the stream does not enter. The client's own figure from the
  stream, (completion_tokens - 1) / (last content delta - first content delta), is kept
  beside it in the JSON, and stands in for a response without timings (`decode_from` says
  which). Per stream: the median over the one-at-a-time requests;
* aggregate decode tok/s of a round = the sum of its streams' decode tok/s, the median over
  rounds (the JSON also has all completion tokens / the round's wall time, prefills
  included, as bench.py's aggregate);
* TTFT median (client: request sent -> first content delta) of the one-at-a-time requests;
* acceptance = accepted / drafted tokens, summed over the workload's requests from each
  response's `timings.draft_n` and `draft_n_accepted` (both servers), and for inferloopd also
  from /metrics (`inferloop_spec_drafted_tokens_total`, `..._accepted_tokens_total`).

Ratios (decode tok/s, one stream and aggregate) and the issue's targets: grounded and code,
ours-ngram / ours-off >= 1.5 and ours-ngram / the best llama-server n-gram mode >= 1.1; chat,
ours-ngram / ours-off >= 0.97. Also: how many one-at-a-time answers are the same text with
speculation as without (ours and llama-server's, each against its own `off`).

Usage:
  bench/speed.py [--quick] [--configs NAME ...] [--workloads grounded code chat]
                 [--draft-model PATH] [--ab-daemon BIN] [--model PATH] [--prompts N] [--rounds N]
                 [--max-tokens N] [--output PATH] [--daemon-arg F] [--peer-arg F]
  make bench-speed BENCH_ARGS="--quick"

Writes bench/results/speed.json (and one server log per configuration next to it). Standard
library only; servers and streaming come from bench.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import platform
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import (  # noqa: E402
    REPO, BenchError, Daemon, fmt, free_port, get_json, git_commit, median, stream_messages,
)
from prefix import write_json  # noqa: E402
import prefix_metrics  # noqa: E402
import speed_workloads  # noqa: E402
from speed_workloads import WORKLOADS  # noqa: E402

DEFAULT_MODEL = REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
# The main model when a draft model is given: the Q4_1 default drafts for its Q8_0 copy.
DRAFT_MAIN_MODEL = REPO / "models/SmolLM2-135M-Instruct.Q8_0.gguf"
DRAFT = "{draft}"  # stands for --draft-model's path in a configuration's flags

# name -> (server, flags). Those that name DRAFT run only with --draft-model.
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "ours-off": ("inferloopd", ["--spec", "off"]),
    "ours-ngram": ("inferloopd", ["--spec", "ngram"]),
    "ours-ngram-q8kv": ("inferloopd", ["--spec", "ngram", "--kv-type", "q8_0"]),
    "ours-draft": ("inferloopd", ["--spec", "draft", "--draft-model", DRAFT]),
    "peer-off": ("llama-server", []),
    "peer-ngram-simple": ("llama-server", ["--spec-type", "ngram-simple"]),
    "peer-ngram-map-k": ("llama-server", ["--spec-type", "ngram-map-k"]),
    "peer-q8kv": ("llama-server", ["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]),
    "peer-draft": ("llama-server", ["--spec-type", "draft-simple", "--model-draft", DRAFT]),
    # Runs only with --ab-daemon: another inferloopd build, side by side with this one.
    "ours-ngram-ab": ("inferloopd", ["--spec", "ngram"]),
}
AB_CONFIG = "ours-ngram-ab"
PEER_NGRAM = ("peer-ngram-simple", "peer-ngram-map-k")
# (numerator, denominator) of every ratio reported; "peer-best" is the faster of PEER_NGRAM.
RATIOS = [("ours-ngram", "ours-off"), ("ours-ngram", "peer-best"), ("peer-best", "peer-off"),
          ("ours-ngram-q8kv", "ours-ngram"), ("peer-q8kv", "peer-off"),
          ("ours-draft", "ours-off"), ("ours-draft", "peer-draft"),
          ("ours-ngram-ab", "ours-off"), ("ours-ngram", "ours-ngram-ab")]
# Issue 35's targets: the least each ratio of one-stream decode tok/s may be, per workload.
TARGETS: dict[str, dict[str, float]] = {
    "grounded": {"ours-ngram/ours-off": 1.5, "ours-ngram/peer-best": 1.1},
    "code": {"ours-ngram/ours-off": 1.5, "ours-ngram/peer-best": 1.1},
    "chat": {"ours-ngram/ours-off": 0.97},
}
# Same temperature-0 text with speculation as without: (speculating, baseline).
SAME_TEXT = [("ours-ngram", "ours-off"), ("ours-draft", "ours-off"), ("ours-ngram-ab", "ours-off"),
             ("peer-ngram-simple", "peer-off"), ("peer-ngram-map-k", "peer-off"),
             ("peer-draft", "peer-off")]
# Every request a full prefill, a repeated prompt included: decode is measured here, and a
# workload's texts are sent as they are (a per-request number in front would defeat the
# caches too, but a 135M model answers "1. 1. 1." to "Request 1. <question>").
NO_PROMPT_REUSE = {"inferloopd": ["--prefix-cache", "off", "--prompt-cache-ram-mb", "0"],
                   "llama-server": ["--no-cache-prompt", "--cache-ram", "0"]}
METRIC_DRAFTED = "inferloop_spec_drafted_tokens_total"
METRIC_ACCEPTED = "inferloop_spec_accepted_tokens_total"


# --- configurations ------------------------------------------------------------------------


def selected_configs(names: list[str] | None, draft_model: str | None,
                     ab_daemon: str | None = None) -> list[str]:
    """The configurations to run, in CONFIGS' order: `names` or all; those needing a draft
    model only when one is given, the A/B one only with a second build."""
    chosen = names or list(CONFIGS)
    needs_draft = [n for n in chosen if DRAFT in CONFIGS[n][1]]
    if draft_model is None:
        if names and needs_draft:
            raise ValueError(f"{', '.join(needs_draft)} need --draft-model")
        chosen = [n for n in chosen if n not in needs_draft]
    if ab_daemon is None:
        if names and AB_CONFIG in names:
            raise ValueError(f"{AB_CONFIG} needs --ab-daemon")
        chosen = [n for n in chosen if n != AB_CONFIG]
    return [n for n in CONFIGS if n in chosen]


def server_argv(name: str, args: argparse.Namespace) -> tuple[list[str], str | None, str]:
    """argv, base URL (None: inferloopd prints it) and readiness path of a configuration."""
    server, flags = CONFIGS[name]
    flags = [args.draft_model if f == DRAFT else f for f in flags]
    if server == "inferloopd":
        binary = args.ab_daemon if name == AB_CONFIG else args.daemon
        argv = [binary, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", "0",
                "--threads", str(args.threads), "--slots", str(args.slots), "--ctx", str(args.ctx),
                *NO_PROMPT_REUSE["inferloopd"]]
        return argv + flags + args.daemon_arg, None, "/readyz"
    port = free_port()
    argv = [args.peer, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
            "-t", str(args.threads), "-tb", str(args.threads), "-np", str(args.slots),
            "-c", str(args.slots * args.ctx), "--no-webui",
            # The GGUF's Jinja chat template, as inferloopd uses it (its default system prompt
            # included; --no-jinja would leave that out): both see the same prompt tokens,
            # which the report checks.
            "--jinja", *NO_PROMPT_REUSE["llama-server"]]
    return argv + flags + args.peer_arg, f"http://127.0.0.1:{port}", "/health"


# --- measuring -----------------------------------------------------------------------------


def one_round(base_url: str, model_id: str, messages: list[list[dict[str, str]]],
              max_tokens: int) -> list[dict[str, Any]]:
    """The requests sent together (released by one barrier); their records in order."""
    results: list[dict[str, Any] | None] = [None] * len(messages)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(messages))

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = stream_messages(base_url, model_id, messages[i], max_tokens)
        except BaseException as e:  # reported below, after all threads are joined
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(messages))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise BenchError(f"{len(errors)} of {len(messages)} concurrent streams failed: {errors[0]}")
    return [r for r in results if r is not None]


def record(r: dict[str, Any], index: int) -> dict[str, Any]:
    """What the JSON keeps of a request: its prompt index, figures, drafts and text. Its
    decode tok/s is the server's `timings.predicted_per_second` when there is one (both
    servers compute it alike: tokens after the first over the time from the first token to
    the last, in the server), else the client's figure from the stream."""
    t = r.get("server_timings") or {}
    server = t.get("predicted_per_second") if r["completion_tokens"] > 1 else None
    return {"prompt": index, "ttft_ms": r["ttft_ms"],
            "decode_tps": server if server else r["decode_tps"],
            "decode_from": "server" if server else "client",
            "decode_tps_client": r["decode_tps"],
            "completion_tokens": r["completion_tokens"], "prompt_tokens": r["prompt_tokens"],
            "finish_reason": r["finish_reason"], "t_start": r["t_start"], "t_end": r["t_end"],
            # llama-server leaves both out when it drafted nothing.
            "draft_n": t.get("draft_n", 0 if t else None),
            "draft_n_accepted": t.get("draft_n_accepted", 0 if t else None),
            "text": r["text"]}


def run_request(srv: "Server", messages: list[dict[str, str]], index: int,
                args: argparse.Namespace, label: str) -> dict[str, Any]:
    r = record(stream_messages(srv.base_url, srv.model_id, messages, args.max_tokens), index)
    print(f"    [{srv.name}] {label}: {r['prompt_tokens']} prompt tokens, {r['completion_tokens']} "
          f"generated, decode {fmt(r['decode_tps'])} tok/s ({r['decode_from']})", file=sys.stderr)
    return r


# What a configuration's failing request raises; any of them marks it `error` and the bench goes on.
MEASURE_ERRORS = (BenchError, OSError, http.client.HTTPException, ValueError, KeyError)


def run_round(srv: "Server", msgs: list[list[dict[str, str]]], idx: list[int],
              args: argparse.Namespace, label: str) -> dict[str, Any]:
    streams = [record(r, i) for r, i in zip(one_round(srv.base_url, srv.model_id, msgs, args.max_tokens), idx)]
    r = {"streams": streams, "aggregate_decode_tps": aggregate_decode_tps(streams),
         "aggregate_tps": round_tps(streams)}
    print(f"    [{srv.name}] {label}: aggregate decode {fmt(r['aggregate_decode_tps'])} tok/s",
          file=sys.stderr)
    return r


class Server:
    """One configuration's running server and what it measured so far."""

    def __init__(self, name: str, args: argparse.Namespace, log_dir: Path):
        self.name = name
        argv, self.base_url, ready_path = server_argv(name, args)
        self.out: dict[str, Any] = {"server": CONFIGS[name][0], "argv": argv, "workloads": {}}
        self.model_id = ""
        self.proc: Daemon | None = None
        print(f"[{name}] starting: {' '.join(argv)}", file=sys.stderr)
        try:
            self.proc = Daemon(argv, log_dir / f"speed-{name}.log", base_url=self.base_url,
                               ready_path=ready_path)
        except OSError as e:
            self.out.update(status="unavailable", reason=str(e))
            return
        self.out["log"] = str(self.proc.log_path)
        try:
            self.base_url = self.proc.wait_ready(args.ready_timeout)
            self.model_id = get_json(self.base_url, "/v1/models", None)["data"][0]["id"]
            self.out["model_id"] = self.model_id
            # First-request costs (page faults in the weights) are not steady state.
            stream_messages(self.base_url, self.model_id, [{"role": "user", "content": "Hi"}], 8)
        except BenchError as e:
            self.out.update(status="unavailable", reason=last_lines(str(e)))
            return
        except MEASURE_ERRORS as e:
            self.out.update(status="error", reason=str(e))
            return
        self.out["status"] = "ok"

    @property
    def ok(self) -> bool:
        return self.out.get("status") == "ok"

    def fail(self, e: BaseException) -> None:
        """A request failed: the configuration is `error` and gets no more requests."""
        self.out.update(status="error", reason=str(e))
        print(f"[{self.name}] error: {e}", file=sys.stderr)

    def stop(self) -> None:
        if self.proc is None:
            return
        rc = self.proc.stop()
        if self.ok and rc != 0:
            print(f"speed: warning: {self.name} exited with status {rc} (log: {self.proc.log_path})",
                  file=sys.stderr)


def turns(servers: list[Server], k: int) -> list[Server]:
    """The running servers in the order they take turn `k`: rotated by one each turn, so that
    none is always measured first or right after the same neighbour."""
    live = [s for s in servers if s.ok]
    if not live:
        return []
    k %= len(live)
    return live[k:] + live[:k]


def take_turn(servers: list[Server], k: int, measure) -> dict[str, Any]:
    """`measure(server)` on every running server in turn `k`'s order: what each returned, by
    name; a server whose measurement raises is marked `error` and left out."""
    got = {}
    for srv in turns(servers, k):
        try:
            got[srv.name] = measure(srv)
        except MEASURE_ERRORS as e:
            srv.fail(e)
    return got


def run_workload(servers: list[Server], workload: str, args: argparse.Namespace) -> None:
    """One workload on every running server, interleaved: each prompt goes to every server in
    turn before the next prompt, then each round of concurrent streams likewise, so that the
    machine's drift over the run (a shared host's neighbours, thermal state) falls on all
    configurations alike instead of on whichever ran last."""
    requests = speed_workloads.prompts(workload, args.prompts, args.seed)
    before = {s.name: prefix_metrics.scrape(s.base_url) for s in servers if s.ok}
    single: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
    for i, messages in enumerate(requests):
        label = f"{workload} {i + 1}/{len(requests)}"
        got = take_turn(servers, i, lambda srv: run_request(srv, messages, i, args, label))
        for name, r in got.items():
            single[name].append(r)
    rounds: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
    for n in range(args.rounds):
        idx = [(n * args.streams + j) % len(requests) for j in range(args.streams)]
        label = f"{workload} round {n + 1}/{args.rounds}"
        got = take_turn(servers, n, lambda srv: run_round(srv, [requests[i] for i in idx], idx,
                                                          args, label))
        for name, r in got.items():
            rounds[name].append(r)
    for srv in servers:
        if not srv.ok:
            continue
        after = prefix_metrics.scrape(srv.base_url)
        spec_metrics = {"drafted": prefix_metrics.delta(before[srv.name], after, METRIC_DRAFTED),
                        "accepted": prefix_metrics.delta(before[srv.name], after, METRIC_ACCEPTED)}
        srv.out["workloads"][workload] = summarize(single[srv.name], rounds[srv.name], spec_metrics)


def run_all(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """Starts every configuration's server (each idles while another is measured), runs the
    workloads interleaved across them, stops them all. A server that does not come up is
    `unavailable` (with its last log lines); one that fails a request mid-run is `error`;
    either way the bench goes on with the others."""
    servers: list[Server] = []
    try:
        for name in args.configs:
            servers.append(Server(name, args, log_dir))
        for workload in args.workloads:
            run_workload(servers, workload, args)
    finally:
        for srv in servers:
            srv.stop()
    return {srv.name: srv.out for srv in servers}


def last_lines(text: str, n: int = 4) -> str:
    """The end of a start-up failure (bench.Daemon's message and log tail) on one line."""
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.startswith("--- ")]
    return " | ".join(lines[-n:])


# --- statistics ----------------------------------------------------------------------------


def aggregate_decode_tps(streams: list[dict[str, Any]]) -> float | None:
    """The sum of the streams' own decode tok/s: the round's decode throughput while they run
    together. Not tokens over the round's span: with long prompts the span is mostly the
    streams' prefills one after another, and would measure those instead."""
    rates = [s["decode_tps"] for s in streams if s["decode_tps"] is not None]
    return sum(rates) if rates else None


def round_tps(streams: list[dict[str, Any]]) -> float | None:
    """All completion tokens over the round's wall time, prefills included (bench.py's
    aggregate)."""
    wall = max(s["t_end"] for s in streams) - min(s["t_start"] for s in streams)
    return sum(s["completion_tokens"] for s in streams) / wall if wall > 0 else None


def acceptance(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Drafted and accepted tokens summed over the requests' timings; rate None when the
    server reports no timings or drafted nothing."""
    drafted = [r["draft_n"] for r in requests if r.get("draft_n") is not None]
    accepted = [r["draft_n_accepted"] for r in requests if r.get("draft_n_accepted") is not None]
    if not drafted:
        return {"drafted": None, "accepted": None, "rate": None}
    d, a = sum(drafted), sum(accepted)
    return {"drafted": d, "accepted": a, "rate": a / d if d else None}


def summarize(single: list[dict[str, Any]], rounds: list[dict[str, Any]],
              spec_metrics: dict[str, float | None]) -> dict[str, Any]:
    streams = [s for r in rounds for s in r["streams"]]
    prompt_tokens = [r["prompt_tokens"] for r in single if r["prompt_tokens"] is not None]
    return {
        "single": {
            "requests": single,
            "decode_tps_median": median([r["decode_tps"] for r in single]),
            "client_decode_tps_median": median([r["decode_tps_client"] for r in single]),
            "decode_from": sorted({r["decode_from"] for r in single + streams}),
            "ttft_ms_median": median([r["ttft_ms"] for r in single]),
            "completion_tokens_median": median([r["completion_tokens"] for r in single]),
            "prompt_tokens_range": [min(prompt_tokens), max(prompt_tokens)] if prompt_tokens else None,
        },
        "concurrent": {
            "rounds": rounds,
            "aggregate_decode_tps_median": median([r["aggregate_decode_tps"] for r in rounds]),
            "aggregate_tps_median": median([r["aggregate_tps"] for r in rounds]),
            "per_stream_decode_tps_median": median([s["decode_tps"] for s in streams]),
            "ttft_ms_median": median([s["ttft_ms"] for s in streams]),
        },
        "acceptance": acceptance(single + streams),
        "acceptance_metrics": {**spec_metrics,
                               "rate": prefix_metrics.frac(spec_metrics.get("accepted"),
                                                           spec_metrics.get("drafted"))},
    }


def decode_figures(configs: dict[str, Any],
                   workload: str) -> tuple[dict[str, tuple[float | None, float | None]], str | None]:
    """Per configuration that ran: (one-stream, aggregate) decode tok/s on `workload`; and the
    faster llama-server n-gram mode by one-stream decode, whose figures also go in as
    "peer-best"."""
    figs: dict[str, tuple[float | None, float | None]] = {}
    for name, run in configs.items():
        w = (run.get("workloads") or {}).get(workload) if run.get("status") == "ok" else None
        if w:
            figs[name] = (w["single"]["decode_tps_median"], w["concurrent"]["aggregate_decode_tps_median"])
    ngram = [n for n in PEER_NGRAM if n in figs and figs[n][0] is not None]
    best = max(ngram, key=lambda n: figs[n][0]) if ngram else None
    if best:
        figs["peer-best"] = figs[best]
    return figs, best


def div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare(configs: dict[str, Any], workload: str) -> dict[str, Any]:
    """The ratios of RATIOS whose both sides ran, and the verdict of each target: True, False,
    or None when a side is missing."""
    figs, best = decode_figures(configs, workload)
    ratios = {}
    for a, b in RATIOS:
        if a in figs and b in figs:
            ratios[f"{a}/{b}"] = {"single": div(figs[a][0], figs[b][0]),
                                  "aggregate": div(figs[a][1], figs[b][1])}
    targets = {}
    for key, least in TARGETS.get(workload, {}).items():
        got = (ratios.get(key) or {}).get("single")
        targets[key] = {"least": least, "ratio": got, "pass": None if got is None else got >= least}
    return {"peer_best": best, "ratios": ratios, "targets": targets}


def same_texts(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """How many of the one-at-a-time answers are the same text in both runs; for each that
    differs, its prompt index and the characters they share before the first difference."""
    by_prompt = {r["prompt"]: r["text"] for r in b}
    pairs = [(r["prompt"], r["text"], by_prompt[r["prompt"]]) for r in a if r["prompt"] in by_prompt]
    differ = []
    for i, x, y in pairs:
        if x != y:
            common = next((k for k, (c, d) in enumerate(zip(x, y)) if c != d), min(len(x), len(y)))
            differ.append({"prompt": i, "common_chars": common, "chars": [len(x), len(y)]})
    return {"same": len(pairs) - len(differ), "of": len(pairs), "differ": differ}


def text_identity(configs: dict[str, Any], workloads: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a, b in SAME_TEXT:
        ra, rb = configs.get(a) or {}, configs.get(b) or {}
        if ra.get("status") != "ok" or rb.get("status") != "ok":
            continue
        out[f"{a}/{b}"] = {w: same_texts(ra["workloads"][w]["single"]["requests"],
                                         rb["workloads"][w]["single"]["requests"])
                           for w in workloads if w in ra["workloads"] and w in rb["workloads"]}
    return out


def prompt_token_mismatch(configs: dict[str, Any], workload: str) -> dict[str, list]:
    """Every configuration's prompt token counts on `workload` when they are not all the same
    (the same texts should tokenize alike everywhere; if not, the chat templates differ);
    else {}."""
    counts = {name: [r["prompt_tokens"] for r in run["workloads"][workload]["single"]["requests"]]
              for name, run in configs.items()
              if run.get("status") == "ok" and workload in run["workloads"]}
    return counts if len({tuple(c) for c in counts.values()}) > 1 else {}


# --- output --------------------------------------------------------------------------------


def pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def config_rows(configs: dict[str, Any], workload: str) -> list[tuple[str, ...]]:
    """The table of one workload: a row per configuration."""
    rows = [("config", "1-stream tok/s", "4-stream agg tok/s", "TTFT ms", "tokens",
             "accepted/drafted", "accept (/metrics)")]
    for name, run in configs.items():
        if run.get("status") != "ok":
            rows.append((name, run.get("status", "-"), "", "", "", "", ""))
            continue
        w = run["workloads"].get(workload)
        if not w:
            continue
        s, c, a, m = w["single"], w["concurrent"], w["acceptance"], w["acceptance_metrics"]
        drafts = "-" if a["drafted"] is None else f"{a['accepted']}/{a['drafted']} {pct(a['rate'])}"
        rows.append((name, fmt(s["decode_tps_median"]), fmt(c["aggregate_decode_tps_median"]),
                     fmt(s["ttft_ms_median"], 0), fmt(s["completion_tokens_median"], 0), drafts,
                     pct(m["rate"])))
    return rows


def ratio_rows(cmp: dict[str, Any]) -> list[tuple[str, ...]]:
    rows = [("ratio (decode tok/s)", "1 stream", "4 streams", "target")]
    for key, r in cmp["ratios"].items():
        t = cmp["targets"].get(key)
        verdict = ""
        if t is not None:
            word = {True: "PASS", False: "FAIL", None: "n/a"}[t["pass"]]
            verdict = f"{word} (>= {t['least']:g})"
        label = key.replace("peer-best", f"peer-best ({cmp['peer_best']})") if cmp["peer_best"] else key
        rows.append((label, fmt(r["single"], 2), fmt(r["aggregate"], 2), verdict))
    return rows


def print_report(result: dict[str, Any]) -> None:
    c = result["config"]
    print()
    print(f"Decode speed  model={Path(c['model']).name}  threads={c['threads']}  slots={c['slots']}  "
          f"ctx={c['ctx']}  max_tokens={c['max_tokens']}  prompts={c['prompts']}  "
          f"rounds={c['rounds']}x{c['streams']} streams{'  (quick)' if c['quick'] else ''}")
    print("decode tok/s: the servers' timings, (tokens - 1) / (last token - first token); 1-stream "
          "and TTFT (client): medians of the one-at-a-time requests; agg: the streams' sum, "
          "median over rounds")
    for workload in c["workloads"]:
        ranges = [r["workloads"][workload]["single"]["prompt_tokens_range"]
                  for r in result["configs"].values()
                  if r.get("status") == "ok" and workload in r["workloads"]]
        span = next((f", {lo}-{hi} prompt tokens" for lo, hi in filter(None, ranges)), "")
        print(f"\n## {workload}{span}\n")
        prefix_metrics.print_rows(config_rows(result["configs"], workload), (18,))
        odd = result["prompt_tokens_differ"].get(workload)
        if odd:
            print(f"\nwarning: prompt tokens differ between configurations: {odd}")
        cmp = result["compare"][workload]
        if cmp["ratios"]:
            print()
            prefix_metrics.print_rows(ratio_rows(cmp), (34,))
    if result["same_text"]:
        print("\nSame temperature-0 text as without speculation (one-at-a-time requests):")
        for key, per in result["same_text"].items():
            cells = ", ".join(f"{w} {v['same']}/{v['of']}" for w, v in per.items())
            print(f"  {key}: {cells}")
    down = {n: r.get("reason", "") for n, r in result["configs"].items() if r.get("status") != "ok"}
    for name, reason in down.items():
        print(f"\n{name}: {result['configs'][name]['status']}: {reason}")
    print()


# --- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 2 prompts, 1 round, --max-tokens 64 unless given")
    p.add_argument("--configs", nargs="+", default=None, metavar="NAME",
                   help=f"subset of {', '.join(CONFIGS)} (space or comma separated; default: "
                        "all, the draft ones only with --draft-model)")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), metavar="NAME",
                   help=f"subset of {', '.join(WORKLOADS)}")
    p.add_argument("--draft-model", default=None, help="draft GGUF: also run ours-draft and peer-draft")
    p.add_argument("--model", default=None,
                   help=f"main GGUF (default {DEFAULT_MODEL.name}; with --draft-model, {DRAFT_MAIN_MODEL.name})")
    p.add_argument("--daemon", default=str(REPO / "target/release/inferloopd"), help="inferloopd binary")
    p.add_argument("--peer", default=str(REPO / "peer/llama-server"),
                   help="llama-server binary (scripts/build-peer.sh)")
    p.add_argument("--ab-daemon", default=None, metavar="BIN",
                   help=f"another inferloopd build, run as {AB_CONFIG} (--spec ngram) beside "
                        "the others: an A/B of two builds in one interleaved run")
    p.add_argument("--daemon-arg", action="append", default=[], help="extra inferloopd serve flag (repeatable)")
    p.add_argument("--peer-arg", action="append", default=[], help="extra llama-server flag (repeatable)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--ctx", type=int, default=2048, help="per slot; the longest handbook is ~1500 tokens")
    p.add_argument("--prompts", type=int, default=None, help="requests per workload (default 6, quick 2)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of concurrent streams (default 2, quick 1)")
    p.add_argument("--streams", type=int, default=4, help="concurrent streams per round")
    p.add_argument("--max-tokens", type=int, default=None, help="default 256, quick 64")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ready-timeout", type=float, default=120.0)
    p.add_argument("--output", default=str(REPO / "bench/results/speed.json"))
    args = p.parse_args(argv)
    quick = args.quick
    for name, full, small in (("prompts", 6, 2), ("rounds", 2, 1), ("max_tokens", 256, 64)):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    for name in ("threads", "slots", "ctx", "prompts", "rounds", "streams", "max_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.model is None:
        args.model = str(DRAFT_MAIN_MODEL if args.draft_model else DEFAULT_MODEL)
    args.workloads = [w for item in args.workloads for w in item.split(",") if w]
    names = [n for item in args.configs or [] for n in item.split(",") if n] or None
    for kind, given, known in (("workload", args.workloads, WORKLOADS), ("config", names or [], CONFIGS)):
        unknown = sorted(set(given) - set(known))
        if unknown:
            p.error(f"unknown {kind}(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    try:
        args.configs = selected_configs(names, args.draft_model, args.ab_daemon)
    except ValueError as e:
        p.error(str(e))
    return args


def check_files(args: argparse.Namespace) -> None:
    servers = {CONFIGS[n][0] for n in args.configs}
    for what, path, hint, needed in (
            ("inferloopd binary", args.daemon, "make build", "inferloopd" in servers),
            ("llama-server binary", args.peer, "scripts/build-peer.sh", "llama-server" in servers),
            ("model", args.model, "make model / make model-q8", True),
            ("draft model", args.draft_model, "make model", args.draft_model is not None),
            ("A/B inferloopd binary", args.ab_daemon, "--ab-daemon", args.ab_daemon is not None)):
        if needed and not Path(path).is_file():
            raise BenchError(f"{what} {path} not found ({hint})")


def config(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in (
        "threads", "slots", "ctx", "prompts", "rounds", "streams", "max_tokens", "seed", "quick",
        "model", "draft_model", "ab_daemon", "workloads", "configs", "daemon_arg", "peer_arg")} | {
        "temperature": 0,
        "decode_tps": "the servers' timings.predicted_per_second, (generated - 1) / (last "
                      "token - first token) in the server (records say decode_from: client "
                      "when a response had none); aggregate: the sum over a round's streams"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (a runner's timeout, a QUIET-lock watcher) unwinds like Ctrl-C, so the running
    # configuration's server is stopped too instead of left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    output = Path(args.output)
    try:
        check_files(args)
    except BenchError as e:
        print(f"speed: error: {e}", file=sys.stderr)
        return 1
    if args.draft_model and Path(args.draft_model).resolve() == Path(args.model).resolve():
        print("speed: warning: the draft model is the main model", file=sys.stderr)
    t0 = time.monotonic()
    configs = run_all(args, output.parent)
    result = {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "host": {"platform": platform.platform(), "machine": platform.machine(),
                 "cpus": os.cpu_count(), "python": platform.python_version(),
                 "loadavg": os.getloadavg()},
        "wall_s": time.monotonic() - t0,
        "config": config(args),
        "targets": TARGETS,
        "configs": configs,
        "compare": {w: compare(configs, w) for w in args.workloads},
        "same_text": text_identity(configs, args.workloads),
        "prompt_tokens_differ": {w: d for w in args.workloads
                                 if (d := prompt_token_mismatch(configs, w))},
    }
    print_report(result)
    write_json(output, result)
    print(f"wrote {output}", file=sys.stderr)
    return 1 if any(r["status"] == "error" for r in configs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
