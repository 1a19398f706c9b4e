#!/usr/bin/env python3
"""A stand-in `inferloopd serve` for a smoke check of bench/prefix.py, and that check.

`bench/prefix_fake.py --smoke` runs bench/prefix.py (--quick, the shared, gen and restart
workloads, inferloopd only) against this file as the daemon and checks what it wrote: the gen
bands and their raised --ctx, the hit rates by tier from /metrics, the restart ratio with the
disk tier (<= 0.3) and without it (about 1). Seconds, no model, no build. It checks the bench's
plumbing only: the fake's figures say nothing about inferloopd.

As a daemon (`prefix_fake.py serve --port 0 --slots N [--state-dir D]
[--prompt-cache-disk-mb N] [--prompt-cache-ram-mb N] ...`, other flags ignored): a prompt's
tokens are its words; the resident slots hold the last N prompts, a prompt pushed out goes to
the RAM tier, and every prompt is written to D/fake-prompt-cache/ when the disk tier is on
(a state dir and a disk budget other than 0). A request reuses its longest prefix from the
slots, else RAM, else disk, and "prefills" the rest at PREFILL_S per token. /metrics has the
issue-34 series the bench reads.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import tempfile
import threading
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PREFILL_S = 0.0002
TIERS = ("ram", "disk")


def common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Cache:
    """Slots, RAM and disk as lists of token tuples; the counters /metrics exports."""

    def __init__(self, slots: int, ram_on: bool, disk_dir: Path | None) -> None:
        self.slots: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self.n_slots, self.ram_on, self.disk_dir = slots, ram_on, disk_dir
        self.ram: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self.lock = threading.Lock()
        self.c = {"lookup": 0, "hit": 0} | {f"{k}_{t}": 0 for k in ("tokens", "hits", "saves")
                                              for t in TIERS}
        if disk_dir:
            disk_dir.mkdir(parents=True, exist_ok=True)

    def disk_entries(self) -> list[tuple[str, ...]]:
        if not self.disk_dir:
            return []
        return [tuple(json.loads(p.read_text())) for p in sorted(self.disk_dir.glob("*.json"))]

    def lookup(self, tokens: tuple[str, ...]) -> int:
        """The reused prefix's length; counts it by tier."""
        with self.lock:
            best = [(max((common_prefix(tokens, e) for e in entries), default=0), tier)
                    for tier, entries in (("slots", list(self.slots)), ("ram", list(self.ram)),
                                          ("disk", self.disk_entries()))]
            hit, tier = max(best, key=lambda b: b[0])  # ties: the first, the fastest tier
            self.c["lookup"] += len(tokens)
            self.c["hit"] += hit
            if hit and tier != "slots":
                self.c[f"tokens_{tier}"] += hit
                self.c[f"hits_{tier}"] += 1
            return hit

    def keep(self, tokens: tuple[str, ...]) -> None:
        """The finished prompt stays resident; one pushed out goes to RAM; all go to disk."""
        with self.lock:
            self.slots[tokens] = None
            self.slots.move_to_end(tokens)
            while len(self.slots) > self.n_slots:
                old, _ = self.slots.popitem(last=False)
                if self.ram_on:
                    self.ram[old] = None
                    self.c["saves_ram"] += 1
            if self.disk_dir:
                name = hashlib.sha256("\0".join(tokens).encode()).hexdigest()[:16]
                path = self.disk_dir / f"{name}.json"
                if not path.exists():
                    path.write_text(json.dumps(tokens))
                    self.c["saves_disk"] += 1

    def metrics(self) -> str:
        with self.lock:
            c, disk = dict(self.c), len(self.disk_entries())
            entries = {"ram": len(self.ram), "disk": disk}
        lines = [f"inferloop_prefix_cache_lookup_tokens_total {c['lookup']}",
                 f"inferloop_prefix_cache_hit_tokens_total {c['hit']}"]
        for t in TIERS:
            # As prometheus-client does: a labelled counter appears once it has counted.
            lines += [f'inferloop_prompt_cache_{name}{{tier="{t}"}} {c[key + t]}'
                      for name, key in (("hit_tokens_total", "tokens_"), ("hits_total", "hits_"),
                                        ("saves_total", "saves_")) if c[key + t]]
            lines += [f'inferloop_prompt_cache_entries{{tier="{t}"}} {entries[t]}',
                      f'inferloop_prompt_cache_bytes{{tier="{t}"}} {entries[t] * 4096}']
        return "\n".join(lines) + "\n"


def handler(cache: Cache) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            pass

        def reply(self, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self.reply(cache.metrics().encode(), "text/plain; version=0.0.4")
            elif self.path == "/v1/models":
                self.reply(json.dumps({"data": [{"id": "fake"}]}).encode())
            else:
                self.reply(b"ok", "text/plain")

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            tokens = tuple(w for m in req["messages"] for w in [f"<{m['role']}>", *m["content"].split()])
            hit = cache.lookup(tokens)
            threading.Event().wait(PREFILL_S * (len(tokens) - hit))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            usage = {"prompt_tokens": len(tokens), "completion_tokens": 2,
                     "prompt_tokens_details": {"cached_tokens": hit}}
            for chunk in ({"choices": [{"delta": {"content": "Fine"}}]},
                          {"choices": [{"delta": {"content": "."}, "finish_reason": "stop"}]},
                          {"choices": [], "usage": usage}):
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True
            cache.keep(tokens)

    return Handler


def serve(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--state-dir")
    p.add_argument("--prompt-cache-disk-mb", type=int, default=64)
    p.add_argument("--prompt-cache-ram-mb", type=int, default=64)
    args, _ = p.parse_known_args(argv)
    disk = None
    if args.state_dir and args.prompt_cache_disk_mb:
        disk = Path(args.state_dir) / "fake-prompt-cache"
    cache = Cache(args.slots, args.prompt_cache_ram_mb != 0, disk)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(cache))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


def smoke() -> int:
    """bench/prefix.py against this fake; checks what it wrote."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import prefix
    me = str(Path(__file__).resolve())
    with tempfile.TemporaryDirectory(prefix="prefix-smoke-") as tmp:
        out = Path(tmp) / "prefix.json"
        rc = prefix.main(["--quick", "--servers", "inferloopd", "--daemon", me, "--model", me,
                          "--workloads", "shared", "gen", "restart", "--gen-band", "50-100,2900-3000",
                          "--gen-prompts", "1", "2", "--gen-requests", "4", "--gen-rate", "50",
                          "--restart-wait", "0.1", "--output", str(out)])
        res = json.loads(out.read_text())
    w, r = res["workloads"], res["restart"]
    checks = {
        "exit status 0": rc == 0,
        "one gen run per count and band": {"gen-p1@50-100", "gen-p2@2900-3000"} <= set(w),
        "gen --ctx raised to 3296": res["config"]["gen_ctx"] == 3296
        and "3296" in w["gen-p1@2900-3000"]["runs"]["inferloopd"]["argv"],
        "tier rates read": w["shared"]["runs"]["inferloopd"]["tiers"]["hit_rate"]["slots"] > 0.3,
        "restart meets 0.3 with the disk tier": r["restart"]["pass"] is True,
        "disk hits after the restart": r["restart"]["tiers_after_restart"]["hit_tokens_by_tier"]["disk"] > 0,
        "control about 1": r["restart-control"]["ratio_median"] > 0.5,
    }
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--smoke"]:
        sys.exit(smoke())
    sys.exit(serve(sys.argv[2:] if sys.argv[1:2] == ["serve"] else sys.argv[1:]))
