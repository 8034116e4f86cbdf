"""``vm``: each sandbox is a QEMU virtual machine, forked from a booted snapshot with shared RAM.

The guest (``vm_image``) is Debian's kernel, a small initramfs and a qcow2 disk made from the same
Debian root filesystem the container substrates use; it has no network device. Its init is a
small C agent (``vm_agent.c``) that speaks JSON lines over virtio-serial: exec with a timeout and
bounded output, read and write files, set the clock, reseed randomness, reset in place.

How a sandbox is made (see docs/vm.md for the measurements):

1. Once per machine and recipe, a **base VM** boots with its RAM in a file
   (``memory-backend-file,share=on``), warms its caches, and migrates with ``x-ignore-shared``:
   only device state is saved (about 0.4 MB); the RAM file and the disk overlay it wrote
   (``frozen.qcow2``) are frozen beside it. This **booted snapshot** is cached under
   ``images.cache_dir()/vm-snap-<key>`` (the key covers image, QEMU version, accelerator, memory
   size and machine arguments) and the base VM exits.
2. ``create()`` starts a **fork**: a new QEMU that maps the RAM file privately (copy-on-write,
   ``share=off``: the file never changes), has its own qcow2 overlay on top of ``frozen.qcow2``
   and loads the device state with ``-incoming defer`` + ``migrate-incoming``. The host then
   sets the guest's clock (it resumes at snapshot time) and sends fresh entropy that the agent
   mixes in and forces a CRNG reseed with (``-device vmgenid`` makes the kernel reseed too), so
   siblings never share random bytes.
3. ``destroy()`` kills that QEMU and removes its folder (overlay, pidfile, logs). The command and
   monitor channels are socketpairs handed to QEMU as file descriptors: no socket files exist.

Accelerator: KVM only when a short probe boot under KVM reaches the guest's userspace (cached per
host boot); otherwise software emulation (TCG). ``VmSubstrate.accel`` and the capabilities'
notes say which, because it changes every figure. ``DRUMSBENCH_VM_ACCEL=tcg|kvm`` forces one.
``DRUMSBENCH_VM_CREATE=boot`` makes every sandbox a fresh boot instead of a fork (slow; for
measurement).

Every QEMU process carries ``DRUMSBENCH_RUN=<run id>`` and ``DRUMSBENCH_SANDBOX=<id>`` in its
environment and writes a pidfile under ``<state>/vm/<run id>/<sandbox id>/``, which is how
``leftovers()`` and ``gc`` find them.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drumsbench import images
from drumsbench.errors import SubstrateError
from drumsbench.substrates.base import (
    DEFAULT_OUTPUT_LIMIT,
    Capabilities,
    ExecResult,
    Forking,
    Freezable,
    Isolation,
    ResetStrategy,
    Sandbox,
    SandboxFrozen,
    SandboxPaths,
    Snapshotting,
    Substrate,
)
from drumsbench.substrates.containers import END_ARGV
from drumsbench.substrates.hostproc import kill_pids, pids_with_env
from drumsbench.substrates.vm_image import IMAGE_RECIPE, PROBE_MARK, GuestImage, cache_lock, ensure_image, missing_tools

RUN_VAR = "DRUMSBENCH_RUN"
SANDBOX_VAR = "DRUMSBENCH_SANDBOX"
ACCEL_VAR = "DRUMSBENCH_VM_ACCEL"
CREATE_VAR = "DRUMSBENCH_VM_CREATE"
MEM_MIB = 512
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_ROOT = "/sandbox"
KERNEL_CMDLINE = ("console=ttyS0 quiet loglevel=3 panic=-1 root=/dev/vda i8042.noaux i8042.nokbd tsc=reliable "
                  # Hardening that costs a lot under emulation and guards only processes inside one sandbox
                  # from each other (the VM boundary is what isolates sandboxes):
                  "mitigations=off init_on_alloc=0 randomize_kstack_offset=off apparmor=0 audit=0 "
                  "transparent_hugepage=never psi=0")
# Seconds an answer may take beyond a command's own timeout (software emulation under load is slow).
AGENT_SLACK_S = 30.0
BOOT_TIMEOUT_S = 240.0
FORK_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 10.0
SNAP_RECIPE_VERSION = 1
# Run in the base VM before its snapshot, so every fork starts with these in its page cache.
WARM_UP = (
    "true",
    "python3 -c 'import json, hashlib, unittest, subprocess, base64, os, sys'",
    "git --version >/dev/null",
    "ps -eo args >/dev/null; grep -c x /dev/null; find /sandbox >/dev/null; ls >/dev/null",
)


# -- host facts ---------------------------------------------------------------------------------
_facts_lock = threading.Lock()
_facts: dict[str, Any] = {}


def qemu_version() -> str:
    with _facts_lock:
        if "qemu" not in _facts:
            try:
                out = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True,
                                     timeout=30).stdout
            except (OSError, subprocess.TimeoutExpired) as e:
                raise SubstrateError(f"vm: qemu-system-x86_64 --version failed: {e}") from e
            _facts["qemu"] = out.splitlines()[0].strip() if out else "unknown"
        return str(_facts["qemu"])


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def probe_argv(image: GuestImage, accel: str) -> list[str]:
    """Boot the guest kernel to the initramfs's userspace, print a mark and power off."""
    cpu = ["-cpu", "host"] if accel == "kvm" else []
    return ["qemu-system-x86_64", "-M", "pc", "-accel", accel, *cpu, "-m", "256M", "-nodefaults",
            "-no-user-config", "-display", "none", "-no-reboot", "-kernel", str(image.kernel),
            "-initrd", str(image.initrd), "-append", f"{KERNEL_CMDLINE} drumsbench.probe", "-serial", "stdio"]


def probe_kvm(image: GuestImage) -> tuple[bool, str]:
    """(KVM runs a guest here, why). Cached per host boot, kernel and QEMU version."""
    if not os.path.exists("/dev/kvm"):
        return False, "no /dev/kvm"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "/dev/kvm is not accessible to this user"
    key = hashlib.sha256(f"{_boot_id()}|{qemu_version()}|{image.kernel_version}".encode()).hexdigest()[:12]
    cache = images.cache_dir() / f"vm-kvm-probe-{key}.json"
    with contextlib.suppress(OSError, ValueError):
        got = json.loads(cache.read_text())
        return bool(got["kvm"]), str(got["why"])
    t0 = time.monotonic()
    try:
        proc = subprocess.run(probe_argv(image, "kvm"), capture_output=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        ok = PROBE_MARK.encode() in proc.stdout
        why = (f"a probe boot under KVM reached userspace in {time.monotonic() - t0:.1f} s" if ok else
               f"a probe boot under KVM failed: {proc.stderr.decode(errors='replace').strip()[-200:]}")
    except subprocess.TimeoutExpired:
        ok, why = False, f"a probe boot under KVM did not reach userspace in {PROBE_TIMEOUT_S:g} s"
    except OSError as e:
        ok, why = False, f"a probe boot under KVM could not start: {e}"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"kvm": ok, "why": why}))
    return ok, why


def choose_accel(image: GuestImage) -> tuple[str, str]:
    """("kvm" | "tcg", why)."""
    forced = os.environ.get(ACCEL_VAR, "auto").strip().lower()
    if forced in ("tcg", "kvm"):
        return forced, f"forced by {ACCEL_VAR}={forced}"
    with _facts_lock:
        if "accel" in _facts:
            return _facts["accel"]
    ok, why = probe_kvm(image)
    result = ("kvm", why) if ok else ("tcg", f"software emulation (TCG): {why}")
    with _facts_lock:
        _facts["accel"] = result
    return result


# -- QEMU processes -----------------------------------------------------------------------------
def machine_argv(image: GuestImage, accel: str, *, ram: Path, share: bool, disk: Path, ctl_fd: int,
                 qmp_fd: int, console: Path, name: str, pidfile: Path, cache: str) -> list[str]:
    """The QEMU command line; base VM and forks differ only in files, sharing and incoming."""
    accel_args = ["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else ["-accel", "tcg,tb-size=96"]
    return [
        "qemu-system-x86_64", "-name", name, "-M", "pc,memory-backend=mem", *accel_args,
        "-smp", "1", "-m", f"{MEM_MIB}M",
        "-object", f"memory-backend-file,id=mem,size={MEM_MIB}M,mem-path={ram},share={'on' if share else 'off'}",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", KERNEL_CMDLINE,
        "-drive", f"file={disk},if=none,id=d0,format=qcow2,cache={cache},discard=unmap",
        "-device", "virtio-blk-pci,drive=d0",
        "-device", "virtio-serial-pci",
        "-chardev", f"socket,id=c0,fd={ctl_fd}", "-device", "virtserialport,chardev=c0,name=ctl",
        "-chardev", f"socket,id=qmp,fd={qmp_fd}", "-mon", "chardev=qmp,mode=control",
        "-serial", f"file:{console}", "-device", "vmgenid,guid=auto", "-nic", "none",
        "-pidfile", str(pidfile),
    ]


def snapshot_key(image: GuestImage, accel: str) -> str:
    probe = machine_argv(image, accel, ram=Path("R"), share=True, disk=Path("D"), ctl_fd=0, qmp_fd=0,
                         console=Path("C"), name="N", pidfile=Path("P"), cache="X")
    recipe = {"image": image.key, "qemu": qemu_version(), "accel": accel, "mem": MEM_MIB, "argv": probe,
              "warm": WARM_UP, "version": SNAP_RECIPE_VERSION}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


_live: set[subprocess.Popen[bytes]] = set()
_live_lock = threading.Lock()


def _kill_live() -> None:
    """At interpreter exit (including Ctrl-C): no QEMU started by this process survives it."""
    with _live_lock:
        procs = list(_live)
    for p in procs:
        with contextlib.suppress(OSError):
            p.kill()
        with contextlib.suppress(Exception):
            p.wait(timeout=5)


atexit.register(_kill_live)


class AgentError(Exception):
    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno


class Channel:
    """JSON lines to and from the guest agent over one socket; calls may run concurrently."""

    def __init__(self, sock: socket.socket, label: str) -> None:
        self.sock = sock
        self.label = label
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self._next = 0
        self.closed: str | None = None
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"vm-agent-{label}")
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        why = "the guest agent closed its channel (the VM exited)"
        try:
            while True:
                chunk = self.sock.recv(1 << 18)
                if not chunk:
                    break
                buf += chunk
                while True:
                    nl = buf.find(b"\n")
                    if nl < 0:
                        break
                    line, buf = buf[:nl], buf[nl + 1:]
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        continue
                    with self._lock:
                        waiter = self._pending.pop(msg.get("id"), None)
                    if waiter is not None:
                        waiter[1].append(msg)
                        waiter[0].set()
        except OSError as e:
            why = f"the guest agent's channel failed: {e}"
        with self._lock:
            self.closed = self.closed or why
            waiters, self._pending = list(self._pending.values()), {}
        for event, _ in waiters:
            event.set()

    def call(self, op: str, wait: float, **args: Any) -> dict[str, Any]:
        """The agent's answer; ``AgentError`` when it answered with an error, ``SubstrateError``
        when it did not answer at all."""
        event: threading.Event = threading.Event()
        box: list[dict[str, Any]] = []
        with self._lock:
            if self.closed:
                raise SubstrateError(f"vm {self.label}: {self.closed}")
            self._next += 1
            rid = self._next
            self._pending[rid] = (event, box)
        data = (json.dumps({"id": rid, "op": op, **args}, separators=(",", ":")) + "\n").encode()
        try:
            with self._send_lock:
                self.sock.sendall(data)
        except OSError as e:
            with self._lock:
                self._pending.pop(rid, None)
            raise SubstrateError(f"vm {self.label}: cannot reach the guest agent: {e}") from e
        if not event.wait(wait):
            with self._lock:
                self._pending.pop(rid, None)
            raise SubstrateError(f"vm {self.label}: the guest agent did not answer {op!r} within {wait:g} s")
        if not box:
            raise SubstrateError(f"vm {self.label}: {self.closed or 'no answer'}")
        msg = box[0]
        if not msg.get("ok"):
            raise AgentError(str(msg.get("error")), msg.get("errno"))
        return msg

    def close(self) -> None:
        with self._lock:
            self.closed = self.closed or "closed by the host"
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


class Qmp:
    """A minimal QMP client over a socket (used only while starting and snapshotting)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.file = sock.makefile("rwb")
        self.lock = threading.Lock()
        self.shutdown: dict[str, Any] | None = None  # the data of QEMU's SHUTDOWN event, once seen

    def send(self, cmd: str, **args: Any) -> None:
        msg: dict[str, Any] = {"execute": cmd}
        if args:
            msg["arguments"] = args
        self.file.write(json.dumps(msg).encode() + b"\n")
        self.file.flush()

    def answer(self) -> dict[str, Any]:
        while True:
            line = self.file.readline()
            if not line:
                raise SubstrateError("vm: QEMU's monitor closed (QEMU exited)")
            msg = json.loads(line)
            if "event" in msg or "QMP" in msg:
                self._note(msg)
                continue
            if "error" in msg:
                raise SubstrateError(f"vm: QEMU monitor: {msg['error'].get('desc', msg['error'])}")
            return msg

    def cmd(self, cmd: str, **args: Any) -> dict[str, Any]:
        with self.lock:
            self.send(cmd, **args)
            return self.answer()

    def _note(self, msg: dict[str, Any]) -> None:
        if msg.get("event") == "SHUTDOWN":
            self.shutdown = dict(msg.get("data") or {})

    def last_words(self, wait: float = 2.0) -> dict[str, Any] | None:
        """After QEMU exited: read what its monitor still holds, and return the SHUTDOWN event's
        data (``{"guest": bool, "reason": ...}``) if QEMU sent one (a SIGKILL leaves none)."""
        if not self.lock.acquire(timeout=wait):
            return self.shutdown
        try:
            self.sock.settimeout(wait)
            while True:
                line = self.file.readline()
                if not line:
                    break
                with contextlib.suppress(ValueError):
                    self._note(json.loads(line))
        except (OSError, ValueError):
            pass
        finally:
            self.lock.release()
        return self.shutdown

    def send_fd(self, name: str, fd: int) -> None:
        """``getfd``: hand QEMU a file descriptor (SCM_RIGHTS) under ``name``."""
        with self.lock:
            msg = json.dumps({"execute": "getfd", "arguments": {"fdname": name}}).encode() + b"\n"
            socket.send_fds(self.sock, [msg], [fd])
            self.answer()

    def wait_migration(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            status = self.cmd("query-migrate")["return"].get("status")
            if status == "completed":
                return
            if status in ("failed", "cancelled") or time.monotonic() > deadline:
                raise SubstrateError(f"vm: migration {status or 'did not start'}")
            time.sleep(0.01)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
        with contextlib.suppress(OSError):
            self.sock.close()


class Qemu:
    """One QEMU process with its agent channel; labelled with the run and sandbox ids."""

    def __init__(self, argv_for: Any, folder: Path, run_id: str, sid: str, timeout: float,
                 extra_fds: Sequence[int] = ()) -> None:
        self.folder = folder
        self.sid = sid
        ctl_host, ctl_guest = socket.socketpair()
        qmp_host, qmp_guest = socket.socketpair()
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), RUN_VAR: run_id, SANDBOX_VAR: sid}
        argv = argv_for(ctl_guest.fileno(), qmp_guest.fileno())
        self.log = folder / "qemu.log"
        try:
            with open(self.log, "wb") as log:
                self.proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                    pass_fds=(ctl_guest.fileno(), qmp_guest.fileno(), *extra_fds), start_new_session=True)
        except OSError as e:
            for s in (ctl_host, ctl_guest, qmp_host, qmp_guest):
                s.close()
            raise SubstrateError(f"vm: cannot start qemu-system-x86_64: {e}") from e
        finally:
            ctl_guest.close()
            qmp_guest.close()
        with _live_lock:
            _live.add(self.proc)
        self.timeout = timeout
        self.disk = folder / "disk.qcow2"  # the top of its disk chain (changes with live snapshots)
        self.qmp = Qmp(qmp_host)
        self.agent = Channel(ctl_host, sid)

    def why_dead(self) -> str:
        code = self.proc.poll()
        with contextlib.suppress(OSError):
            tail = self.log.read_text(errors="replace").strip()[-400:]
            if tail:
                return f"QEMU exit {code}: {tail}"
        return f"QEMU exit {code}"

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=10)
        with _live_lock:
            _live.discard(self.proc)
        self.agent.close()
        self.qmp.close()


# -- the booted snapshot ------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    folder: Path
    image: GuestImage
    accel: str
    accel_why: str
    boot_s: float

    @property
    def ram(self) -> Path:
        return self.folder / "ram"

    @property
    def state(self) -> Path:
        return self.folder / "state"

    @property
    def frozen(self) -> Path:
        return self.folder / "frozen.qcow2"

    @property
    def template(self) -> Path:
        return self.folder / "overlay.qcow2"


_snapshots: dict[str, Snapshot] = {}


def _qemu_img_overlay(backing: Path, path: Path, size: str | None = None) -> None:
    """A qcow2 overlay on ``backing`` (absolute path); with ``size``, ``backing`` need not exist yet."""
    extra = ["-u", str(path), size] if size else [str(path)]
    proc = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(backing.absolute()), "-F", "qcow2",
                           *extra], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SubstrateError(f"vm: qemu-img create overlay failed: {proc.stderr.strip()[-300:]}")


def boot(image: GuestImage, accel: str, folder: Path, run_id: str, sid: str, *, ram: Path, share: bool,
         disk: Path, timeout: float = BOOT_TIMEOUT_S) -> Qemu:
    """Boot a fresh VM from the image; returns once its agent answers."""
    vm = Qemu(lambda c, q: machine_argv(image, accel, ram=ram, share=share, disk=disk, ctl_fd=c, qmp_fd=q,
                                        console=folder / "console.log", name=f"drumsbench-{run_id}-{sid}",
                                        pidfile=folder / "qemu.pid", cache="writeback"),
              folder, run_id, sid, timeout)
    try:
        vm.qmp.cmd("qmp_capabilities")
        vm.agent.call("ping", timeout)
    except (SubstrateError, AgentError) as e:
        why = vm.why_dead()
        vm.kill()
        raise SubstrateError(f"vm: boot failed ({e}); {why}") from e
    return vm


def ensure_snapshot(run_id: str) -> Snapshot:
    """The booted snapshot of this machine's guest, built first if missing (one boot)."""
    image = ensure_image()
    accel, why = choose_accel(image)
    key = snapshot_key(image, accel)
    with _facts_lock:
        if key in _snapshots:
            return _snapshots[key]
    target = images.cache_dir() / f"vm-snap-{key}"
    with cache_lock("vm-snapshot"):
        if not (target / ".complete").exists():
            _prune_snapshots()
            _build_snapshot(image, accel, target, run_id)
        meta = json.loads((target / ".complete").read_text())
        with contextlib.suppress(OSError):
            (target / ".used").touch()
    snap = Snapshot(target, image, accel, why, float(meta.get("boot_s", 0.0)))
    with _facts_lock:
        _snapshots[key] = snap
    return snap


def _prune_snapshots(unused_for_s: float = 2 * 86400) -> None:
    """Remove booted snapshots of other recipes that no process has used for two days (about
    150 MB each); a snapshot in use is touched by every process that uses it."""
    for folder in images.cache_dir().glob("vm-snap-*"):
        stamp = folder / ".used" if (folder / ".used").exists() else folder / ".complete"
        with contextlib.suppress(OSError):
            if time.time() - stamp.stat().st_mtime > unused_for_s:
                shutil.rmtree(folder, ignore_errors=True)


def _build_snapshot(image: GuestImage, accel: str, target: Path, run_id: str) -> None:
    from drumsbench.substrates.vm_image import new_build_dir, publish

    tmp = new_build_dir("vm-snap")
    vm: Qemu | None = None
    try:
        ram, frozen = tmp / "ram", tmp / "frozen.qcow2"
        _qemu_img_overlay(image.disk, frozen)
        t0 = time.monotonic()
        vm = boot(image, accel, tmp, run_id, "base", ram=ram, share=True, disk=frozen)
        boot_s = time.monotonic() - t0
        for d in ("work", "home", "tmp", "verify"):
            vm.agent.call("exec", 60, argv=["mkdir", "-p", f"{SANDBOX_ROOT}/{d}"], cwd="/", env={"PATH": GUEST_PATH},
                          timeout=30, limit=4096)
        for cmd in WARM_UP:
            vm.agent.call("exec", 120, argv=["/bin/sh", "-c", cmd], cwd=SANDBOX_ROOT, env={"PATH": GUEST_PATH},
                          timeout=60, limit=4096)
        vm.agent.call("sync", 60)
        # The VM keeps running while its device state is saved; at completion QEMU stops it, so the
        # RAM file and the disk overlay are frozen at exactly the saved point.
        state = tmp / "state"
        vm.qmp.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
        vm.qmp.cmd("migrate", uri=f"exec:cat > {shlex.quote(str(state))}")
        vm.qmp.wait_migration()
        vm.kill()
        vm = None
        for p in (tmp / "qemu.pid", tmp / "qemu.log"):
            p.unlink(missing_ok=True)
        # The template every fork copies: an empty overlay on the frozen one at its published path.
        _qemu_img_overlay(target / "frozen.qcow2", tmp / "overlay.qcow2", size=str(IMAGE_RECIPE["disk_size"]))
        for p in (ram, state, frozen, tmp / "overlay.qcow2"):
            os.chmod(p, 0o444)
        publish(tmp, target, {"boot_s": boot_s, "accel": accel, "image": image.key, "qemu": qemu_version(),
                              "mem_mib": MEM_MIB, "made": time.time()})
    except BaseException:
        if vm is not None:
            vm.kill()
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def fork(snap: Snapshot, folder: Path, run_id: str, sid: str, timeout: float = FORK_TIMEOUT_S) -> Qemu:
    """A new VM running from a snapshot (the booted one or a live one), with its own overlay on the
    frozen disk, its own copy-on-write view of the RAM file, a corrected clock and fresh entropy."""
    disk = folder / "disk.qcow2"
    shutil.copyfile(snap.template, disk)
    state_fd = os.open(snap.state, os.O_RDONLY)
    try:
        vm = Qemu(lambda c, q: [*machine_argv(snap.image, snap.accel, ram=snap.ram, share=False, disk=disk,
                                              ctl_fd=c, qmp_fd=q, console=folder / "console.log",
                                              name=f"drumsbench-{run_id}-{sid}", pidfile=folder / "qemu.pid",
                                              cache="unsafe"),
                                 "-incoming", "defer"],
                  folder, run_id, sid, timeout, extra_fds=(state_fd,))
    finally:
        os.close(state_fd)
    try:
        vm.qmp.send("qmp_capabilities")
        vm.qmp.send("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
        vm.qmp.send("migrate-incoming", uri=f"fd:{state_fd}")
        for _ in range(3):
            vm.qmp.answer()
        vm.agent.call("hello", timeout, time=time.time(), seed=base64.b64encode(os.urandom(64)).decode())
    except (SubstrateError, AgentError, OSError, ValueError) as e:
        why = vm.why_dead()
        vm.kill()
        raise SubstrateError(f"vm: fork failed ({e}); {why}") from e
    return vm


def live_snapshot(vm: Qemu, base: Snapshot, folder: Path, run_id: str, snap_id: str) -> Snapshot:
    """Freeze a running VM's RAM, devices and disk into ``folder`` as a shared-RAM snapshot; the VM
    runs on. Forks of it start in 0.3 s like forks of the booted snapshot.

    1. ``stop`` the VM; ``blockdev-snapshot-sync`` moves its writes to a new overlay, so its disk
       as of now is frozen (hard-linked into ``folder``);
    2. a **loader** QEMU, paused for good, maps a new RAM file shared and receives the VM's full
       state over a unix socket (the VM's own RAM is a private mapping: all of it is sent);
    3. the VM continues (``cont``); the loader saves only its device state (``x-ignore-shared``)
       and exits. It was started with ``store-global-state=off`` so that forks of this state run
       instead of inheriting the loader's paused state.
    """
    loader_dir = folder / "loader"
    loader_dir.mkdir()
    to_loader, in_loader = socket.socketpair()  # the migration stream: no socket file, no path limit
    q = vm.qmp
    loader: Qemu | None = None
    try:
        q.cmd("stop")
        try:
            new_top = vm.folder / f"disk-{snap_id}.qcow2"
            q.cmd("blockdev-snapshot-sync", device="d0", format="qcow2", mode="absolute-paths",
                  **{"snapshot-file": str(new_top)})
            os.link(vm.disk, folder / "frozen.qcow2")
            vm.disk = new_top
            in_loader_fd = in_loader.fileno()
            scratch = loader_dir / "disk.qcow2"
            _qemu_img_overlay(folder / "frozen.qcow2", scratch)
            loader = Qemu(lambda c, m: [*machine_argv(base.image, base.accel, ram=folder / "ram", share=True,
                                                      disk=scratch, ctl_fd=c, qmp_fd=m,
                                                      console=loader_dir / "console.log",
                                                      name=f"drumsbench-{run_id}-snap-{snap_id}",
                                                      pidfile=loader_dir / "qemu.pid", cache="unsafe"),
                                        "-incoming", "defer", "-global", "migration.store-global-state=off"],
                          loader_dir, run_id, f"snap-{snap_id}", FORK_TIMEOUT_S, extra_fds=(in_loader.fileno(),))
            in_loader.close()
            loader.qmp.cmd("qmp_capabilities")
            loader.qmp.cmd("migrate-incoming", uri=f"fd:{in_loader_fd}")
            q.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": False}])
            q.send_fd("snapshot", to_loader.fileno())
            q.cmd("migrate", uri="fd:snapshot")
            q.wait_migration()
            loader.qmp.wait_migration()
        finally:
            q.cmd("cont")
        loader.qmp.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
        loader.qmp.cmd("migrate", uri=f"exec:cat > {shlex.quote(str(folder / 'state'))}")
        loader.qmp.wait_migration()
    except (SubstrateError, OSError, ValueError) as e:
        why = loader.why_dead() if loader is not None else ""
        raise SubstrateError(f"vm: live snapshot failed ({e}) {why}".strip()) from e
    finally:
        if loader is not None:
            loader.kill()
        shutil.rmtree(loader_dir, ignore_errors=True)
        to_loader.close()
        in_loader.close()
    _qemu_img_overlay(folder / "frozen.qcow2", folder / "overlay.qcow2", size=str(IMAGE_RECIPE["disk_size"]))
    return Snapshot(folder, base.image, base.accel, base.accel_why, 0.0)


# -- sandbox ------------------------------------------------------------------------------------
def run_folder(state_dir: Path, run_id: str) -> Path:
    return state_dir / "vm" / run_id


class VmSandbox(Sandbox, Freezable, Snapshotting):
    def __init__(self, substrate: VmSubstrate, sid: str, folder: Path, vm: Qemu) -> None:
        self.substrate = "vm"
        self.run_id = substrate.run_id
        self.id = sid
        self.folder = folder
        self.vm = vm
        self._owner = substrate
        r = SANDBOX_ROOT
        self.paths = SandboxPaths(root=r, work=f"{r}/work", home=f"{r}/home", tmp=f"{r}/tmp", verify=f"{r}/verify")
        self._lock = threading.Lock()
        self._destroyed = False

    def _call(self, op: str, wait: float, **args: Any) -> dict[str, Any]:
        if self._destroyed:
            raise SubstrateError(f"sandbox {self.id} is destroyed")
        try:
            return self.vm.agent.call(op, wait, **args)
        except SubstrateError as e:
            if self.vm.proc.poll() is not None:
                raise SubstrateError(f"{e}; {self.vm.why_dead()}") from e
            raise

    @staticmethod
    def _abs(path: str) -> str:
        if not path.startswith("/"):
            raise SubstrateError(f"{path!r}: give an absolute in-sandbox path")
        return os.path.normpath(path)

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        full_env = {"PATH": GUEST_PATH, "HOME": self.paths.home, "TMPDIR": self.paths.tmp, "LANG": "C.UTF-8",
                    "PYTHONDONTWRITEBYTECODE": "1", SANDBOX_VAR: self.id}
        if env:
            full_env.update(env)
        t0 = time.monotonic()
        if self._stopped_by_host():  # the guest would only run it after a thaw: refuse, as docker does
            raise SandboxFrozen(f"vm: sandbox {self.id}: exec refused, QEMU reports the VM paused")
        try:
            res = self._call("exec", timeout + AGENT_SLACK_S, argv=argv, cwd=cwd or self.paths.work, env=full_env,
                             stdin=None if stdin is None else base64.b64encode(stdin).decode(),
                             timeout=timeout, limit=output_limit)
        except AgentError as e:
            raise SubstrateError(f"sandbox {self.id}: exec failed: {e}") from e
        except SubstrateError as e:
            if self._stopped_by_host():
                raise SandboxFrozen(f"{e} (QEMU reports the VM paused)") from e
            raise
        return self._result(res, t0)

    def _stopped_by_host(self) -> bool:
        """QEMU's own record (``query-status``): was the VM stopped from the host?"""
        if self._destroyed or self.vm.proc.poll() is not None:
            return False
        try:
            return str(self.vm.qmp.cmd("query-status")["return"].get("status")) == "paused"
        except (SubstrateError, OSError, ValueError, KeyError):
            return False

    @staticmethod
    def _result(res: dict[str, Any], t0: float) -> ExecResult:
        return ExecResult(
            exit_code=int(res["code"]), stdout=base64.b64decode(res["out"]), stderr=base64.b64decode(res["err"]),
            stdout_total=int(res["out_total"]), stderr_total=int(res["err_total"]),
            timed_out=bool(res["timed_out"]), duration_s=time.monotonic() - t0)

    def tree_digest(self, path: str) -> str:
        """``fingerprint.tree_digest`` computed by the agent itself (no interpreter to start)."""
        try:
            return str(self._call("digest", 120, path=self._abs(path))["digest"])
        except AgentError as e:
            raise SubstrateError(f"sandbox {self.id}: tree digest failed: {e}") from e

    def scan(self, folders: Sequence[str], tokens: Sequence[str]) -> set[str]:
        """``scan.scan_tokens`` computed by the agent itself."""
        if not tokens:
            return set()
        try:
            res = self._call("scan", 120, folders=[self._abs(f) for f in folders], tokens=list(tokens),
                             max_bytes=8 << 20)
        except AgentError as e:
            raise SubstrateError(f"sandbox {self.id}: canary scan failed: {e}") from e
        return {str(t) for t in res["hits"]}

    def write_file(self, path: str, data: bytes) -> None:
        try:
            self._call("write", 60 + len(data) / 1e6, path=self._abs(path), data=base64.b64encode(data).decode())
        except AgentError as e:
            raise SubstrateError(f"sandbox {self.id}: cannot write {path}: {e}") from e

    def put_files(self, base: str, files: Mapping[str, bytes]) -> None:
        size = sum(len(v) for v in files.values())
        try:
            self._call("put", 60 + size / 1e6, base=self._abs(base),
                       files={rel: base64.b64encode(data).decode() for rel, data in files.items()})
        except AgentError as e:
            raise SubstrateError(f"sandbox {self.id}: cannot write files under {base}: {e}") from e

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        try:
            res = self._call("read", 60, path=self._abs(path), limit=limit)
        except AgentError as e:
            if e.errno == 2:
                raise FileNotFoundError(2, "No such file in the sandbox", path) from None
            raise SubstrateError(f"sandbox {self.id}: cannot read {path}: {e}") from e
        return base64.b64decode(res["data"])

    def reset_in_place(self) -> None:
        p = self.paths
        try:
            self._call("reset", 60, dirs=[p.work, p.home, p.tmp, p.verify])
        except AgentError as e:
            raise SubstrateError(f"sandbox {self.id}: in-place reset failed: {e}") from e

    def end_processes(self) -> None:
        """Kill every guest process but the agent (PID 1), keeping files: ``containers.END_SCRIPT``
        run through the agent's exec (the agent's ``reset`` also kills them all, but empties the
        guest's temp folders)."""
        self._run_checked(END_ARGV, "ending the sandbox's processes", timeout=60.0)

    # -- gate-side evidence ----------------------------------------------------------------------
    def probe(self, timeout: float = 5.0) -> str | None:
        """What QEMU, outside the guest, says about the VM; never changes it.

        Evidence: QEMU killed by a signal or exited with an error, its process stopped, its monitor
        silent, or ``query-status`` other than ``running`` (``paused``: a host-side ``stop``). Not
        evidence: the guest shutting itself down (SHUTDOWN event with ``guest: true``; root in the
        guest can power off), nor a silent agent inside a running VM (root in the guest can stop
        or kill PID 1): everything inside the guest is within the policy's reach, so the base
        class's liveness command is not used here."""
        if self._destroyed:
            return f"vm: sandbox {self.id} is destroyed"
        proc = self.vm.proc
        if proc.poll() is not None:
            return self._death_evidence()
        with contextlib.suppress(OSError, IndexError):
            state = Path(f"/proc/{proc.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            if state in (b"T", b"t"):
                return f"vm: the QEMU process {proc.pid} is stopped (by a signal or a debugger on the host)"
        answer: list[Any] = []

        def ask() -> None:
            try:
                answer.append(self.vm.qmp.cmd("query-status")["return"])
            except (SubstrateError, OSError, ValueError) as e:
                answer.append(e)

        asker = threading.Thread(target=ask, daemon=True, name=f"vm-probe-{self.id}")
        asker.start()
        wait = max(timeout, 10.0)  # QEMU's own answer; a loaded host is slow, not absent
        asker.join(wait)
        if not answer:
            return f"vm: QEMU's monitor did not answer query-status within {wait:g} s"
        if isinstance(answer[0], BaseException):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
            if proc.poll() is not None:
                return self._death_evidence()
            return f"vm: QEMU's monitor failed: {answer[0]}"
        status = str(answer[0].get("status", "?"))
        if status != "running":
            return f"vm: QEMU reports the VM {status}" + (" (a host-side stop)" if status == "paused" else "")
        return None

    def _death_evidence(self) -> str | None:
        code = self.vm.proc.returncode
        last = self.vm.qmp.last_words() or {}
        if code == 0 and last.get("guest") is True:
            return None  # the guest powered itself off or reset (-no-reboot): within the policy's reach
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        reason = f", shutdown reason {last.get('reason')}" if last else ""
        return f"vm: QEMU {how}{reason}: {self.vm.why_dead()}"

    # -- host-side freeze (fault injection only) -------------------------------------------------
    def freeze(self) -> None:
        """QEMU monitor ``stop``: the guest's vCPU stops (its clock and every process with it)."""
        if self._destroyed:
            raise SubstrateError(f"vm: sandbox {self.id} is destroyed")
        try:
            self.vm.qmp.cmd("stop")
        except (OSError, ValueError) as e:
            raise SubstrateError(f"vm: sandbox {self.id}: cannot stop the VM: {e}") from e

    def thaw(self) -> None:
        if self._destroyed or self.vm.proc.poll() is not None:
            return
        try:
            self.vm.qmp.cmd("cont")  # a no-op on a running VM
        except (OSError, ValueError) as e:
            raise SubstrateError(f"vm: sandbox {self.id}: cannot continue the VM: {e}") from e

    def snapshot(self) -> str:
        """A live snapshot of this VM (processes, memory, files) for ``VmSubstrate.fork``; this
        sandbox keeps running. About a second (its RAM is copied once into a shared file)."""
        if self._destroyed:
            raise SubstrateError(f"sandbox {self.id} is destroyed")
        with self._lock:
            return self._owner._snapshot_of(self)

    def destroy(self) -> None:
        with self._lock:
            if self._destroyed:
                return
            self._destroyed = True
        self.vm.kill()
        shutil.rmtree(self.folder, ignore_errors=True)
        self._owner._forget(self)

    def describe(self) -> str:
        return f"vm:{self.id} ({self._owner.accel})"


class VmSubstrate(Substrate, Forking):
    name = "vm"
    sandbox_class = VmSandbox
    capabilities = Capabilities(
        isolation=Isolation.VM,
        reset_strategies=(ResetStrategy.IN_PLACE, ResetStrategy.RECREATE),
        snapshot=True,
        network=False,
        notes="QEMU guest (Debian kernel + the shared Debian rootfs), no network device; sandboxes fork "
              "from a booted snapshot with shared copy-on-write RAM; KVM if a probe boot works, else TCG",
    )

    def __init__(self, run_id: str, state_dir: Path) -> None:
        super().__init__(run_id, state_dir)
        self._boxes: set[VmSandbox] = set()
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._live_snaps: dict[str, Snapshot] = {}
        self.create_mode = os.environ.get(CREATE_VAR, "fork").strip().lower() or "fork"
        if self.create_mode not in ("fork", "boot"):
            raise SubstrateError(f"{CREATE_VAR}={self.create_mode!r}: choose fork or boot")

    # -- facts reports show ------------------------------------------------------------------
    def booted(self) -> Snapshot:
        """The booted snapshot every ``create()`` forks from (built on first use)."""
        if self._snap is None:
            self._snap = ensure_snapshot(self.run_id)
            self.capabilities = self.capabilities.model_copy(  # type: ignore[misc]
                update={"notes": f"{type(self).capabilities.notes}; accel={self._snap.accel} "
                                 f"({self._snap.accel_why})"})
        return self._snap

    @property
    def accel(self) -> str:
        return self.booted().accel

    @classmethod
    def missing(cls) -> str | None:
        return missing_tools()

    # -- sandboxes ---------------------------------------------------------------------------
    def create(self) -> Sandbox:
        return self._new_box(None)

    def fork(self, snapshot_id: str) -> VmSandbox:
        """A new sandbox running from live snapshot ``snapshot_id`` (see ``VmSandbox.snapshot``)."""
        with self._lock:
            snap = self._live_snaps.get(snapshot_id)
        if snap is None:
            raise SubstrateError(f"vm: no snapshot {snapshot_id!r} in run {self.run_id}")
        return self._new_box(snap)

    def snapshots(self) -> list[str]:
        with self._lock:
            return list(self._live_snaps)

    def drop_snapshot(self, snapshot_id: str) -> None:
        with self._lock:
            snap = self._live_snaps.pop(snapshot_id, None)
        if snap is not None:
            shutil.rmtree(snap.folder, ignore_errors=True)

    def _snapshot_of(self, box: VmSandbox) -> str:
        snap_id = uuid.uuid4().hex[:12]
        folder = run_folder(self.state_dir, self.run_id) / f"snap-{snap_id}"
        folder.mkdir(parents=True)
        try:
            snap = live_snapshot(box.vm, self.booted(), folder, self.run_id, snap_id)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        with self._lock:
            self._live_snaps[snap_id] = snap
        return snap_id

    def _new_box(self, source: Snapshot | None) -> VmSandbox:
        snap = self.booted()
        sid = uuid.uuid4().hex[:12]
        folder = run_folder(self.state_dir, self.run_id) / sid
        try:
            folder.mkdir(parents=True)
        except OSError as e:
            raise SubstrateError(f"vm: cannot create sandbox folder {folder}: {e}") from e
        try:
            if source is not None:
                vm = fork(source, folder, self.run_id, sid)
            elif self.create_mode == "boot":
                vm = boot(snap.image, snap.accel, folder, self.run_id, sid, ram=folder / "ram", share=False,
                          disk=_fresh_disk(snap.image, folder))
                vm.agent.call("exec", 60, argv=["mkdir", "-p", *(f"{SANDBOX_ROOT}/{d}" for d in
                                                                  ("work", "home", "tmp", "verify"))],
                              cwd="/", env={"PATH": GUEST_PATH}, timeout=30, limit=4096)
            else:
                vm = fork(snap, folder, self.run_id, sid)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        box = VmSandbox(self, sid, folder, vm)
        with self._lock:
            self._boxes.add(box)
        return box

    def _forget(self, box: VmSandbox) -> None:
        with self._lock:
            self._boxes.discard(box)

    def close(self) -> None:
        with self._lock:
            boxes = list(self._boxes)
        for box in boxes:
            box.destroy()
        for snap_id in self.snapshots():
            self.drop_snapshot(snap_id)
        folder = run_folder(self.state_dir, self.run_id)
        with contextlib.suppress(OSError):
            folder.rmdir()
        with contextlib.suppress(OSError):
            folder.parent.rmdir()

    def raw_floor(self) -> list[str] | None:
        """Boot the same kernel and initramfs to userspace, print a line, power off: the cost of a VM
        that runs one command, with no snapshot."""
        try:
            image = ensure_image()
        except SubstrateError:
            return None
        return probe_argv(image, self.accel)

    def leftovers(self) -> list[str]:
        left = [f"qemu process {pid}" for pid in pids_with_env(RUN_VAR, self.run_id)]
        folder = run_folder(self.state_dir, self.run_id)
        if folder.is_dir():
            left += [f"vm folder {p}" for p in folder.iterdir()]
        return left

    @classmethod
    def gc(cls, state_dir: Path, dead_runs: set[str]) -> list[str]:
        removed = []
        for pid, run in pids_with_env(RUN_VAR).items():
            if run in dead_runs and _is_qemu(pid):
                kill_pids([pid])
                removed.append(f"qemu process {pid} of run {run}")
        for run in dead_runs:
            folder = run_folder(state_dir, run)
            if not folder.exists():
                continue
            for pidfile in folder.glob("*/qemu.pid"):  # belt and braces: a QEMU that lost its label
                with contextlib.suppress(OSError, ValueError):
                    pid = int(pidfile.read_text().strip())
                    if _is_qemu(pid) and str(pidfile.parent) in Path(f"/proc/{pid}/cmdline").read_text():
                        os.kill(pid, signal.SIGKILL)
                        removed.append(f"qemu process {pid} of run {run} (pidfile)")
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(f"vm folder {folder}")
        with contextlib.suppress(OSError):
            (state_dir / "vm").rmdir()  # only when empty
        return removed


def _fresh_disk(image: GuestImage, folder: Path) -> Path:
    disk = folder / "disk.qcow2"
    disk.unlink(missing_ok=True)
    _qemu_img_overlay(image.disk, disk)
    return disk


def _is_qemu(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip().startswith("qemu-system")
    except OSError:
        return False
