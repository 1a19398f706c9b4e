"""The `gen` workload of bench/prefix.py: requests nobody tuned the cache for.

Requests arrive at random (a Poisson process: exponential gaps at --gen-rate per second,
open loop, so a slow server builds a queue as it would in the field). Each carries one of
--gen-prompts distinct system prompts, drawn uniformly, whose lengths are drawn once per
prompt from --gen-prompt-tokens MIN MAX (or from a --gen-band LO-HI), and a question of
--gen-question-tokens MIN MAX tokens of its own. Everything comes from --seed, so both
servers get the same requests at the same offsets.

One run per prompt count and band, named gen-p<count>[@LO-HI]; their --ctx is raised to fit
the longest band (args.gen_ctx). The report: a table with a row per prompt count and server
and a column per band, each cell TTFT median/p90/max, and the median ratio against the
target. Hit rates by cache tier come from /metrics (prefix_metrics.py).
"""

from __future__ import annotations

import argparse
import math
import random
import re
import sys
import time
from typing import Any, Callable

import prefix_metrics

# Tokens the chat template and a short answer need besides the system prompt and question.
TEMPLATE_MARGIN = 64

WORDS = ("device", "account", "order", "signal", "battery", "screen", "network", "update",
         "schedule", "sensor", "invoice", "profile", "message", "setting", "storage", "report",
         "camera", "window", "ticket", "payment", "delivery", "password", "warranty", "manual")


def parse_band(text: str) -> tuple[int, int]:
    """`LO-HI` (system-prompt tokens) -> (LO, HI)."""
    m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise argparse.ArgumentTypeError(f"band {text!r}: need LO-HI with 1 <= LO <= HI")
    return int(m.group(1)), int(m.group(2))


def band_label(band: tuple[int, int]) -> str:
    return f"{band[0]}-{band[1]}"


def workload_name(n_prompts: int, band: tuple[int, int] | None = None) -> str:
    return f"gen-p{n_prompts}" + (f"@{band_label(band)}" if band else "")


def parse_workload(workload: str) -> tuple[int, tuple[int, int] | None] | None:
    """`gen-p<count>[@LO-HI]` -> (count, band or None); None for other workloads."""
    m = re.fullmatch(r"gen-p(\d+)(?:@(\d+)-(\d+))?", workload)
    if not m:
        return None
    band = (int(m.group(2)), int(m.group(3))) if m.group(2) else None
    return int(m.group(1)), band


def prompt_count(workload: str) -> int | None:
    """The distinct-prompt count of a `gen-p<count>[@LO-HI]` workload, else None."""
    parsed = parse_workload(workload)
    return parsed[0] if parsed else None


def target(n_prompts: int, slots: int) -> dict[str, float]:
    """Issue 34's targets: at most llama-server's median TTFT, half of it when there are 2-4x
    more distinct prompts than slots."""
    return {"median": 0.5} if n_prompts >= 2 * slots else {"median": 1.0}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gen-prompts", type=int, nargs="+", default=None, metavar="N",
                   help="distinct system prompts of the gen workload, one run per count "
                        "(default: the slots and 4 x the slots; the issue's table: "
                        "1, slots, 2 x and 4 x the slots)")
    p.add_argument("--gen-band", nargs="+", action="extend", default=None, metavar="LO-HI",
                   help="system-prompt length bands, tokens (space or comma separated, "
                        "repeatable): one gen run per band and prompt count, lengths drawn "
                        "within the band (default: one band, --gen-prompt-tokens)")
    p.add_argument("--gen-requests", type=int, default=None,
                   help="requests per gen run (default 32, 8 with --quick)")
    p.add_argument("--gen-rate", type=float, default=1.0, help="mean arrivals per second")
    p.add_argument("--gen-prompt-tokens", type=int, nargs=2, default=None,
                   metavar=("MIN", "MAX"),
                   help="system prompt length range, tokens (default 100-3000, 100-1000 with --quick)")
    p.add_argument("--gen-question-tokens", type=int, nargs=2, default=(10, 200),
                   metavar=("MIN", "MAX"), help="question length range, tokens")


def needed_ctx(longest_prompt: int, args: argparse.Namespace) -> int:
    """A slot context that holds the longest system prompt, question and answer."""
    return longest_prompt + args.gen_question_tokens[1] + args.max_tokens + TEMPLATE_MARGIN


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fills the defaults, checks the values and sets args.gen_ctx, the gen runs' --ctx."""
    if args.gen_prompts is None:
        args.gen_prompts = sorted({args.slots, 4 * args.slots})
    if args.gen_requests is None:
        args.gen_requests = 8 if args.quick else 32
    if args.gen_prompt_tokens is None:
        args.gen_prompt_tokens = (100, 1000) if args.quick else (100, 3000)
    if any(n < 1 for n in args.gen_prompts) or args.gen_requests < 1 or args.gen_rate <= 0:
        p.error("--gen-prompts, --gen-requests and --gen-rate must be positive")
    for name in ("gen_prompt_tokens", "gen_question_tokens"):
        lo, hi = getattr(args, name)
        if not 1 <= lo <= hi:
            p.error(f"--{name.replace('_', '-')}: need 1 <= MIN <= MAX")
    try:
        bands = [parse_band(b) for item in args.gen_band or [] for b in item.split(",") if b]
    except argparse.ArgumentTypeError as e:
        p.error(f"--gen-band: {e}")
    args.gen_band = bands or None
    longest = max(hi for _, hi in bands or [args.gen_prompt_tokens])
    # Every request must fit a slot's context: the gen runs get a larger --ctx (both servers).
    args.gen_ctx = max(args.ctx, needed_ctx(longest, args))
    if args.gen_ctx > args.ctx and "gen" in args.workloads:
        print(f"prefix: gen runs use --ctx {args.gen_ctx} (both servers; --ctx {args.ctx} "
              f"is too small for {longest}-token system prompts)", file=sys.stderr)


def expand(args: argparse.Namespace) -> list[str]:
    """The gen workloads to run: one per prompt count, for each band."""
    return [workload_name(n, band) for band in (args.gen_band or [None])
            for n in args.gen_prompts]


def filler(rng: random.Random, n_tokens: int, chars_per_token: float) -> str:
    """About n_tokens tokens of plain sentences."""
    words: list[str] = []
    while sum(map(len, words)) + len(words) < n_tokens * chars_per_token:
        words.append(rng.choice(WORDS))
        if len(words) % 9 == 0:
            words[-1] += "."
    return " ".join(words)


def clients(cfg: argparse.Namespace, workload: str,
            system_prompt: Callable[[int, int], str], chars_per_token: float) -> list[Any]:
    """One client per request, each sleeping until its arrival offset, then sending once."""
    parsed = parse_workload(workload)
    assert parsed is not None, workload
    n_prompts, band = parsed
    # Without a band, the seed of the runs before bands existed: the same requests as then.
    rng = random.Random(cfg.seed * 7919 + n_prompts + (100_003 * band[0] if band else 0))
    lo, hi = band or cfg.gen_prompt_tokens
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


def summarize(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """TTFT distribution, and the hit rates the responses report (`cached_tokens`)."""
    ttft = [r["ttft_ms"] for r in requests]
    prompt = [r["prompt_tokens"] for r in requests if r["prompt_tokens"] is not None]
    cached = sum(r["cached_tokens"] or 0 for r in requests)
    return {
        "ttft_ms_dist": {f"p{int(q * 100)}": percentile(ttft, q)
                         for q in (0.1, 0.5, 0.9, 0.95, 0.99)} | {"max": max(ttft)},
        "prompt_tokens_range": [min(prompt), max(prompt)] if prompt else None,
        "reported": {
            "token_hit_rate": cached / sum(prompt) if prompt and sum(prompt) else None,
            "request_hit_rate": sum(1 for r in requests if (r["cached_tokens"] or 0) > 0)
            / len(requests),
        },
    }


def dist_cell(run: dict[str, Any] | None, fmt: Callable[..., str]) -> str:
    gen = (run or {}).get("gen")
    if not gen:
        return "error" if run else "-"
    d = gen["ttft_ms_dist"]
    return "/".join(fmt(d[k], 0) for k in ("p50", "p90", "max"))


def ratio_cell(w: dict[str, Any] | None, fmt: Callable[..., str]) -> str:
    if not w:
        return "-"
    cmp = w["compare"]
    verdict = {True: " ok", False: " FAIL", None: ""}[cmp["pass"]]
    return fmt(cmp["ttft_ratio"]["median"], 2) + verdict


def print_report(workloads: dict[str, Any], fmt: Callable[..., str], args: argparse.Namespace) -> None:
    """The generator's table: a row per prompt count and server, a column per band."""
    runs = {parse_workload(name): w for name, w in workloads.items() if parse_workload(name)}
    if not runs:
        return
    bands = list(dict.fromkeys(band for _, band in runs))
    counts = sorted({n for n, _ in runs})
    servers = list(dict.fromkeys(s for w in runs.values() for s in w["runs"]))
    labels = [band_label(b or tuple(args.gen_prompt_tokens)) for b in bands]
    print(f"gen: TTFT ms, median/p90/max, by system-prompt length band (tokens; plus a "
          f"{args.gen_question_tokens[0]}-{args.gen_question_tokens[1]}-token question); "
          f"{args.gen_requests} requests at {args.gen_rate:g}/s per run; --ctx {args.gen_ctx}; "
          f"ratio = median inferloopd / llama-server vs issue 34's target")
    rows = [["prompts", "server"] + labels]
    for n in counts:
        for server in servers:
            rows.append([str(n), server] + [dist_cell(runs.get((n, b), {}).get("runs", {}).get(server), fmt)
                                            for b in bands])
        if len(servers) > 1:
            rows.append([str(n), "ratio"] + [ratio_cell(runs.get((n, b)), fmt) for b in bands])
    widths = [8, 13] + [20] * len(bands)
    prefix_metrics.print_rows(rows, widths)
    print()
