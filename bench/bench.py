#!/usr/bin/env python3
"""Benchmark inferloopd: time to first token and decode throughput.

Streams chat completions (OpenAI SSE) at temperature 0 and measures, on the
client side:

* single stream: TTFT (request sent -> first content delta) and decode tok/s,
  (completion_tokens - 1) / (t_last_delta - t_first_delta), median of --runs;
* --concurrency streams at once: aggregate tok/s (all completion tokens / wall
  time) and per-stream decode tok/s.

The server's llama-server style `timings` object is recorded when the final
chunk carries one. With --reference (the `raw_decode` example: llama.cpp in
process, no HTTP, no scheduler) the same decode is also measured without the
daemon, single and --concurrency sequences, and the serving overhead printed. Starts the daemon itself on port 0 unless --base-url is
given. Standard library only. Results: a table on stdout and JSON in
bench/results/latest.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import itertools
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROMPT = "Write a long story about a robot."
LISTEN_RE = re.compile(r"listening on (https?://[A-Za-z0-9._\-:\[\]]+)")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
REQUEST_NO = itertools.count(1)


class BenchError(Exception):
    pass


# --- daemon -----------------------------------------------------------------


class Daemon:
    """A server process: inferloopd on 127.0.0.1:0, whose address comes from its `listening on`
    line, or a peer started on a known `base_url`; ready when `ready_path` answers 200."""

    def __init__(self, argv: list[str], log_path: Path, base_url: str | None = None,
                 ready_path: str = "/readyz") -> None:
        self.argv = argv
        self.base_url: str | None = base_url
        self.ready_path = ready_path
        self._bound = threading.Event()
        if base_url is not None:
            self._bound.set()
        # INFERLOOP_* variables set what the flags leave unset: keep them out.
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERLOOP_")}
        env["NO_COLOR"] = "1"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "w", encoding="utf-8")
        self.log_path = log_path
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, errors="replace", env=env,
        )
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._log.write(line)
            self._log.flush()
            if self.base_url is None:
                m = LISTEN_RE.search(ANSI_RE.sub("", line))
                if m:
                    self.base_url = m.group(1).rstrip("/")
                    self._bound.set()

    def _tail(self) -> str:
        self._log.flush()
        return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-40:])

    def wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reader.join(timeout=2)
                raise BenchError(
                    f"daemon exited with status {self.proc.returncode}\n--- stderr ---\n{self._tail()}"
                )
            if self.base_url is None:
                self._bound.wait(0.1)
                continue
            try:
                with urllib.request.urlopen(self.base_url + self.ready_path, timeout=2) as r:
                    if r.status == 200:
                        return self.base_url
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise BenchError(f"daemon not ready within {timeout:.0f} s\n--- stderr ---\n{self._tail()}")

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=2)
        self._log.close()
        return self.proc.returncode


# --- client -----------------------------------------------------------------


def get_json(base_url: str, path: str, api_key: str | None) -> Any:
    req = urllib.request.Request(base_url + path)
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def stream_chat(base_url: str, model_id: str, prompt: str, max_tokens: int,
                api_key: str | None, timeout: float = 600.0) -> dict[str, Any]:
    """One streaming chat completion; returns client-side timings and counts."""
    # A different first word per request: servers that reuse a cached prompt prefix (llama-server
    # does by default) must evaluate every prompt, as inferloopd does.
    messages = [{"role": "user", "content": f"Request {next(REQUEST_NO)}. {prompt}"}]
    result = stream_messages(base_url, model_id, messages, max_tokens, api_key, timeout)
    del result["text"], result["usage"]
    return result


def stream_messages(base_url: str, model_id: str, messages: list[dict[str, str]],
                    max_tokens: int, api_key: str | None = None,
                    timeout: float = 600.0) -> dict[str, Any]:
    """One streaming chat completion of `messages` as given; returns client-side timings and
    counts, the answer text and the server's usage."""
    url = urllib.parse.urlsplit(base_url)
    body = json.dumps({
        "model": model_id,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)
    try:
        conn.connect()  # connect outside the timed region, as a pooled client would
        t_start = time.perf_counter()
        conn.request("POST", (url.path.rstrip("/") or "") + "/v1/chat/completions", body, headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise BenchError(f"HTTP {resp.status}: {resp.read()[:500].decode(errors='replace')}")
        t_first = t_last = None
        deltas = 0
        text: list[str] = []
        usage = timings = finish_reason = None
        done = False
        while True:
            raw = resp.readline()
            if not raw:
                break
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if not line.startswith("data:"):
                continue  # blank separators, comments, `event:` lines
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise BenchError(f"error in stream: {chunk['error']}")
            now = time.perf_counter()
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    if t_first is None:
                        t_first = now
                    t_last = now
                    deltas += 1
                    text.append(content)
                if choice.get("finish_reason"):
                    finish_reason = choice["finish_reason"]
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("timings"):
                timings = chunk["timings"]
        t_end = time.perf_counter()
    finally:
        conn.close()

    if not done:
        raise BenchError("stream ended without `data: [DONE]`")
    if t_first is None:
        raise BenchError("stream carried no content")
    completion_tokens = usage["completion_tokens"] if usage else deltas
    decode_s = t_last - t_first
    return {
        "t_start": t_start,
        "t_end": t_end,
        "ttft_ms": (t_first - t_start) * 1e3,
        "e2e_ms": (t_end - t_start) * 1e3,
        "decode_tps": (completion_tokens - 1) / decode_s if completion_tokens > 1 and decode_s > 0 else None,
        "completion_tokens": completion_tokens,
        "prompt_tokens": usage["prompt_tokens"] if usage else None,
        "tokens_from": "usage" if usage else "content deltas",
        "content_deltas": deltas,
        "finish_reason": finish_reason,
        "text_chars": sum(map(len, text)),
        "server_timings": timings,
        "text": "".join(text),
        "usage": usage,
    }


# --- phases -----------------------------------------------------------------


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def server_timing_medians(results: list[dict[str, Any]]) -> dict[str, float] | None:
    timings = [r["server_timings"] for r in results if r.get("server_timings")]
    if not timings:
        return None
    keys = ["prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second", "queue_ms"]
    out = {}
    for k in keys:
        m = median([t.get(k) for t in timings if isinstance(t.get(k), (int, float))])
        if m is not None:
            out[k] = m
    return out


def single_stream(args, base_url: str, model_id: str) -> dict[str, Any]:
    runs = []
    for i in range(args.runs):
        r = stream_chat(base_url, model_id, args.prompt, args.max_tokens, args.api_key)
        runs.append(r)
        print(f"  single run {i + 1}/{args.runs}: ttft {r['ttft_ms']:.1f} ms, "
              f"decode {fmt(r['decode_tps'])} tok/s, {r['completion_tokens']} tokens", file=sys.stderr)
    return {
        "runs": runs,
        "ttft_ms_median": median([r["ttft_ms"] for r in runs]),
        "decode_tps_median": median([r["decode_tps"] for r in runs]),
        "completion_tokens_median": median([r["completion_tokens"] for r in runs]),
        "server_timings_median": server_timing_medians(runs),
    }


def concurrent_round(args, base_url: str, model_id: str) -> dict[str, Any]:
    n = args.concurrency
    results: list[dict[str, Any] | None] = [None] * n
    errors: list[BaseException] = []
    barrier = threading.Barrier(n + 1)

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = stream_chat(base_url, model_id, args.prompt, args.max_tokens, args.api_key)
        except BaseException as e:  # reported below, after all threads are joined
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise BenchError(f"{len(errors)} of {n} concurrent streams failed: {errors[0]}")
    streams = [r for r in results if r is not None]
    total = sum(r["completion_tokens"] for r in streams)
    return {
        "wall_s": wall,
        "total_completion_tokens": total,
        "aggregate_tps": total / wall,
        "streams": streams,
    }


def concurrent(args, base_url: str, model_id: str) -> dict[str, Any]:
    rounds = []
    for i in range(args.concurrent_runs):
        r = concurrent_round(args, base_url, model_id)
        rounds.append(r)
        print(f"  concurrent round {i + 1}/{args.concurrent_runs}: aggregate "
              f"{r['aggregate_tps']:.1f} tok/s over {r['wall_s']:.2f} s", file=sys.stderr)
    streams = [s for r in rounds for s in r["streams"]]
    per_stream = [s["decode_tps"] for s in streams if s["decode_tps"] is not None]
    return {
        "concurrency": args.concurrency,
        "rounds": rounds,
        "aggregate_tps_median": median([r["aggregate_tps"] for r in rounds]),
        "per_stream_tps_median": median(per_stream),
        "per_stream_tps_min": min(per_stream) if per_stream else None,
        "per_stream_tps_max": max(per_stream) if per_stream else None,
        "ttft_ms_median": median([s["ttft_ms"] for s in streams]),
        "ttft_ms_max": max(s["ttft_ms"] for s in streams),
        "server_timings_median": server_timing_medians(streams),
    }


# --- peer --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_peer(args, log_dir: Path) -> dict[str, Any]:
    """llama.cpp's llama-server on the same GGUF, threads, slots and per-slot context."""
    port = free_port()
    argv = [args.peer, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
            "-t", str(args.threads), "-tb", str(args.threads), "-np", str(args.slots),
            "-c", str(args.slots * args.ctx), "--no-webui",
            # Like inferloopd: the built-in chat template (the GGUF's Jinja one adds a system
            # prompt, 47 instead of 17 prompt tokens) and no prompt cache.
            "--no-jinja", "--no-cache-prompt"] + args.peer_arg
    print(f"starting peer: {' '.join(argv)}", file=sys.stderr)
    peer = Daemon(argv, log_dir / "peer.log", base_url=f"http://127.0.0.1:{port}", ready_path="/health")
    try:
        base_url = peer.wait_ready(args.ready_timeout)
        model_id = get_json(base_url, "/v1/models", None)["data"][0]["id"]
        stream_chat(base_url, model_id, args.prompt, min(8, args.max_tokens), None)
        peer_args = argparse.Namespace(**{**vars(args), "api_key": None})
        single = single_stream(peer_args, base_url, model_id)
        conc = concurrent(peer_args, base_url, model_id)
    finally:
        peer.stop()
    return {"argv": argv, "model_id": model_id, "single": single, "concurrent": conc}


def bench_backend(args, log_dir: Path, model: str, backend: str) -> dict[str, Any]:
    """inferloopd on `model` with `--backend backend` (CPU), same threads, slots and context."""
    argv = [args.daemon, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
            "--threads", str(args.threads), "--slots", str(args.slots), "--ctx", str(args.ctx),
            "--backend", backend, "--device", "cpu"]
    print(f"starting: {' '.join(argv)}", file=sys.stderr)
    daemon = Daemon(argv, log_dir / f"daemon-{backend}.log")
    try:
        base_url = daemon.wait_ready(args.ready_timeout)
        model_id = get_json(base_url, "/v1/models", None)["data"][0]["id"]
        stream_chat(base_url, model_id, args.prompt, min(8, args.max_tokens), None)
        run_args = argparse.Namespace(**{**vars(args), "api_key": None})
        single = single_stream(run_args, base_url, model_id)
        conc = concurrent(run_args, base_url, model_id)
    finally:
        daemon.stop()
    return {"argv": argv, "model_id": model_id, "single": single, "concurrent": conc}


def bench_native(args, log_dir: Path) -> dict[str, Any]:
    """The native backend's CPU twin next to llama.cpp, both in inferloopd on the Q8_0 file."""
    return {backend: bench_backend(args, log_dir, args.native_model, backend)
            for backend in ("native", "llama")}


# --- in-process reference ---------------------------------------------------


def reference(args) -> dict[str, Any]:
    """llama.cpp decoding in process (same threads, tokens, model), single and concurrent."""
    out: dict[str, Any] = {"binary": args.reference}
    for key, parallel in (("single", 1), ("concurrent", args.concurrency)):
        runs = []
        for _ in range(args.reference_runs):
            cmd = [args.reference, args.model, str(args.threads), str(args.max_tokens), str(parallel)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.SubprocessError) as e:
                raise BenchError(f"reference {' '.join(cmd)}: {e}") from e
            if proc.returncode != 0:
                raise BenchError(f"reference {' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
            try:
                runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            except (IndexError, json.JSONDecodeError) as e:
                raise BenchError(f"reference printed no JSON line: {proc.stdout!r}") from e
            print(f"  reference x{parallel}: {runs[-1]['aggregate_tok_s']:.1f} tok/s aggregate", file=sys.stderr)
        out[key] = {
            "parallel": parallel,
            "runs": runs,
            "aggregate_tps_median": median([r["aggregate_tok_s"] for r in runs]),
            "prompt_ms_median": median([r["prompt_ms"] for r in runs]),
        }
    return out


def overhead_pct(served: float | None, reference_tps: float | None) -> float | None:
    """How much slower the daemon decodes than llama.cpp in process, in percent."""
    if not served or not reference_tps:
        return None
    return (1.0 - served / reference_tps) * 100.0


# --- output -----------------------------------------------------------------


def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def print_table(res: dict[str, Any]) -> None:
    c, s, m = res["config"], res["single"], res["concurrent"]
    print()
    print(f"InferLoop bench  model={res['model_id']}  threads={c['threads']}  slots={c['slots']}  "
          f"ctx={c['ctx']}  max_tokens={c['max_tokens']}")
    rows = [
        (f"single stream ({c['runs']} runs, median)", "", ""),
        ("  TTFT", fmt(s["ttft_ms_median"]), "ms"),
        ("  decode", fmt(s["decode_tps_median"]), "tok/s"),
        ("  completion tokens", fmt(s["completion_tokens_median"], 0), ""),
    ]
    st = s["server_timings_median"]
    if st:
        rows += [
            ("  server prompt_ms", fmt(st.get("prompt_ms")), "ms"),
            ("  server predicted/s", fmt(st.get("predicted_per_second")), "tok/s"),
        ]
    rows += [
        (f"{m['concurrency']} concurrent streams ({c['concurrent_runs']} rounds, median)", "", ""),
        ("  aggregate", fmt(m["aggregate_tps_median"]), "tok/s"),
        ("  per stream", fmt(m["per_stream_tps_median"]), "tok/s"),
        ("  per stream min..max", f"{fmt(m['per_stream_tps_min'])}..{fmt(m['per_stream_tps_max'])}", "tok/s"),
        ("  TTFT median / max", f"{fmt(m['ttft_ms_median'])} / {fmt(m['ttft_ms_max'])}", "ms"),
    ]
    peer = res.get("peer")
    if peer:
        ps, pc = peer["single"], peer["concurrent"]
        pst = ps["server_timings_median"] or {}
        rows += [
            (f"llama-server, same settings ({c['runs']} runs, median)", "", ""),
            ("  TTFT", fmt(ps["ttft_ms_median"]), "ms"),
            ("  decode", fmt(ps["decode_tps_median"]), "tok/s"),
            ("  server predicted/s", fmt(pst.get("predicted_per_second")), "tok/s"),
            (f"  aggregate, {pc['concurrency']} streams", fmt(pc["aggregate_tps_median"]), "tok/s"),
            ("  TTFT median / max, concurrent", f"{fmt(pc['ttft_ms_median'])} / {fmt(pc['ttft_ms_max'])}", "ms"),
        ]
    native = res.get("native")
    if native:
        for backend, label in (("native", "native backend (CPU twin)"), ("llama", "llama.cpp")):
            b = native[backend]
            bs, bc = b["single"], b["concurrent"]
            rows += [
                (f"{label}, Q8_0 file ({c['runs']} runs, median)", "", ""),
                ("  TTFT", fmt(bs["ttft_ms_median"]), "ms"),
                ("  decode", fmt(bs["decode_tps_median"]), "tok/s"),
                (f"  aggregate, {bc['concurrency']} streams", fmt(bc["aggregate_tps_median"]), "tok/s"),
            ]
    ref = res.get("reference")
    if ref:
        rs, rc = ref["single"], ref["concurrent"]
        served_single = (st or {}).get("predicted_per_second") or s["decode_tps_median"]
        rows += [
            (f"llama.cpp in process ({len(rs['runs'])} runs, median)", "", ""),
            ("  decode, 1 sequence", fmt(rs["aggregate_tps_median"]), "tok/s"),
            (f"  aggregate, {rc['parallel']} sequences", fmt(rc["aggregate_tps_median"]), "tok/s"),
            ("  serving overhead, single", fmt(overhead_pct(served_single, rs["aggregate_tps_median"])), "%"),
            ("  serving overhead, concurrent",
             fmt(overhead_pct(m["aggregate_tps_median"], rc["aggregate_tps_median"])), "%"),
        ]
    for label, value, unit in rows:
        print(f"{label:<44}{value:>16} {unit}".rstrip())
    print()


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# --- main -------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--daemon", default=str(REPO / "target/release/inferloopd"), help="inferloopd binary")
    p.add_argument("--model", default=str(REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf"), help="GGUF file")
    p.add_argument("--base-url", help="benchmark a running daemon (e.g. http://127.0.0.1:8080) instead of starting one")
    p.add_argument("--model-id", help="model id for requests (default: first of GET /v1/models)")
    p.add_argument("--api-key", help="bearer token, if the daemon requires one")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=5, help="single-stream runs")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--concurrent-runs", type=int, default=3, help="rounds of concurrent streams")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--ready-timeout", type=float, default=120.0)
    p.add_argument("--output", default=str(REPO / "bench/results/latest.json"))
    p.add_argument("--reference", help="raw_decode example binary: also measure llama.cpp in process")
    p.add_argument("--reference-runs", type=int, default=5)
    p.add_argument("--peer", help="llama-server binary (scripts/build-peer.sh): also benchmark it, same settings")
    p.add_argument("--native-model", help="a Q8_0 GGUF: also run inferloopd --backend native (the "
                   "kernels' CPU twin) and --backend llama on it, same settings")
    p.add_argument("--peer-arg", action="append", default=[], help="extra llama-server flag (repeatable)")
    args = p.parse_args(argv)
    for name in ("threads", "slots", "ctx", "max_tokens", "runs", "concurrency", "concurrent_runs",
                 "reference_runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output = Path(args.output)
    daemon = None
    try:
        if args.base_url:
            base_url = args.base_url.rstrip("/")
            if base_url.endswith("/v1"):
                base_url = base_url[:-3]
        else:
            for what, path in (("daemon binary", args.daemon), ("model", args.model)):
                if not Path(path).is_file():
                    raise BenchError(f"{what} {path} not found (make build / make model)")
            cmd = [args.daemon, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", "0",
                   "--threads", str(args.threads), "--slots", str(args.slots), "--ctx", str(args.ctx)]
            if args.api_key:
                cmd += ["--api-key", args.api_key]
            print(f"starting: {' '.join(cmd)}", file=sys.stderr)
            daemon = Daemon(cmd, output.parent / "daemon.log")
            base_url = daemon.wait_ready(args.ready_timeout)
        print(f"daemon at {base_url}", file=sys.stderr)

        model_id = args.model_id or get_json(base_url, "/v1/models", args.api_key)["data"][0]["id"]
        # Warm-up: first-request costs (page faults in the weights, allocator) are not steady state.
        stream_chat(base_url, model_id, args.prompt, min(8, args.max_tokens), args.api_key)

        single = single_stream(args, base_url, model_id)
        conc = concurrent(args, base_url, model_id)
        if daemon is not None:
            daemon.stop()  # the peer and the reference get the CPU to themselves; idempotent
        peer = bench_peer(args, output.parent) if args.peer else None
        native = bench_native(args, output.parent) if args.native_model else None
        ref = reference(args) if args.reference else None
    except BenchError as e:
        print(f"bench: error: {e}", file=sys.stderr)
        return 1
    finally:
        if daemon is not None:
            rc = daemon.stop()
            if rc != 0:
                print(f"bench: warning: daemon exited with status {rc} (log: {daemon.log_path})",
                      file=sys.stderr)

    result = {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "host": {"platform": platform.platform(), "machine": platform.machine(),
                 "cpus": os.cpu_count(), "python": platform.python_version()},
        "base_url": base_url,
        "model_id": model_id,
        "daemon_argv": daemon.argv if daemon else None,
        "config": {
            "threads": args.threads if daemon else None,
            "slots": args.slots if daemon else None,
            "ctx": args.ctx if daemon else None,
            "max_tokens": args.max_tokens, "runs": args.runs,
            "concurrency": args.concurrency, "concurrent_runs": args.concurrent_runs,
            "prompt": args.prompt, "temperature": 0,
        },
        "single": single,
        "concurrent": conc,
        "peer": peer,
        "native": native,
        "reference": ref,
    }
    print_table(result)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(output.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(output)
    print(f"wrote {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
