"""Fleet rollouts: the real `inferloop-ota agent` on simulated boxes (RAUC on loop devices,
see tests/ota/ota.py) against a real goosebit server (fleet.py), each case with its own server.

Every case reads its verdict from the server's own API (`/api/v1/devices`, the device's
log), the way an operator would see it.
"""

import json
import os
import random
import shutil
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import fleet
import ota
from conftest import missing_capability

PAD_BYTES = 16 * 1024 * 1024
# Download rate through the proxy in the restart case: the 16 MiB bundle takes ~8 s.
THROTTLE = 2 * 1024 * 1024
TIMINGS = {}


def goosebit_missing():
    venv = Path(os.environ.get("GOOSEBIT_VENV", ota.REPO / ".venv-goosebit"))
    if not (venv / "bin/aerich").exists():
        return f"goosebit not installed in {venv} (scripts/goosebit.sh install)"
    if not fleet.AGENT.exists():
        return f"{fleet.AGENT} not built (cargo build --release -p inferloop-ota)"
    return None


def build_padded(world, name, version):
    """An image with PAD_BYTES of random bytes (a bundle big enough to interrupt)."""
    fx = world._fixture()
    base = fx / "base-pad"
    if not base.exists():
        shutil.copytree(fx / "base", base, symlinks=True)
        (base / "var/lib/pad").mkdir(parents=True)
        (base / "var/lib/pad/random.bin").write_bytes(random.Random(17).randbytes(PAD_BYTES))
    spec = world.spec(name, version)
    text = spec.read_text().replace(f'base = "{fx / "base"}"', f'base = "{base}"')
    assert text != spec.read_text()
    spec.write_text(text)
    out = world.root / "images" / name
    env = dict(os.environ, SOURCE_DATE_EPOCH=ota.EPOCH)
    ota.run([ota.IMAGE_TOOL, "--quiet", "build", "--spec", spec, "--out", out], env=env, timeout=600)
    world.images[name] = {"spec": spec, "dir": out, "image": out / "root.squashfs", "version": version}


@pytest.fixture(scope="module")
def fleet_world(tmp_path_factory):
    why = missing_capability() or goosebit_missing()
    if why:
        if os.environ.get("OTA_REQUIRE") == "1":
            pytest.fail(f"fleet tests cannot run: {why}")
        pytest.skip(why)
    t = time.monotonic()
    w = ota.World(tmp_path_factory.mktemp("fleet-world"))
    w.make_keys()
    w.build_image("v1.0.0", "1.0.0")
    w.build_image("v1.1.0", "1.1.0")
    w.build_image("v0.9.0", "0.9.0")
    build_padded(w, "big", "1.3.0")
    w.bundle("good-1.1.0", "v1.1.0")
    w.bundle("older-0.9.0", "v0.9.0")
    w.bundle("untrusted-1.1.0", "v1.1.0", keys=w.stranger)
    w.bundle("big-1.3.0", "big")
    TIMINGS["world (keys, 4 images, 4 bundles)"] = time.monotonic() - t
    yield w
    report = Path(os.environ.get("FLEET_REPORT", ota.REPO / "out/fleet-test/timings.txt"))
    report.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{k:<44} {v:7.1f} s" if isinstance(v, float) else f"{k:<44} {v}" for k, v in TIMINGS.items()]
    report.write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))


@pytest.fixture
def server(tmp_path):
    gb = fleet.Goosebit(tmp_path / "goosebit")
    try:
        gb.start()
        TIMINGS.setdefault("goosebit start", gb.started_in)
        yield gb
    finally:
        gb.close()


@pytest.fixture
def boxes(fleet_world, server, tmp_path):
    made = []

    def make(n, prefix="box"):
        for i in range(n):
            b = fleet.Box(fleet_world, tmp_path / f"{prefix}-{i}", server.url, f"{prefix}-{i}")
            made.append(b)
            b.start()
        return made[-n:]

    yield make
    errors = []
    for b in made:
        errors += b.close()
        errors += b.errors
    assert not errors, errors


def on(version):
    return lambda d: d["sw_version"] == version and d["last_state"] == "Finished"


def registered(d):
    return d["sw_version"] == "1.0.0" and d["last_state"] in ("Registered", "Finished")


def test_rollout_installs_reboots_confirms_and_reports_success(fleet_world, server, boxes):
    [box] = boxes(1, "single")
    fleet.wait_devices(server, [box.name], registered, 30, "registration")
    d = server.device(box.name)
    assert d["hardware"]["model"] == "inferloop-jetson-orin-nx-16gb", d
    sw = server.upload(fleet_world.bundles["good-1.1.0"])
    t = time.monotonic()
    server.rollout(sw)
    fleet.wait_devices(server, [box.name], on("1.1.0"), 90, "1.1.0 reported")
    TIMINGS["one box: rollout -> success"] = time.monotonic() - t
    assert box.reboots == 1
    assert box.dev.booted == "B" and box.dev.running_version() == "1.1.0"
    assert box.dev.boot_state("B") == "good" and box.dev.nvb_state()["slots"][1]["successful"]
    log = server.device_log(box.name)["log"]
    assert "installing" in log and "marked good by the health check" in log, log
    state = json.loads((box.dev.w / "data/ota/state.json").read_text())
    assert state["closed"]["finished"] == "success" and state["closed"]["reported"], state
    assert "pending" not in state
    assert not list((box.dev.w / "data/ota").glob("action-*")), "bundle left on the data partition"
    # Done means done: no second install on later polls.
    time.sleep(3)
    assert box.log().count("installing with RAUC") == 1
    assert box.reboots == 1


def test_tampered_artifact_is_reported_and_deleted(fleet_world, server, boxes):
    [box] = boxes(1, "tamper")
    fleet.wait_devices(server, [box.name], registered, 30, "registration")
    sw = server.upload(fleet_world.bundles["good-1.1.0"])
    path = server.artifact_path(sw)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    server.rollout(sw)
    fleet.wait_devices(server, [box.name], lambda d: d["last_state"] == "Error", 60, "the failure report")
    log = server.device_log(box.name)["log"]
    TIMINGS["tampered: server log"] = " | ".join(log.strip().splitlines()[-2:])
    assert "sha1 mismatch" in log and "deleted" in log, log
    assert not list((box.dev.w / "data/ota").glob("action-*")), "the bad download was kept"
    assert box.dev.primary() == "A" and box.reboots == 0
    assert "installing with RAUC" not in box.log()
    assert server.device(box.name)["sw_version"] == "1.0.0"


@pytest.mark.parametrize("bundle,reason", [
    ("older-0.9.0", "handler"),
    ("untrusted-1.1.0", "signature"),
])
def test_refused_bundle_shows_raucs_reason_on_the_server(fleet_world, server, boxes, bundle, reason):
    [box] = boxes(1, "refuse")
    fleet.wait_devices(server, [box.name], registered, 30, "registration")
    sw = server.upload(fleet_world.bundles[bundle])
    server.rollout(sw)
    fleet.wait_devices(server, [box.name], lambda d: d["last_state"] == "Error", 90, "the failure report")
    log = server.device_log(box.name)["log"]
    TIMINGS[f"refused {bundle}: server log"] = " | ".join(log.strip().splitlines()[-2:])[:300]
    assert "RAUC refused" in log and reason in log.lower(), log
    assert box.dev.primary() == "A" and box.reboots == 0
    d = server.device(box.name)
    assert d["sw_version"] == "1.0.0", d


def test_server_restart_mid_download_resumes(fleet_world, tmp_path):
    # goosebit behind a throttling proxy, so the download can be caught half-way.
    server = fleet.Goosebit(tmp_path / "goosebit", throttle=THROTTLE)
    box = None
    try:
        server.start()
        box = fleet.Box(fleet_world, tmp_path / "resume-0", server.url, "resume-0").start()
        fleet.wait_devices(server, [box.name], registered, 30, "registration")
        bundle = fleet_world.bundles["big-1.3.0"]
        size = bundle.stat().st_size
        sw = server.upload(bundle)
        t = time.monotonic()
        server.rollout(sw)
        parts = box.dev.w / "data/ota"

        def mid():
            n = sum(p.stat().st_size for p in parts.glob("action-*.part")) if parts.exists() else 0
            return n if size // 5 < n < size // 2 else 0

        had = fleet.wait_for(mid, 60, "the download to be under way", interval=0.05)
        server.stop(signal.SIGKILL)
        time.sleep(2)
        server.start()
        fleet.wait_devices(server, [box.name], on("1.3.0"), 120, "1.3.0 reported after the restart")
        TIMINGS["resume: 16 MiB at 2 MiB/s, kill -9 + restart -> success"] = time.monotonic() - t
        log = box.log()
        resumed = [line for line in log.splitlines() if "resuming the download" in line]
        assert resumed, log[-3000:]
        offset = int(resumed[0].split("offset=")[1].split()[0])
        assert offset >= had, (offset, had)
        TIMINGS["resume: killed at / resumed from (bytes)"] = f"{had} / {offset} of {size}"
        assert box.dev.running_version() == "1.3.0"
        assert box.reboots == 1 and not box.errors, box.errors
    finally:
        errors = box.close() if box else []
        server.close()
    assert not errors, errors


def test_ten_boxes_each_get_the_update_once(fleet_world, server, boxes):
    t = time.monotonic()
    fleet_boxes = boxes(10, "fleet")
    names = [b.name for b in fleet_boxes]
    fleet.wait_devices(server, names, registered, 60, "ten registrations")
    TIMINGS["ten boxes: start + register"] = time.monotonic() - t
    sw = server.upload(fleet_world.bundles["good-1.1.0"])
    t = time.monotonic()
    server.rollout(sw, name="ten")
    firsts = {}

    def all_done():
        devs = {d["id"]: d for d in server.devices()}
        for n in names:
            if n not in firsts and on("1.1.0")(devs.get(n, {"sw_version": None, "last_state": None})):
                firsts[n] = time.monotonic() - t
        return len(firsts) == len(names)

    fleet.wait_for(all_done, 240, "ten boxes on 1.1.0", interval=0.5)
    TIMINGS["ten boxes: rollout -> all success"] = time.monotonic() - t
    TIMINGS["ten boxes: first / median / last box (s)"] = " / ".join(
        f"{v:.1f}" for v in (min(firsts.values()), sorted(firsts.values())[5], max(firsts.values())))
    time.sleep(3)
    for b in fleet_boxes:
        assert b.reboots == 1, (b.name, b.reboots)
        assert b.log().count("installing with RAUC") == 1, b.name
        assert b.dev.booted == "B" and b.dev.running_version() == "1.1.0", b.name
        assert b.log().count("update finished") == 1, b.name
    devs = {d["id"]: d for d in server.devices()}
    assert all(on("1.1.0")(devs[n]) for n in names), devs
    # goosebit 0.2.12 counts rollout successes with a read-modify-write per feedback, so
    # concurrent reports can be lost (8 of 10 seen here): recorded, not asserted.
    rollout = next(r for r in server.api("GET", "/api/v1/rollouts")["rollouts"] if r["name"] == "ten")
    TIMINGS["ten boxes: goosebit rollout success/failure count"] = (
        f"{rollout['success_count']} / {rollout['failure_count']}")
    assert rollout["failure_count"] == 0, rollout


def test_strict_device_auth_admits_the_right_token_and_refuses_a_wrong_one(fleet_world, tmp_path):
    # goosebit in strict mode: devices exist only through the admin API, each with its token.
    server = fleet.Goosebit(tmp_path / "goosebit", device_auth="strict")
    made = []
    try:
        server.start()
        good_token, bad_token = "k7Qm2xV9pL4sT8wZ3nB6cR1dF5gH0jY2", "not-the-token-for-auth-bad"
        server.create_device("auth-good", good_token)
        server.create_device("auth-bad", "k7Qm2xV9pL4sT8wZ3nB6cR1dF5gH0jXX")
        # Without a token the server says no (so the good box's success is the token's doing).
        ddi = f"{server.url}/DEFAULT/controller/v1/auth-good"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(ddi, timeout=10)
        assert refused.value.code == 401
        for name, token in (("auth-good", good_token), ("auth-bad", bad_token)):
            token_file = tmp_path / f"{name}.token"
            token_file.write_text(token + "\n")
            box = fleet.Box(fleet_world, tmp_path / name, server.url, name,
                            agent_conf={"target_token_file": str(token_file)})
            made.append(box)
            box.start()
        good, bad = made
        t = time.monotonic()
        fleet.wait_devices(server, [good.name], registered, 30, "the good box's registration")
        sw = server.upload(fleet_world.bundles["good-1.1.0"])
        server.rollout(sw)
        fleet.wait_devices(server, [good.name], on("1.1.0"), 90, "1.1.0 reported by the good box")
        TIMINGS["strict auth: start + rollout -> success"] = time.monotonic() - t
        assert good.reboots == 1 and good.dev.running_version() == "1.1.0"
        assert "unauthorized" not in good.log()

        # The wrong token: every poll refused, logged, backed off; nothing installed.
        log = bad.log()
        refusals = [line for line in log.splitlines() if 'kind="unauthorized"' in line]
        assert len(refusals) >= 2, log[-3000:]
        assert "server refused the box's credentials: 401" in refusals[0], refusals[0]
        assert "Device authentication token does not match" in refusals[0], refusals[0]
        TIMINGS["strict auth: wrong token, agent log"] = refusals[0].split("error=")[-1][:160]
        assert "installing with RAUC" not in log and "sent configData" not in log
        assert bad.reboots == 0 and bad.dev.primary() == "A"
        d = server.device(bad.name)
        assert d["sw_version"] is None and d["last_state"] != "Finished", d
    finally:
        errors = []
        for b in made:
            errors += b.close()
            errors += b.errors
        server.close()
    assert not errors, errors
