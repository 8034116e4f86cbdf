"""``vm``: each sandbox is a QEMU virtual machine, forked from a booted snapshot with shared RAM.

The guest (``vm.image``) is Debian's kernel, a small initramfs and a qcow2 disk made from the same
Debian root filesystem the container substrates use; it has no network device. Its init is a
small C agent (``vm/agent.c``) that speaks JSON lines over virtio-serial: exec with a timeout and
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

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from drumsbench import images
from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import (
    SANDBOX_FOLDERS,
    Capabilities,
    ExecRequest,
    ExecResult,
    Forking,
    Freezable,
    GuestLaunching,
    ImageFlavors,
    ImageRecipe,
    Isolation,
    RecipeImages,
    ResetStrategy,
    Sandbox,
    SandboxFrozen,
    SandboxLimits,
    SandboxPaths,
    Snapshotting,
    Stream,
    Streaming,
    Substrate,
)
from drumsbench.substrates.containers.layered_images import LayeredImages
from drumsbench.substrates.exec_core import SANDBOX_PATH, EndedStream, sandbox_env
from drumsbench.substrates.hostproc import (
    FreezerCgroup,
    cgroup_leftovers,
    kill_pids,
    limit_hierarchies,
    pids_with_env,
)
from drumsbench.substrates.vm.agent import AgentError
from drumsbench.substrates.vm.image import IMAGE_RECIPE, ensure_image, missing_tools
from drumsbench.substrates.vm.qemu import MEM_MIB, RUN_VAR, SANDBOX_VAR, Qemu, is_qemu, probe_argv
from drumsbench.substrates.vm.snapshot import (
    SANDBOX_ROOT,
    Snapshot,
    boot,
    ensure_snapshot,
    fork,
    fresh_disk,
    live_snapshot,
)
from drumsbench.substrates.vm.stream import AgentStream

CREATE_VAR = "DRUMSBENCH_VM_CREATE"
# Seconds an answer may take beyond a command's own timeout (software emulation under load is slow).
AGENT_SLACK_S = 30.0


def run_folder(state_dir: Path, run_id: str) -> Path:
    return state_dir / "vm" / run_id


class VmSandbox(Sandbox, Freezable, Snapshotting, GuestLaunching, Streaming):
    def __init__(self, substrate: VmSubstrate, sid: str, folder: Path, vm: Qemu,
                 cgroup: FreezerCgroup | None = None) -> None:
        self.cgroup = cgroup  # QEMU's pids and memory limit groups (its freezer group is not used)
        self.substrate = "vm"
        self.run_id = substrate.run_id
        self.id = sid
        self.folder = folder
        self.vm = vm
        self._owner = substrate
        self.paths = SandboxPaths.under(SANDBOX_ROOT)
        self._lock = threading.Lock()
        self._destroyed = False
        self.base: Snapshot | None = None  # the booted snapshot it came from (None: the substrate's)
        self.image_env: dict[str, str] = {}  # a task image's ENV, under every command's own

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

    def _run(self, req: ExecRequest) -> ExecResult:
        full_env = sandbox_env(self.paths, {**self.image_env, **(req.env or {})}, labels={SANDBOX_VAR: self.id})
        t0 = time.monotonic()
        if self._stopped_by_host():  # the guest would only run it after a thaw: refuse, as docker does
            raise SandboxFrozen(f"vm: sandbox {self.id}: exec refused, QEMU reports the VM paused")
        try:
            res = self._call("exec", req.timeout + AGENT_SLACK_S, argv=req.argv, cwd=req.cwd, env=full_env,
                             stdin=None if req.stdin is None else base64.b64encode(req.stdin).decode(),
                             timeout=req.timeout, limit=req.output_limit)
        except AgentError as e:
            raise SubstrateError(f"sandbox {self.id}: exec failed: {e}") from e
        except SubstrateError as e:
            if self._stopped_by_host():
                raise SandboxFrozen(f"{e} (QEMU reports the VM paused)") from e
            raise
        return self._result(res, t0)

    def open_stream(self, argv: Sequence[str], *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None) -> Stream:
        """``Streaming``: the agent starts the command as it starts an exec (``sopen``: the same uid,
        environment and token); ``stream.AgentStream`` carries its stdin and stdout."""
        if self._stopped_by_host():
            raise SandboxFrozen(f"vm: sandbox {self.id}: stream refused, QEMU reports the VM paused")
        full_env = sandbox_env(self.paths, {**self.image_env, **(env or {})}, labels={SANDBOX_VAR: self.id})
        try:
            res = self._call("sopen", AGENT_SLACK_S, argv=list(argv), cwd=self._abs(cwd or self.paths.work),
                             env=full_env)
        except AgentError as e:
            raise SubstrateError(f"sandbox {self.id}: cannot start a stream: {e}") from e
        if res.get("sid") is None:  # no working folder (126), not found (127) or not executable (126)
            return EndedStream(int(res["code"]))
        return AgentStream(self.vm.agent, int(res["sid"]), self.id)

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
        """The agent's reset (every guest process killed, the sandbox's folders and the guest's
        temp folders emptied), then ``sync && fstrim /``: the freed blocks are discarded down to the host
        (the disk is attached with ``discard=unmap``), so a long-lived VM's qcow2 overlay does not
        grow by what each attempt wrote and removed (a desktop sweep's leak check saw +139 MiB/h
        without it). About 0.1 s under TCG."""
        p = self.paths
        try:
            self._call("reset", 60, dirs=[p.work, p.home, p.tmp, p.verify])
        except AgentError as e:
            raise SubstrateError(f"sandbox {self.id}: in-place reset failed: {e}") from e
        # sync first: ext4 trims only blocks whose freeing its journal has committed
        self._run_checked(["/bin/sh", "-c", "sync && fstrim /"], "discarding freed disk blocks (fstrim)",
                          timeout=60.0)

    def launch_detached(self, argv: Sequence[str], *, env: Mapping[str, str], log: str) -> int:
        """``GuestLaunching``: ``setsid`` in the guest, backgrounded by a shell that prints its pid
        and exits; the agent (the guest's init) adopts and reaps it."""
        script = 'setsid "$@" </dev/null >"$LOG" 2>&1 & echo $!'
        res = self._run(ExecRequest(argv=["/bin/sh", "-c", script, "launch", *argv], cwd="/",
                                    env={**env, "LOG": log}, timeout=30.0, stdin=None, output_limit=4096))
        out = res.stdout.decode(errors="replace").strip()
        if res.exit_code != 0 or not out.isdigit():
            raise SubstrateError(f"sandbox {self.id}: cannot start {argv[0]} in the guest (exit {res.exit_code}): "
                                 f"{res.stderr.decode(errors='replace')[-200:]}")
        return int(out)

    def end_processes(self) -> None:
        """Kill every guest process but the agent (PID 1), keeping files: the agent's ``end``, no
        program of the guest (its root may have replaced any)."""
        try:
            self._call("end", 60)
        except AgentError as e:
            raise SubstrateError(f"sandbox {self.id}: ending the sandbox's processes failed: {e}") from e

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
        if self.cgroup is not None:
            self.cgroup.remove()
        shutil.rmtree(self.folder, ignore_errors=True)
        self._owner._forget(self)

    def describe(self) -> str:
        return f"vm:{self.id} ({self._owner.accel})"


def _disk_mib() -> int:
    """The guest disk's virtual size in MiB (``IMAGE_RECIPE["disk_size"]``, e.g. "2G")."""
    size = str(IMAGE_RECIPE["disk_size"]).strip().upper()
    scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}.get(size[-1:], 1 / (1 << 20))
    return int(float(size.rstrip("KMGT")) * scale)


class VmSubstrate(Substrate, Forking, ImageFlavors, RecipeImages):
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
        self.flavor = "base"  # the rootfs flavor of the guest disk (``use_flavor``)
        self._live_snaps: dict[str, Snapshot] = {}
        self._live_env: dict[str, dict[str, str]] = {}  # a live snapshot's image ENV (its sandbox's)
        self.images = LayeredImages("vm", run_id, state_dir)  # task images (RecipeImages)
        self._image_snaps: dict[str, Snapshot] = {}  # image reference -> its booted snapshot
        self.create_mode = os.environ.get(CREATE_VAR, "fork").strip().lower() or "fork"
        if self.create_mode not in ("fork", "boot"):
            raise SubstrateError(f"{CREATE_VAR}={self.create_mode!r}: choose fork or boot")
        self.cgroups = FreezerCgroup.hierarchy() is not None and limit_hierarchies() is not None

    def limit_mechanisms(self) -> dict[str, str]:
        lim = self.limits
        why = "not enforced on the host: needs root and the cgroup v1 freezer, pids and memory hierarchies"

        def host(value: int | None, text: str) -> str:
            return "off (setting)" if value is None else text if self.cgroups else why
        return {
            "pids": host(lim.pids, f"{lim.pids}: pids.max of QEMU's v1 pids cgroup (its threads); inside, the "
                                   "guest kernel (bounded by the guest's RAM)"),
            "memory_mb": host(lim.memory_mb, f"{lim.memory_mb} MiB: memory.limit_in_bytes of QEMU's v1 memory "
                                             f"cgroup (guest RAM {MEM_MIB} MiB + QEMU; over it the host OOM-kills "
                                             "QEMU); inside, the guest's own OOM killer at its RAM"),
            "disk_mb": f"{_disk_mib()} MiB, fixed (not the setting): the guest disk's qcow2 virtual size; the "
                       "guest's ext4 fills at ENOSPC and the host file cannot grow past the virtual size "
                       "(+ qcow2 metadata)",
        }

    def use_flavor(self, flavor: str) -> None:
        """``ImageFlavors``: sandboxes created from now on boot (fork) the guest whose disk holds the
        rootfs of ``flavor``; its image and booted snapshot are built on first use (``desktop``:
        about a minute once, beside the rootfs)."""
        if flavor not in images.FLAVORS:
            raise SubstrateError(f"vm: unknown image flavor {flavor!r} (one of {', '.join(images.FLAVORS)})")
        with self._lock:
            if flavor != self.flavor:
                self.flavor, self._snap = flavor, None

    # -- facts reports show ------------------------------------------------------------------
    def booted(self) -> Snapshot:
        """The booted snapshot every ``create()`` forks from (built on first use)."""
        if self._snap is None:
            self._snap = ensure_snapshot(self.run_id, self.flavor)
            self.capabilities = self.capabilities.model_copy(
                update={"notes": f"{type(self).capabilities.notes}; image flavor {self.flavor}; "
                                 f"accel={self._snap.accel} "
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

    def build_recipe(self, recipe: ImageRecipe) -> str:
        """``RecipeImages.build_recipe``: built by a container engine (``LayeredImages``); its guest
        disk and booted snapshot are made at the first ``create_from_image``. ``SubstrateError`` for
        an image whose ``USER`` is not root (the guest agent runs every command as root)."""
        return self.images.build(recipe)

    def create_from_image(self, image: str, limits: SandboxLimits | None = None) -> Sandbox:
        """``RecipeImages.create_from_image``: a fork of the image's own booted snapshot — a guest
        whose disk is the image's file system under the sandbox folders (``vm.image.ensure_task_image``:
        about 10 s of ``mkfs`` and one boot, 20-35 s under TCG, once per image and machine) — every
        command given the image's ``ENV``."""
        layout = self.images.layout(image)
        with self._lock:
            snap = self._image_snaps.get(image)
        if snap is None:
            from drumsbench.substrates.layer_mounts import make_skeleton
            from drumsbench.substrates.vm.image import ensure_task_image

            folder = run_folder(self.state_dir, self.run_id)
            guest = ensure_task_image(image, layout.layers, make_skeleton(folder / "_skeleton"))
            snap = ensure_snapshot(self.run_id, guest.flavor, image=guest)
            with self._lock:
                self._image_snaps[image] = snap
        box = self._new_box(None, base=snap, limits=limits)
        box.image_env = dict(layout.env)
        return box

    def fork(self, snapshot_id: str) -> VmSandbox:
        """A new sandbox running from live snapshot ``snapshot_id`` (see ``VmSandbox.snapshot``)."""
        with self._lock:
            snap = self._live_snaps.get(snapshot_id)
        if snap is None:
            raise SubstrateError(f"vm: no snapshot {snapshot_id!r} in run {self.run_id}")
        box = self._new_box(snap)
        box.image_env = dict(self._live_env.get(snapshot_id, {}))
        return box

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
            snap = live_snapshot(box.vm, box.base or self.booted(), folder, self.run_id, snap_id)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        with self._lock:
            self._live_snaps[snap_id] = snap
            self._live_env[snap_id] = dict(box.image_env)
        return snap_id

    def _new_box(self, source: Snapshot | None, base: Snapshot | None = None,
                 limits: SandboxLimits | None = None) -> VmSandbox:
        """A sandbox from live snapshot ``source``, else a fork of booted snapshot ``base`` (default:
        the substrate's flavor's), under ``limits`` (default: the run's)."""
        snap = base or self.booted()
        lim = limits or self.limits
        sid = uuid.uuid4().hex[:12]
        folder = run_folder(self.state_dir, self.run_id) / sid
        try:
            folder.mkdir(parents=True)
        except OSError as e:
            raise SubstrateError(f"vm: cannot create sandbox folder {folder}: {e}") from e
        cgroup: FreezerCgroup | None = None
        try:
            if self.cgroups and (lim.pids is not None or lim.memory_mb is not None):
                cgroup = FreezerCgroup.create(self.run_id, f"{self.name}-{sid}",
                                              limits=SandboxLimits(lim.pids, lim.memory_mb, None))
            wrap = None if cgroup is None else cgroup.wrap
            if source is not None:
                vm = fork(source, folder, self.run_id, sid, wrap=wrap)
            elif self.create_mode == "boot":
                vm = boot(snap.image, snap.accel, folder, self.run_id, sid, ram=folder / "ram", share=False,
                          disk=fresh_disk(snap.image, folder), wrap=wrap)
                vm.agent.call("exec", 60, argv=["mkdir", "-p", *(f"{SANDBOX_ROOT}/{d}" for d in SANDBOX_FOLDERS)],
                              cwd="/", env={"PATH": SANDBOX_PATH}, timeout=30, limit=4096)
            else:
                vm = fork(snap, folder, self.run_id, sid, wrap=wrap)
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            shutil.rmtree(folder, ignore_errors=True)
            raise
        box = VmSandbox(self, sid, folder, vm, cgroup)
        box.base = source or snap  # (a live snapshot carries its booted snapshot's image and accelerator)
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
        self.images.close()
        for snap_id in self.snapshots():
            self.drop_snapshot(snap_id)
        for cg in FreezerCgroup.of_run(self.run_id, f"{self.name}-"):
            cg.remove()
        folder = run_folder(self.state_dir, self.run_id)
        shutil.rmtree(folder / "_skeleton", ignore_errors=True)
        with contextlib.suppress(OSError):
            folder.rmdir()
        with contextlib.suppress(OSError):
            folder.parent.rmdir()

    def raw_floor(self) -> list[str] | None:
        """Boot the same kernel and initramfs to userspace, print a line, power off: the cost of a VM
        that runs one command, with no snapshot."""
        try:
            image = ensure_image(self.flavor)
        except SubstrateError:
            return None
        return probe_argv(image, self.accel)

    def leftovers(self) -> list[str]:
        left = [f"qemu process {pid}" for pid in pids_with_env(RUN_VAR, self.run_id)]
        left += cgroup_leftovers(self.run_id, f"{self.name}-")
        folder = run_folder(self.state_dir, self.run_id)
        if folder.is_dir():
            left += [f"vm folder {p}" for p in folder.iterdir()]
        return left

    @classmethod
    def gc(cls, state_dir: Path, dead_runs: set[str]) -> list[str]:
        removed = FreezerCgroup.gc(dead_runs)  # QEMU's limit groups (and what is left in them)
        for pid, run in pids_with_env(RUN_VAR).items():
            if run in dead_runs and is_qemu(pid):
                kill_pids([pid])
                removed.append(f"qemu process {pid} of run {run}")
        for run in dead_runs:
            folder = run_folder(state_dir, run)
            if not folder.exists():
                continue
            for pidfile in folder.glob("*/qemu.pid"):  # belt and braces: a QEMU that lost its label
                with contextlib.suppress(OSError, ValueError):
                    pid = int(pidfile.read_text().strip())
                    if is_qemu(pid) and str(pidfile.parent) in Path(f"/proc/{pid}/cmdline").read_text():
                        os.kill(pid, signal.SIGKILL)
                        removed.append(f"qemu process {pid} of run {run} (pidfile)")
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(f"vm folder {folder}")
        with contextlib.suppress(OSError):
            (state_dir / "vm").rmdir()  # only when empty
        return removed
