"""The OTA harness: real RAUC against two loop-device slots and a fake nvbootctrl.

A `World` holds what every case shares and builds once: signing keys (scripts/ota-keys.sh),
images (`inferloop-image build`), bundles (`inferloop-image bundle`) and the RAUC config
(`inferloop-image rauc-conf`, its handler paths pointed at this checkout's rootfs/ scripts).

A `Device` is one emulated board: a system D-Bus on a socket in its own directory, two slot
files behind loop devices, the fake bootloader's state file (tests/ota/fake-nvbootctrl) and
`rauc service` in its own mount namespace, told which slot it booted from with
`--override-boot-slot` (RAUC 1.8 reads it from the kernel command line otherwise).
A "reboot" stops the service, lets the fake bootloader choose the slot as UEFI would, and
starts the service again on that slot, with the manifest of the image in that slot as the
"running" one (the pre-install handler reads its version).

`python3 tests/ota/ota.py demo OUTDIR` is `make ota-demo`: install, reboot, mark-good,
printing `rauc status` after each step.
"""

import contextlib
import hashlib
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ROOTFS = REPO / "rootfs"
IMAGE_TOOL = Path(os.environ.get("INFERLOOP_IMAGE", REPO / "target/release/inferloop-image"))
FAKE_NVBOOTCTRL = HERE / "fake-nvbootctrl"
FAKE_QUAL = HERE / "fake-qual"
FAKE_SYSTEMCTL = HERE / "fake-systemctl"
BOARD = "jetson-orin-nx-16gb"
OTHER_BOARD = "jetson-orin-nano-8gb"
EPOCH = "1700000000"
MODEL_BYTES = b"GGUF fake weights for the OTA tests"
# Slot sizes: small images, and the large one (>= 200 MiB of random bytes) plus headroom.
SLOT_BYTES = 32 * 1024 * 1024
LARGE_SLOT_BYTES = 320 * 1024 * 1024
LARGE_PAD_BYTES = 210 * 1024 * 1024


def run(cmd, check=True, env=None, timeout=300, **kw):
    """Runs cmd, returns CompletedProcess with text output (stdout+stderr merged)."""
    p = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env, timeout=timeout, **kw,
    )
    if check and p.returncode != 0:
        raise RuntimeError(f"{shlex.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout}")
    return p


def sha256_file(path, limit=None):
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as f:
        while True:
            n = 4 << 20 if left is None else min(4 << 20, left)
            if n == 0:
                break
            b = f.read(n)
            if not b:
                break
            h.update(b)
            if left is not None:
                left -= len(b)
    return h.hexdigest()


def fake_elf(machine=0xB7):
    """The 64-byte ELF header of inferloop_image::elf::fake_header: 64-bit LE, ET_EXEC."""
    h = bytearray(64)
    h[0:4] = b"\x7fELF"
    h[4], h[5], h[6], h[16] = 2, 1, 1, 2
    h[18:20] = machine.to_bytes(2, "little")
    return bytes(h)


class World:
    """Keys, images, bundles and the RAUC config shared by every case."""

    def __init__(self, root: Path, log=print):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.keys = self.root / "keys"
        self.stranger = self.root / "stranger-keys"
        self.images = {}
        self.bundles = {}
        self.timings = {}

    # -- keys ---------------------------------------------------------------------------
    def make_keys(self):
        for d in (self.keys, self.stranger):
            run([REPO / "scripts/ota-keys.sh", d])

    # -- images -------------------------------------------------------------------------
    def _fixture(self):
        fx = self.root / "fixture"
        if fx.exists():
            return fx
        base = fx / "base"
        (base / "etc").mkdir(parents=True)
        (base / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (base / "etc/group").write_text("root:x:0:\n")
        (base / "tmp").mkdir(mode=0o1777)
        os.chmod(base / "tmp", 0o1777)
        daemon = fx / "inferloopd"
        daemon.write_bytes(fake_elf() + b"fake inferloopd for the OTA tests")
        daemon.chmod(0o755)
        return fx

    def _large_base(self):
        """The base plus an incompressible file, so the squashfs is >= 200 MiB."""
        fx = self._fixture()
        big = fx / "base-large"
        if not big.exists():
            shutil.copytree(fx / "base", big, symlinks=True)
            (big / "var/lib/pad").mkdir(parents=True)
            rnd = random.Random(15)
            with open(big / "var/lib/pad/random.bin", "wb") as f:
                left = LARGE_PAD_BYTES
                while left:
                    n = min(left, 8 << 20)
                    f.write(rnd.randbytes(n))
                    left -= n
        return big

    def spec(self, name, version, board=BOARD, large=False):
        fx = self._fixture()
        base = self._large_base() if large else fx / "base"
        sha = hashlib.sha256(MODEL_BYTES).hexdigest()
        text = f"""board = "{board}"
version = "{version}"
format = "squashfs"
base = "{base}"
overlay = "{ROOTFS}"
memory_max = "6G"

[daemon]
path = "{fx / 'inferloopd'}"
version = "0.1.0"

[model]
mount = "/data/models/model.gguf"
sha256 = "{sha}"
size = {len(MODEL_BYTES)}

[config]
port = 8080
slots = 2
"""
        path = fx / f"{name}.toml"
        path.write_text(text)
        return path

    def build_image(self, name, version, board=BOARD, large=False):
        spec = self.spec(name, version, board, large)
        out = self.root / "images" / name
        t = time.monotonic()
        env = dict(os.environ, SOURCE_DATE_EPOCH=EPOCH)
        run([IMAGE_TOOL, "--quiet", "build", "--spec", spec, "--out", out], env=env, timeout=600)
        self.timings[f"build {name}"] = time.monotonic() - t
        img = out / "root.squashfs"
        if not img.exists():
            img = next(out.glob("*.squashfs"))
        self.images[name] = {"spec": spec, "dir": out, "image": img, "version": version}
        return self.images[name]

    # -- bundles ------------------------------------------------------------------------
    def bundle(self, name, image, keys=None, fmt="plain"):
        keys = keys or self.keys
        im = self.images[image]
        out = self.root / "bundles" / f"{name}.raucb"
        out.parent.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        out.unlink(missing_ok=True)
        run([IMAGE_TOOL, "--quiet", "bundle", "--spec", im["spec"], "--image", im["dir"],
             "--cert", keys / "signing.cert.pem", "--key", keys / "signing.key.pem",
             "--keyring", keys / "ca.cert.pem", "--format", fmt, "--out", out], timeout=600)
        self.timings[f"bundle {name}"] = time.monotonic() - t
        self.bundles[name] = out
        return out

    # -- config -------------------------------------------------------------------------
    def system_conf(self, slot_a, slot_b, data_dir, out):
        """`inferloop-image rauc-conf` for these loop devices, handlers from this checkout."""
        run([IMAGE_TOOL, "rauc-conf", "--board", BOARD,
             "--slot-device", f"rootfs.0={slot_a}", "--slot-device", f"rootfs.1={slot_b}",
             "--keyring", self.keys / "ca.cert.pem", "--data-dir", data_dir, "--out", out])
        text = Path(out).read_text()
        text = text.replace("/usr/lib/inferloop/", f"{ROOTFS}/usr/lib/inferloop/")
        # HTTP installs download the whole bundle first (no streaming without nbd here);
        # RAUC's default limit is 8 MiB.
        if "max-bundle-download-size" not in text:
            text = text.replace("[system]\n", "[system]\nmax-bundle-download-size=1073741824\n", 1)
        Path(out).write_text(text)
        return text


class Device:
    """One emulated board: D-Bus, loop-device slots, fake bootloader, rauc service."""

    def __init__(self, world: World, workdir: Path, log=print, slot_bytes=SLOT_BYTES):
        self.world = world
        self.slot_bytes = slot_bytes
        self.w = Path(workdir)
        self.w.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.loops = []
        self.service = None
        self.dbus_pid = None
        self.booted = None
        self.bus = self.w / "bus"
        self.state = self.w / "nvbootctrl.json"
        self.running_manifest = self.w / "running-manifest.json"
        self.allow_downgrade = self.w / "allow-downgrade"
        self.tmp = self.w / "tmp"
        self.mnt = self.w / "mnt"
        self.env = dict(
            os.environ,
            DBUS_SYSTEM_BUS_ADDRESS=f"unix:path={self.bus}",
            INFERLOOP_NVBOOTCTRL=str(FAKE_NVBOOTCTRL),
            FAKE_NVBOOTCTRL_STATE=str(self.state),
            INFERLOOP_MANIFEST=str(self.running_manifest),
            INFERLOOP_ALLOW_DOWNGRADE=str(self.allow_downgrade),
            TMPDIR=str(self.tmp),
        )

    # -- set-up -------------------------------------------------------------------------
    def start(self, slot_a_image):
        """A freshly flashed board: slot A holds slot_a_image, booted from A."""
        self.tmp.mkdir(exist_ok=True)
        self.mnt.mkdir(exist_ok=True)
        for name in ("slotA.img", "slotB.img"):
            with open(self.w / name, "wb") as f:
                f.truncate(self.slot_bytes)
        with open(self.w / "slotA.img", "r+b") as f, open(slot_a_image, "rb") as src:
            shutil.copyfileobj(src, f, 4 << 20)
        for name in ("slotA.img", "slotB.img"):
            dev = run(["losetup", "-f", "--show", self.w / name]).stdout.strip()
            self.loops.append(dev)
        self.slot_a, self.slot_b = self.loops
        self.conf = self.w / "system.conf"
        (self.w / "data").mkdir(exist_ok=True)
        self.world.system_conf(self.slot_a, self.slot_b, self.w / "data", self.conf)
        out = run(["dbus-daemon", "--config-file=/usr/share/dbus-1/system.conf",
                   f"--address=unix:path={self.bus}", "--nopidfile", "--fork", "--print-pid"],
                  env=self.env).stdout
        self.dbus_pid = int(out.split()[0])
        self.nvb("init")
        self.power_on()

    def nvb(self, *args):
        return run([FAKE_NVBOOTCTRL, *args], env=self.env).stdout.strip()

    def nvb_state(self):
        return json.loads(self.state.read_text())

    def slot_dev(self, bootname):
        return self.slot_a if bootname == "A" else self.slot_b

    # -- the service --------------------------------------------------------------------
    def start_service(self, booted):
        assert self.service is None
        log = open(self.w / "service.log", "a")
        log.write(f"\n--- rauc service, booted {booted} ---\n")
        log.flush()
        self.service = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private",
             "rauc", f"--conf={self.conf}", f"--mount={self.mnt}", "service",
             f"--override-boot-slot={booted}"],
            stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.service.poll() is not None:
                raise RuntimeError(f"rauc service exited {self.service.returncode}:\n{self.service_log()}")
            if run(["rauc", "status"], check=False, env=self.env, timeout=10).returncode == 0:
                self.booted = booted
                return
            time.sleep(0.1)
        raise RuntimeError(f"rauc service did not answer on D-Bus:\n{self.service_log()}")

    def service_log(self):
        return (self.w / "service.log").read_text()

    def stop_service(self, sig=signal.SIGTERM):
        if self.service is None:
            return
        if self.service.poll() is None:
            self.service.send_signal(sig)
            try:
                self.service.wait(10)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait(10)
        self.service = None

    # -- boots --------------------------------------------------------------------------
    def power_on(self):
        """UEFI's choice (fake-nvbootctrl boot), then the service on that slot."""
        booted = self.nvb("boot")
        dev = self.slot_dev(booted)
        p = run(["unsquashfs", "-cat", dev, "etc/inferloop/manifest.json"], check=False)
        if p.returncode == 0:
            self.running_manifest.write_text(p.stdout)
        else:
            self.running_manifest.unlink(missing_ok=True)
        self.start_service(booted)
        return booted

    def reboot(self):
        self.stop_service()
        return self.power_on()

    def running_version(self):
        return json.loads(self.running_manifest.read_text())["image"]["version"]

    # -- rauc ---------------------------------------------------------------------------
    def rauc(self, *args, check=False, timeout=300):
        return run(["rauc", *map(str, args)], check=check, env=self.env, timeout=timeout)

    def install(self, bundle, check=False):
        return self.rauc("install", bundle, check=check, timeout=600)

    def status(self):
        """`rauc status --output-format=shell` as a dict."""
        out = self.rauc("status", "--detailed", "--output-format=shell", check=True).stdout
        d = {}
        for line in out.splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                d[k] = shlex.split(v)[0] if v else ""
        return d

    def primary(self):
        return self.rauc_bootloader("get-primary")

    def boot_state(self, bootname):
        return self.rauc_bootloader("get-state", bootname)

    def rauc_bootloader(self, *args):
        return run([ROOTFS / "usr/lib/inferloop/rauc-bootloader", *args], env=self.env).stdout.strip()

    def slot_hash(self, bootname, length=None):
        return sha256_file(self.slot_dev(bootname), length)

    def health(self, qual_rc=0, daemon_exit=None):
        """Runs rootfs/usr/lib/inferloop/inferloop-health with a stand-in inferloop-qual;
        `daemon_exit` N: inferloopd's unit has failed for good with exit status N."""
        (self.w / "qual-args").unlink(missing_ok=True)
        env = dict(
            self.env,
            INFERLOOP_QUAL=str(FAKE_QUAL),
            FAKE_QUAL_RC=str(qual_rc),
            SYSTEMCTL=str(FAKE_SYSTEMCTL),
            FAKE_DAEMON_EXIT="" if daemon_exit is None else str(daemon_exit),
            FAKE_QUAL_ARGS=str(self.w / "qual-args"),
            INFERLOOP_HEALTH_SMOKE=str(ROOTFS / "etc/inferloop/health-smoke.txt"),
            INFERLOOP_CONFIG=str(self.w / "no-config.toml"),
            INFERLOOP_HEALTH_STATE=str(self.w / "data/health-passed"),
            INFERLOOP_REBOOT=f"touch {self.w / 'reboot-requested'}",
            INFERLOOP_HEALTH_TIMEOUT="30",
        )
        (self.w / "reboot-requested").unlink(missing_ok=True)
        p = run([ROOTFS / "usr/lib/inferloop/inferloop-health"], check=False, env=env, timeout=120)
        p.reboot_requested = (self.w / "reboot-requested").exists()
        return p

    # -- the kill test ------------------------------------------------------------------
    def install_and_kill(self, bundle, fraction):
        """Starts an install, SIGKILLs the service once it wrote `fraction` of the image."""
        image_bytes = os.path.getsize(bundle)
        client = subprocess.Popen(["rauc", "install", str(bundle)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=self.env)
        # The service is `unshare` exec'ing rauc: the same pid.
        pid = self.service.pid
        def wchar():
            io = Path(f"/proc/{pid}/io").read_text()
            return int(next(l for l in io.splitlines() if l.startswith("wchar:")).split()[1])

        # The service may have written before (an earlier install): count from now.
        base = wchar()
        target = int(image_bytes * fraction)
        written = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and client.poll() is None:
            try:
                written = wchar() - base
            except (OSError, StopIteration):
                pass
            if written >= target:
                break
            time.sleep(0.001)
        os.kill(pid, signal.SIGKILL)
        self.service.wait(10)
        self.service = None
        out = client.communicate(timeout=60)[0]
        return client.returncode, out, written

    # -- tear-down ----------------------------------------------------------------------
    def close(self):
        errors = []
        with contextlib.suppress(Exception):
            self.stop_service(signal.SIGKILL)
        if self.dbus_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.dbus_pid, signal.SIGTERM)
            self.dbus_pid = None
        # A bundle mount could only have leaked into the service's own namespace, gone with
        # it; unmount anything left under the work dir in ours all the same.
        for line in reversed(Path("/proc/self/mounts").read_text().splitlines()):
            mp = line.split()[1]
            if mp.startswith(str(self.w) + "/"):
                if run(["umount", "-l", mp], check=False).returncode != 0:
                    errors.append(f"umount {mp}")
        for dev in self.loops:
            if run(["losetup", "-d", dev], check=False).returncode != 0:
                errors.append(f"losetup -d {dev}")
        self.loops = []
        for name in ("slotA.img", "slotB.img"):
            (self.w / name).unlink(missing_ok=True)
        return errors


def show(dev, title):
    print(f"\n=== {title} ===", flush=True)
    print(dev.rauc("status").stdout.rstrip())
    print("nvbootctrl -t rootfs dump-slots-info:")
    print(dev.nvb("-t", "rootfs", "dump-slots-info"), flush=True)


def demo(outdir):
    """make ota-demo: keys, two image versions and bundles, install -> reboot -> mark-good."""
    world = World(Path(outdir).resolve())
    print(f"building keys, images 1.0.0 and 1.1.0 and their bundles into {world.root}", flush=True)
    world.make_keys()
    world.build_image("v1.0.0", "1.0.0")
    world.build_image("v1.1.0", "1.1.0")
    world.bundle("inferloop-1.0.0", "v1.0.0")
    b = world.bundle("inferloop-1.1.0", "v1.1.0")
    dev = Device(world, Path(tempfile.mkdtemp(prefix="ota-demo-", dir="/tmp")))
    try:
        dev.start(world.images["v1.0.0"]["image"])
        print(f"\n$ rauc info {b.name}")
        print(dev.rauc(f"--conf={dev.conf}", "info", b, check=True).stdout.rstrip())
        show(dev, "flashed: booted A (1.0.0)")
        print(f"\n$ rauc install {b}", flush=True)
        t = time.monotonic()
        p = dev.install(b, check=True)
        print(p.stdout.rstrip())
        print(f"(installed in {time.monotonic() - t:.1f} s)")
        show(dev, "installed into B, B primary; rebooting")
        booted = dev.reboot()
        show(dev, f"booted {booted} ({dev.running_version()}), not yet confirmed")
        p = dev.health(qual_rc=0)
        print(p.stdout.rstrip())
        show(dev, "after the health check: rauc status mark-good")
    finally:
        errors = dev.close()
        shutil.rmtree(dev.w, ignore_errors=True)
        if errors:
            print("cleanup problems:", errors, file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "demo":
        demo(sys.argv[2])
    else:
        sys.exit("usage: ota.py demo OUTDIR")
