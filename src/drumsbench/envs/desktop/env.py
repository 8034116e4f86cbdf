"""The desktop environment: LibreOffice under a real X server, screenshot observations, a UNO verifier.

Each reset starts a fresh instance (``instance.py``: Xvfb + openbox + LibreOffice in their own pid,
ipc, uts, net and mount namespaces, the document in the sandbox's work folder and a copy of the
template profile in its home) and waits until the document's window is drawn and the screen is
still.

Observations: ``{"png": bytes, "screen": ndarray (h, w, 3) uint8, "title": str, "size": (w, h),
"settled": bool, "problem": str | None}`` plus ``"result"`` ({exit_code, stdout, stderr}) after a
``shell`` action. ``problem`` is set for a black or one-colour screen and for a frozen one (the X
server did not answer a screenshot in time): gate 4 turns it into ``bad_observation``.

Actions (payload fields; coordinates in screen pixels), each applied with xdotool inside the
instance and followed by a settle wait (the screen stable within a small pixel tolerance — the
text cursor blinks):

| kind | payload |
|---|---|
| key | keys: "ctrl+b" or a list of them (pressed in turn) |
| type | text (a "\\n" presses Return) |
| click / double_click | x, y, button (1) |
| drag | x1, y1, x2, y2 |
| scroll | x, y, dy (clicks; > 0 scrolls down) |
| move | x, y |
| wait | seconds, or title (a regular expression the active window's title must match) |
| shell | command: /bin/sh inside the instance's namespaces (its output in ``result``) |

A ``wait`` for a title that never comes (a dialog swallowed the input) runs into the step timeout.

Start fingerprint (gate 1): a digest of the work folder (each file's sha256; the document's
``.~lock.<name>#`` only as "own" when it names this instance's host and profile, else "foreign"),
the active window's title, the profile's lock (own/foreign/missing) and the screen size. A stale
lock left beside the document, or a "Document in Use" dialog that would open it read-only, can
never pass for a clean start. The reset removes stale locks before LibreOffice starts.

Fault injection: ``break_observation_channel`` blanks the X server's screen for real (its screen
saver forced on, which maps a black window over everything) — or, with ``observation_fault = "frozen"``, stops the X
server with SIGSTOP; ``break_verifier`` corrupts the staged runner; ``plant_stale_lock`` (for
tests and positive controls) writes a foreign lock beside the document after the reset's clean-up
and before LibreOffice opens it.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from drumsbench.core import criu
from drumsbench.core.errors import InvalidAttempt, PolicyFault, SubstrateError
from drumsbench.core.outcome import InvalidCause
from drumsbench.core.verdict_channel import authentic_verdict, new_secret, runner_source, saw_ready
from drumsbench.envs.base import (
    Action,
    ActionSpec,
    BreakableObservation,
    Environment,
    MachineForks,
    Observation,
    RestoringReset,
    Resumable,
    VerifierNotes,
    VerifierResult,
)
from drumsbench.envs.desktop import restore, xcb
from drumsbench.envs.desktop.actions import ACTIONS, INSTRUCTIONS
from drumsbench.envs.desktop.guest import GuestInstance
from drumsbench.envs.desktop.instance import (
    HOSTNAME,
    SYSTEM_PYTHON,
    DesktopInstance,
    Settings,
    screen_problem,
)
from drumsbench.envs.desktop.observation import DesktopObservation
from drumsbench.envs.desktop.running import RunningDesktop
from drumsbench.envs.desktop.settle import Frame, frames_differ
from drumsbench.envs.desktop.task import DesktopTask, lock_name, state_digest
from drumsbench.substrates.base import GuestLaunching, HostFolders, HostLaunching, Sandbox, ViewLaunching

RUNNER = runner_source(Path(__file__).parent / "verify_runner.py")
OUTPUT_LIMIT = 16 * 1024
LOCK_RE = re.compile(r"^\.~lock\..*#$")
MENU_BAND = (slice(20, 36), slice(0, 320))  # where the maximised window's menu bar is drawn


def parse_lock(text: str) -> dict[str, str]:
    """Fields of a LibreOffice document lock: ``,user,host,date,profile-url;``."""
    parts = text.strip().rstrip(";").split(",")
    keys = ("name", "user", "host", "date", "profile")
    return {k: parts[i] if i < len(parts) else "" for i, k in enumerate(keys)}


@dataclasses.dataclass(frozen=True)
class BlankEvidence:
    """What a blank frame is put down to: ``fault`` — the infrastructure's (the observation's
    ``problem``, gate 4), else the policy's (a ``note``); ``text`` says why."""

    fault: bool
    text: str


class ArtifactSink:
    """Where screenshots go: ``<out>/screenshots/<run>/<task>/{start,middle,end}.png``.

    ``<out>`` is the environment's ``artifact_dir`` (the run's output folder, set by the job that
    made the environment), else ``$DRUMSBENCH_ARTIFACTS``, else ``<state dir>/artifacts``. Only the
    first attempt of each task that reaches its verifier is kept.
    """

    @staticmethod
    def folder(explicit: Path | None) -> Path:
        if explicit is not None:
            return Path(explicit)
        env = os.environ.get("DRUMSBENCH_ARTIFACTS")
        if env:
            return Path(env)
        from drumsbench.core import host_state as state

        return state.state_dir() / "artifacts"


class DesktopEnv(Environment[DesktopTask], BreakableObservation, Resumable[DesktopTask],
                 RestoringReset[DesktopTask], MachineForks[DesktopTask], VerifierNotes):
    # the X server and LibreOffice start in the sandbox's view (process, bwrap, overlay, docker, podman:
    # ``requires``), or inside the guest of a sandbox that is a machine of its own (vm: ``unmet``)
    requires = (ViewLaunching, HostLaunching)
    image_flavor = "desktop"  # a container sandbox runs the desktop image (images.DESKTOP_INCLUDE)
    kind = "desktop"
    actions = ACTIONS
    observations = DesktopObservation
    instructions = INSTRUCTIONS

    @classmethod
    def unmet(cls, sandbox_class: type[Sandbox] | None) -> list[str]:
        if sandbox_class is not None and issubclass(sandbox_class, GuestLaunching):
            return []  # a guest instance (guest.py)
        return super().unmet(sandbox_class)

    def __init__(self, settings: Settings | None = None, artifact_dir: Path | None = None) -> None:
        super().__init__()
        self.settings = settings or Settings()
        self.artifact_dir = artifact_dir
        self.inst: RunningDesktop | None = None
        self.task: DesktopTask | None = None
        self.observation_fault = "black"  # or "frozen"
        self.plant_stale_lock = False
        self._fault_armed = False
        self.history: list[ActionSpec] = []  # actions applied in this episode (replay records these)
        self.frames: list[tuple[str, bytes]] = []  # (title, png) of each observation of this episode
        self.last_start_s = 0.0
        self._ready_frame: Frame | None = None  # the still frame the reset ended on
        self.verify_note: dict[str, object] = {"trust": "in-sandbox"}  # VerifierNotes (_note_verification)
        self.start_phases: dict[str, float] = {}  # seconds from the reset's start: prepare, display, window, ready
        self.reset_note: dict[str, object] = {}  # how the last reset_by_restore went
        self.start_cpu_s = 0.0  # CPU seconds of the last cold start's instance up to its ready screen
        # the task's document as LibreOffice knows it (its RuntimeUID), asked when the start is ready:
        # the verifier checks that document and no other (verify_runner.find_document)
        self.document_uid: str | None = None

    # -- reset -----------------------------------------------------------------------------------
    def _write_start(self, task: DesktopTask) -> None:
        self._start(task, write_document=True)

    def resume(self, task: DesktopTask) -> None:
        """Start LibreOffice on the document already in the work folder (a file-copy fork: the
        files came from elsewhere). Locks that came with them are removed first; what lived only in
        the parent's process — undo stack, cursor, selection, dialogs, unsaved edits — is lost,
        and ``capture()`` shows it. The generation is left as the fork set it."""
        try:
            self.box.read_file(f"{self.box.paths.work}/{task.document}", limit=1)
        except OSError:
            raise SubstrateError(f"desktop: resume: no {task.document} in the work folder") from None
        self._start(task, write_document=False)

    def _start(self, task: DesktopTask, write_document: bool) -> None:
        self.stop()
        self.document_uid = None
        self._ready_frame = None
        self.task = task
        self.history = []
        self.frames = []
        inst = self.new_instance(self.box)
        self.inst = inst
        t0 = time.monotonic()
        inst.remove_stale()
        if write_document:
            inst.write_work(task.document, task.document_bytes)
        if self.plant_stale_lock:
            self.plant_stale_lock = False
            stale = ",someone,other-host,01.01.2024 00:00,file:///home/someone/.config/libreoffice/4;"
            inst.write_work(lock_name(task.document), stale.encode())
        inst.prepare()
        self.start_phases = {"prepare": time.monotonic() - t0}
        inst.launch(task.document)
        self._check_box(inst)
        # the document's identity is asked while the start's screen settles (no screen effect)
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="desktop-identify")
        asked: list[concurrent.futures.Future[str | None]] = []

        def on_drawn() -> None:
            if not asked:
                asked.append(pool.submit(self._identify, inst, task))

        try:
            self._wait_ready(inst, task, t0 + self.start_timeout_s(inst), on_drawn)
        finally:
            pool.shutdown(wait=False)
        self.start_phases["ready"] = time.monotonic() - t0
        # a start that ended on another window (a dialog) is asked now: the fingerprint judges it
        self.document_uid = asked[0].result() if asked else self._identify(inst, task)
        self.last_start_s = time.monotonic() - t0
        self.start_phases["identified"] = self.last_start_s
        # CPU seconds the instance's processes spent up to the ready screen (load-independent; host
        # processes only: a guest's are QEMU's)
        self.start_cpu_s = restore.tree_cpu_s(inst.holder_pid) if inst.holder_pid is not None else 0.0

    def _identify(self, inst: RunningDesktop, task: DesktopTask) -> str | None:
        """The RuntimeUID of the task's document (found by its place: nothing but the start has
        acted yet), asked over UNO by the verifier's runner; None when no such document is open (a
        dialog in front at the start: the start fingerprint fails it)."""
        try:
            res = inst.exec_inside(self.runner_argv(inst, task, "--identify"), timeout=30, output_limit=1 << 16)
        except SubstrateError as e:
            raise SubstrateError(f"desktop: cannot ask LibreOffice for the task's document: {e}") from None
        for line in res.stdout.decode(errors="replace").splitlines():
            if line.startswith("DRUMSBENCH_IDENTITY "):
                uid = json.loads(line.split(" ", 1)[1]).get("document_uid")
                return uid if isinstance(uid, str) else None
        raise SubstrateError(f"desktop: LibreOffice did not say which document it holds (exit {res.exit_code}): "
                             f"{res.stderr.decode(errors='replace')[-200:]}")

    @staticmethod
    def runner_argv(inst: RunningDesktop, task: DesktopTask, mode: str) -> list[str]:
        """The runner in ``mode`` (``--identify``, ``--capture``: no verdict) as ``python3 -I -c`` with
        its source and the task's spec in argv: nothing is staged in the sandbox, where a process the
        policy left running could swap a staged file for its own code before root runs it."""
        spec = task.verify_files(inst.work_inside, inst.app_exit_inside)["task.json"].decode()
        return [SYSTEM_PYTHON, "-I", "-c", RUNNER.decode(), "-", "--spec", spec, mode]

    def new_instance(self, box: Sandbox) -> RunningDesktop:
        """The kind of instance ``box`` runs: inside its guest (``GuestLaunching``), else host processes."""
        if isinstance(box, GuestLaunching):
            return GuestInstance(box, self.settings)
        return DesktopInstance(box, self.settings)

    def start_timeout_s(self, inst: RunningDesktop) -> float:
        """How long a start may take: a guest's settings allow for software emulation."""
        return inst.settings.start_timeout_s if isinstance(inst, GuestInstance) else self.settings.start_timeout_s

    # -- reset by restore (``--reset restore``) ----------------------------------------------------------
    RESTORE_SCREEN_S = 2.5  # how long a restored screen may take to show the checkpoint's frame
    CHECKPOINT_QUIET_S = 1.0  # the still spell before and after a start's checkpoint

    def reset_by_restore(self, task: DesktopTask, spare: Callable[[], Sandbox]) -> None:
        """The task's verified start, restored from its checkpoint (made once per run and task, in a
        ``spare`` sandbox: a cold start that passed the start fingerprint, dumped, then ended). The
        restored instance must show the checkpoint's screen and pass the start fingerprint; when
        anything fails the task starts cold here instead, and ``reset_note`` says why."""
        key: tuple[str, str, str] | None = None
        made: list[float] = []
        try:
            key = restore.IMAGES.key(self.box, task.id, self.settings)  # host folders only (else: cold)
            image = restore.IMAGES.get(key, lambda folder: self._make_start_image(task, spare, folder, made))
            try:
                note: dict[str, object] = {"reset": "restore", **self._restore_start(task, image)}
            except restore.ScreenMismatch as first:  # seen now and then under load: once more
                note = {"reset": "restore", **self._restore_start(task, image), "retried": str(first)[:200]}
            if made:
                note["checkpoint_made_s"] = made[0]
        except Exception as e:  # any failure of the restore path: a cold start, recorded
            if key is not None and not isinstance(e, restore.ScreenMismatch):
                restore.IMAGES.forget(key)  # remade by the next reset
            self._stop_and_clear()
            t0 = time.monotonic()
            self._start(task, write_document=True)
            note = {"reset": "cold", "cold_s": time.monotonic() - t0, "fallback": f"{type(e).__name__}: {e}"[:300]}
        self.reset_note = note
        self.generation += 1
        self.step_count = 0

    def _make_start_image(self, task: DesktopTask, spare: Callable[[], Sandbox], folder: Path,
                          made: list[float]) -> restore.StartImage:
        """A cold, checkpointable start of ``task`` in a spare sandbox, checked against the start
        fingerprint, dumped with its folder; the spare is then ended (its path kept as a folder)."""
        t0 = time.monotonic()
        box = spare()
        origin = DesktopEnv(dataclasses.replace(self.settings, checkpointable=True))
        try:
            origin.attach(box)
            origin._start(task, write_document=True)
            got = origin.fingerprint()
            frame = origin._ready_frame
            if got != task.start_fingerprint or frame is None:
                raise SubstrateError(f"desktop: the start to checkpoint is not the verified start "
                                     f"({origin.fingerprint_details()})")
            inst = origin.instance
            assert inst.holder_pid is not None and isinstance(box, HostFolders)
            root = str(box.host_root)
            tol = self.settings.settle_tolerance_px
            # LibreOffice lays out its ruler and status bar on idle, after the start's settle has
            # seen a still screen: wait for a longer quiet spell, so the dump holds the finished start
            frame, _ = inst.settle(time.monotonic() + 10.0, quiet_s=self.CHECKPOINT_QUIET_S)
            for _ in range(3):  # the screen the dump holds: still from before the dump to after it
                shutil.rmtree(folder / "frozen", ignore_errors=True)
                before = inst.grab()
                dump_s = criu.checkpoint(inst.holder_pid, folder / "images", {root: str(folder / "frozen")})
                time.sleep(self.CHECKPOINT_QUIET_S)  # idle work the dump interrupted shows by now
                after = inst.grab()
                if before.title == after.title == frame.title and frames_differ(before.rgb, after.rgb) <= tol:
                    break
                frame, _ = inst.settle(time.monotonic() + 5.0)
            else:
                raise SubstrateError("desktop: the start's screen did not hold still across its checkpoint")
            image = restore.StartImage(folder, root, restore.origin_uid(box), inst.display, origin.settings,
                                       before.rgb, before.title, time.monotonic() - t0, dump_s,
                                       document_uid=origin.document_uid)
        finally:
            origin.stop()
            box.destroy()
        restore.keep_path(image.origin_root)
        made.append(time.monotonic() - t0)
        return image

    def _restore_start(self, task: DesktopTask, image: restore.StartImage) -> dict[str, float]:
        """Restore ``image`` into this sandbox and check it: the checkpoint's screen (within the
        cursor's tolerance) and the start fingerprint. Returns where the time went (seconds)."""
        self._stop_and_clear()
        self._ready_frame = None
        self.task, self.history, self.frames = task, [], []
        self.document_uid = image.document_uid  # the checkpoint's process: the same document
        box = self.box
        if not isinstance(box, HostFolders) or not isinstance(box, HostLaunching):
            raise SubstrateError(f"desktop: reset by restore needs host folders; {box.substrate} has none")
        root = Path(box.host_root)
        t0 = time.monotonic()
        restore.copy_frozen(image.frozen, root, image.origin_uid, box.uid)
        t1 = time.monotonic()
        cpu: dict[str, float] = {}
        pid = restore.restore_tree(image.images, image.origin_root, root, box.id, cpu)
        t2 = time.monotonic()
        inst = DesktopInstance.adopt_restored(box, image.settings, pid, image.display, image.origin_root)
        self.inst = inst
        self._watch_folder(inst, root)
        deadline = t2 + self.RESTORE_SCREEN_S
        tol = self.settings.settle_tolerance_px
        frame: Frame | None = None
        while True:
            try:
                frame = inst.grab(timeout=max(0.1, deadline - time.monotonic()))
                if frame.title == image.title and frames_differ(frame.rgb, image.frame) <= tol:
                    break
                why = f"title {frame.title!r}, {frames_differ(frame.rgb, image.frame)} pixels differ"
            except xcb.XError as e:
                why = f"no screen: {e}"
            if time.monotonic() > deadline:
                if frame is not None:  # both screens beside the images, for a person to compare
                    (image.folder / "mismatch-reference.png").write_bytes(xcb.encode_png(image.frame))
                    (image.folder / "mismatch-restored.png").write_bytes(xcb.encode_png(frame.rgb))
                raise restore.ScreenMismatch(f"desktop: the restored screen is not the checkpoint's ({why})")
            time.sleep(0.02)
        t3 = time.monotonic()
        got = self.fingerprint()
        if got != task.start_fingerprint:
            raise SubstrateError(f"desktop: the restored start fails the start fingerprint "
                                 f"({self.fingerprint_details()})")
        self._ready_frame = frame
        t4 = time.monotonic()
        self.last_start_s = t4 - t0
        self.start_phases = {"copy": t1 - t0, "restore": t2 - t0, "screen": t3 - t0, "ready": t4 - t0}
        return {"copy_s": t1 - t0, "criu_restore_s": t2 - t1, "first_screen_s": t3 - t2, "fingerprint_s": t4 - t3,
                "restore_total_s": t4 - t0, **cpu}

    def _stop_and_clear(self, wait_s: float = 5.0) -> None:
        """End the running instance and wait until its processes are gone, then empty the
        sandbox's folders of what it wrote after the substrate's reset: a restored instance carries
        another sandbox's labels, so that reset did not end it (a profile or lock file written
        meanwhile must not meet the copy of the checkpoint's folder)."""
        inst = self.inst
        pids = criu.tree_pids(inst.holder_pid) if inst is not None and inst.holder_pid is not None else []
        self.stop()
        if not pids or inst is None or not inst.restored:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(restore.running(p) for p in pids):
            time.sleep(0.01)
        box = self.box
        assert isinstance(box, HostFolders)
        for sub in (box.paths.work, box.paths.home, box.paths.tmp):
            folder = box.host_path(sub)
            for entry in folder.iterdir() if folder.is_dir() else ():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)

    @staticmethod
    def _watch_folder(inst: DesktopInstance, root: Path) -> None:
        """A restored instance carries the origin sandbox's labels, so its own sandbox's destroy
        does not find it: it ends when the sandbox's folder goes (or with ``stop``, or the run)."""
        def watch() -> None:
            while inst.holder_pid is not None and inst.alive():
                if not root.is_dir():
                    inst.stop()
                    return
                time.sleep(0.5)

        threading.Thread(target=watch, name=f"watch-restored-{inst.holder_pid}", daemon=True).start()

    def _check_box(self, inst: RunningDesktop) -> None:
        """The sandbox may be destroyed behind our back (Ctrl-C destroys live sandboxes from another
        thread): then stop what we started and remove the folders we may have recreated."""
        if inst.sandbox_gone():
            inst.stop()
            if isinstance(self.box, HostFolders):
                shutil.rmtree(self.box.host_root, ignore_errors=True)
            raise SubstrateError(f"desktop: sandbox {self.box.id} was destroyed during start-up") from None

    def _wait_ready(self, inst: RunningDesktop, task: DesktopTask, deadline: float,
                    on_drawn: Callable[[], None] = lambda: None) -> None:
        """Until the document's window is drawn (title and menu bar) and still, or another window
        (a dialog) has held the focus for a while: the fingerprint judges that. ``on_drawn`` is
        called once the window is drawn, before the wait for stillness.

        While LibreOffice starts, only the title and the menu bar's strip are polled (a full
        screenshot costs CPU that LibreOffice needs on a small host)."""
        top, left = MENU_BAND[0].start, MENU_BAND[1].start
        height, width = MENU_BAND[0].stop - top, MENU_BAND[1].stop - left
        title = ""
        foreign: tuple[str, float] | None = None
        while time.monotonic() < deadline:
            self._check_box(inst)
            if not inst.alive():
                said = inst.launch_said()
                raise SubstrateError("desktop: the instance exited during start-up (Xvfb or the namespaces failed)"
                                     + (f": {said}" if said else ""))
            try:
                band, title = inst.region(left, top, width, height,
                                          min(inst.settings.grab_timeout_s, max(0.2, deadline - time.monotonic())))
            except xcb.XError:
                time.sleep(0.02)
                continue
            since = time.monotonic() - inst.t_launch + self.start_phases.get("prepare", 0.0)
            self.start_phases.setdefault("display", since)
            if title == task.title:
                self.start_phases.setdefault("window", since)
                if int(np.ptp(band)) > 64:  # the menu bar is drawn: the window is laid out
                    self.start_phases.setdefault("drawn", since)
                    on_drawn()
                    try:
                        self._ready_frame, _ = inst.settle(deadline)
                    except xcb.XError:
                        continue
                    return
                foreign = None
            elif title:
                if foreign is None or foreign[0] != title:
                    foreign = (title, time.monotonic())
                elif time.monotonic() - foreign[1] > 1.5:
                    return  # e.g. "Document in Use": the fingerprint turns it into dirty_reset
            time.sleep(0.03)
        if not title:
            raise SubstrateError(f"desktop: LibreOffice showed no window within {self.start_timeout_s(inst):g} s")

    def adopt(self, task: DesktopTask, inst: RunningDesktop, history: list[ActionSpec],
              document_uid: str | None) -> None:
        """Take over a live instance restored from a checkpoint of another environment's (the
        ``criu`` fork method): the task, the actions so far, the parent's ``document_uid`` (the
        restored process holds the same document); the generation is left as the fork set it."""
        self.stop()
        self.task, self.inst = task, inst
        self.document_uid = document_uid
        self.history = list(history)
        self.frames = []
        self._ready_frame = None

    def handover(self) -> dict[str, object]:
        """``MachineForks``: a guest instance is named by its launcher's pid inside the guest (the
        same in every copy of the machine); a host instance is not copied by a machine fork."""
        if isinstance(self.inst, GuestInstance) and self.inst.launcher_pid is not None:
            return {"guest_launcher_pid": self.inst.launcher_pid, "document_uid": self.document_uid}
        return {}

    def adopt_fork(self, task: DesktopTask, history: list[ActionSpec], handover: dict[str, object]) -> None:
        """``MachineForks``: take over the running desktop a vm fork copied (its X server and
        LibreOffice continue where the parent's were when the snapshot was taken)."""
        box = self.box
        pid = handover.get("guest_launcher_pid")
        if not isinstance(box, GuestLaunching) or not isinstance(pid, int):
            raise SubstrateError(f"desktop: a {box.substrate} snapshot copies files, not the running desktop; "
                                 "fork it with file, criu (process) or podman-checkpoint (podman)")
        inst = GuestInstance(box, self.settings)
        inst.launcher_pid, inst.t_launch = pid, time.monotonic()
        if not inst.alive():
            raise SubstrateError(f"desktop: the fork of sandbox {box.id} holds no running desktop (pid {pid})")
        uid = handover.get("document_uid")
        self.adopt(task, inst, history, uid if isinstance(uid, str) else None)

    def stop(self) -> None:
        if self.inst is not None:
            self.inst.stop()
            self.inst = None

    @property
    def instance(self) -> RunningDesktop:
        if self.inst is None:
            raise SubstrateError("desktop: no instance running (reset first)")
        return self.inst

    def fingerprint(self) -> str:
        inst, task = self.instance, self.task
        assert task is not None
        work: dict[str, str] = {}
        for rel, data in inst.work_files().items():
            if LOCK_RE.match(rel.rsplit("/", 1)[-1]):
                work[rel] = self._lock_state(data.decode(errors="replace"), inst)
            else:
                work[rel] = hashlib.sha256(data).hexdigest()
        try:
            title = inst.title()
        except xcb.XError as e:
            title = f"<no display: {e}>"
        return state_digest(work, title, self._profile_lock_state(inst), (self.settings.width, self.settings.height))

    @staticmethod
    def _lock_state(text: str, inst: RunningDesktop) -> str:
        fields = parse_lock(text)
        own = fields["host"] == HOSTNAME and fields["profile"].rstrip("/") == inst.profile_inside.as_uri()
        return "own" if own else f"foreign ({fields['user']}@{fields['host']})"

    @staticmethod
    def _profile_lock_state(inst: RunningDesktop) -> str:
        text = inst.profile_lock()
        if text is None:
            return "missing"
        m = re.search(r"^Host=(.*)$", text, re.M)
        return "own" if m and m.group(1).strip() == HOSTNAME else "foreign"

    def fingerprint_details(self) -> dict[str, Any]:
        """What the fingerprint is made of (for a person reading a dirty_reset)."""
        inst = self.instance
        files = inst.work_files()
        locks = {rel: self._lock_state(data.decode(errors="replace"), inst)
                 for rel, data in files.items() if "/" not in rel and LOCK_RE.match(rel)}
        try:
            title = inst.title()
        except xcb.XError as e:
            title = f"<no display: {e}>"
        return {"files": sorted(rel for rel in files if "/" not in rel), "locks": locks, "title": title,
                "profile_lock": self._profile_lock_state(inst)}

    # -- observations ----------------------------------------------------------------------------
    def _observation(self, frame: Frame | None, settled: bool, problem: str | None,
                     extra: dict[str, Any] | None = None, timed_out: bool = False) -> Observation:
        content: dict[str, Any] = {"png": b"", "screen": None, "title": "", "size": None, "settled": settled,
                                   "problem": problem}
        if frame is not None:
            png = xcb.encode_png(frame.rgb)
            content.update(png=png, screen=frame.rgb, title=frame.title,
                           size=(frame.rgb.shape[1], frame.rgb.shape[0]))
            if problem is None:
                blank = screen_problem(frame.rgb)
                if blank and self.inst is not None and self._app_closing(self.inst):
                    content["note"] = f"LibreOffice was closed: an empty desktop ({blank}) is what there is to see"
                elif blank:
                    why = self.blank_evidence(self.inst, blank)
                    content["problem" if why.fault else "note"] = why.text
            self.frames.append((frame.title, png))
        if extra:
            content.update(extra)
        return Observation(self.generation, self.step_count, content, timed_out=timed_out)

    @staticmethod
    def blank_evidence(inst: RunningDesktop | None, blank: str) -> BlankEvidence:
        """Whose doing a blank frame is (docs/attribution.md, the desktop). Infrastructure only on
        evidence out of a GUI policy's reach: the X server says its screen saver is on (no key or
        click turns it on; Xvfb's timer is off), the X server does not answer, or LibreOffice is gone
        with a status other than the user's own close. A blank frame while the server answers, its
        saver is off and LibreOffice runs is a hidden, minimised or covered window: the policy's."""
        if inst is None:
            return BlankEvidence(True, f"{blank} (no instance to ask)")
        try:
            saver = inst.screen_saver()
        except xcb.XError as e:
            return BlankEvidence(True, f"{blank}; the X server did not answer: {e}")
        if saver == "on":
            return BlankEvidence(True, f"{blank}: the X server's screen saver is on")
        if not inst.app_running():  # a status file alone is no evidence: LibreOffice's uid may write one
            return BlankEvidence(True, f"{blank}: LibreOffice is gone (exit status {inst.app_exit()})")
        return BlankEvidence(False, f"{blank} while the X server answers, its screen saver is off and LibreOffice "
                                    "runs: its window is hidden, minimised or covered (the policy's doing)")

    @staticmethod
    def _app_closing(inst: RunningDesktop, grace_s: float = 2.0) -> bool:
        """True when LibreOffice exited normally (the policy closed it), waiting ``grace_s`` for an
        exit in progress: its window goes before its process does."""
        end = time.monotonic() + grace_s
        while True:
            code = inst.app_exit()
            if code is not None or time.monotonic() >= end:
                return code == 0
            time.sleep(0.05)

    def _fire_fault(self) -> None:
        if not self._fault_armed:
            return
        self._fault_armed = False
        inst = self.instance
        if self.observation_fault == "frozen":
            inst.freeze_display()
        else:
            inst.blank()

    def _look(self, deadline: float, settle: bool = True, extra: dict[str, Any] | None = None) -> Observation:
        inst = self.instance
        self._fire_fault()
        try:
            if settle:
                frame, settled = inst.settle(deadline)
            else:
                frame, settled = inst.grab(), True
        except xcb.XTimeout as e:
            return self._observation(None, False, f"frozen screen: {e}", extra)
        except xcb.XError as e:
            return self._observation(None, False, f"no screen: {e}", extra)
        return self._observation(frame, settled, None, extra)

    def observe(self, timeout: float) -> Observation:
        ready, self._ready_frame = self._ready_frame, None
        if ready is not None and not self._fault_armed:
            # The reset ended on a still screen: one grab that matches it is the first observation.
            try:
                frame = self.instance.grab()
            except xcb.XError:
                frame = None
            if frame is not None and frame.title == ready.title and \
                    frames_differ(frame.rgb, ready.rgb) <= self.settings.settle_tolerance_px:
                return self._observation(frame, True, None)
        return self._look(time.monotonic() + timeout)

    def observation_problem(self, obs: Observation) -> str | None:
        problem = obs.content.get("problem")
        return str(problem) if problem else None

    def break_observation_channel(self) -> None:
        self._fault_armed = True

    # -- actions ---------------------------------------------------------------------------------
    def _apply(self, action: Action, timeout: float) -> Observation:
        inst = self.instance
        deadline = time.monotonic() + timeout
        p = action.payload
        self.history.append(ActionSpec(action.kind, dict(p)))
        s = self.settings
        try:
            if action.kind == "wait":
                return self._wait(p, deadline)
            if action.kind == "shell":
                why = inst.shell_unavailable()
                if why is not None:  # the policy asked for what this substrate does not offer: its error
                    return self._look(deadline, extra={"error": why})
                res = inst.exec_inside(["/bin/sh", "-c", str(p.get("command", ""))], timeout=timeout,
                                       all_namespaces=True, output_limit=OUTPUT_LIMIT, as_sandbox_user=True)
                result = {"exit_code": res.exit_code, "stdout": res.stdout.decode(errors="replace"),
                          "stderr": res.stderr.decode(errors="replace")}
                if res.timed_out:
                    return self._observation(None, False, None, {"result": result}, timed_out=True)
                return self._look(deadline, extra={"result": result})
            args = self._xdotool_args(action.kind, p, s)
        except (KeyError, TypeError, ValueError) as e:
            return self._look(deadline, extra={"error": f"bad {action.kind} action: {e!r}"})
        if args is None:
            return self._look(deadline, extra={"error": f"unknown action kind {action.kind!r}"})
        extra = None
        for one in args:
            res = inst.xdotool(one, timeout=max(0.05, deadline - time.monotonic()))
            if res.timed_out:
                return self._observation(None, False, None, timed_out=True)
            if res.exit_code != 0:
                extra = {"error": f"xdotool exit {res.exit_code}: {res.stderr.decode(errors='replace')[-200:]}"}
                break
        return self._look(deadline, extra=extra)

    @staticmethod
    def _xdotool_args(kind: str, p: dict[str, Any], s: Settings) -> list[list[str]] | None:
        """The xdotool invocations (one or more, run in turn) for an action; None for an unknown kind."""
        if kind == "type":  # xdotool types a newline as a keysym applications ignore: press Return
            calls: list[list[str]] = []
            for i, part in enumerate(str(p["text"]).split("\n")):
                if i:
                    calls.append(["key", "Return"])
                if part:
                    calls.append(["type", "--delay", str(s.type_delay_ms), "--", part])
            return calls
        one = DesktopEnv._xdotool_one(kind, p, s)
        return None if one is None else [one]

    @staticmethod
    def _xdotool_one(kind: str, p: dict[str, Any], s: Settings) -> list[str] | None:
        def xy(kx: str = "x", ky: str = "y") -> list[str]:
            return [str(int(p[kx])), str(int(p[ky]))]

        button = str(int(p.get("button", 1)))
        if kind == "key":
            keys = p["keys"]
            keys = [keys] if isinstance(keys, str) else [str(k) for k in keys]
            return ["key", "--delay", str(s.key_delay_ms), *keys]
        if kind == "click":
            return ["mousemove", *xy(), "click", button]
        if kind == "double_click":
            return ["mousemove", *xy(), "click", "--repeat", "2", "--delay", "60", button]
        if kind == "move":
            return ["mousemove", *xy()]
        if kind == "drag":
            return ["mousemove", *xy("x1", "y1"), "mousedown", button, "sleep", "0.05",
                    "mousemove", *xy("x2", "y2"), "sleep", "0.05", "mouseup", button]
        if kind == "scroll":
            dy = int(p["dy"])
            return ["mousemove", *xy(), "click", "--repeat", str(max(1, abs(dy))), "--delay", "20",
                    "5" if dy > 0 else "4"]
        return None

    def _wait(self, p: dict[str, Any], deadline: float) -> Observation:
        if "title" in p:
            pattern = re.compile(str(p["title"]))
            inst = self.instance
            checked = time.monotonic()
            while True:
                try:
                    if pattern.search(inst.title()):
                        return self._look(deadline)
                except xcb.XTimeout as e:
                    return self._observation(None, False, f"frozen screen: {e}")
                except xcb.XError as e:
                    return self._observation(None, False, f"no screen: {e}")
                if time.monotonic() >= deadline:
                    return self._observation(None, False, None, timed_out=True)
                if time.monotonic() - checked >= 0.5:  # a killed LibreOffice shows no title, ever
                    checked = time.monotonic()
                    died = self.instance_failed(inst)
                    if died:
                        return self._observation(None, False, f"awaiting a title: {died}")
                time.sleep(0.03)
        seconds = float(p.get("seconds", 0.1))
        if time.monotonic() + seconds > deadline:
            time.sleep(max(0.0, deadline - time.monotonic()))
            return self._observation(None, False, None, timed_out=True)
        time.sleep(seconds)
        return self._look(deadline)

    # -- verifier --------------------------------------------------------------------------------
    def stage_verifier(self, task: DesktopTask) -> None:
        box = self.box
        exit_file = self.inst.app_exit_inside if self.inst is not None else ""
        work = self.inst.work_inside if self.inst is not None else box.paths.work
        if self.inst is not None and self.inst.policy_uid is not None:
            # whatever the policy's shell actions left running (as the sandbox's uid) ends before the
            # verifier is staged; LibreOffice, Xvfb and the holder run as root and stay
            self.inst.exec_inside(["pkill", "-KILL", "-U", str(self.inst.policy_uid)], 10.0, all_namespaces=True)
        files = {"runner.py": RUNNER, **task.verify_files(work, exit_file, self.document_uid)}
        box.put_files(box.paths.verify, files)
        self._keep_screenshots(task)

    def break_verifier(self) -> None:
        self.box.write_file(f"{self.box.paths.verify}/runner.py", b"import json\nraise SystemExit(\n")

    def _note_verification(self) -> None:
        """``verify_note``, recorded in the attempt's extra: the check runs in the sandbox (next to
        LibreOffice, which the policy drove), not in a judge outside it (docs/attribution.md, per
        kind), and who LibreOffice ran as (``office``: the report's ways table says it, a stated
        gap where it is root)."""
        note: dict[str, object] = {"trust": "in-sandbox"}
        if self.inst is not None:
            note["office"] = self.inst.office_runs_as
        self.verify_note = note

    def run_verifier(self, task: DesktopTask, timeout: float) -> VerifierResult:
        self._note_verification()
        inst = self.inst
        if inst is None or not inst.alive():
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, "the desktop instance is gone: nothing to ask")
        code = inst.app_exit()
        if code is not None and inst.app_running():
            code = None  # the status file was written while LibreOffice runs: not its exit wrapper's
        if code is not None and code != 0:
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE,
                                 f"LibreOffice exited with status {code} (crashed or killed): nothing to ask")
        box = self.box
        argv = [SYSTEM_PYTHON, "-I", f"{box.paths.verify}/runner.py", box.paths.verify]
        if code == 0:  # the policy closed LibreOffice: a valid end; only stored files can be checked
            argv.append("--office-closed")
        secret = new_secret()
        try:
            res = inst.exec_inside(argv, timeout=timeout, output_limit=OUTPUT_LIMIT,
                                   stdin=secret.hex().encode() + b"\n")
        except SubstrateError as e:
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"verifier could not start: {e}") from None
        lines = res.stdout.decode(errors="replace").splitlines()
        err = res.stderr.decode(errors="replace")[-200:]
        if not saw_ready(lines, secret):
            if res.timed_out:
                raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"verifier timed out after {timeout:g} s")
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE,
                                 f"verifier did not reach LibreOffice (exit {res.exit_code}): {err}")
        verdict = authentic_verdict(lines, secret)
        if verdict is None:
            # The runner reached LibreOffice; the task's check then read what the policy left. Only
            # the instance's or the sandbox's own failure makes this infrastructure.
            evidence = self.instance_failed(inst, wait_s=2.0 if code is None else 0.0) or self.box.probe()
            if evidence:
                raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"verifier gave no verdict: {evidence}")
            raise PolicyFault(f"the check gave no verdict on the document the policy left "
                              f"({'timed out' if res.timed_out else f'exit {res.exit_code}'}): {err}",
                              destroy=res.timed_out)
        self.last_verdict = verdict
        if verdict.get("passed") is True:
            return VerifierResult.success()
        return VerifierResult.failed(f"verifier: {verdict.get('why') or 'not done'}")

    last_verdict: dict[str, Any] | None = None

    @staticmethod
    def instance_failed(inst: RunningDesktop, wait_s: float = 0.0) -> str | None:
        """Evidence out of the policy's reach that the desktop failed under the attempt: the instance
        died (its holder, pid 1 and root, ends it when Xvfb dies), or LibreOffice is gone with a
        status other than 0 (killed or crashed) as its exit wrapper recorded it
        (``RunningDesktop.app_exit``: a file the policy's uid wrote is not taken, nor any file while
        LibreOffice runs). A policy's keys
        end LibreOffice only by closing it (status 0: a valid end), its shell cannot signal root's
        processes. Polled for ``wait_s``: the wrapper writes the status once the dying process is
        gone, and the holder exits a moment after Xvfb; None when nothing shows by then."""
        end = time.monotonic() + wait_s
        while True:
            if not inst.alive():
                return "the desktop instance died (its X server or holder is gone)"
            code = inst.app_exit()
            # taken only once LibreOffice is gone: its exit wrapper runs as LibreOffice's uid, so a
            # Save As could put a status file there while it runs
            if code is not None and code != 0 and not inst.app_running():
                return f"LibreOffice exited with status {code} (crashed or killed)"
            if time.monotonic() >= end:
                return None
            time.sleep(0.05)

    def failure_evidence(self) -> str | None:
        """The instance (Xvfb, the holder: root, out of the policy's reach) died or LibreOffice was
        killed (``instance_failed``), or the sandbox's own records. The rollout asks it when a step
        failed or timed out: a title awaited from a killed LibreOffice never comes."""
        if self.inst is not None:
            evidence = self.instance_failed(self.inst)
            if evidence:
                return evidence
        return super().failure_evidence()

    # -- branching: the live state a continuation must reproduce ------------------------------------
    PIXEL_TOLERANCE_PX = 64  # pixels that may differ: the blinking text cursor (about 2 x 18)

    # the UNO query (a Python started in the instance's namespaces) may run while the screen settles
    # (a wait of at least 0.8 s of stillness): benchmarks/desktop_capture.py measures both ways. Off:
    # a CI rehearsal's criu continuation was unfaithful on the screen with it on (the UNO call's own
    # effect on the screen can land after the stillness began); the settle must follow the query.
    capture_overlap: bool = False
    capture_phases: dict[str, float] = {}  # noqa: RUF012 - the last capture's (a new dict each time)

    def capture(self) -> dict[str, Any]:
        """Pixels (a PNG, base64), the window title (an open dialog shows there), lock files as
        own/foreign, and through UNO: document, text, cursor, selection, undo titles, modified flag.
        ``capture_phases`` has where the time went (seconds: stage, uno, settle, locks, png)."""
        inst, task = self.instance, self.task
        assert task is not None
        phases: dict[str, float] = {}
        t0 = time.monotonic()
        argv = self.runner_argv(inst, task, "--capture")
        phases["stage_s"] = time.monotonic() - t0
        asked: list[Any] = []

        def ask() -> None:
            t = time.monotonic()
            try:
                asked.append(inst.exec_inside(argv, timeout=30, output_limit=1 << 20))
            except BaseException as e:  # raised in the caller's thread below
                asked.append(e)
            phases["uno_s"] = time.monotonic() - t

        def settle() -> tuple[Any, bool]:
            t = time.monotonic()
            try:
                return inst.settle(time.monotonic() + 5.0, quiet_s=0.8)
            finally:
                phases["settle_s"] = time.monotonic() - t

        if self.capture_overlap:
            worker = threading.Thread(target=ask, name="desktop-capture-uno", daemon=True)
            worker.start()
            try:
                frame, _settled = settle()
            finally:
                worker.join()
        else:
            ask()
            frame, _settled = settle()
        res = asked[0]
        if isinstance(res, BaseException):
            raise res
        live: dict[str, Any] | None = None
        for line in res.stdout.decode(errors="replace").splitlines():
            if line.startswith("DRUMSBENCH_CAPTURE "):
                live = json.loads(line.split(" ", 1)[1])
        if live is None:
            raise SubstrateError(f"desktop: capture failed (exit {res.exit_code}): "
                                 f"{res.stderr.decode(errors='replace')[-200:]}")
        t = time.monotonic()
        locks = {rel: self._lock_state(data.decode(errors="replace"), inst)
                 for rel, data in sorted(inst.work_files().items()) if "/" not in rel and LOCK_RE.match(rel)}
        profile_lock = self._profile_lock_state(inst)
        phases["locks_s"] = time.monotonic() - t
        t = time.monotonic()
        screen = base64.b64encode(xcb.encode_png(frame.rgb)).decode()
        phases["png_s"] = time.monotonic() - t
        phases["total_s"] = time.monotonic() - t0
        self.capture_phases = phases
        return {"screen": screen, "title": frame.title, "locks": locks, "profile_lock": profile_lock, **live}

    def compare(self, prepared: dict[str, Any], now: dict[str, Any]) -> dict[str, bool]:
        out = super().compare(prepared, now)
        if "screen" in prepared:
            a, b = (xcb.decode_png(base64.b64decode(x["screen"])) if x.get("screen") else None
                    for x in (prepared, now))
            out["screen"] = (a is not None and b is not None and a.shape == b.shape
                             and frames_differ(a, b) <= self.PIXEL_TOLERANCE_PX)
        return out

    # -- screenshots kept for people ---------------------------------------------------------------
    def _keep_screenshots(self, task: DesktopTask) -> None:
        if not self.frames:
            return
        try:
            shots = ArtifactSink.folder(self.artifact_dir) / "screenshots"
            folder = shots / self.box.run_id / task.id
            if (folder / "end.png").exists():
                return
            if not shots.exists():  # the owner's alone: an oracle's end screen shows the answer
                shots.mkdir(parents=True, mode=0o700, exist_ok=True)
            folder.mkdir(parents=True, exist_ok=True)
            picks = {"start": self.frames[0], "middle": self.frames[len(self.frames) // 2], "end": self.frames[-1]}
            for name, (_title, png) in picks.items():
                (folder / f"{name}.png").write_bytes(png)
            (folder / "titles.json").write_text(json.dumps({k: v[0] for k, v in picks.items()}, indent=1))
        except OSError:
            pass  # screenshots are for people; never let them fail an attempt
