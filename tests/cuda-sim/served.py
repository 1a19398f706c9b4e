"""The native backend served on CUDA, on the CUDA emulator, against the same backend on the
CPU twins: the same requests through the real `openai` client give the same text, token for
token, streamed or not (each CUDA kernel gives its twin's bits, so greedy decoding agrees).

Run by scripts/cuda-sim-check.sh with the emulator's LD_LIBRARY_PATH and
INFERLOOP_KERNELS_PTX set. Usage: served.py DAEMON MODEL
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

import openai

LISTEN = re.compile(r"listening on (http://[0-9.:]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MODEL_ID = "SmolLM2-135M-Instruct.Q8_0"
# Short, so that the emulator (seconds per forward pass) finishes in about a minute.
MESSAGES = [{"role": "user", "content": "Name the capital city of France."}]
MAX_TOKENS = 6


class Daemon:
    def __init__(self, binary: str, model: str, device: str) -> None:
        self.lines: list[str] = []
        self.url: str | None = None
        self.ready = threading.Event()
        argv = [binary, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
                "--slots", "1", "--ctx", "256", "--threads", "2",
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


def ask(d: Daemon) -> dict:
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", timeout=600, max_retries=0)
    whole = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES,
                                           max_tokens=MAX_TOKENS, temperature=0)
    pieces, finish = [], None
    for chunk in client.chat.completions.create(model=MODEL_ID, messages=MESSAGES,
                                                max_tokens=MAX_TOKENS, temperature=0,
                                                stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    return {
        "text": whole.choices[0].message.content,
        "finish": whole.choices[0].finish_reason,
        "usage": (whole.usage.prompt_tokens, whole.usage.completion_tokens),
        "streamed": "".join(pieces),
        "streamed_finish": finish,
    }


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
                assert 'inferloop_backend_info{backend="native",device="cuda"} 1' in metrics
                log = "".join(d.lines)
                assert "CUDA pass checked against the CPU twins" in log, log
                assert "emulator" in log, "not the CUDA emulator:\n" + log
            results[device] = ask(d)
        finally:
            d.stop()
        print(f"{device}: {results[device]} ({time.monotonic() - t:.0f} s)")
    cpu, cuda = results["cpu"], results["cuda"]
    assert cpu["text"], "empty reply"
    assert cuda == cpu, f"CUDA and CPU replies differ:\n cuda {cuda}\n cpu  {cpu}"
    assert cuda["streamed"] == cuda["text"], "streamed and whole replies differ"
    print("served on CUDA (emulated) = served on the CPU twins")


if __name__ == "__main__":
    main()
