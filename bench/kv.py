#!/usr/bin/env python3
"""KV cache types: how much context fits one memory limit, and what quantized cells cost in
quality.

1. Fit: for each `--kv-type`, the largest `ctx` (a multiple of 256, llama.cpp's padding) at
   `--slots` that the daemon's own boot memory check admits under `--limit-mb`
   (`inferloopd check --memory-budget-mb`, the prompt cache's RAM tier off so that only the
   engine is sized), and the ratio of its `slots x ctx` to f16's.
2. Cgroup (root with a writable memory controller, else skipped and said so): each type's
   largest fit is served inside a real memory cgroup of that limit (the forward gate: ready,
   answers, no OOM kill, the cgroup's peak under the limit; `--fill` first fills every slot
   to near its context, the worst case), and one step of 256 more is refused with exit 1
   before it loads (the reverse gate).
3. Quality: `inferloopd golden --kv-type T --noise-floor` on the prompts: llama.cpp with f16
   KV against llama.cpp with T, KL and top-1 agreement over every position, beside llama.cpp
   against itself (flash attention off vs on) as the scale.
4. Speed (`--speed RUNS`): prefill and decode tok/s of one slot per type, rounds interleaved.

Usage: bench/kv.py [--daemon PATH] [--model PATH] [--limit-mb N] [--slots N] [--types T ...]
       [--fill] [--no-cgroup] [--no-golden] [--speed RUNS] [--output PATH]
Writes bench/results/kv.json and prints the tables. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from memory import post, varied_text  # noqa: E402 (bench/ is on the path)

# Seconds a request may take: a full slot's prefill on a slow box under a tight limit.
LONG = 1800

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
PAD = 256


def check(daemon: str, model: str, limit_mb: int, slots: int, ctx: int, kv_type: str) -> dict:
    """The daemon's boot decision for one configuration (exit 0: fits, 1: refused)."""
    argv = [daemon, "check", "--model", model, "--memory-budget-mb", str(limit_mb),
            "--slots", str(slots), "--ctx", str(ctx), "--kv-type", kv_type,
            "--prompt-cache-ram-mb", "0", "--json"]
    r = subprocess.run(argv, capture_output=True, text=True, env=clean_env())
    if r.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} exited {r.returncode}:\n{r.stderr}")
    return json.loads(r.stdout)


def clean_env() -> dict:
    # INFERLOOP_* variables set what the flags leave unset: keep them out.
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERLOOP_")}
    env["NO_COLOR"] = "1"
    return env


def term(decision: dict, name: str) -> int:
    return next(t["bytes"] for t in decision["ledger"]["terms"] if t["name"] == name)


def largest_fit(daemon: str, model: str, limit_mb: int, slots: int, kv_type: str,
                max_ctx: int) -> dict | None:
    """Binary search over multiples of PAD for the largest ctx the check admits."""
    lo, hi = 0, max_ctx // PAD  # lo fits (0: nothing yet), hi + 1 does not
    if not check(daemon, model, limit_mb, slots, PAD, kv_type)["fits"]:
        return None
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if check(daemon, model, limit_mb, slots, mid * PAD, kv_type)["fits"]:
            lo = mid
        else:
            hi = mid - 1
    ctx = lo * PAD
    d = check(daemon, model, limit_mb, slots, ctx, kv_type)
    return {
        "kv_type": kv_type,
        "slots": slots,
        "ctx": ctx,
        "slots_x_ctx": slots * ctx,
        "required_mib": d["required_bytes"] / MIB,
        "kv_mib": term(d, "kv") / MIB,
        "kv_cell_bytes": term(d, "kv") // (slots * ctx),
        "at_max_ctx": ctx == max_ctx,
    }


# ---- real cgroups ----

class Cgroup:
    def __init__(self, name: str) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("not root")
        v1 = Path("/sys/fs/cgroup/memory")
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        if (v1 / "memory.limit_in_bytes").exists():
            parent, self.v2 = v1, False
        elif v2.exists() and "memory" in v2.read_text().split():
            parent, self.v2 = Path("/sys/fs/cgroup"), True
        else:
            raise RuntimeError("no cgroup memory controller")
        self.dir = parent / f"{name}-{os.getpid()}"
        self.dir.mkdir()

    def limit(self, nbytes: int) -> None:
        (self.dir / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(str(nbytes))
        if self.v2:
            try:
                (self.dir / "memory.swap.max").write_text("0")
            except OSError:
                pass

    def read(self, v1: str, v2: str) -> str:
        try:
            return (self.dir / (v2 if self.v2 else v1)).read_text()
        except OSError:
            return ""

    def peak(self) -> int:
        return int(self.read("memory.max_usage_in_bytes", "memory.peak").strip() or 0)

    def oom_kills(self) -> int:
        for line in self.read("memory.oom_control", "memory.events").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def spawn(self, argv: list[str]) -> subprocess.Popen:
        procs = str(self.dir / "cgroup.procs")

        def join() -> None:
            with open(procs, "w") as f:
                f.write("0")

        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, errors="replace",
                                env=clean_env(), preexec_fn=join)

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def wait_ready(base: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{base} not ready within {timeout:.0f} s")


def serve_in_cgroup(daemon: str, model: str, limit_mb: int, slots: int, ctx: int,
                    kv_type: str, threads: int, fill: bool) -> dict:
    cg = Cgroup(f"inferloop-kv-{kv_type.replace(',', '-')}")
    try:
        cg.limit(limit_mb * MIB)
        argv = [daemon, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
                "--slots", str(slots), "--ctx", str(ctx), "--kv-type", kv_type,
                "--threads", str(threads), "--prompt-cache-ram-mb", "0"]
        proc = cg.spawn(argv)
        lines: list[str] = []
        url: list[str] = []
        bound = threading.Event()

        def drain() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)
                if "listening on" in line and not url:
                    url.append("http://" + line.split("listening on")[1].split()[0]
                               .strip().removeprefix("http://").rstrip("/"))
                    bound.set()

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        result: dict = {"kv_type": kv_type, "slots": slots, "ctx": ctx}
        deadline = time.monotonic() + 120
        while not bound.is_set() and proc.poll() is None and time.monotonic() < deadline:
            bound.wait(0.1)
        if not bound.is_set():
            proc.wait(timeout=60)
            reader.join(timeout=5)
            result.update(served=False, exit=proc.returncode,
                          refusal=next((l.strip() for l in lines
                                        if "memory admission rejected" in l), None))
        else:
            base = url[0]
            wait_ready(base)
            if fill:
                # Every slot nearly full at once: ~1.85 tokens a word.
                words = int((ctx - 64) / 1.9)
                threads_ = [threading.Thread(target=post, args=(
                    base + "/v1/completions",
                    {"prompt": varied_text(i, words), "max_tokens": 16, "temperature": 0},
                    LONG))
                    for i in range(slots)]
                for t in threads_:
                    t.start()
                for t in threads_:
                    t.join()
            answer = post(base + "/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Name the capital city of France."}],
                "max_tokens": 16, "temperature": 0}, LONG)
            status = json.loads(urllib.request.urlopen(base + "/v1/status", timeout=10).read())
            proc.terminate()
            proc.wait(timeout=60)
            result.update(
                served=True,
                answer=answer["choices"][0]["message"]["content"],
                filled=fill,
                peak_rss_mib=status["memory"]["peak_rss_bytes"] / MIB,
                expected_peak_mib=status["memory"]["expected_peak_bytes"] / MIB,
                required_mib=status["memory"]["required_bytes"] / MIB,
                limit_source=(status["memory"]["limit"] or {}).get("source"),
            )
        result["cgroup_peak_mib"] = cg.peak() / MIB
        result["oom_kills"] = cg.oom_kills()
        return result
    finally:
        cg.remove()


def speed(daemon: str, model: str, types: list[str], threads: int, runs: int) -> list[dict]:
    """Prefill and decode tok/s per KV type: one slot, a ~2000-token prompt, 128 tokens at
    temperature 0, `runs` rounds with the types interleaved (so drift hits them alike)."""
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    rows: dict[str, list[dict]] = {t: [] for t in types}
    try:
        for t in types:
            argv = [daemon, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
                    "--slots", "1", "--ctx", "4096", "--kv-type", t, "--threads", str(threads),
                    "--prefix-cache", "off", "--prompt-cache-ram-mb", "0"]
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True, errors="replace",
                                    env=clean_env())
            assert proc.stderr is not None
            for line in proc.stderr:
                if "listening on" in line:
                    url = "http://" + line.split("listening on")[1].split()[0] \
                        .removeprefix("http://").rstrip("/")
                    break
            else:
                raise SystemExit(f"{t}: the daemon exited before listening")
            threading.Thread(target=lambda p=proc: [None for _ in p.stderr], daemon=True).start()
            wait_ready(url)
            servers[t] = (proc, url)
        for r in range(runs):
            for t in types:
                v = post(servers[t][1] + "/v1/completions", {
                    "prompt": varied_text(100 + r, 1050), "max_tokens": 128,
                    "temperature": 0}, LONG)
                tm = v["timings"]
                rows[t].append({"prompt_n": tm["prompt_n"],
                                "prompt_per_second": tm["prompt_per_second"],
                                "predicted_n": tm["predicted_n"],
                                "predicted_per_second": tm["predicted_per_second"]})
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    out = []
    for t in types:
        med = lambda k: sorted(x[k] for x in rows[t])[len(rows[t]) // 2]  # noqa: E731
        out.append({"kv_type": t, "runs": rows[t], "prompt_n": rows[t][0]["prompt_n"],
                    "prefill_tok_s_median": med("prompt_per_second"),
                    "decode_tok_s_median": med("predicted_per_second")})
    return out


def golden(daemon: str, model: str, prompts: str, kv_type: str, threads: int,
           continue_tokens: int) -> dict:
    argv = [daemon, "golden", "--model", model, "--prompts", prompts, "--kv-type", kv_type,
            "--noise-floor", "--continue", str(continue_tokens), "--threads", str(threads),
            "--json"]
    r = subprocess.run(argv, capture_output=True, text=True, env=clean_env())
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", default=str(REPO / "target/release/inferloopd"))
    ap.add_argument("--model", default=str(REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--limit-mb", type=int, default=1024)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--max-ctx", type=int, default=65536)
    ap.add_argument("--types", nargs="+", default=["f16", "q8_0", "q4_0"],
                    help="KV types as --kv-type takes them (K[,V]); f16 first for the ratios")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fill", action="store_true",
                    help="fill every slot before measuring the cgroup's peak (slow)")
    ap.add_argument("--no-cgroup", action="store_true")
    ap.add_argument("--no-golden", action="store_true")
    ap.add_argument("--speed", type=int, default=0, metavar="RUNS",
                    help="also prefill/decode tok/s per type, RUNS interleaved rounds")
    ap.add_argument("--prompts", default=str(REPO / "bench/golden-prompts.txt"))
    ap.add_argument("--continue", dest="continue_tokens", type=int, default=16)
    ap.add_argument("--output", default=str(REPO / "bench/results/kv.json"))
    args = ap.parse_args()
    types = args.types

    out: dict = {"model": Path(args.model).name, "limit_mb": args.limit_mb,
                 "slots": args.slots, "fit": [], "cgroup": [], "golden": []}
    print(f"## Fit: {args.slots} slots, --memory-budget-mb {args.limit_mb}, "
          f"{out['model']}\n")
    print("| kv type | ctx | slots x ctx | vs f16 | kv MiB | B/cell | required MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = None
    for t in types:
        fit = largest_fit(args.daemon, args.model, args.limit_mb, args.slots, t, args.max_ctx)
        if fit is None:
            print(f"| {t} | nothing fits | | | | | |")
            continue
        if t == "f16":
            base = fit["slots_x_ctx"]
        fit["vs_f16"] = fit["slots_x_ctx"] / base if base else None
        out["fit"].append(fit)
        ratio = f"{fit['vs_f16']:.2f}x" if fit["vs_f16"] else "-"
        print(f"| {t} | {fit['ctx']} | {fit['slots_x_ctx']} | {ratio} | {fit['kv_mib']:.1f} | "
              f"{fit['kv_cell_bytes']} | {fit['required_mib']:.1f} |", flush=True)

    if not args.no_cgroup:
        print(f"\n## In a real memory cgroup of {args.limit_mb} MiB\n")
        try:
            for fit in out["fit"]:
                for ctx in (fit["ctx"], fit["ctx"] + PAD):
                    r = serve_in_cgroup(args.daemon, args.model, args.limit_mb, args.slots,
                                        ctx, fit["kv_type"], args.threads, args.fill)
                    out["cgroup"].append(r)
                    if r["served"]:
                        what = (f"served ({'filled, ' if r['filled'] else ''}answer "
                                f"{r['answer']!r}), peak RSS {r['peak_rss_mib']:.1f} MiB of "
                                f"expected {r['expected_peak_mib']:.1f}")
                    else:
                        why = (r["refusal"] or "").partition("rejected: ")[2]
                        why = " ".join(why.split()[:3])
                        what = f"refused, exit {r['exit']} ({why})"
                    print(f"- {fit['kv_type']} {args.slots} x {ctx}: {what}; cgroup peak "
                          f"{r['cgroup_peak_mib']:.1f} MiB, OOM kills {r['oom_kills']}",
                          flush=True)
        except RuntimeError as e:
            print(f"SKIPPED (cgroup): {e}; needs root and a writable memory controller")

    if not args.no_golden:
        print(f"\n## Quality against f16 KV (golden, {Path(args.prompts).name}, "
              f"--continue {args.continue_tokens})\n")
        print("| kv type | positions | top-1 agreement | mean KL | max KL | "
              "floor: top-1 | floor: mean KL | floor: max KL |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for t in types:
            if t == "f16":
                continue
            g = golden(args.daemon, args.model, args.prompts, t, args.threads,
                       args.continue_tokens)
            g["kv_type"] = t
            out["golden"].append(g)
            f = g["llama_noise_floor"]
            print(f"| {t} | {g['positions']} | {100 * g['top1_agreement']:.2f}% | "
                  f"{g['mean_kl']:.2e} | {g['max_kl']:.2e} | {100 * f['top1_agreement']:.2f}% | "
                  f"{f['mean_kl']:.2e} | {f['max_kl']:.2e} |", flush=True)

    if args.speed:
        print(f"\n## Speed: 1 slot, ~2000-token prompt, 128 tokens, --threads {args.threads}, "
              f"median of {args.speed}\n")
        print("| kv type | prompt tokens | prefill tok/s | decode tok/s |")
        print("|---|---:|---:|---:|")
        out["speed"] = speed(args.daemon, args.model, types, args.threads, args.speed)
        for r in out["speed"]:
            print(f"| {r['kv_type']} | {r['prompt_n']} | {r['prefill_tok_s_median']:.1f} | "
                  f"{r['decode_tok_s_median']:.1f} |", flush=True)

    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
