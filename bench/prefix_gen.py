"""The `gen` workload of bench/prefix.py: requests nobody tuned the cache for.

Requests arrive at random (a Poisson process: exponential gaps at --gen-rate per second,
open loop, so a slow server builds a queue as it would in the field). Each carries one of
--gen-prompts distinct system prompts, drawn uniformly, whose lengths are drawn once per
prompt from --gen-prompt-tokens MIN MAX, and a question of --gen-question-tokens MIN MAX
tokens of its own. Everything comes from --seed, so both servers get the same requests at
the same offsets.

The report: TTFT percentiles per server, medians by prompt-length band, and hit rates:
prompt tokens reused / prompt tokens, and requests that reused anything. The only tier
today is the KV cells (`kv`); the RAM and disk tiers of issue 34 will add theirs.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from typing import Any, Callable

# Prompt-length bands (tokens, as the server counts them) the TTFT medians are split by.
BANDS = ((0, 500), (500, 1500), (1500, None))
# Tokens the chat template and a short answer need besides the system prompt and question.
TEMPLATE_MARGIN = 64

WORDS = ("device", "account", "order", "signal", "battery", "screen", "network", "update",
         "schedule", "sensor", "invoice", "profile", "message", "setting", "storage", "report",
         "camera", "window", "ticket", "payment", "delivery", "password", "warranty", "manual")


def workload_name(n_prompts: int) -> str:
    return f"gen-p{n_prompts}"


def prompt_count(workload: str) -> int | None:
    """The distinct-prompt count of a `gen-p<count>` workload, else None."""
    if workload.startswith("gen-p") and workload[5:].isdigit():
        return int(workload[5:])
    return None


def target(n_prompts: int, slots: int) -> dict[str, float]:
    """Issue 34's targets: at most llama-server's median TTFT, half of it when there are 2-4x
    more distinct prompts than slots."""
    return {"median": 0.5} if n_prompts >= 2 * slots else {"median": 1.0}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gen-prompts", type=int, nargs="+", default=None, metavar="N",
                   help="distinct system prompts of the gen workload, one run per count "
                        "(default: the slots and 4 x the slots)")
    p.add_argument("--gen-requests", type=int, default=None,
                   help="requests per gen run (default 32, 8 with --quick)")
    p.add_argument("--gen-rate", type=float, default=1.0, help="mean arrivals per second")
    p.add_argument("--gen-prompt-tokens", type=int, nargs=2, default=(100, 3000),
                   metavar=("MIN", "MAX"), help="system prompt length range, tokens")
    p.add_argument("--gen-question-tokens", type=int, nargs=2, default=(10, 200),
                   metavar=("MIN", "MAX"), help="question length range, tokens")


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.gen_prompts is None:
        args.gen_prompts = sorted({args.slots, 4 * args.slots})
    if args.gen_requests is None:
        args.gen_requests = 8 if args.quick else 32
    if any(n < 1 for n in args.gen_prompts) or args.gen_requests < 1 or args.gen_rate <= 0:
        p.error("--gen-prompts, --gen-requests and --gen-rate must be positive")
    for name in ("gen_prompt_tokens", "gen_question_tokens"):
        lo, hi = getattr(args, name)
        if not 1 <= lo <= hi:
            p.error(f"--{name.replace('_', '-')}: need 1 <= MIN <= MAX")
    # Every request must fit a slot's context: clamp the prompt lengths, and say so.
    room = args.ctx - args.gen_question_tokens[1] - args.max_tokens - TEMPLATE_MARGIN
    lo, hi = args.gen_prompt_tokens
    if hi > room:
        if room < lo:
            p.error(f"--ctx {args.ctx} leaves no room for a {lo}-token system prompt")
        print(f"prefix: warning: gen system prompts clamped to {lo}-{room} tokens to fit "
              f"--ctx {args.ctx} (pass --ctx {hi + args.ctx - room} for {lo}-{hi})",
              file=sys.stderr)
        args.gen_prompt_tokens = (lo, room)


def filler(rng: random.Random, n_tokens: int, chars_per_token: float) -> str:
    """About n_tokens tokens of plain sentences."""
    words: list[str] = []
    while sum(map(len, words)) + len(words) < n_tokens * chars_per_token:
        words.append(rng.choice(WORDS))
        if len(words) % 9 == 0:
            words[-1] += "."
    return " ".join(words)


def clients(cfg: argparse.Namespace, n_prompts: int,
            system_prompt: Callable[[int, int], str], chars_per_token: float) -> list[Any]:
    """One client per request, each sleeping until its arrival offset, then sending once."""
    rng = random.Random(cfg.seed * 7919 + n_prompts)
    lo, hi = cfg.gen_prompt_tokens
    systems = [system_prompt(100 + k, rng.randint(lo, hi)) for k in range(n_prompts)]
    qlo, qhi = cfg.gen_question_tokens
    at = 0.0
    plan = []
    for i in range(cfg.gen_requests):
        at += rng.expovariate(cfg.gen_rate)
        question = f"Request {i}. {filler(rng, rng.randint(qlo, qhi), chars_per_token)} What now?"
        plan.append((at, rng.randrange(n_prompts), question))

    def client(offset: float, prompt: int, question: str) -> Callable[[Any], None]:
        def run(send: Any) -> None:
            time.sleep(offset)  # the clients start together
            send([{"role": "system", "content": systems[prompt]},
                  {"role": "user", "content": question}])
        return run

    return [client(*p) for p in plan]


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def band_name(lo: int, hi: int | None) -> str:
    return f"{lo}-{hi}" if hi is not None else f">={lo}"


def summarize(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """TTFT distribution, TTFT by prompt-length band, and the kv tier's hit rates."""
    ttft = [r["ttft_ms"] for r in requests]
    prompt = sum(r["prompt_tokens"] or 0 for r in requests)
    cached = sum(r["cached_tokens"] or 0 for r in requests)
    bands = {}
    for lo, hi in BANDS:
        inside = [r["ttft_ms"] for r in requests
                  if r["prompt_tokens"] is not None and lo <= r["prompt_tokens"]
                  and (hi is None or r["prompt_tokens"] < hi)]
        bands[band_name(lo, hi)] = {
            "n": len(inside), "ttft_ms_median": statistics.median(inside) if inside else None}
    return {
        "ttft_ms_dist": {f"p{int(q * 100)}": percentile(ttft, q)
                         for q in (0.1, 0.5, 0.9, 0.95, 0.99)} | {"max": max(ttft)},
        "bands": bands,
        "tiers": {"kv": {
            "token_hit_rate": cached / prompt if prompt else None,
            "request_hit_rate": sum(1 for r in requests if (r["cached_tokens"] or 0) > 0)
            / len(requests),
        }},
    }


def print_report(workloads: dict[str, Any], fmt: Callable[..., str]) -> None:
    """One block per gen run: a row per server."""
    for name, w in workloads.items():
        if prompt_count(name) is None:
            continue
        print(f"{name}: {prompt_count(name)} distinct system prompts; TTFT ms")
        header = ["server", "req", "p10", "p50", "p90", "p95", "p99", "max"]
        header += [f"p50 {band_name(lo, hi)}" for lo, hi in BANDS]
        header += ["kv hit tok", "kv hit req"]
        rows = [header]
        for server, run in w["runs"].items():
            gen = run.get("gen")
            if not gen:
                rows.append([server, "error"])
                continue
            d = gen["ttft_ms_dist"]
            row = [server, str(run["requests_n"])]
            row += [fmt(d[k], 0) for k in ("p10", "p50", "p90", "p95", "p99", "max")]
            row += [f"{fmt(b['ttft_ms_median'], 0)} (n={b['n']})" for b in gen["bands"].values()]
            kv = gen["tiers"]["kv"]
            row += [fmt(kv["token_hit_rate"], 2), fmt(kv["request_hit_rate"], 2)]
            rows.append(row)
        widths = [13, 4] + [7] * 6 + [16] * len(BANDS) + [11, 10]
        for row in rows:
            print("  ".join(c.ljust(wd) for c, wd in zip(row, widths)).rstrip())
        print()
