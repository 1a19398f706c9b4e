#!/usr/bin/env python3
"""Prompt reuse: time to first token when prompts share a prefix, inferloopd vs llama-server.

Runs four workloads of streaming chat completions (temperature 0, --max-tokens short answers)
against inferloopd and against llama.cpp's llama-server with its prompt cache on (its default,
`cache_prompt: true`), same GGUF, --threads, --slots x --ctx (llama-server: -np SLOTS
-c SLOTS*CTX):

* shared: one ~600-token system prompt; 4 concurrent clients x 4 short questions each, every
  client sending its questions one after the other;
* apps:   8 different ~600-token system prompts ("8 applications") over the 4 slots; 4 clients
  x 6 requests, each request picking an application from a fixed-seed sequence;
* chat:   2 concurrent chats x 5 turns, the whole history resent every turn (the assistant's
  answer and a new question appended);
* nonce:  workload `shared` with a unique number at the very start of every prompt: nothing
  is reusable, so this measures what looking for reuse costs;
* shared-exact, chat-exact: workloads `shared` and `chat` with inferloopd's
  `--prefix-cache exact`, which reuses only rows that keep output identical to reuse off
  (the default, `on`, reuses every resident row as llama-server does; see
  docs/configuration.md, "Prompt reuse"): what exactness costs. No target; their
  llama-server run is the plain workload's when both ran.
* gen: a generated workload nobody tuned for (bench/prefix_gen.py): --gen-requests requests
  arriving at random (Poisson, --gen-rate per second), each a system prompt drawn from
  --gen-prompts distinct ones (a list: one workload per count) with random lengths
  (--gen-prompt-tokens MIN MAX, default 100-3000, or per --gen-band LO-HI: one workload per
  band and count, named gen-p<count>@LO-HI) and a random question (--gen-question-tokens MIN
  MAX). Their --ctx is raised to fit the longest band. Prints a table of TTFT median/p90/max
  with a row per count and server and a column per band.
* restart (not in the default set; bench/prefix_restart.py): inferloopd only, K application
  prompts cold, a restart on the same --state-dir, the same prompts warm: the ratio warm / cold
  TTFT, with the disk tier (`restart`) and without it (`restart-control`).

Per workload, the prompt-cache hit rates by tier (resident slots, RAM, disk) come from the
servers' /metrics before and after it (bench/prefix_metrics.py; "-" where a series is not
exported).

Every (workload, server) pair runs on a freshly started server, so caches start cold, and the
servers run one after the other, never at the same time. Per pair, client side: TTFT (request
sent -> first content delta) median, mean and p95; decode tok/s, median of per-request
(completion_tokens - 1) / (t_last_delta - t_first_delta); and the prompt tokens the server
reports as reused (`usage.prompt_tokens_details.cached_tokens`, else `timings.cache_n`).
The table compares TTFT and checks the targets (TARGETS below).

Usage:
  bench/prefix.py [--workloads shared apps chat nonce gen restart] [--quick] [--output PATH]
                  [--servers inferloopd llama-server] [--gen-prompts 1 4 8 16]
                  [--gen-band 100-500 500-1500 1500-3000] [--gen-requests N]
                  [--gen-rate PER_S] [--gen-prompt-tokens MIN MAX] [--restart-prompts K]
                  [--daemon PATH] [--peer PATH] [--model PATH]
                  [--daemon-arg FLAG ...] [--peer-arg FLAG ...]
  make bench-prefix BENCH_ARGS="--quick --workloads shared"

Writes bench/results/prefix.json (and one server log per run next to it). Standard library
only; the server handling comes from bench.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import (  # noqa: E402
    REPO, BenchError, Daemon, fmt, free_port, get_json, git_commit, stream_messages,
)
import prefix_gen  # noqa: E402
import prefix_metrics  # noqa: E402
import prefix_restart  # noqa: E402

DEFAULT_WORKLOADS = ("shared", "apps", "chat", "nonce", "shared-exact", "chat-exact", "gen")
# `restart` runs both prefix_restart.VARIANTS; not a default: it needs the disk tier's flags.
WORKLOADS = DEFAULT_WORKLOADS + ("restart",)
# inferloopd flags a workload adds to the server's own.
WORKLOAD_DAEMON_ARGS = {"shared-exact": ["--prefix-cache", "exact"],
                        "chat-exact": ["--prefix-cache", "exact"]}
# The workload whose llama-server run an exact variant shares (same requests, same server).
SAME_PEER_RUN = {"shared-exact": "shared", "chat-exact": "chat"}
SERVERS = ("inferloopd", "llama-server")
# Per workload: the most TTFT may be, as a multiple of llama-server's, for each statistic.
TARGETS: dict[str, dict[str, float]] = {
    "shared": {"median": 1.0, "mean": 0.6},
    "apps": {"median": 0.5},
    "chat": {"median": 1.0},
    "nonce": {"median": 1.05},
    "shared-exact": {},
    "chat-exact": {},
}
# English instructions through SmolLM2's tokenizer: characters per token, measured. The
# prompt token counts the servers report are recorded and printed, so drift shows.
CHARS_PER_TOKEN = 4.5

Message = dict[str, str]
Send = Callable[[list[Message]], dict[str, Any]]
Client = Callable[[Send], None]


# --- prompts -------------------------------------------------------------------------------

APPS = ["Northwind Outfitters", "Harbor Health Clinic", "Quill & Ledger Accounting",
        "Bluebird Airlines", "Cedar Valley Library", "Voltline Energy", "Sprocket Bike Repair",
        "Meridian Hotels"]
TOPICS = ["refunds", "opening hours", "account security", "billing", "delivery times",
          "appointments", "complaints", "loyalty points", "privacy", "cancellations",
          "gift cards", "accessibility", "pricing", "technical problems", "feedback"]
ACTIONS = ["answer in at most three sentences", "stay polite and calm",
           "ask for the reference number first", "never promise a date you cannot confirm",
           "point the user to the help page", "summarise the policy before the details",
           "offer to open a ticket", "avoid jargon", "confirm the user's name",
           "mention the relevant fee", "recommend contacting a human agent",
           "explain the next step clearly"]
CONDITIONS = ["the user sounds upset", "the request is urgent", "the user is a new customer",
              "the question is vague", "the user writes in capital letters",
              "several questions arrive at once", "the user mentions a previous ticket",
              "the amount is above one hundred dollars", "the user asks for a manager",
              "it is outside business hours"]
QUESTIONS = ["What are your opening hours?", "How do I reset my password?",
             "Can I get a refund?", "Where is my order?", "Do you have a loyalty program?",
             "How can I contact support?", "Is there a fee for cancelling?",
             "Can I change my appointment?", "What payment methods do you accept?",
             "How long does delivery take?", "Do you offer gift cards?",
             "Is my data shared with anyone?", "Can I speak to a manager?",
             "What is your return policy?", "Are you open on Sundays?",
             "How do I update my address?", "Why was I charged twice?",
             "Do you have student discounts?", "Can I pay in installments?",
             "How do I close my account?", "Is the service accessible by wheelchair?",
             "What does the premium plan include?", "Can I transfer my points?",
             "How do I leave feedback?"]
FOLLOW_UPS = ["Tell me about your refund policy.", "Why is that?", "Can you give an example?",
              "What if I lost the receipt?", "How long will it take?", "Who do I ask next?",
              "Is there anything else I should know?"]


def system_prompt(app: int, n_tokens: int) -> str:
    """A deterministic, instruction-like system prompt of about n_tokens tokens."""
    rng = random.Random(1000 + app)
    name = APPS[app % len(APPS)]
    parts = [f"You are the customer assistant of {name}. Follow these rules in every answer."]
    rule = 1
    while sum(map(len, parts)) + len(parts) < n_tokens * CHARS_PER_TOKEN:
        parts.append(f"Rule {rule}: about {rng.choice(TOPICS)}, when {rng.choice(CONDITIONS)}, "
                     f"{rng.choice(ACTIONS)} and {rng.choice(ACTIONS)}.")
        rule += 1
    return " ".join(parts)


def question(rng: random.Random) -> str:
    return rng.choice(QUESTIONS)


# --- workloads -----------------------------------------------------------------------------
#
# A workload is a list of clients, run concurrently; a client sends its requests in order
# through `send`, which returns the measured request (its "text" included).


def shared_clients(cfg: argparse.Namespace, nonce: bool = False) -> list[Client]:
    """4 clients x N questions on one system prompt; with `nonce`, every prompt starts with
    a number of its own."""
    system = system_prompt(0, cfg.system_tokens)
    per_client = 2 if cfg.quick else 4
    nonces = random.Random(cfg.seed).sample(range(10**8, 10**9), 4 * per_client)

    def client(i: int) -> Client:
        def run(send: Send) -> None:
            rng = random.Random(cfg.seed * 100 + i)
            for k in range(per_client):
                content = f"{nonces[i * per_client + k]}. {system}" if nonce else system
                send([{"role": "system", "content": content},
                      {"role": "user", "content": question(rng)}])
        return run

    return [client(i) for i in range(4)]


def apps_clients(cfg: argparse.Namespace) -> list[Client]:
    """4 clients x N requests, each on one of 8 system prompts chosen by a fixed seed."""
    systems = [system_prompt(app, cfg.system_tokens) for app in range(8)]
    per_client = 3 if cfg.quick else 6

    def client(i: int) -> Client:
        def run(send: Send) -> None:
            rng = random.Random(cfg.seed * 100 + 10 + i)
            for _ in range(per_client):
                system = systems[rng.randrange(len(systems))]
                send([{"role": "system", "content": system},
                      {"role": "user", "content": question(rng)}])
        return run

    return [client(i) for i in range(4)]


def chat_clients(cfg: argparse.Namespace) -> list[Client]:
    """2 chats x N turns; each turn resends the history plus the answer and a new question."""
    turns = 3 if cfg.quick else 5

    def client(i: int) -> Client:
        def run(send: Send) -> None:
            rng = random.Random(cfg.seed * 100 + 20 + i)
            history = [{"role": "system", "content": system_prompt(i + 1, cfg.system_tokens)}]
            for turn in range(turns):
                ask = question(rng) if turn == 0 else rng.choice(FOLLOW_UPS)
                history.append({"role": "user", "content": ask})
                answer = send(list(history))
                history.append({"role": "assistant", "content": answer["text"]})
        return run

    return [client(i) for i in range(2)]


def workload_clients(name: str, cfg: argparse.Namespace) -> list[Client]:
    if prefix_gen.prompt_count(name) is not None:
        return prefix_gen.clients(cfg, name, system_prompt, CHARS_PER_TOKEN)
    return {
        "shared": lambda: shared_clients(cfg),
        "apps": lambda: apps_clients(cfg),
        "chat": lambda: chat_clients(cfg),
        "nonce": lambda: shared_clients(cfg, nonce=True),
        "shared-exact": lambda: shared_clients(cfg),
        "chat-exact": lambda: chat_clients(cfg),
    }[name]()


# --- client --------------------------------------------------------------------------------


def cached_tokens(usage: dict | None, timings: dict | None) -> tuple[int | None, str | None]:
    """Prompt tokens the server says it reused, and which field said so."""
    details = (usage or {}).get("prompt_tokens_details") or {}
    if isinstance(details.get("cached_tokens"), int):
        return details["cached_tokens"], "usage.prompt_tokens_details.cached_tokens"
    if isinstance((timings or {}).get("cache_n"), int):
        return timings["cache_n"], "timings.cache_n"
    return None, None


def ask(base_url: str, model_id: str, messages: list[Message], max_tokens: int) -> dict[str, Any]:
    """One streaming chat completion (bench.stream_messages) with the cache report added."""
    r = stream_messages(base_url, model_id, messages, max_tokens)
    r["cached_tokens"], r["cached_from"] = cached_tokens(r.pop("usage"), r["server_timings"])
    return r


def run_clients(base_url: str, model_id: str, clients: list[Client], max_tokens: int) -> list[dict]:
    """Runs the clients concurrently (released together) and returns every request measured."""
    records: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(clients) + 1)

    def worker(i: int, client: Client) -> None:
        step = 0

        def send(messages: list[Message]) -> dict[str, Any]:
            nonlocal step
            r = ask(base_url, model_id, messages, max_tokens)
            r.update(client=i, step=step)
            step += 1
            with lock:
                records.append(r)
            return r

        barrier.wait()
        try:
            client(send)
        except BaseException as e:  # reported below, after all threads are joined
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise BenchError(f"{len(errors)} of {len(clients)} clients failed: {errors[0]}")
    for r in records:
        r["t_start"] -= t0
    return sorted(records, key=lambda r: r["t_start"])


# --- servers -------------------------------------------------------------------------------


def workload_ctx(workload: str, args: argparse.Namespace) -> int:
    """--ctx of a workload's servers: raised for long gen bands and the restart prompts."""
    if prefix_gen.prompt_count(workload) is not None:
        return args.gen_ctx
    if workload in prefix_restart.VARIANTS:
        return args.restart_ctx
    return args.ctx


def daemon_argv(args: argparse.Namespace, workload: str) -> tuple[list[str], str | None, str]:
    """inferloopd on port 0 (its `listening on` line gives the address)."""
    ctx = workload_ctx(workload, args)
    argv = [args.daemon, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", "0",
            "--threads", str(args.threads), "--slots", str(args.slots), "--ctx", str(ctx),
            "--prefix-slots", str(args.prefix_slots)]
    return argv + WORKLOAD_DAEMON_ARGS.get(workload, []) + args.daemon_arg, None, "/readyz"


def peer_argv(args: argparse.Namespace, workload: str) -> tuple[list[str], str | None, str]:
    """llama-server as bench.py starts it, but with its prompt cache on (its default)."""
    port = free_port()
    argv = [args.peer, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
            "-t", str(args.threads), "-tb", str(args.threads), "-np", str(args.slots),
            "-c", str(args.slots * workload_ctx(workload, args)), "--no-webui",
            # Like inferloopd: the built-in chat template, so both see the same prompt tokens.
            "--no-jinja",
            # Its reused prompt tokens as counters, for the hit-rate table.
            "--metrics"]
    return argv + args.peer_arg, f"http://127.0.0.1:{port}", "/health"


def run_on_server(server: str, workload: str, args: argparse.Namespace, log_dir: Path) -> dict:
    """Starts `server` afresh, warms it up on an unrelated prompt, runs `workload`, stops it."""
    argv, base_url, ready_path = (daemon_argv if server == "inferloopd" else peer_argv)(args, workload)
    print(f"[{workload}] starting {server}: {' '.join(argv)}", file=sys.stderr)
    proc = Daemon(argv, log_dir / f"prefix-{workload}-{server}.log", base_url=base_url,
                  ready_path=ready_path)
    try:
        base_url = proc.wait_ready(args.ready_timeout)
        model_id = get_json(base_url, "/v1/models", None)["data"][0]["id"]
        # First-request costs (page faults in the weights) are not steady state. A short user
        # message only: it shares no more than the chat template's first tokens.
        ask(base_url, model_id, [{"role": "user", "content": "Hi"}], 4)
        before = prefix_metrics.scrape(base_url)
        t0 = time.perf_counter()
        requests = run_clients(base_url, model_id, workload_clients(workload, args), args.max_tokens)
        wall = time.perf_counter() - t0
        tiers = prefix_metrics.tiers(server, before, prefix_metrics.scrape(base_url))
    finally:
        rc = proc.stop()
    if rc != 0:
        print(f"prefix: warning: {server} exited with status {rc} (log: {proc.log_path})", file=sys.stderr)
    extra = {"gen": prefix_gen.summarize(requests)} if prefix_gen.prompt_count(workload) else {}
    return {"argv": argv, "model_id": model_id, "wall_s": wall, **summarize(requests), **extra,
            "tiers": tiers, "requests": requests}


# --- statistics and output -----------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(requests: list[dict[str, Any]]) -> dict[str, Any]:
    ttft = [r["ttft_ms"] for r in requests]
    decode = [r["decode_tps"] for r in requests if r["decode_tps"] is not None]
    prompt = [r["prompt_tokens"] for r in requests if r["prompt_tokens"] is not None]
    cached = [r["cached_tokens"] for r in requests if r["cached_tokens"] is not None]
    return {
        "requests_n": len(requests),
        "ttft_ms_median": statistics.median(ttft),
        "ttft_ms_mean": statistics.fmean(ttft),
        "ttft_ms_p95": percentile(ttft, 0.95),
        "decode_tps_median": statistics.median(decode) if decode else None,
        "prompt_tokens_median": statistics.median(prompt) if prompt else None,
        "prompt_tokens_total": sum(prompt) if prompt else None,
        "cached_tokens_total": sum(cached) if cached else None,
        "cached_from": next((r["cached_from"] for r in requests if r["cached_from"]), None),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def workload_target(workload: str, slots: int) -> dict[str, float]:
    n_prompts = prefix_gen.prompt_count(workload)
    return prefix_gen.target(n_prompts, slots) if n_prompts is not None else TARGETS[workload]


def compare(workload: str, runs: dict[str, dict], slots: int) -> dict[str, Any]:
    """TTFT ratios inferloopd / llama-server and the workload's target verdict."""
    ours, peer = runs.get("inferloopd") or {}, runs.get("llama-server") or {}
    ratios = {stat: ratio(ours.get(f"ttft_ms_{stat}"), peer.get(f"ttft_ms_{stat}"))
              for stat in ("median", "mean", "p95")}
    target = workload_target(workload, slots)
    checks = [ratios[stat] is not None and ratios[stat] <= limit for stat, limit in target.items()]
    missing = not target or any(ratios[stat] is None for stat in target)
    verdict = None if missing else all(checks)
    return {"ttft_ratio": ratios, "target": target, "pass": verdict}


def cached_cell(run: dict | None) -> str:
    if not run or run.get("cached_tokens_total") is None:
        return "-"
    return f"{run['cached_tokens_total']}/{run['prompt_tokens_total'] or '?'}"


def ttft_cell(run: dict | None) -> str:
    if not run or "ttft_ms_median" not in run:
        return "error" if run else "-"
    return "/".join(fmt(run[f"ttft_ms_{s}"], 0) for s in ("median", "mean", "p95"))


def target_cell(cmp: dict[str, Any]) -> str:
    short = {"median": "med", "mean": "mean", "p95": "p95"}
    goal = " ".join(f"{short[stat]}<={limit:g}x" for stat, limit in cmp["target"].items())
    verdict = {True: "PASS", False: "FAIL", None: "n/a"}[cmp["pass"]]
    return f"{verdict} ({goal})" if goal else verdict


def print_table(res: dict[str, Any]) -> None:
    c = res["config"]
    print()
    has_gen = any(prefix_gen.prompt_count(w) is not None for w in res["workloads"])
    ctxs = f" (gen runs {c['gen_ctx']})" if has_gen and c["gen_ctx"] != c["ctx"] else ""
    print(f"Prompt reuse  threads={c['threads']}  slots={c['slots']}  ctx={c['ctx']}{ctxs}  "
          f"max_tokens={c['max_tokens']}  system prompts ~{c['system_tokens']} tokens"
          f"{'  (quick)' if c['quick'] else ''}")
    print("TTFT in ms, median/mean/p95; ratio = inferloopd / llama-server; "
          "cached = prompt tokens reused / prompt tokens")
    header = ("workload", "req", "prompt", "inferloopd TTFT", "llama-server TTFT", "ratio med",
              "ratio mean", "decode tok/s il/ls", "cached il", "cached ls", "target")
    widths = (12, 4, 7, 16, 18, 10, 11, 19, 12, 12, 0)
    rows = [header]
    for name, w in res["workloads"].items():
        ours, peer, cmp = w["runs"].get("inferloopd"), w["runs"].get("llama-server"), w["compare"]
        rows.append((
            name, str((ours or peer or {}).get("requests_n", "-")),
            fmt((ours or {}).get("prompt_tokens_median"), 0),
            ttft_cell(ours), ttft_cell(peer),
            fmt(cmp["ttft_ratio"]["median"], 2), fmt(cmp["ttft_ratio"]["mean"], 2),
            f"{fmt((ours or {}).get('decode_tps_median'))}/{fmt((peer or {}).get('decode_tps_median'))}",
            cached_cell(ours), cached_cell(peer), target_cell(cmp),
        ))
    prefix_metrics.print_rows(rows, widths)
    print()


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)


# --- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", nargs="+", default=list(DEFAULT_WORKLOADS), metavar="NAME",
                   help=f"subset of {', '.join(WORKLOADS)} (space or comma separated; "
                        f"default: all but restart)")
    p.add_argument("--quick", action="store_true", help="fewer requests per workload: a smoke run")
    p.add_argument("--output", default=str(REPO / "bench/results/prefix.json"))
    p.add_argument("--daemon", default=str(REPO / "target/release/inferloopd"), help="inferloopd binary")
    p.add_argument("--peer", default=str(REPO / "peer/llama-server"),
                   help="llama-server binary (scripts/build-peer.sh)")
    p.add_argument("--model", default=str(REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf"), help="GGUF file")
    p.add_argument("--prefix-slots", type=int, default=None,
                   help="inferloopd --prefix-slots (default: 2 x --slots, room for the 8 "
                        "applications and the copies running ones hold; llama-server keeps prompts in "
                        "RAM too, its --cache-ram)")
    p.add_argument("--daemon-arg", action="append", default=[], help="extra inferloopd serve flag (repeatable)")
    p.add_argument("--peer-arg", action="append", default=[], help="extra llama-server flag (repeatable)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--system-tokens", type=int, default=600, help="size of each system prompt, about")
    p.add_argument("--seed", type=int, default=1, help="seed of the question and application choices")
    p.add_argument("--ready-timeout", type=float, default=120.0)
    p.add_argument("--servers", nargs="+", default=list(SERVERS), choices=SERVERS,
                   help="which servers to run (a functional check of one needs no other)")
    prefix_gen.add_args(p)
    prefix_restart.add_args(p)
    args = p.parse_args(argv)
    if args.prefix_slots is None:
        args.prefix_slots = 2 * args.slots
    args.workloads = [w for item in args.workloads for w in item.split(",") if w]
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown:
        p.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    for name in ("threads", "slots", "ctx", "max_tokens", "system_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    prefix_gen.check_args(p, args)
    prefix_restart.check_args(p, args)
    for name, expansion in (("gen", prefix_gen.expand(args)), ("restart", list(prefix_restart.VARIANTS))):
        if name in args.workloads:
            at = args.workloads.index(name)
            args.workloads[at:at + 1] = expansion
    return args


def check_files(args: argparse.Namespace) -> None:
    for what, path, hint in (("inferloopd binary", args.daemon, "make build"),
                             ("llama-server binary", args.peer, "scripts/build-peer.sh"),
                             ("model", args.model, "make model")):
        if what.split()[0] in SERVERS and what.split()[0] not in args.servers:
            continue
        if not Path(path).is_file():
            raise BenchError(f"{what} {path} not found ({hint})")


def warn_prompt_size(workload: str, run: dict[str, Any], target: int) -> None:
    """The system prompts are sized by a characters-per-token estimate; say when it is off."""
    n = run.get("prompt_tokens_median")
    if workload in ("shared", "apps", "nonce", "shared-exact") and n is not None and not 0.85 * target <= n <= 1.25 * target:
        print(f"prefix: warning: {workload}: median prompt is {n:.0f} tokens, not ~{target}",
              file=sys.stderr)


def run_workloads(args: argparse.Namespace, log_dir: Path) -> tuple[dict[str, Any], bool]:
    """Every workload but the restart ones, on each server in turn; returns them and whether
    a run failed."""
    workloads: dict[str, Any] = {}
    failed = False
    for workload in args.workloads:
        if workload in prefix_restart.VARIANTS:
            continue
        runs: dict[str, dict] = {}
        for server in args.servers:
            same = workloads.get(SAME_PEER_RUN.get(workload, ""), {}).get("runs", {}).get(server)
            if server == "llama-server" and same:
                # The same requests to the same server: run once.
                runs[server] = {**same, "reused_from": SAME_PEER_RUN[workload]}
                continue
            try:
                runs[server] = run_on_server(server, workload, args, log_dir)
            except BenchError as e:
                print(f"prefix: error: {workload} on {server}: {e}", file=sys.stderr)
                runs[server] = {"error": str(e)}
                failed = True
                continue
            r = runs[server]
            print(f"[{workload}] {server}: TTFT median {r['ttft_ms_median']:.1f} ms, mean "
                  f"{r['ttft_ms_mean']:.1f} ms, cached {cached_cell(r)}", file=sys.stderr)
            if server == "inferloopd":
                warn_prompt_size(workload, r, args.system_tokens)
        workloads[workload] = {"runs": runs, "compare": compare(workload, runs, args.slots)}
    return workloads, failed


def run_restarts(args: argparse.Namespace, log_dir: Path) -> tuple[dict[str, Any], bool]:
    variants = [w for w in args.workloads if w in prefix_restart.VARIANTS]
    if variants and "inferloopd" not in args.servers:
        print("prefix: restart runs on inferloopd only; skipped", file=sys.stderr)
        return {}, False
    return prefix_restart.run_all(variants, lambda v: daemon_argv(args, v)[0], args, log_dir,
                                  system_prompt, ask)


def config(args: argparse.Namespace) -> dict[str, Any]:
    return {"threads": args.threads, "slots": args.slots, "ctx": args.ctx,
            "max_tokens": args.max_tokens, "system_tokens": args.system_tokens,
            "seed": args.seed, "quick": args.quick, "temperature": 0,
            "model": args.model, "prefix_slots": args.prefix_slots,
            "daemon_arg": args.daemon_arg, "peer_arg": args.peer_arg,
            "servers": args.servers, "gen_ctx": args.gen_ctx, "restart_ctx": args.restart_ctx,
            "gen": {k: getattr(args, f"gen_{k}", None) for k in
                    ("prompts", "band", "requests", "rate", "prompt_tokens", "question_tokens")},
            "restart": {k: getattr(args, f"restart_{k}", None) for k in
                        ("prompts", "prompt_tokens", "wait", "disk_mb", "ram_mb")}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output = Path(args.output)
    try:
        check_files(args)
    except BenchError as e:
        print(f"prefix: error: {e}", file=sys.stderr)
        return 1
    workloads, failed = run_workloads(args, output.parent)
    restarts, restart_failed = run_restarts(args, output.parent)
    result = {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "host": {"platform": platform.platform(), "machine": platform.machine(),
                 "cpus": os.cpu_count(), "python": platform.python_version()},
        "config": config(args),
        "targets": {w: workload_target(w, args.slots) for w in workloads},
        "workloads": workloads,
        "restart": restarts,
    }
    if workloads:
        print_table(result)
    prefix_gen.print_report(workloads, fmt, args)
    prefix_metrics.print_report(workloads, fmt)
    prefix_restart.print_report(restarts, fmt)
    write_json(output, result)
    print(f"wrote {output}", file=sys.stderr)
    return 1 if failed or restart_failed else 0


if __name__ == "__main__":
    sys.exit(main())
