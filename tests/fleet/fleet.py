"""The fleet harness: goosebit (a real hawkBit-DDI rollout server, from PyPI) and simulated
boxes that each run the real `inferloop-ota agent` against their own RAUC (ota.Device).

`Goosebit` starts the server on loopback with its database and artifacts in a temporary
directory (scripts/goosebit.sh), optionally behind `Throttle`, a TCP proxy that caps the
bytes per second towards the boxes (downloads slow enough to kill the server mid-way).
Its admin API (`/setup`, `/api/v1/...`) uploads bundles, creates rollouts and reads the
server's view of every device.

A `Box` is an ota.Device plus the agent process. The agent's reboot command touches a file;
a watcher thread then does what a reboot does: stops the agent, `Device.reboot()` (the fake
bootloader picks the slot, RAUC restarts on it), starts the agent again and runs the health
check (`Device.health`, which marks the slot good and writes data/health-passed).

`python3 tests/fleet/fleet.py demo OUTDIR` is `make fleet-demo`.
"""

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ota"))
import ota  # noqa: E402  (tests/ota/ota.py)

REPO = ota.REPO
AGENT = Path(os.environ.get("INFERLOOP_OTA", REPO / "target/release/inferloop-ota"))
GOOSEBIT_SH = REPO / "scripts/goosebit.sh"
ADMIN = ("admin@example.com", "fleet-test-password")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout, what, interval=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


class Throttle:
    """A TCP proxy on 127.0.0.1 that forwards to `port`, at most `rate` bytes/s per
    connection towards the client. Runs its own event loop in a thread."""

    def __init__(self, upstream_port, rate):
        self.upstream = upstream_port
        self.rate = rate
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()

    async def _pipe(self, reader, writer, rate):
        try:
            while True:
                data = await reader.read(16384 if rate else 65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
                if rate:
                    await asyncio.sleep(len(data) / rate)
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _client(self, creader, cwriter):
        try:
            ureader, uwriter = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            cwriter.close()
            return
        await asyncio.gather(self._pipe(creader, uwriter, None),
                             self._pipe(ureader, cwriter, self.rate))

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Goosebit:
    """goosebit 0.2.12 on loopback with its own database and artifacts directory."""

    def __init__(self, workdir, poll_time="00:00:01", throttle=None, device_auth=None):
        """`device_auth`: None (goosebit's default, no device authentication) or one of its
        modes; "strict" answers 401 to any DDI request without the `TargetToken` the admin
        API gave the device (and never registers a device itself)."""
        self.dir = Path(workdir)
        self.device_auth = device_auth
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.poll_time = poll_time
        self.proc = None
        self.token = None
        self.proxy = Throttle(self.port, throttle) if throttle else None
        self.log_path = self.dir / "server.log"

    @property
    def url(self):
        """What the boxes talk to (the throttling proxy when there is one)."""
        return f"http://127.0.0.1:{self.proxy.port if self.proxy else self.port}"

    @property
    def admin_url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        env = dict(os.environ, GOOSEBIT_POLL_TIME=self.poll_time,
                   GOOSEBIT_MAX_CONCURRENT_UPDATES="1000")
        if self.device_auth:
            # pydantic-settings' nested keys: device_auth.enable, device_auth.mode.
            env.update(GOOSEBIT_DEVICE_AUTH__ENABLE="true", GOOSEBIT_DEVICE_AUTH__MODE=self.device_auth)
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen([GOOSEBIT_SH, "start", self.dir, str(self.port)],
                                     stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        t = time.monotonic()

        def up():
            if self.proc.poll() is not None:
                raise RuntimeError(f"goosebit exited {self.proc.returncode}:\n{self.log_path.read_text()}")
            # Any HTTP answer (the admin API without a token is 401) means it is up; a
            # DDI URL would register a device.
            try:
                urllib.request.urlopen(f"{self.admin_url}/api/v1/devices", timeout=2)
                return True
            except urllib.error.HTTPError:
                return True
            except (urllib.error.URLError, OSError):
                return False

        wait_for(up, 90, "goosebit to answer")
        self.started_in = time.monotonic() - t
        if self.token is None:
            self.token = self._form("/setup")["access_token"]
        else:
            self.token = self._form("/login")["access_token"]
        return self

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def close(self):
        self.stop()
        if self.proxy:
            self.proxy.close()

    # -- the admin API --------------------------------------------------------------------
    def _form(self, path):
        body = f"username={ADMIN[0]}&password={ADMIN[1]}".encode()
        req = urllib.request.Request(self.admin_url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        return json.loads(urllib.request.urlopen(req, timeout=30).read())

    def api(self, method, path, body=None, raw=None, content_type=None):
        headers = {"Authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif raw is not None:
            data = raw
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.admin_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                text = r.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path}: {e.code} {e.read()[:500]!r}") from None
        return json.loads(text) if text else None

    def upload(self, bundle):
        """PUT /api/v1/software (multipart file=); returns the software id."""
        boundary = uuid.uuid4().hex
        name = Path(bundle).name
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\n").encode()
        raw = head + Path(bundle).read_bytes() + f"\r\n--{boundary}--\r\n".encode()
        return self.api("PUT", "/api/v1/software", raw=raw,
                        content_type=f"multipart/form-data; boundary={boundary}")["id"]

    def software(self):
        return self.api("GET", "/api/v1/software")["software"]

    def artifact_path(self, software_id):
        """The uploaded file on the server's disk (for the tampering case): the file under
        the artifacts directory whose SHA-1 is the one the server announces."""
        import hashlib
        sw = next(s for s in self.software() if s["id"] == software_id)
        for p in (self.dir / "artifacts").rglob("*"):
            if p.is_file() and hashlib.sha1(p.read_bytes()).hexdigest() == sw["hash"]:
                return p
        raise FileNotFoundError(f"no artifact with sha1 {sw['hash']} under {self.dir / 'artifacts'}")

    def rollout(self, software_id, feed="default", name=None):
        return self.api("PUT", "/api/v1/rollouts",
                        {"name": name or f"rollout-{software_id}", "feed": feed, "software_id": software_id})

    def devices(self):
        return self.api("GET", "/api/v1/devices")["devices"]

    def create_device(self, dev_id, auth_token):
        """PUT /api/v1/devices creates the device (strict mode will not) with its token
        (goosebit keeps at most 32 characters)."""
        assert len(auth_token) <= 32, auth_token
        self.api("PUT", "/api/v1/devices", {"devices": [dev_id], "auth_token": auth_token})

    def device(self, dev_id):
        return self.api("GET", f"/api/v1/devices/{dev_id}")

    def device_log(self, dev_id):
        return self.api("GET", f"/api/v1/devices/{dev_id}/log")


class Box:
    """One simulated box: RAUC on loop devices (ota.Device) and the agent pointed at a server."""

    def __init__(self, world, workdir, server_url, name, image="v1.0.0", agent_conf=None):
        self.name = name
        self.dev = ota.Device(world, Path(workdir), log=lambda *a: None)
        self.image = world.images[image]["image"]
        self.server_url = server_url
        self.agent = None
        self.reboots = 0
        self.stopping = threading.Event()
        self.errors = []
        w = self.dev.w
        self.reboot_flag = w / "reboot-requested"
        self.agent_log = w / "agent.log"
        self.conf = w / "ota.toml"
        extra = agent_conf or {}
        lines = {
            "server": server_url,
            "controller_id": name,
            "download_dir": str(w / "data/ota"),
            "state_file": str(w / "data/ota/state.json"),
            "manifest": str(self.dev.running_manifest),
            "reboot_command": ["touch", str(self.reboot_flag)],
            "health_passed_file": str(w / "data/health-passed"),
            "retry_min_s": 0.5,
            "retry_max_s": 2.0,
            "poll_default_s": 1,
            "confirm_timeout_s": 120,
            **extra,
        }
        self.conf_text = "".join(f"{k} = {json.dumps(v)}\n" for k, v in lines.items())

    def start(self):
        self.dev.start(self.image)
        self.conf.write_text(self.conf_text)
        self.start_agent()
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()
        return self

    def start_agent(self):
        log = open(self.agent_log, "a")
        log.write(f"--- agent start (boot {self.reboots}) ---\n")
        log.flush()
        self.agent = subprocess.Popen([AGENT, "agent", "--config", self.conf], stdout=log,
                                      stderr=subprocess.STDOUT, env=self.dev.env,
                                      start_new_session=True)

    def stop_agent(self):
        if self.agent and self.agent.poll() is None:
            self.agent.terminate()
            try:
                self.agent.wait(10)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait(5)
        self.agent = None

    def _watch(self):
        """The reboot the agent asked for, then the health check on the new slot."""
        while not self.stopping.is_set():
            if self.reboot_flag.exists():
                try:
                    self.reboot_flag.unlink()
                    self.stop_agent()
                    self.dev.reboot()
                    self.reboots += 1
                    self.start_agent()
                    h = self.dev.health(qual_rc=0)
                    if h.returncode != 0:
                        self.errors.append(f"health: {h.stdout}")
                except Exception as e:  # reported by the test through self.errors
                    self.errors.append(repr(e))
            time.sleep(0.1)

    def log(self):
        return self.agent_log.read_text() if self.agent_log.exists() else ""

    def close(self):
        self.stopping.set()
        self.stop_agent()
        return self.dev.close()


def wait_devices(gb, ids, pred, timeout, what):
    """Polls the server's device list until pred(device) holds for every id."""
    last = {}

    def check():
        nonlocal last
        last = {d["id"]: d for d in gb.devices()}
        return all(i in last and pred(last[i]) for i in ids)

    try:
        wait_for(check, timeout, what, interval=0.5)
    except TimeoutError as e:
        raise TimeoutError(f"{e}; server says: {json.dumps(last, indent=1)[:4000]}") from None
    return last


def summary(devices):
    return [{"id": d["id"], "sw_version": d["sw_version"], "last_state": d["last_state"],
             "hardware": (d.get("hardware") or {}).get("model"), "progress": d["progress"]}
            for d in sorted(devices, key=lambda d: d["id"])]


def demo(outdir):
    """make fleet-demo: goosebit, bundles 1.0.0 and 1.1.0, three boxes, a rollout of 1.1.0."""
    out = Path(outdir).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="fleet-demo-", dir="/tmp"))
    world = ota.World(work / "world")
    print(f"building keys, images 1.0.0 and 1.1.0 and their bundles in {world.root}", flush=True)
    world.make_keys()
    world.build_image("v1.0.0", "1.0.0")
    world.build_image("v1.1.0", "1.1.0")
    b100 = world.bundle("inferloop-1.0.0", "v1.0.0")
    b110 = world.bundle("inferloop-1.1.0", "v1.1.0")
    gb = Goosebit(work / "goosebit")
    boxes = []
    try:
        gb.start()
        print(f"goosebit on {gb.url} (started in {gb.started_in:.1f} s)", flush=True)
        ids = {v: gb.upload(b) for v, b in (("1.0.0", b100), ("1.1.0", b110))}
        print(f"uploaded: {ids}", flush=True)
        for i in range(3):
            boxes.append(Box(world, work / f"box-{i}", gb.url, f"demo-box-{i}").start())
        names = [b.name for b in boxes]
        wait_devices(gb, names, lambda d: d["sw_version"] == "1.0.0", 60, "three boxes on 1.0.0")
        print("enrolled:", json.dumps(summary(gb.devices()), indent=1), flush=True)
        t = time.monotonic()
        gb.rollout(ids["1.1.0"], name="demo 1.1.0")
        devs = wait_devices(gb, names, lambda d: d["sw_version"] == "1.1.0" and d["last_state"] == "Finished",
                            180, "every box to report 1.1.0")
        took = time.monotonic() - t
        print(f"rollout of 1.1.0 to 3 boxes: {took:.1f} s", flush=True)
        view = [{"id": d["id"], "sw_version": d["sw_version"], "update_state": d["last_state"],
                 "hardware": d["hardware"], "progress": d["progress"], "feed": d["feed"]}
                for d in sorted(devs.values(), key=lambda d: d["id"])]
        (out / "devices.json").write_text(json.dumps(view, indent=1) + "\n")
        (out / "rollouts.json").write_text(json.dumps(gb.api("GET", "/api/v1/rollouts"), indent=1) + "\n")
        for b in boxes:
            shutil.copy(b.agent_log, out / f"{b.name}.agent.log")
        print(json.dumps(view, indent=1))
        print(f"wrote {out / 'devices.json'}")
    finally:
        for b in boxes:
            b.close()
        gb.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "demo":
        demo(sys.argv[2])
    else:
        sys.exit("usage: tests/fleet/fleet.py demo OUTDIR")
