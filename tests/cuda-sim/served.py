"""The native backend served on CUDA, on the CUDA emulator, against the same backend on the
CPU twins: the same requests through the real `openai` client give the same text, token for
token, whole or streamed, with a cached prefix, and two at once in one batch (each CUDA
kernel gives its twin's bits, so greedy decoding agrees).

Run by scripts/cuda-sim-check.sh with the emulator's LD_LIBRARY_PATH and
INFERLOOP_KERNELS_PTX set. Usage: served.py DAEMON MODEL
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai

LISTEN = re.compile(r"listening on (http://[0-9.:]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MODEL_ID = "SmolLM2-135M-Instruct.Q8_0"
# Short, so that the emulator (seconds per forward pass) finishes in about a minute.
PROMPTS = ["Name the capital city of France.", "Say hello.", "What is two plus two?"]
MAX_TOKENS = 6


class Daemon:
    def __init__(self, binary: str, model: str, device: str) -> None:
        self.lines: list[str] = []
        self.url: str | None = None
        self.ready = threading.Event()
        argv = [binary, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
                "--slots", "2", "--ctx", "256", "--threads", "2",
                # Every resident row reusable (the default, named for clarity), so that a
                # prompt this short is reused at all (exact mode recomputes the last 64
                # tokens); the twins and the kernels round a row alike however it was
                # batched, so the replies stay equal.
                "--prefix-cache", "on",
                "--backend", "native", "--device", device]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace",
                                     env={**os.environ, "NO_COLOR": "1"})
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"inferloopd --device {device} exited {self.proc.returncode}:\n"
                         + "".join(self.lines[-40:]))
            if self.url:
                try:
                    with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                        if r.status == 200:
                            return
                except OSError:
                    pass
            time.sleep(0.2)
        sys.exit(f"inferloopd --device {device} not ready in 300 s")

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            m = LISTEN.search(ANSI.sub("", line))
            if m and not self.url:
                self.url = m.group(1)

    def get(self, path: str) -> str:
        assert self.url
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def one(client: openai.OpenAI, content: str, stream: bool) -> dict:
    messages = [{"role": "user", "content": content}]
    if not stream:
        r = client.chat.completions.create(model=MODEL_ID, messages=messages,
                                           max_tokens=MAX_TOKENS, temperature=0)
        return {"text": r.choices[0].message.content, "finish": r.choices[0].finish_reason,
                "usage": (r.usage.prompt_tokens, r.usage.completion_tokens)}
    pieces, finish = [], None
    for chunk in client.chat.completions.create(model=MODEL_ID, messages=messages,
                                                max_tokens=MAX_TOKENS, temperature=0,
                                                stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    return {"text": "".join(pieces), "finish": finish}


def ask(d: Daemon) -> dict:
    """One prompt whole, then streamed (its prefix now cached), then two prompts at once
    (decoded in one batch over both slots)."""
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", timeout=600, max_retries=0)
    out = {"whole": one(client, PROMPTS[0], False), "streamed": one(client, PROMPTS[0], True)}
    out["cached_tokens"] = json.loads(d.get("/v1/status"))["prefix_cache"]["hit_tokens"]
    with ThreadPoolExecutor(2) as pool:
        both = [pool.submit(one, client, PROMPTS[1], False),
                pool.submit(one, client, PROMPTS[2], True)]
        out["together"] = [f.result() for f in both]
    return out


def main() -> None:
    binary, model = sys.argv[1], sys.argv[2]
    results = {}
    for device in ["cpu", "cuda"]:
        t = time.monotonic()
        d = Daemon(binary, model, device)
        try:
            if device == "cuda":
                status = d.get("/v1/status")
                assert '"device":"cuda"' in status.replace(" ", ""), status
                metrics = d.get("/metrics")
                assert ('inferloop_backend_info{backend="native",device="cuda",'
                        'gpu="InferLoop CUDA emulator') in metrics, metrics
                log = "".join(d.lines)
                assert "CUDA pass checked against the CPU twins" in log, log
                assert "emulator" in log, "not the CUDA emulator:\n" + log
            results[device] = ask(d)
        finally:
            d.stop()
        print(f"{device}: {results[device]} ({time.monotonic() - t:.0f} s)")
    cpu, cuda = results["cpu"], results["cuda"]
    assert cpu["whole"]["text"], "empty reply"
    assert cuda["cached_tokens"] > 0, "the repeated prompt did not reuse its cached prefix"
    assert cuda == cpu, f"CUDA and CPU replies differ:\n cuda {cuda}\n cpu  {cpu}"
    assert cuda["streamed"]["text"] == cuda["whole"]["text"], "streamed and whole replies differ"
    print("served on CUDA (emulated) = served on the CPU twins, one by one and two at once")


if __name__ == "__main__":
    main()
