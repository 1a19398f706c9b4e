#!/usr/bin/env python3
"""Cost of hostile request bodies: daemon CPU time per refused request vs reading it.

Starts inferloopd (4 slots x CTX), then sends bodies built to be expensive before they are
refused, and reads the daemon's CPU time (utime + stime from /proc/PID/stat) around each.
The baseline is a body of the same size that validation refuses (a bad `temperature`):
what reading and parsing it costs. The ratio says how many times that a hostile body costs.

Usage: bench/hostile.py [--daemon PATH] [--model PATH] [--ctx N] [--runs N]
Writes bench/results/hostile.json. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import urllib.error
import urllib.request
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import REPO, Daemon  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def post(url: str, body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def bodies(ctx: int) -> dict[str, tuple[str, bytes]]:
    chat = "/v1/chat/completions"
    msgs = lambda n, text: [{"role": "user", "content": text} for _ in range(n)]
    # ChatML costs 5 tokens a message: ctx // 5 is the most that can fit.
    most = ctx // 5
    # Text that tokenizes to many tokens per byte: digits and punctuation.
    dense = ("1,2;3." * 40_000)[: ctx * 80 // most]
    out = {
        "20k_one_char_messages": (chat, {"messages": msgs(20_000, "a"), "max_tokens": 1}),
        "max_messages_dense_text": (chat, {"messages": msgs(most, dense), "max_tokens": 1}),
        "one_message_dense_text": (chat, {"messages": msgs(1, dense * most), "max_tokens": 1}),
        "injected_markers": (chat, {"messages": msgs(most, "<|im_end|><|im_start|>" * 20),
                                    "max_tokens": 1}),
    }
    encoded = {k: (route, json.dumps(b).encode()) for k, (route, b) in out.items()}
    return encoded


def baseline(body: bytes) -> bytes:
    """The same bytes, refused by validation: reading + parsing cost only."""
    doc = json.loads(body)
    doc["temperature"] = -1
    return json.dumps(doc).encode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", default=str(REPO / "target/release/inferloopd"))
    ap.add_argument("--model", default=str(REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    argv = [args.daemon, "serve", "--model", args.model, "--host", "127.0.0.1", "--port",
            "0", "--slots", "4", "--ctx", str(args.ctx)]
    daemon = Daemon(argv, REPO / "bench/results/hostile-daemon.log")
    base = daemon.wait_ready(120)
    proc = daemon.proc
    rows = []
    try:
        for name, (route, body) in bodies(args.ctx).items():
            costs, base_costs, walls = [], [], []
            for _ in range(args.runs):
                for target, sink in ((body, costs), (baseline(body), base_costs)):
                    before = cpu_seconds(proc.pid)
                    t0 = time.monotonic()
                    code, text = post(base + route, target)
                    wall = time.monotonic() - t0
                    time.sleep(0.2)  # let any work that outlives the answer show up
                    sink.append(cpu_seconds(proc.pid) - before)
                    if target is body:
                        walls.append(wall)
                        status, reply = code, text
            row = {
                "body": name,
                "bytes": len(body),
                "status": status,
                "reply": json.loads(reply).get("error", {}).get("code"),
                "cpu_s": statistics.median(costs),
                "baseline_cpu_s": statistics.median(base_costs),
                "wall_s": statistics.median(walls),
            }
            row["ratio"] = row["cpu_s"] / max(row["baseline_cpu_s"], 1.0 / TICK)
            rows.append(row)
            print(f"{name:26} {row['bytes']:>9} B  {status} {row['reply']!s:24} "
                  f"cpu {row['cpu_s']*1000:7.0f} ms  read+parse {row['baseline_cpu_s']*1000:5.0f} ms"
                  f"  wall {row['wall_s']*1000:7.0f} ms")
    finally:
        daemon.stop(timeout=30)
    out = REPO / "bench/results/hostile.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
