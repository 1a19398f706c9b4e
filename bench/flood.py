#!/usr/bin/env python3
"""A connection flood against inferloopd: tens of thousands of idle and trickling sockets.

Starts inferloopd with its default connection cap, measures a real streamed chat request's
time to first token (TTFT) alone, then again while flooder processes hold SOCKETS sockets
(half of them idle, half trickling one header byte every few seconds, each reopened when the
daemon closes it, as a slowloris does), and once more after the flood. Meanwhile it samples
the daemon's open fds, RSS and threads from /proc, and reads the connection series from
/metrics.

It fails (exit 1) when the daemon's fds pass its cap plus its reserve, when a real request
fails, or when the median TTFT during the flood is above 2x the median before it.

Usage: bench/flood.py [--daemon PATH] [--model PATH] [--sockets N] [--hold SECS]
Writes bench/results/flood.json. Standard library only. Run as root (or with a high hard
fd limit) to hold more sockets than the default limit allows.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import random
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import REPO, Daemon  # noqa: E402

# Ephemeral ports per source address (32768-60999): spread sockets over loopback addresses.
PER_SOURCE = 20_000
TRICKLE_EVERY = 5.0
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)
FD_RESERVE = 256


def raise_fd_limit(want: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(soft, want)
    for limit in (target, hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, max(limit, hard)))
            return limit
        except (ValueError, OSError):
            continue
    return soft


def flooder(k: int, host: str, port: int, count: int, first_source: int, reopen_rate: float,
            stop: mp.Event, stats: mp.Queue) -> None:
    """Holds `count` sockets open to (host, port) until `stop`; reopens the ones closed, at
    most `reopen_rate` a second (0: at once)."""
    raise_fd_limit(count + 256)
    sel = selectors.DefaultSelector()
    opened = reopened = failed = 0
    socks: dict[int, tuple[socket.socket, bool]] = {}

    def open_one(i: int) -> bool:
        nonlocal opened, failed
        src = f"127.0.0.{2 + first_source + i // PER_SOURCE}"
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # The port is picked at connect: bind(addr, 0) searches ports at every call,
            # which makes opening tens of thousands quadratic.
            s.setsockopt(socket.SOL_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            s.bind((src, 0))
            s.setblocking(False)
            s.connect_ex((host, port))
        except OSError:
            s.close()
            failed += 1
            return False
        trickle = i % 2 == 1
        socks[s.fileno()] = (s, trickle)
        sel.register(s, selectors.EVENT_READ, i)
        opened += 1
        return True

    for i in range(count):
        open_one(i)
        if stop.is_set():
            break
    started = time.monotonic()
    last_trickle = 0.0
    sent_head: set[int] = set()
    to_reopen: list[int] = []
    budget, budget_at = 0.0, started
    while not stop.is_set():
        for key, _ in sel.select(timeout=0.5):
            s, _ = socks.get(key.fd, (None, False))
            if s is None:
                continue
            try:
                data = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(s)
                socks.pop(key.fd, None)
                sent_head.discard(key.fd)
                s.close()
                to_reopen.append(key.data)
        now = time.monotonic()
        budget = min(budget + (now - budget_at) * reopen_rate, max(reopen_rate, 1.0))
        budget_at = now
        while to_reopen and (reopen_rate <= 0 or budget >= 1):
            budget -= 1
            if open_one(to_reopen.pop()):
                reopened += 1
        if now - last_trickle >= TRICKLE_EVERY:
            last_trickle = now
            for fd, (s, trickle) in list(socks.items()):
                if not trickle:
                    continue
                try:
                    s.send(b"GET / HTTP/1.1\r\nX-a: " if fd not in sent_head else b"a")
                    sent_head.add(fd)
                except OSError:
                    pass
        stats.put({"k": k, "held": len(socks), "opened": opened, "reopened": reopened,
                   "failed": failed, "since_s": now - started})
    for s, _ in socks.values():
        s.close()


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def proc_sample(pid: int) -> dict:
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return {"fds": fds, "rss_kib": rss, "threads": threads}


# About 120 tokens of context before each question: a real request, not a one-liner.
CONTEXT = ("The harbour town keeps a small museum of ships, a bakery that opens at five, and "
           "a lighthouse that has not been lit since the new beacon was built on the point. "
           "Fishing boats leave before dawn and return by noon; in winter the ferry runs twice "
           "a day and the school closes when the road along the cliffs is icy. ")
QUESTIONS = ["Name three colours.", "What is a river?", "Write a haiku about rain.",
             "Why is the sky blue?", "List two prime numbers.", "What do bees make?"]
asked = 0
connect_s: list[float] = []


def ttft(base: str, model: str) -> float:
    """Seconds from sending a streamed chat request to its first content chunk. Each
    request differs from the ones before (a numbered question), so no prompt is reused
    whole."""
    global asked
    asked += 1
    host, port = base.removeprefix("http://").split(":")
    # The context's words in an order of their own: the prompt differs from every earlier
    # one right after the template's preamble, so it is computed, not reused.
    words = CONTEXT.split()
    random.Random(asked).shuffle(words)
    question = f"{' '.join(words)} {QUESTIONS[asked % len(QUESTIONS)]}"
    body = json.dumps({"model": model, "stream": True, "max_tokens": 8, "temperature": 0,
                       "messages": [{"role": "user", "content": question}]})
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    t0 = time.monotonic()
    conn.connect()
    connect_s.append(time.monotonic() - t0)
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"real request got {resp.status}: {resp.read()[:300]!r}")
    first = None
    for line in resp:
        # The opening chunk carries the role and an empty content before any prefill; the
        # first token is the first chunk whose content is not empty.
        if first is None and line.startswith(b"data: {"):
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                first = time.monotonic() - t0
    conn.close()
    if first is None:
        raise RuntimeError("no content chunk")
    return first


def metrics(base: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("inferloop_connections_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", default=str(REPO / "target/release/inferloopd"))
    ap.add_argument("--model", default=str(REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--sockets", type=int, default=30_000)
    ap.add_argument("--flooders", type=int, default=2)
    ap.add_argument("--reopen-rate", type=float, default=200.0,
                    help="sockets a second the flood reopens after the daemon closed them "
                         "(0: at once, a connect flood)")
    ap.add_argument("--hold", type=float, default=40.0, help="seconds the flood is held")
    ap.add_argument("--runs", type=int, default=9, help="real requests per phase")
    ap.add_argument("--out", default=str(REPO / "bench/results/flood.json"))
    args = ap.parse_args()

    out_dir = Path(args.out).parent
    # A short idle timeout: a flood leaves half-open connections (handshakes the kernel
    # completed with SYN cookies for clients that had already given up), which only the
    # idle timeout closes; the check that every connection closes waits for it.
    d = Daemon([args.daemon, "serve", "--model", args.model, "--port", "0",
                "--idle-timeout-secs", "5"],
               out_dir / "flood-daemon.log")
    try:
        base = d.wait_ready(120)
        pid = d.proc.pid
        model = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"]
        ttft(base, model)  # warm-up
        idle = proc_sample(pid)
        before = [ttft(base, model) for _ in range(args.runs)]
        connect_before = list(connect_s)
        connect_s.clear()

        host, port = base.removeprefix("http://").split(":")
        stop, stats = mp.Event(), mp.Queue()
        per = args.sockets // args.flooders
        procs = [mp.Process(target=flooder,
                            args=(k, host, int(port), per, k * (per // PER_SOURCE + 1),
                                  args.reopen_rate / args.flooders, stop, stats))
                 for k in range(args.flooders)]
        for p in procs:
            p.start()
        latest: dict[int, dict] = {}
        samples, during = [], []
        # The hold starts once every flooder has opened its sockets.
        opening = time.monotonic() + 120
        while len(latest) < args.flooders and time.monotonic() < opening:
            s = stats.get(timeout=120)
            latest[s["k"]] = s
        print(f"flood open: {sum(s['held'] for s in latest.values())} sockets held",
              file=sys.stderr)
        t_start = time.monotonic()
        cpu_start = cpu_seconds(pid)
        flood_cpu_start = sum(cpu_seconds(p.pid) for p in procs)
        t_end = t_start + args.hold
        while time.monotonic() < t_end:
            time.sleep(2)
            while not stats.empty():
                s = stats.get()
                latest[s["k"]] = s
            samples.append(proc_sample(pid))
            during.append(ttft(base, model))
        held_s = time.monotonic() - t_start
        daemon_cpu = (cpu_seconds(pid) - cpu_start) / held_s
        flood_cpu = (sum(cpu_seconds(p.pid) for p in procs) - flood_cpu_start) / held_s
        connect_during = list(connect_s)
        stop.set()
        for p in procs:
            p.join(30)
        time.sleep(3)
        after_proc = proc_sample(pid)
        after = [ttft(base, model) for _ in range(args.runs)]
        # Every socket of the flood, and of the requests, must close on its own: within the
        # idle timeout (5 s here) or, for a head still arriving, the header timeout (30 s).
        settled = time.monotonic() + 35
        # The reading that ends the wait is the one judged: a scrape right after another may
        # count the previous scrape's connection, still closing (the client's FIN in flight).
        m = metrics(base)
        while m.get("inferloop_connections_open", 0) > 1 and time.monotonic() < settled:
            time.sleep(0.5)
            m = metrics(base)
        if m.get("inferloop_connections_open", 0) > 1:
            # What the kernel still holds for the port, to tell a live peer from a count.
            ss = subprocess.run(["ss", "-tanpo", "state", "all", f"( sport = :{port} )"],
                                capture_output=True, text=True)
            print(f"connections still open; ss:\n{ss.stdout}{ss.stderr}", file=sys.stderr)
    finally:
        d.stop()

    cap = m.get("inferloop_connections_max", 0)
    peak_fds = max(s["fds"] for s in samples)
    peak_rss = max(s["rss_kib"] for s in samples)
    per_place_kib = (peak_rss - idle["rss_kib"]) / cap if cap else 0
    opened = sum(s["opened"] for s in latest.values())
    held = sum(s["held"] for s in latest.values())
    reopened = sum(s["reopened"] for s in latest.values())
    result = {
        "sockets_asked": args.sockets,
        "reopen_rate": args.reopen_rate,
        "sockets_opened": opened,
        "sockets_reopened": reopened,
        "sockets_held_by_flooders": held,
        "cap": cap,
        "idle": idle,
        "peak_during": {"fds": peak_fds, "rss_kib": peak_rss,
                        "threads": max(s["threads"] for s in samples)},
        "after": after_proc,
        "cpu_cores_during": {"daemon": round(daemon_cpu, 2), "flooders": round(flood_cpu, 2)},
        "rss_rise_per_cap_place_kib": round(per_place_kib, 1),
        "ttft_s": {"before_median": statistics.median(before),
                   "during_median": statistics.median(during),
                   "during_max": max(during),
                   "after_median": statistics.median(after)},
        "tcp_connect_s": {"before_median": statistics.median(connect_before),
                          "during_median": statistics.median(connect_during),
                          "during_max": max(connect_during)},
        "metrics": m,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    problems = []
    if m.get("inferloop_connections_open", 0) > 1:
        problems.append(f"{m['inferloop_connections_open']:.0f} connections still open after the flood")
    if peak_fds > cap + FD_RESERVE:
        problems.append(f"peak fds {peak_fds} above the cap {cap:.0f} + {FD_RESERVE}")
    if result["ttft_s"]["during_median"] > 2 * result["ttft_s"]["before_median"]:
        problems.append("median TTFT during the flood above 2x the median before it")
    for p in problems:
        print("FAIL:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
