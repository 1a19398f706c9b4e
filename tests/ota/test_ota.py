"""End-to-end A/B updates with the real RAUC (see ota.py for the emulated board).

Each case starts from a freshly flashed board: image 1.0.0 in slot A, booted from A.
"""

import http.server
import os
import random
import shutil
import threading
import time
from functools import partial

import pytest

A_LEN = None  # set per case: bytes of the image flashed into slot A


def slot_a_before(device):
    return device.slot_hash("A")


def assert_refused(device, bundle, message, a_hash):
    p = device.install(bundle)
    assert p.returncode != 0, p.stdout
    assert message in p.stdout, f"expected {message!r} in:\n{p.stdout}"
    assert device.slot_hash("A") == a_hash, "slot A was written"
    assert device.primary() == "A"
    assert device.reboot() == "A"
    return p


def test_a_install_reboot_health_marks_good(world, device):
    t = time.monotonic()
    p = device.install(world.bundles["good-1.1.0"])
    world.timings["install small (case a)"] = time.monotonic() - t
    assert p.returncode == 0, p.stdout
    assert "Installing `" in p.stdout and "succeeded" in p.stdout, p.stdout
    assert device.primary() == "B"
    img = world.images["v1.1.0"]["image"]
    assert device.slot_hash("B", img.stat().st_size) == ota_sha(img)

    assert device.reboot() == "B"
    assert device.running_version() == "1.1.0"
    st = device.status()
    assert st["RAUC_SYSTEM_BOOTED_BOOTNAME"] == "B"
    assert not device.nvb_state()["slots"][1]["successful"]

    h = device.health(qual_rc=0)
    assert h.returncode == 0, h.stdout
    assert not h.reboot_requested
    args = (device.w / "qual-args").read_text().split("\n")
    assert args[:2] == ["--base-url", "http://127.0.0.1:8080"], args
    assert "api.readyz.ready" in args[args.index("--filter") + 1].split(",")
    nvb = device.nvb_state()
    assert nvb["slots"][1]["successful"] and nvb["slots"][1]["retry_count"] == 3
    assert device.primary() == "B" and device.boot_state("B") == "good"
    # Confirmed: later boots stay on B.
    assert device.reboot() == "B"
    assert device.reboot() == "B"


def ota_sha(path):
    import ota
    return ota.sha256_file(path)


def test_b_wrong_compatible_is_refused(world, device):
    a = slot_a_before(device)
    assert_refused(device, world.bundles["wrong-compatible"], "Compatible mismatch", a)


def test_c_flipped_byte_is_refused(world, device, tmp_path):
    bad = tmp_path / "flipped.raucb"
    shutil.copy(world.bundles["good-1.1.0"], bad)
    with open(bad, "r+b") as f:
        f.seek(4096 + 100)  # inside the squashfs payload, far from the signature at the end
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    a = slot_a_before(device)
    p = assert_refused(device, bad, "ailed", a)
    assert "signature" in p.stdout.lower() or "verif" in p.stdout.lower(), p.stdout


def test_d_untrusted_signer_is_refused(world, device):
    a = slot_a_before(device)
    p = assert_refused(device, world.bundles["untrusted-signer"], "ailed", a)
    assert "verif" in p.stdout.lower() or "issuer" in p.stdout.lower(), p.stdout


def test_e_older_version_is_refused_unless_allowed_once(world, device):
    a = slot_a_before(device)
    p = assert_refused(device, world.bundles["older-0.9.0"], "handler", a)
    assert device.nvb_state()["slots"][1]["unbootable"] is False, "B touched before the handler"
    log = device.service_log()
    assert "refusing downgrade: bundle version 0.9.0 is older than the running image 1.0.0" in (
        p.stdout + log), p.stdout + log
    # The flag allows one downgrade and is used up by it.
    device.allow_downgrade.touch()
    p = device.install(world.bundles["older-0.9.0"])
    assert p.returncode == 0, p.stdout
    assert not device.allow_downgrade.exists()
    assert device.primary() == "B"


@pytest.mark.large_slots
def test_f_kill_during_write_keeps_a_and_reinstall_succeeds(world, device):
    runs = int(os.environ.get("OTA_KILL_RUNS", "3"))
    bundle = world.bundles["large-1.2.0"]
    img = world.images["large"]["image"]
    img_sha = ota_sha(img)
    a = slot_a_before(device)
    rnd = random.Random(int(os.environ.get("OTA_KILL_SEED", "15")))
    tally = {"killed mid-write": 0, "killed after the last write": 0, "A kept": 0,
             "re-install ok": 0}
    installs = []
    for i in range(runs):
        frac = rnd.uniform(0.1, 0.7)
        if i:
            # Back to "A is primary" (the last run installed B): as an operator would undo it.
            device.rauc("status", "mark-active", "booted", check=True)
            assert device.primary() == "A"
        rc, out, written = device.install_and_kill(bundle, frac)
        # Writes land in the page cache at ~1 GB/s, so a kill may come after the last
        # write() but before RAUC synced the slot and switched it: still an interrupted
        # install. What must never happen is an install that completed.
        assert rc != 0 and "succeeded" not in out, out
        assert written > 0, f"run {i}: killed before writing"
        tally["killed mid-write" if written < img.stat().st_size else "killed after the last write"] += 1
        # The service is gone; what the bootloader will do is what counts.
        assert device.primary() == "A", f"run {i}: {device.nvb_state()}"
        assert device.boot_state("B") == "bad"
        assert device.slot_hash("A") == a
        assert device.power_on() == "A"
        tally["A kept"] += 1
        t = time.monotonic()
        p = device.install(bundle)
        installs.append(time.monotonic() - t)
        assert p.returncode == 0, p.stdout
        assert device.primary() == "B"
        assert device.slot_hash("B", img.stat().st_size) == img_sha
        tally["re-install ok"] += 1
    world.timings["install large (mean)"] = sum(installs) / len(installs)
    world.timings[f"kill runs ({runs}): " + ", ".join(f"{k} {v}" for k, v in tally.items())] = 0.0
    print(f"kill tally over {runs} runs: {tally}; installs {[round(x, 1) for x in installs]} s")


def test_g_failed_health_marks_bad_and_falls_back(world, device):
    assert device.install(world.bundles["good-1.1.0"]).returncode == 0
    assert device.reboot() == "B"
    h = device.health(qual_rc=1)
    assert h.returncode != 0
    assert h.reboot_requested, h.stdout
    assert "marking slot B bad" in h.stdout, h.stdout
    assert device.boot_state("B") == "bad"
    assert device.reboot() == "A"
    assert device.running_version() == "1.0.0"
    assert device.primary() == "A"


def test_g1_a_daemon_that_failed_for_good_fails_health_at_once(world, device):
    # The update's weights pin is wrong, say: inferloopd exits 3 and is not restarted.
    assert device.install(world.bundles["good-1.1.0"]).returncode == 0
    assert device.reboot() == "B"
    h = device.health(qual_rc=0, daemon_exit=3)
    assert h.returncode != 0 and h.reboot_requested, h.stdout
    assert "inferloopd.service failed with exit status 3" in h.stdout, h.stdout
    assert not (device.w / "qual-args").exists(), "the smoke set ran against a dead daemon"
    assert device.boot_state("B") == "bad"
    assert device.reboot() == "A"


def test_g2_health_failure_of_a_confirmed_image_keeps_the_slot(world, device):
    assert device.install(world.bundles["good-1.1.0"]).returncode == 0
    assert device.reboot() == "B"
    assert device.health(qual_rc=0).returncode == 0
    h = device.health(qual_rc=1)
    assert h.returncode != 0 and not h.reboot_requested, h.stdout
    assert "already passed" in h.stdout
    assert device.boot_state("B") == "good" and device.reboot() == "B"


def test_h_never_confirmed_falls_back_after_its_tries(world, device):
    assert device.install(world.bundles["good-1.1.0"]).returncode == 0
    boots = [device.reboot() for _ in range(4)]
    # Three unconfirmed tries of B (retry count 3), then UEFI gives up on it.
    assert boots == ["B", "B", "B", "A"], boots
    assert device.boot_state("B") == "bad"
    assert device.reboot() == "A"


def test_i_install_over_http(world, device):
    bundle = world.bundles["good-1.1.0"]
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(bundle.parent))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{bundle.name}"
        p = device.install(url)
        assert p.returncode == 0, p.stdout
    finally:
        server.shutdown()
        server.server_close()
    assert device.primary() == "B"
    img = world.images["v1.1.0"]["image"]
    assert device.slot_hash("B", img.stat().st_size) == ota_sha(img)
    assert device.reboot() == "B"


def fill(directory):
    """Writes a filler file into `directory` until its file system has no byte left."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    probe = directory / "probe"
    with pytest.raises(OSError):
        probe.write_bytes(b"x" * 4096)
    probe.unlink(missing_ok=True)


def test_l_a_full_or_read_only_data_partition_fails_the_install_cleanly(world, device):
    """/data full, then read-only. RAUC keeps its slot status there (data-directory=): it
    writes the other slot, cannot record it, and fails the install. A stays primary and
    booted, B is not bootable, and what was already on /data is unchanged. With space again
    the same bundle installs. (The OTA agent downloads bundles to /data; that download
    failing on a full disk is ota/tests/it/download.rs. Here the bundle lies elsewhere.)"""
    import ota
    data = device.w / "data"
    a = slot_a_before(device)
    bundle = world.bundles["good-1.1.0"]
    device.stop_service()
    ota.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", data])
    kept = [data / "models/model.gguf", data / "health-passed"]
    kept[0].parent.mkdir()
    kept[0].write_bytes(ota.MODEL_BYTES)
    kept[1].write_text("1.0.0\n")
    before = [ota.sha256_file(f) for f in kept]
    fill(data)

    for how, cause in [("full", "No space left on device"), ("read-only", "Read-only file system")]:
        if how == "read-only":
            device.stop_service()
            ota.run(["mount", "-o", "remount,ro", data])
        assert device.power_on() == "A"
        p = device.install(bundle)
        assert p.returncode != 0, f"/data {how}: {p.stdout}"
        assert "Error while writing status file" in p.stdout and cause in p.stdout, p.stdout
        assert device.service.poll() is None, "the rauc service died"
        assert device.primary() == "A" and device.boot_state("B") == "bad", device.nvb_state()
        assert device.slot_hash("A") == a
        assert [ota.sha256_file(f) for f in kept] == before, f"/data {how}: a kept file changed"
        assert not list(data.glob("central.raucs*")), list(data.iterdir())
        assert device.reboot() == "A"

    device.stop_service()
    ota.run(["mount", "-o", "remount,rw", data])
    (data / "filler").unlink()
    device.power_on()
    p = device.install(bundle)
    assert p.returncode == 0, p.stdout
    assert device.primary() == "B"
    img = world.images["v1.1.0"]["image"]
    assert device.slot_hash("B", img.stat().st_size) == ota_sha(img)
    assert (data / "central.raucs").exists()
    assert [ota.sha256_file(f) for f in kept] == before


def test_j_verity_bundle_info_and_extract(world, tmp_path):
    import ota
    bundle = world.bundles["verity-1.1.0"]
    # The device's config: its keyring with check-purpose=codesign, which the signer needs.
    conf = tmp_path / "system.conf"
    ota.run([ota.IMAGE_TOOL, "rauc-conf", "--board", ota.BOARD, "--keyring",
             world.keys / "ca.cert.pem", "--data-dir", tmp_path / "data", "--out", conf])
    info = ota.run(["rauc", f"--conf={conf}", "info", bundle])
    assert "verity" in info.stdout and "1.1.0" in info.stdout, info.stdout
    ota.run(["rauc", f"--conf={conf}", "extract", bundle, tmp_path / "good"])
    img = world.images["v1.1.0"]["image"]
    extracted = next((tmp_path / "good").glob("*.squashfs"))
    assert ota_sha(extracted) == ota_sha(img)

    bad = tmp_path / "flipped.raucb"
    shutil.copy(bundle, bad)
    with open(bad, "r+b") as f:
        f.seek(8192)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    # The signature covers the manifest (and with it the verity root hash), not each block:
    # info still accepts the bundle, reading the payload does not.
    assert ota.run(["rauc", f"--conf={conf}", "info", bad], check=False).returncode == 0
    p = ota.run(["rauc", f"--conf={conf}", "extract", bad, tmp_path / "bad"], check=False)
    assert p.returncode != 0, p.stdout
    assert not list((tmp_path / "bad").glob("*.squashfs")) or "rror" in p.stdout, p.stdout


def test_k_rauc_service_wrapper_passes_the_slot_nvbootctrl_booted(tmp_path):
    """rootfs' rauc.service drop-in: RAUC 1.8 learns the booted slot from nvbootctrl."""
    here = os.path.dirname(os.path.abspath(__file__))
    wrapper = os.path.join(here, "../../rootfs/usr/lib/inferloop/rauc-service")
    fake_nvb = os.path.join(here, "fake-nvbootctrl")
    fake_rauc = tmp_path / "rauc"
    fake_rauc.write_text('#!/bin/sh\necho "rauc $*"\n')
    fake_rauc.chmod(0o755)
    cmdline = tmp_path / "cmdline"
    cmdline.write_text("console=ttyTCU0 root=/dev/nvme0n1p1 ro\n")
    state = tmp_path / "nvb.json"
    env = {**os.environ, "FAKE_NVBOOTCTRL_STATE": str(state), "INFERLOOP_NVBOOTCTRL": fake_nvb,
           "INFERLOOP_RAUC": str(fake_rauc), "INFERLOOP_CMDLINE": str(cmdline)}
    import subprocess
    subprocess.run([fake_nvb, "-t", "rootfs", "init"], env=env, check=True, capture_output=True)
    out = subprocess.run([wrapper], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "rauc --mount=/run/rauc service --override-boot-slot=A", out.stdout
    subprocess.run([fake_nvb, "-t", "rootfs", "set-active-boot-slot", "1"], env=env, check=True)
    subprocess.run([fake_nvb, "-t", "rootfs", "boot"], env=env, check=True, capture_output=True)
    out = subprocess.run([wrapper], env=env, capture_output=True, text=True)
    assert out.stdout.strip().endswith("--override-boot-slot=B"), out.stdout
    # A bootloader that passes rauc.slot= wins: RAUC reads it itself.
    cmdline.write_text("root=/dev/nvme0n1p2 rauc.slot=B\n")
    out = subprocess.run([wrapper], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "rauc --mount=/run/rauc service", out.stdout
    # nvbootctrl failing is a clear error, not a service started on a guessed slot.
    env["INFERLOOP_NVBOOTCTRL"] = "/bin/false"
    cmdline.write_text("root=/dev/nvme0n1p1\n")
    out = subprocess.run([wrapper], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "get-current-slot' failed" in out.stderr, out.stderr
