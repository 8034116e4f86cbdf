"""QEMU on the host: facts about it (version, accelerator), the command line of a VM, the QEMU
process with its agent channel and its monitor (QMP), qcow2 overlays."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drumsbench import images
from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.vm.agent import Channel
from drumsbench.substrates.vm.image import PROBE_MARK, GuestImage

RUN_VAR = "DRUMSBENCH_RUN"
SANDBOX_VAR = "DRUMSBENCH_SANDBOX"
ACCEL_VAR = "DRUMSBENCH_VM_ACCEL"
MEM_MIB = 512
KERNEL_CMDLINE = ("console=ttyS0 quiet loglevel=3 panic=-1 root=/dev/vda i8042.noaux i8042.nokbd tsc=reliable "
                  # Hardening that costs a lot under emulation and guards only processes inside one sandbox
                  # from each other (the VM boundary is what isolates sandboxes):
                  "mitigations=off init_on_alloc=0 randomize_kstack_offset=off apparmor=0 audit=0 "
                  "transparent_hugepage=never psi=0")
PROBE_TIMEOUT_S = 10.0


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


# -- QEMU processes ---------------------------------------------------------------------------
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
                 extra_fds: Sequence[int] = (), wrap: Any = None) -> None:
        """``wrap``: argv -> argv that places QEMU in the sandbox's limit cgroups before it starts
        (``FreezerCgroup.wrap``; the exec keeps its pid), or None."""
        self.folder = folder
        self.sid = sid
        ctl_host, ctl_guest = socket.socketpair()
        qmp_host, qmp_guest = socket.socketpair()
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), RUN_VAR: run_id, SANDBOX_VAR: sid}
        argv = argv_for(ctl_guest.fileno(), qmp_guest.fileno())
        if wrap is not None:
            argv = wrap(argv)
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


def qemu_img_overlay(backing: Path, path: Path, size: str | None = None) -> None:
    """A qcow2 overlay on ``backing`` (absolute path); with ``size``, ``backing`` need not exist yet."""
    extra = ["-u", str(path), size] if size else [str(path)]
    proc = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(backing.absolute()), "-F", "qcow2",
                           *extra], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SubstrateError(f"vm: qemu-img create overlay failed: {proc.stderr.strip()[-300:]}")


def is_qemu(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip().startswith("qemu-system")
    except OSError:
        return False
