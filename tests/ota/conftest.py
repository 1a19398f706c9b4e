"""Fixtures for the OTA tests: one World (keys, images, bundles) per session, one fresh
Device (D-Bus, loop-device slots, fake bootloader, rauc service) per case.

The tests need root, loop devices, RAUC's service build, dbus-daemon, unshare, mksquashfs
and unsquashfs. Without them every case skips and says why; with OTA_REQUIRE=1 (what
`make ota-test` sets) a missing capability is an error instead.
"""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import ota

TOOLS = ["rauc", "dbus-daemon", "unshare", "losetup", "mksquashfs", "unsquashfs", "openssl"]


def missing_capability():
    if os.geteuid() != 0:
        return "needs root (loop devices, mount namespaces)"
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} not found (scripts/install-deps.sh installs rauc rauc-service dbus ...)"
    if not os.path.exists("/usr/share/dbus-1/system.conf"):
        return "no /usr/share/dbus-1/system.conf (package dbus)"
    if not ota.IMAGE_TOOL.exists():
        return f"{ota.IMAGE_TOOL} not built (cargo build --release -p inferloop-image)"
    probe = subprocess.run(["losetup", "-f"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"no free loop device: {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="session")
def world():
    why = missing_capability()
    if why:
        if os.environ.get("OTA_REQUIRE") == "1":
            pytest.fail(f"OTA tests cannot run: {why}")
        pytest.skip(why)
    keep = os.environ.get("OTA_WORK")
    root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="inferloop-ota-"))
    w = ota.World(root)
    t = time.monotonic()
    w.make_keys()
    w.build_image("v1.0.0", "1.0.0")
    w.build_image("v1.1.0", "1.1.0")
    w.build_image("v0.9.0", "0.9.0")
    w.build_image("other-board", "1.1.0", board=ota.OTHER_BOARD)
    w.build_image("large", "1.2.0", large=True)
    w.bundle("good-1.1.0", "v1.1.0")
    w.bundle("older-0.9.0", "v0.9.0")
    w.bundle("wrong-compatible", "other-board")
    w.bundle("untrusted-signer", "v1.1.0", keys=w.stranger)
    w.bundle("verity-1.1.0", "v1.1.0", fmt="verity")
    w.bundle("large-1.2.0", "large")
    w.timings["world total"] = time.monotonic() - t
    yield w
    report = Path(os.environ.get("OTA_REPORT", ota.REPO / "out/ota-test/timings.txt"))
    report.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{k:<28} {v:7.1f} s" for k, v in w.timings.items()]
    lines += [f"size {k:<23} {p.stat().st_size / 2**20:7.1f} MiB" for k, p in w.bundles.items()]
    report.write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
    if not keep:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def device(world, tmp_path, request):
    large = request.node.get_closest_marker("large_slots") is not None
    dev = ota.Device(world, tmp_path / "device",
                     slot_bytes=ota.LARGE_SLOT_BYTES if large else ota.SLOT_BYTES)
    try:
        dev.start(world.images["v1.0.0"]["image"])
        yield dev
    finally:
        errors = dev.close()
        assert not errors, f"cleanup failed: {errors}"


def pytest_configure(config):
    config.addinivalue_line("markers", "large_slots: slots big enough for the >= 200 MiB image")
