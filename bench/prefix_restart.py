"""The `restart` workload of bench/prefix.py: are an application's prompts warm after a restart?

inferloopd only: it starts with `--state-dir` on a fresh temporary directory, gets K distinct
application prompts (a system prompt and a question, ~600-2000 tokens each) once each, one
after the other, recording their cold TTFT; waits --restart-wait seconds (the disk tier writes
entries off the serving path when slots go idle; the wait runs on, up to 15 s more, until
/metrics shows at least K disk entries, unchanged for a second); stops (SIGTERM, then waits
for the exit); starts again on the same directory and sends each prompt again with a new
question. Per prompt, the ratio warm-after-restart / cold TTFT; issue 34's target: median
<= 0.3. The disk-tier hit tokens after the restart come from /metrics.

Two variants: `restart` (the disk tier on: on whenever a state dir is given) and
`restart-control` (`--prompt-cache-disk-mb 0`: nothing survives, so the ratio is about 1).
llama-server has no tier that survives a restart (its --cache-ram is in memory; its
--slot-save-path saves a slot only when asked to over HTTP), so it has no run here.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench import BenchError, Daemon, get_json
import prefix_metrics

VARIANTS: dict[str, list[str]] = {"restart": [], "restart-control": ["--prompt-cache-disk-mb", "0"]}
TARGET = 0.3
# Tokens of the chat template and the question besides the system prompt, about.
QUESTION_MARGIN = 64
# The most seconds to wait beyond --restart-wait for the disk tier to hold every prompt.
EXTRA_WAIT_S = 15.0
STEADY_S = 1.0
STOP_TIMEOUT_S = 60.0

COLD_QUESTIONS = ["What are your opening hours?", "How do I reset my password?",
                  "Can I get a refund?", "Where is my order?"]
WARM_QUESTIONS = ["How can I contact support?", "Is there a fee for cancelling?",
                  "What payment methods do you accept?", "Do you offer gift cards?"]

Ask = Callable[[str, str, list[dict[str, str]], int], dict[str, Any]]


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--restart-prompts", type=int, default=None, metavar="K",
                   help="distinct application prompts of the restart workload (default 8, 3 with --quick)")
    p.add_argument("--restart-prompt-tokens", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                   help="their length range, tokens (system prompt + question; default 600-2000, "
                        "600-1200 with --quick)")
    p.add_argument("--restart-wait", type=float, default=2.0, metavar="S",
                   help="seconds between the last cold request and the stop")
    p.add_argument("--restart-disk-mb", type=int, default=None, metavar="N",
                   help="inferloopd --prompt-cache-disk-mb of the `restart` run (default: the daemon's)")
    p.add_argument("--restart-ram-mb", type=int, default=None, metavar="N",
                   help="inferloopd --prompt-cache-ram-mb of both restart runs (default: the daemon's)")


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fills the defaults, checks the values and sets args.restart_ctx, the runs' --ctx."""
    if args.restart_prompts is None:
        args.restart_prompts = 3 if args.quick else 8
    if args.restart_prompt_tokens is None:
        args.restart_prompt_tokens = (600, 1200) if args.quick else (600, 2000)
    lo, hi = args.restart_prompt_tokens
    if args.restart_prompts < 1 or not QUESTION_MARGIN < lo <= hi or args.restart_wait < 0:
        p.error(f"--restart-prompts >= 1, --restart-prompt-tokens {QUESTION_MARGIN} < MIN <= MAX "
                "and --restart-wait >= 0, please")
    args.restart_ctx = max(args.ctx, hi + args.max_tokens + QUESTION_MARGIN)


def prompts(args: argparse.Namespace,
            system_prompt: Callable[[int, int], str]) -> list[tuple[str, str, str]]:
    """K (system prompt, cold question, warm question), lengths drawn from --seed."""
    rng = random.Random(args.seed * 31 + 7)
    lo, hi = args.restart_prompt_tokens
    out = []
    for k in range(args.restart_prompts):
        system = system_prompt(200 + k, rng.randint(lo, hi) - QUESTION_MARGIN)
        out.append((system, f"{COLD_QUESTIONS[k % 4]} (customer {k})",
                    f"{WARM_QUESTIONS[k % 4]} (customer {k})"))
    return out


def daemon_argv(base: list[str], variant: str, state_dir: Path, args: argparse.Namespace) -> list[str]:
    argv = base + ["--state-dir", str(state_dir)]
    if args.restart_ram_mb is not None:
        argv += ["--prompt-cache-ram-mb", str(args.restart_ram_mb)]
    if variant == "restart" and args.restart_disk_mb is not None:
        argv += ["--prompt-cache-disk-mb", str(args.restart_disk_mb)]
    return argv + VARIANTS[variant]


def start(argv: list[str], log_path: Path, args: argparse.Namespace) -> tuple[Daemon, str, str]:
    """Starts the daemon and waits until it is ready; returns it, its URL and model id."""
    print(f"[{log_path.stem.removeprefix('prefix-')}] starting inferloopd: {' '.join(argv)}", file=sys.stderr)
    proc = Daemon(argv, log_path)
    try:
        base_url = proc.wait_ready(args.ready_timeout)
        model_id = get_json(base_url, "/v1/models", None)["data"][0]["id"]
    except BaseException:
        proc.stop()
        raise
    return proc, base_url, model_id


def warm_up(base_url: str, model_id: str, ask: Ask) -> None:
    """Page faults in the weights; shares no more than the chat template's first tokens."""
    ask(base_url, model_id, [{"role": "user", "content": "Hi"}], 4)


def send_each(base_url: str, model_id: str, todo: list[tuple[str, str]], ask: Ask,
              max_tokens: int) -> list[dict[str, Any]]:
    """One request per (system, question), one after the other (no queueing in the TTFT)."""
    return [ask(base_url, model_id, [{"role": "system", "content": system},
                                     {"role": "user", "content": q}], max_tokens)
            for system, q in todo]


def wait_for_disk(base_url: str, k: int, wait_s: float) -> float:
    """Sleeps wait_s, then, when the daemon exports the disk tier's entries, up to EXTRA_WAIT_S
    more until it holds at least k and has held still for STEADY_S (the warm-up prompt may
    be an entry too). Returns the seconds waited."""
    t0 = time.monotonic()
    time.sleep(wait_s)
    last, since = None, time.monotonic()
    while time.monotonic() - t0 < wait_s + EXTRA_WAIT_S:
        entries = prefix_metrics.value(prefix_metrics.scrape(base_url),
                                       prefix_metrics.OURS["tier_entries"], tier="disk")
        if entries is None:
            break
        if entries != last:
            last, since = entries, time.monotonic()
        elif entries >= k and time.monotonic() - since >= STEADY_S:
            break
        time.sleep(0.25)
    return time.monotonic() - t0


def stop(proc: Daemon) -> None:
    rc = proc.stop(timeout=STOP_TIMEOUT_S)
    if rc != 0:
        print(f"prefix: warning: inferloopd exited with status {rc} (log: {proc.log_path})",
              file=sys.stderr)


def run(variant: str, base_argv: list[str], args: argparse.Namespace, log_dir: Path,
        system_prompt: Callable[[int, int], str], ask: Ask) -> dict[str, Any]:
    """Both lives of the daemon on one state dir; the cold and warm requests and the tiers."""
    todo = prompts(args, system_prompt)
    state_dir = Path(tempfile.mkdtemp(prefix="prefix-restart-"))
    argv = daemon_argv(base_argv, variant, state_dir, args)
    try:
        proc, url, model_id = start(argv, log_dir / f"prefix-{variant}-inferloopd-1.log", args)
        try:
            warm_up(url, model_id, ask)
            m0 = prefix_metrics.scrape(url)
            cold = send_each(url, model_id, [(s, q) for s, q, _ in todo], ask, args.max_tokens)
            waited = wait_for_disk(url, len(todo), args.restart_wait)
            m1 = prefix_metrics.scrape(url)
        finally:
            stop(proc)
        proc, url, model_id = start(argv, log_dir / f"prefix-{variant}-inferloopd-2.log", args)
        try:
            m2 = prefix_metrics.scrape(url)
            warm_up(url, model_id, ask)
            m3 = prefix_metrics.scrape(url)
            warm = send_each(url, model_id, [(s, q) for s, _, q in todo], ask, args.max_tokens)
            m4 = prefix_metrics.scrape(url)
        finally:
            stop(proc)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    return summarize(variant, argv, cold, warm, waited, m0, m1, m2, m3, m4)


def summarize(variant: str, argv: list[str], cold: list[dict], warm: list[dict], waited: float,
              *snaps: prefix_metrics.Snapshot | None) -> dict[str, Any]:
    m0, m1, m2, m3, m4 = snaps
    per_prompt = [{"prompt_tokens": c["prompt_tokens"], "cold_ttft_ms": c["ttft_ms"],
                   "warm_ttft_ms": w["ttft_ms"], "ratio": w["ttft_ms"] / c["ttft_ms"],
                   "warm_cached_tokens": w["cached_tokens"]} for c, w in zip(cold, warm)]
    median = statistics.median(p["ratio"] for p in per_prompt)
    entries = prefix_metrics.OURS["tier_entries"]
    return {
        "variant": variant, "argv": argv, "prompts": per_prompt, "ratio_median": median,
        "target": TARGET if variant == "restart" else None,
        "pass": median <= TARGET if variant == "restart" else None,
        "waited_s": waited,
        "disk_entries_before_stop": prefix_metrics.value(m1, entries, tier="disk"),
        "disk_entries_at_start": prefix_metrics.value(m2, entries, tier="disk"),
        "tiers_before_restart": prefix_metrics.ours_tiers(m0, m1),
        "tiers_after_restart": prefix_metrics.ours_tiers(m3, m4),
    }


def print_report(results: dict[str, dict[str, Any]], fmt: Callable[..., str]) -> None:
    if not results:
        return
    print("restart: K application prompts sent once each (cold), inferloopd stopped (SIGTERM) "
          "and started again on the same --state-dir, each prompt sent again with a new question "
          "(warm); TTFT ms; ratio = warm / cold. inferloopd only: llama-server keeps no prompt "
          "across a restart.")
    rows = [("variant", "prompt", "tokens", "cold", "warm", "ratio", "reused")]
    for variant, r in results.items():
        if "error" in r:
            rows.append((variant, "error"))
            continue
        for i, p in enumerate(r["prompts"]):
            rows.append((variant, str(i), fmt(p["prompt_tokens"], 0), fmt(p["cold_ttft_ms"], 0),
                         fmt(p["warm_ttft_ms"], 0), fmt(p["ratio"], 2), fmt(p["warm_cached_tokens"], 0)))
    widths = (16, 7, 7, 7, 7, 6, 0)
    prefix_metrics.print_rows(rows, widths)
    for variant, r in results.items():
        if "error" not in r:
            print(summary_line(variant, r, fmt))
    print()


def summary_line(variant: str, r: dict[str, Any], fmt: Callable[..., str]) -> str:
    verdict = {True: "PASS", False: "FAIL", None: "control: expect ~1"}[r["pass"]]
    goal = f" (target <= {r['target']:g})" if r["target"] is not None else ""
    before, after = r["tiers_before_restart"], r["tiers_after_restart"]
    return (f"{variant}: median ratio {r['ratio_median']:.2f}: {verdict}{goal}; disk tier: "
            f"{fmt(before['saves']['disk'], 0)} saves before the stop, "
            f"{fmt(r['disk_entries_at_start'], 0)} entries at the restart, "
            f"{fmt(after['hit_tokens_by_tier']['disk'], 0)} of {fmt(after['lookup_tokens'], 0)} "
            f"prompt tokens restored from it after (hit rate {fmt(after['hit_rate']['disk'], 2)})")


def run_all(variants: list[str], base_argv: Callable[[str], list[str]], args: argparse.Namespace,
            log_dir: Path, system_prompt: Callable[[int, int], str], ask: Ask) -> tuple[dict, bool]:
    """Every variant in turn; returns the results and whether one failed."""
    results: dict[str, dict[str, Any]] = {}
    failed = False
    for variant in variants:
        try:
            results[variant] = r = run(variant, base_argv(variant), args, log_dir, system_prompt, ask)
            print(f"[{variant}] inferloopd: median warm/cold TTFT {r['ratio_median']:.2f}",
                  file=sys.stderr)
        except BenchError as e:
            print(f"prefix: error: {variant} on inferloopd: {e}", file=sys.stderr)
            results[variant] = {"error": str(e)}
            failed = True
    return results, failed
