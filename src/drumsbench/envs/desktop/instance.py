"""One desktop instance: Xvfb + openbox + LibreOffice in their own namespaces, inside a sandbox's folders.

Process tree (host view)::

    harness ── unshare --fork --pid --ipc --uts --net --mount --mount-proc   (no sandbox label)
                 └─ holder.py  = pid 1 of the instance's namespaces            (labelled)
                      ├─ Xvfb :0 -noreset -nolock -nolisten tcp
                      └─ openbox --startup soffice ...
                           └─ soffice.bin (UNO on 127.0.0.1 inside the private network)

- Files: the document is in the sandbox's work folder, the profile (a copy of the cached template)
  in its home, LibreOffice's temporary files in its tmp. The X socket is in ``<tmp>/.X11-unix``
  (bound over ``/tmp/.X11-unix`` inside) and Xvfb's compiled keymaps in ``<tmp>/xkb`` (bound over
  ``/var/lib/xkb``): nothing of an instance is in a shared folder, so every instance can use
  display ``:0`` (the same paths in every instance, which a checkpoint/restore needs).
- The harness reaches X through the socket's host path (``xcb.py``) and runs its other clients
  (xdotool, the UNO verifier, shell actions) as short-lived processes entered into the instance's
  mount and network namespaces with ``nsenter``: no harness connection stays open.
- Labels: the holder and everything below it carry the sandbox's ``DRUMSBENCH_RUN`` /
  ``DRUMSBENCH_SANDBOX`` variables, so the substrate's reset and destroy (and ``drumsbench gc``
  after a crash) kill the tree. ``unshare`` itself carries no label: when the holder dies it is
  still alive to reap it and exits, and the harness reaps ``unshare`` (a waiter thread), so a
  kill leaves no zombie behind. As pid 1 the holder reaps every orphan inside; killing it makes
  the kernel kill the whole namespace.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from drumsbench import office_lockdown
from drumsbench.core.errors import SubstrateError, UsageError
from drumsbench.envs.desktop import kiosk, saver, xcb
from drumsbench.envs.desktop.profile import PROFILE_NAME, SOFFICE, copy_profile
from drumsbench.envs.desktop.running import RunningDesktop
from drumsbench.envs.desktop.settle import (
    SETTLE_MODES,
    Frame,
    SettleParams,
    SettleReport,
    settle_evidence,
    settle_quiet,
)
from drumsbench.substrates.base import (
    DEFAULT_OUTPUT_LIMIT,
    ExecResult,
    HostFolders,
    HostLaunching,
    InitLaunching,
    Sandbox,
    ViewLaunching,
)

RUN_VAR, SANDBOX_VAR = HostLaunching.RUN_VAR, HostLaunching.SANDBOX_VAR

HOLDER = Path(__file__).with_name("holder.py")
SAVER = Path(__file__).with_name("saver.py")  # run in a guest by its own Python
HOSTNAME = "drumsbench-desktop"
DISPLAY = 0
UNO_PORT = 2002
SYSTEM_PYTHON = "/usr/bin/python3"
NEEDED = {
    "Xvfb": "xvfb",
    "openbox": "openbox",
    "xdotool": "xdotool",
    "unshare": "util-linux",
    "nsenter": "util-linux",
}


def missing() -> str | None:
    """None when every system part of the desktop is installed, else what to install."""
    gone = [pkg for tool, pkg in NEEDED.items() if shutil.which(tool) is None]
    if not os.path.exists(SOFFICE):
        gone += ["libreoffice-writer", "libreoffice-calc"]
    if not os.path.exists(SYSTEM_PYTHON):
        gone.append("python3")
    elif subprocess.run([SYSTEM_PYTHON, "-c", "import uno"], capture_output=True).returncode != 0:
        gone.append("python3-uno")
    lib = xcb.available()
    if lib:
        gone.append("libxcb1")
    if gone:
        return f"desktop environment needs: apt-get install {' '.join(dict.fromkeys(gone))} (scripts/setup-desktop.sh)"
    unlocked = office_lockdown.missing("/")  # macros one dialog away: not a policy's desktop
    if unlocked:
        return unlocked
    if os.geteuid() != 0:
        return "desktop environment needs root (it creates pid/net/mount namespaces with unshare)"
    return None


def _children(parent: int) -> Iterator[tuple[int, str]]:
    """(pid, command name) of each live process whose parent is ``parent`` (read from /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        head, rest = stat.rsplit(")", 1)
        if int(rest.split()[1]) == parent:
            yield int(entry), head.partition("(")[2]


@dataclass(frozen=True)
class Settings:
    width: int = 1280
    height: int = 800
    start_timeout_s: float = 30.0
    grab_timeout_s: float = 3.0
    # How a step ends (settle.py): "evidence" — the X server and the application say they are done
    # (drawing stopped, the application answered a ping after the input, window, focus and title
    # unchanged, two grabs agree), with the quiet period only as a fallback; "quiet" — the screen
    # stayed still for ``settle_quiet_s`` (the clock).
    settle_mode: str = "evidence"
    settle_interval_s: float = 0.05
    settle_quiet_s: float = 0.25  # quiet mode (and the fallback): the screen must stay still this long
    settle_max_s: float = 2.0
    settle_tolerance_px: int = 64  # pixels that may differ between "equal" frames (the text cursor blinks)
    settle_ping_timeout_s: float = 2.0  # evidence: an application busy (silent) this long -> the quiet fallback
    settle_evidence_quiet_s: float = 0.03  # evidence: nothing drawn or moved this long before the last grab
    # evidence: after a window was created, mapped, moved or destroyed, no such event this long (the
    # window manager answers no ping: under load openbox maps a new dialog 0.2 s after it exists)
    settle_wm_quiet_s: float = 0.25
    type_delay_ms: int = 8
    key_delay_ms: int = 20
    wm_first: bool = True  # start LibreOffice only once openbox runs (else both at once)
    # openbox with the kiosk configuration (kiosk.py: no key or mouse bindings, no title-bar buttons, so no
    # key or click hides LibreOffice's window); False: openbox's stock configuration
    wm_kiosk: bool = True
    # Checkpointable (for the ``criu`` fork method): no mount namespace of its own (CRIU cannot
    # dump one copied from the host), so the X socket is the host's ``/tmp/.X11-unix/X<n>`` with a
    # display number unique to the instance. Off by default.
    checkpointable: bool = False

    def __post_init__(self) -> None:
        if self.settle_mode not in SETTLE_MODES:
            raise UsageError(f"desktop Settings.settle_mode: {self.settle_mode!r} is not one of "
                             f"{', '.join(SETTLE_MODES)}")

    def settle_params(self) -> SettleParams:
        return SettleParams(self.settle_interval_s, self.settle_quiet_s, self.settle_max_s, self.settle_tolerance_px,
                            self.grab_timeout_s, self.settle_ping_timeout_s, self.settle_evidence_quiet_s,
                            self.settle_wm_quiet_s)


# Folders every uid may write on a Debian system besides /tmp; the instance sees its sandbox's tmp at
# each one its view has (the holder binds those that exist)
SHARED_WRITABLE = ("/var/tmp", "/dev/shm", "/run/lock")

# LibreOffice and openbox of a checkpointable instance on the host: root's uid (CRIU restores a process
# with the uid it was dumped with, and on a host whose root lacks CAP_SYS_RESOURCE, as here, CRIU
# can dump no process of another uid: its prlimit of the task is refused), but no capability at all
# (none inheritable, an empty bounding set: an exec gains none) and no way back to privileges
# (no_new_privs), which CRIU dumps and restores with the process. What it still may: what the
# uid 0 owns (the system's files); not what another uid owns (another sandbox's folders).
CHECKPOINT_CONFINE = ("/usr/bin/setpriv", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--")


def screen_problem(rgb: np.ndarray) -> str | None:
    """'black screen' / 'blank screen (one colour)' for a frame no person could act on, else None.
    Every pixel counts (a pointer or a text cursor anywhere makes the frame not blank)."""
    pixels = rgb.reshape(-1, 3)
    spread = int((pixels.max(axis=0) - pixels.min(axis=0)).max())  # uint8: max >= min, no wrap
    if spread <= 8:
        mean = float(pixels.mean())
        return "black screen" if mean < 16 else f"blank screen (one colour, mean level {mean:.0f})"
    return None


class DesktopInstance(RunningDesktop):
    """A running desktop for one sandbox that lets an environment launch its own processes with its
    confinement (``ViewLaunching``: process, bwrap, overlay, docker, podman; a checkpointable one on
    an ``InitLaunching`` sandbox, podman, under the sandbox's init) and run launchers on the host
    (``HostLaunching``: the ``nsenter`` of every client)."""

    def __init__(self, box: Sandbox, settings: Settings | None = None) -> None:
        if not isinstance(box, ViewLaunching) or not isinstance(box, HostLaunching):
            # A VM runs its commands behind a hypervisor: no host launcher reaches them. The CLI
            # refuses it up front (DesktopEnv.requires).
            raise SubstrateError(f"the desktop environment needs sandboxes that are ViewLaunching and "
                                 f"HostLaunching (process, bwrap, overlay, docker, podman); {box.substrate} is "
                                 "not supported yet (docs/desktop.md)")
        self.box = box
        self.launching: HostLaunching = box  # the same sandbox, as the launcher of every client
        self.settings = settings or Settings()
        # a checkpointable instance in a sandbox its engine checkpoints whole (podman) runs in the
        # sandbox's own namespaces under its init: the engine's checkpoint carries it
        self.in_init = self.settings.checkpointable and isinstance(box, InitLaunching)
        self.view = box.init_view() if isinstance(box, InitLaunching) and self.in_init else box.launch_view()
        self.host_root = Path(self.view.host_root)
        self.work = self.host_path(box.paths.work)
        self.home = self.host_path(box.paths.home)
        self.tmp = self.host_path(box.paths.tmp)
        self.x_dir = self.tmp / ".X11-unix"
        self.profile = self.home / PROFILE_NAME
        self.app_exit_file = self.tmp / ".drumsbench-app-exit"
        self.launch_log = self.tmp / ".drumsbench-launch.err"
        self.proc: subprocess.Popen[bytes] | None = None
        self.holder_pid: int | None = None
        self.t_launch = 0.0
        self.display = DISPLAY
        # where the instance's processes see the sandbox's root folder, when not at its host path:
        # a bwrap or overlay view (/sandbox), or a restored continuation (the parent's root)
        self.inside_root: str | None = None if self.view.inside_root == str(self.host_root) else self.view.inside_root
        self.restored = False
        self._x11_claimed = False
        self._host_left: set[str] = set()  # host paths of sockets seen in the instance's network namespace
        self._released = threading.Lock()
        self.last_settle: SettleReport | None = None  # how the last ``settle`` ended
        self._host_pids: dict[int, int] = {}  # pid inside the instance -> host pid (``asleep``)
        if self.in_init:
            assert self.view.host_tmp is not None
            self.x_dir = self.view.host_tmp / ".X11-unix"  # the sandbox's own /tmp: its own display
        elif self.settings.checkpointable:
            if self.inside_root is not None:
                raise SubstrateError(f"desktop: a checkpointable instance needs host folders seen at their host "
                                     f"paths (the process substrate), or a sandbox its engine checkpoints "
                                     f"whole (podman), not {box.substrate}'s view")
            self.display = _free_display()
            self.x_dir = Path("/tmp/.X11-unix")

    def host_path(self, path: str) -> Path:
        """Where the harness reaches the sandbox's path ``path`` from the host."""
        root = self.box.paths.root.rstrip("/")
        if path != root and not path.startswith(root + "/"):
            raise SubstrateError(f"desktop: {path!r} is outside sandbox {self.box.id} ({root})")
        return Path(os.path.normpath(self.host_root / os.path.relpath(path, root)))

    @classmethod
    def adopt_restored(cls, box: Sandbox, settings: Settings, pid: int, display: int,
                       inside_root: str) -> DesktopInstance:
        """A CRIU-restored instance: ``pid`` is its holder (host pid), living in a private mount
        namespace where this sandbox's folder shows at ``inside_root`` (the parent's root)."""
        inst = cls(box, settings)
        inst.display, inst.holder_pid, inst.inside_root, inst.restored = display, pid, inside_root, True
        inst.x_dir = Path(f"/proc/{pid}/root/tmp/.X11-unix")  # in_init: the same as the sandbox's /tmp
        inst.t_launch = time.monotonic()
        return inst

    def uno_connection(self) -> str:
        """UNO listens on TCP inside the private network; a checkpointable instance on a named pipe
        (a unix socket: CRIU 4.1 cannot dump TCP sockets on this kernel, SO_PASSCRED is refused)."""
        if self.settings.checkpointable:
            return f"pipe,name=drumsbench-{self.display}"
        return f"socket,host=127.0.0.1,port={UNO_PORT}"

    def inside(self, path: str | Path) -> str:
        """The path the instance's processes see for a host path of this sandbox."""
        path = str(path)
        if self.inside_root is None:
            return path
        root = str(self.host_root)
        return self.inside_root + path[len(root):] if path.startswith(root) else path

    @property
    def profile_inside(self) -> Path:
        return Path(self.inside(self.profile))

    @property
    def work_inside(self) -> str:
        return self.inside(self.work)

    @property
    def app_exit_inside(self) -> str:
        return self.inside(self.app_exit_file)

    @property
    def policy_uid(self) -> int | None:
        return self.launching.uid if isinstance(self.box, HostLaunching) else None

    # -- files (RunningDesktop) --------------------------------------------------------------------
    def work_files(self) -> dict[str, bytes]:
        return {p.relative_to(self.work).as_posix(): p.read_bytes()
                for p in sorted(self.work.rglob("*")) if p.is_file()}

    @property
    def app_ids(self) -> tuple[int, int] | None:
        """(uid, gid) LibreOffice and the window manager run as (``LaunchView.app_ids``); None: root
        of the view. A checkpointable instance on the host keeps root (docs/desktop.md)."""
        if self.settings.checkpointable or self.in_init:
            return None
        return self.view.app_ids

    @property
    def office_runs_as(self) -> str:
        if self.app_ids is not None:
            return "unprivileged uid"
        if self.restored and not self.in_init:  # restore.restore_tree: the host's mounts read-only
            return "root's uid on the host without capabilities, its mounts read-only (restored checkpoint)"
        if self.settings.checkpointable and not self.in_init:
            return "root's uid on the host without capabilities (checkpointable)"
        if self.view.read_only_system or self.in_init:
            return "container root"
        return "root of the view"

    def _give(self, path: Path) -> None:
        """A file or folder the harness made for the instance becomes its applications' (never
        following a link)."""
        if self.app_ids is not None:
            os.chown(path, *self.app_ids, follow_symlinks=False)

    def write_work(self, name: str, data: bytes) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / name).write_bytes(data)
        self._give(self.work / name)

    def remove_stale(self) -> None:
        if self.work.is_dir():
            for p in self.work.iterdir():
                if p.name.startswith(".~lock.") and p.name.endswith("#"):
                    p.unlink(missing_ok=True)
        (self.profile / ".lock").unlink(missing_ok=True)
        (self.x_dir / f"X{self.display}").unlink(missing_ok=True)

    def profile_lock(self) -> str | None:
        try:
            return (self.profile / ".lock").read_text(errors="replace")
        except FileNotFoundError:
            return None

    def launch_said(self) -> str:
        try:
            return self.launch_log.read_text(errors="replace").strip()[-300:]
        except OSError:
            return ""

    def sandbox_gone(self) -> bool:
        box = self.box
        try:  # both raise once the sandbox is destroyed
            if isinstance(box, HostFolders):
                box.host_path(box.paths.root)
            elif isinstance(box, ViewLaunching):
                box.launch_view()
        except SubstrateError:
            return True
        return False

    # -- life cycle ------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Private folders and a fresh profile copy (the profile's lock is never copied)."""
        if self._needs_host_x11() and not self._x11_claimed:
            _HOST_X11.claim()  # the shared X socket folder, or the mount point of a bind over it
            self._x11_claimed = True
        if self.x_dir != _HOST_X11.path:
            self.x_dir.mkdir(parents=True, exist_ok=True)
            self.x_dir.chmod(0o1777)
        (self.tmp / "xkb").mkdir(parents=True, exist_ok=True)
        self.app_exit_file.unlink(missing_ok=True)
        if self.profile.exists():
            shutil.rmtree(self.profile)
        copy_profile(self.profile)
        if self.app_ids is not None:
            # what the harness put in the sandbox's folders (the document, the profile, a
            # continuation's copied files) and what an earlier instance as root left there (a
            # restored one): LibreOffice's to write (else it opens the document read-only or shows
            # no window). Xvfb's own (root's) folders in tmp stay root's.
            keep = {self.x_dir, self.tmp / "xkb"}
            for top in (self.work, self.home, self.tmp):
                for folder, dirs, files in os.walk(top):
                    dirs[:] = [d for d in dirs if Path(folder) / d not in keep]
                    for name in [*dirs, *files]:
                        self._give(Path(folder) / name)
        if self.settings.checkpointable and not self.in_init:
            # LibreOffice is root's uid without a capability (CHECKPOINT_CONFINE): the folders are
            # the uid 0's own, the sandbox's gid keeps the policy's commands' access (0770)
            for top in (self.work, self.home, self.tmp):
                os.chown(top, 0, -1, follow_symlinks=False)
        if self.settings.wm_kiosk:  # root's, read-only to the applications (after the hand-over above)
            rc = self.tmp / kiosk.FILE_NAME
            rc.unlink(missing_ok=True)
            fd = os.open(rc, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)  # never through a link
            os.fchmod(fd, 0o644)  # whatever the harness's umask
            with os.fdopen(fd, "w") as f:
                f.write(kiosk.RC_XML)
        if not os.path.isdir("/var/lib/xkb"):  # mount point of the keymap bind
            os.makedirs("/var/lib/xkb", mode=0o1777, exist_ok=True)

    def _needs_host_x11(self) -> bool:
        """Does this instance use the host's ``/tmp/.X11-unix`` (a checkpointable one keeps its X
        socket there; one whose sandbox lies below /tmp binds its own folder over it)?"""
        if self.in_init:
            return False  # the sandbox's own /tmp
        return self.settings.checkpointable or any(dst == str(_HOST_X11.path) for _, dst in self._binds())

    def _binds(self) -> list[list[str]]:
        """What the instance's own mount namespace sees instead of the host's: the sandbox's tmp as
        ``/tmp`` (so the X socket, Xvfb's lock and LibreOffice's ``OSL_PIPE_*`` IPC sockets are the
        sandbox's and go with it, never left in the host's /tmp) and its xkb folder as Xvfb's
        keymap cache. A sandbox whose own folder lies below the host's /tmp cannot have /tmp
        replaced (its paths would vanish inside): then only ``/tmp/.X11-unix`` is bound."""
        xkb = [self.inside(self.tmp / "xkb"), "/var/lib/xkb"]
        work = Path(self.inside(self.work)) if self.inside_root is not None else self.work.resolve()
        if Path("/tmp") in work.parents:
            return [[self.inside(self.x_dir), "/tmp/.X11-unix"], xkb]
        # the other places every uid may write (the host's, a container's) are the sandbox's tmp
        # too: nothing the instance saves there outlives the sandbox or meets a neighbour's files
        shared = [[self.inside(self.tmp), place] for place in SHARED_WRITABLE]
        return [[self.inside(self.tmp), "/tmp"], xkb, *shared]

    def launch(self, document: str) -> None:
        """Start the namespaces, Xvfb, openbox and soffice on ``document`` (its name in the work
        folder), through the sandbox's launch view: the instance's processes see the sandbox as its
        commands do."""
        document = str(self.work / document)
        s = self.settings
        box = self.box
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": self.inside(self.home),
            "TMPDIR": self.inside(self.tmp),
            "LANG": "C.UTF-8",
            "SAL_USE_VCLPLUGIN": "gen",
            "XDG_CONFIG_HOME": self.inside(self.home / ".config"),
            "XDG_CACHE_HOME": self.inside(self.home / ".cache"),
            "XDG_RUNTIME_DIR": self.inside(self.tmp),
        }
        app = [
            SOFFICE, f"-env:UserInstallation={self.profile_inside.as_uri()}", "--norestore", "--nologo",
            f"--accept={self.uno_connection()};urp;StarOffice.ComponentContext", self.inside(document),
        ]
        ckpt = s.checkpointable or self.in_init
        cfg = {
            "hostname": HOSTNAME,
            "binds": [] if ckpt else self._binds(),
            "display": self.display,
            "screen": f"{s.width}x{s.height}x24",
            "env": env,
            "app": app,
            "wm_first": s.wm_first,
            "app_exit_file": self.inside(self.app_exit_file),
            "wm_rc": self.inside(self.tmp / kiosk.FILE_NAME) if s.wm_kiosk else None,
            # a container's layer read-only to the instance but for the sandbox's folder and /tmp
            "writable_only": [self.view.inside_root, "/tmp"] if self.view.read_only_system and not ckpt else None,
            "drop_admin": self.view.drop_admin,
            "keep_caps": self.view.keep_caps,
        }
        if self.app_ids is not None:
            # LibreOffice and openbox as the sandbox's second uid, with no way back to privileges;
            # Xvfb and the holder stay root (the X socket becomes that uid's alone)
            uid, gid = self.app_ids
            cfg["as_user"] = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                              "--no-new-privs", "--"]
            cfg["x_owner"] = uid
        elif s.checkpointable and not self.in_init:
            cfg["as_user"] = list(CHECKPOINT_CONFINE)
        python = SYSTEM_PYTHON if os.path.exists(SYSTEM_PYTHON) else sys.executable
        # checkpointable: no mount namespace of its own (CRIU), the process substrate only (__init__)
        # in_init: the sandbox's own namespaces, under its init (the view's prefix detaches it)
        prefix = ["unshare", "--fork", "--pid", "--ipc", "--uts", "--net", "--"] if ckpt and not self.in_init \
            else list(self.view.prefix)
        # the holder's file is out of sight in every view (overlay's; process's own view covers the
        # package and its checkout): its source is passed instead
        holder = ["-c", HOLDER.read_text()]
        argv = [*prefix, "env", f"{RUN_VAR}={box.run_id}", f"{SANDBOX_VAR}={box.id}",
                python, "-I", *holder, json.dumps(cfg)]
        self.t_launch = time.monotonic()
        # bwrap's recursive read-only binds race with mounts others make and remove meanwhile (a
        # docker container's under /var): a launcher that fails before the holder runs is retried
        tries = 3 if self.inside_root is not None else 1
        for left in range(tries - 1, -1, -1):
            try:
                self._launch_once(argv, env["PATH"], prefix[0])
                return
            except SubstrateError:
                if left == 0 or self.proc is None or self.proc.poll() is None:
                    raise
                self.proc = None

    def _launch_once(self, argv: list[str], path: str, launcher: str) -> None:
        # the launcher's and the holder's complaints, for the error when the start fails (in the
        # sandbox's own tmp: emptied by its reset, gone with it)
        self.launch_log.unlink(missing_ok=True)
        try:
            with open(self.launch_log, "wb") as err:
                proc = subprocess.Popen(argv, env={"PATH": path, "LANG": "C.UTF-8"}, cwd=str(self.work),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                        start_new_session=True)
        except OSError as e:
            raise SubstrateError(f"desktop: cannot start {launcher}: {e}") from e
        self.proc = proc
        threading.Thread(target=self._reap, args=(proc,), name=f"reap-desktop-{proc.pid}", daemon=True).start()
        # bwrap sets up dozens of mounts first: under heavy load that took more than 5 s
        # in_init: the launcher detaches the holder, which the sandbox's init adopts
        top = self.view.init_pid if self.in_init and self.view.init_pid is not None else proc.pid
        self.holder_pid = self._find_holder(top, deadline=time.monotonic() + 20.0)

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        self._release_host()

    def host_sockets(self) -> list[str]:
        """Sockets a checkpointable instance makes in the host's /tmp: X's, LibreOffice's UNO pipe
        and its single-instance pipe (``single_office_pipe``)."""
        uid = os.getuid()
        return [f"/tmp/.X11-unix/X{self.display}", f"/tmp/OSL_PIPE_{uid}_drumsbench-{self.display}",
                f"/tmp/{single_office_pipe(uid, self.profile.as_uri())}"]

    def _note_host_sockets(self) -> None:
        """Remember the path sockets bound in the instance's own network namespace (only its
        processes are there) that lie in the host's /tmp: whatever LibreOffice names them, they are
        removed with the instance. Read while the instance lives (a dead namespace lists nothing)."""
        if not self.settings.checkpointable or self.restored or self.in_init or self.holder_pid is None:
            return
        try:
            lines = Path(f"/proc/{self.holder_pid}/net/unix").read_text().splitlines()[1:]
        except OSError:
            return
        for line in lines:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith("/tmp/"):
                self._host_left.add(fields[7])

    def _release_host(self) -> None:
        """Once the instance is dead: remove the sockets a checkpointable instance left in the host's
        /tmp and give back the host's /tmp/.X11-unix (removed when this process made it and no
        instance uses it any more). Idempotent (``stop`` and the reaper thread both call it)."""
        if not self._released.acquire(blocking=False):
            return
        if self.settings.checkpointable and not self.restored and not self.in_init:
            for path in sorted(set(self.host_sockets()) | self._host_left):
                with contextlib.suppress(OSError):
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        os.unlink(path)
        elif self.inside_root is None and not self.in_init and all(dst != "/tmp" for _, dst in self._binds()):
            # a sandbox below the host's /tmp keeps the host's /tmp (``_binds``): LibreOffice's
            # single-instance pipe is made there, and one killed (not closed) leaves it behind. Its
            # name is this profile's (no other instance's); the instance is dead by now.
            pipe = f"/tmp/{single_office_pipe(os.getuid(), self.profile_inside.as_uri())}"
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(pipe).st_mode):
                    os.unlink(pipe)
        if self._x11_claimed:
            self._x11_claimed = False
            _HOST_X11.release()

    def _find_holder(self, parent: int, deadline: float) -> int:
        """The holder: the first process below the launcher (``unshare``, or ``bwrap`` and its init)
        that carries the sandbox's label."""
        label = f"{SANDBOX_VAR}={self.box.id}".encode()
        while time.monotonic() < deadline:
            level = [parent]
            while level:
                below = [pid for p in level for pid, _comm in _children(p)]
                for pid in below:
                    try:
                        if label in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                            return pid
                    except OSError:
                        continue
                level = below
            code = self.proc.poll() if self.proc is not None else None
            if code is not None and not (self.in_init and code == 0):
                break  # the launcher failed (in_init: it exits 0 once it has detached the holder)
            time.sleep(0.005)
        code = self.proc.poll() if self.proc is not None else None
        try:
            said = self.launch_log.read_text(errors="replace").strip()[-300:]
        except OSError:
            said = ""
        raise SubstrateError(f"desktop: the namespace holder did not start ({self.view.prefix[0]} exit {code})"
                             + (f": {said}" if said else ""))

    def app_exit(self) -> int | None:
        """LibreOffice's exit status once it has exited (0: closed by the user), else None. Only
        as its exit wrapper (root) wrote it: the file lies in the sandbox's tmp, where the policy's
        shell (its own uid) may put one of its own, never one owned by another uid; a file of the
        policy's uid, or a link, is no status."""
        try:
            fd = os.open(self.app_exit_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (self.policy_uid is not None and st.st_uid == self.policy_uid):
                return None
            return int(os.read(fd, 64).decode(errors="replace").strip() or "-1")
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)

    def app_running(self) -> bool:
        """Is a LibreOffice process (``soffice.bin``) alive in this instance's pid namespace?"""
        if self.holder_pid is None:
            return False
        try:
            ns = os.readlink(f"/proc/{self.holder_pid}/ns/pid")
        except OSError:
            return False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if (Path(f"/proc/{entry}/comm").read_text().strip() == "soffice.bin"
                        and os.readlink(f"/proc/{entry}/ns/pid") == ns):
                    return True
            except OSError:
                continue
        return False

    def alive(self) -> bool:
        if self.restored or self.in_init:
            return self.holder_pid is not None and _running(self.holder_pid)
        # the holder itself, not only its launcher: ``unshare`` exits a moment after it (while it
        # lives the holder's pid, a zombie at worst, cannot be another process's)
        return self.proc is not None and self.proc.poll() is None and \
            (self.holder_pid is None or _running(self.holder_pid))

    def stop(self) -> None:
        """Kill the whole instance (SIGKILL to the namespace's pid 1) and reap it. Idempotent."""
        self._note_host_sockets()
        proc, pid = self.proc, self.holder_pid
        self.proc = self.holder_pid = None
        if self.in_init:
            # no pid namespace of its own: every process of the sandbox's but its init goes
            self._end_under_init(proc)
            return
        if self.restored:
            # pid 1 of the restored namespaces: its death takes every process of the continuation
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            return
        # While unshare lives, its child (the holder) is alive or an unreaped zombie: its pid cannot
        # have been reused, so the kill cannot hit a stranger.
        if pid is not None and proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            if proc.poll() is None:
                return  # still alive: the reaper thread releases the host's paths when it dies
        self._release_host()

    def _end_under_init(self, proc: subprocess.Popen[bytes] | None) -> None:
        """SIGKILL every process in the sandbox's pid namespace but its init (an in_init instance's
        tree, and what it started), wait until they are gone (at most 10 s), reap the launcher."""
        init = self.view.init_pid
        try:
            ns = os.readlink(f"/proc/{init}/ns/pid")
        except OSError:
            ns = None  # the sandbox is gone, and its processes with it
        deadline = time.monotonic() + 10.0
        while ns is not None and time.monotonic() < deadline:
            left = [pid for pid in self.namespace_pids(ns).values() if pid != init]
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._release_host()

    def freeze_display(self) -> None:
        pid = self.xvfb_pid()
        if pid is None:
            raise SubstrateError("desktop: no Xvfb to freeze")
        os.kill(pid, signal.SIGSTOP)

    def xvfb_pid(self) -> int | None:
        """Host pid of the instance's Xvfb (a child of the holder)."""
        if self.holder_pid is None:
            return None
        for pid, comm in _children(self.holder_pid):
            if comm == "Xvfb":
                return pid
        return None

    # -- X ---------------------------------------------------------------------------------------
    def grab(self, timeout: float | None = None) -> Frame:
        g = xcb.grab(str(self.x_dir), self.display, timeout or self.settings.grab_timeout_s)
        return Frame(g.rgb, g.title)

    def region(self, left: int, top: int, width: int, height: int,
               timeout: float | None = None) -> tuple[np.ndarray, str]:
        """A rectangle of the screen and the active title: cheap enough to poll during start-up."""
        with xcb.XClient(str(self.x_dir), self.display, timeout or self.settings.grab_timeout_s) as x:
            return x.grab_rgb(left, top, width, height), x.active_title()

    def title(self, timeout: float | None = None) -> str:
        with xcb.XClient(str(self.x_dir), self.display, timeout or self.settings.grab_timeout_s) as x:
            return x.active_title()

    def blank(self) -> None:
        with xcb.XClient(str(self.x_dir), self.display, self.settings.grab_timeout_s) as x:
            x.blank_screen()

    def screen_saver(self) -> str:
        try:
            return saver.state(str(self.x_dir), self.display, self.settings.grab_timeout_s)
        except OSError as e:
            raise xcb.XError(f"screen saver state: {e}") from None

    def settle(self, deadline: float, first: Frame | None = None, quiet_s: float | None = None) -> tuple[Frame, bool]:
        """Wait until the step is over (``settle.py``), at most ``settle_max_s`` (plus the quiet
        period) or until ``deadline``: in ``Settings.settle_mode``, or with ``quiet_s`` given, until
        the screen has been still that long (``first``: a frame already grabbed, quiet mode only).
        Returns the last frame and whether it settled; ``last_settle`` tells how.
        ``xcb.XTimeout`` when the server does not answer, ``xcb.XError`` when it fails."""
        s = self.settings
        params = s.settle_params()
        if quiet_s is not None or s.settle_mode == "quiet":
            frame, report = settle_quiet(self.grab, params, deadline, first,
                                         s.settle_quiet_s if quiet_s is None else quiet_s)
        else:
            frame, report = settle_evidence(self.client, self.grab, params, deadline, self.asleep)
        self.last_settle = report
        return frame, report.settled

    def asleep(self, ns_pid: int) -> bool | None:
        """Is the main thread of this instance's process ``ns_pid`` (its number inside the instance's
        pid namespace, as ``_NET_WM_PID`` gives it) asleep — waiting for input or a timer — rather
        than running or runnable? None when there is no such process."""
        if ns_pid <= 0:
            return None
        host = self._host_pids.get(ns_pid)
        for attempt in (0, 1):
            if host is not None:
                try:
                    return Path(f"/proc/{host}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"
                except OSError:
                    pass
            if attempt == 0:
                self._host_pids = self.namespace_pids()
                host = self._host_pids.get(ns_pid)
        return None

    def namespace_pids(self, ns: str | None = None) -> dict[int, int]:
        """{pid inside the instance's pid namespace (or ``ns``): host pid} of its processes (a /proc walk)."""
        if ns is None:
            if self.holder_pid is None:
                return {}
            try:
                ns = os.readlink(f"/proc/{self.holder_pid}/ns/pid")
            except OSError:
                return {}
        found: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != ns:
                    continue
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
            if nspid:
                found[int(nspid[-1])] = int(entry)
        return found

    def client(self, timeout: float) -> xcb.XClient:
        """An X connection to the instance's server (use it with ``with``: closed at the end)."""
        return xcb.XClient(str(self.x_dir), self.display, timeout)

    # -- commands inside the instance -------------------------------------------------------------
    def exec_inside(self, argv: list[str], timeout: float, *, all_namespaces: bool = False,
                    output_limit: int = DEFAULT_OUTPUT_LIMIT, stdin: bytes | None = None,
                    as_sandbox_user: bool = False) -> ExecResult:
        """Run ``argv`` entered into the instance's mount and network namespaces (all of them with
        ``all_namespaces``), as a sandbox command: killed on timeout, bounded output. With
        ``as_sandbox_user`` it runs as the sandbox's own uid (a policy's shell action), so it cannot
        signal LibreOffice, Xvfb or the namespace holder, which run as root."""
        if self.holder_pid is None:
            raise SubstrateError("desktop: the instance is not running")
        ns = ["-m", "-n", "-u", "-i", "-p"] if all_namespaces else ["-m", "-n"]
        uid = self.launching.uid if as_sandbox_user else None
        confine: list[str] = []
        if as_sandbox_user:
            # A policy's shell action: never in the instance's network namespace (LibreOffice's UNO
            # listener there takes any local client and runs commands as root for it), and in a
            # mount namespace of its own where the instance's sockets (X, LibreOffice's pipes) are
            # covered, set up as root before the privileges drop (it cannot uncover them).
            ns = [n for n in ns if n != "-n"]
            if uid is not None:
                drop = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
                confine = ["unshare", "--net", "--mount", "--propagation", "private", "--",
                           "/bin/sh", "-c", HIDE_SOCKETS, "hide", *drop]
            else:  # the environment does not offer it (``shell_unavailable``): never reached by a policy
                raise SubstrateError(f"desktop: {self.shell_unavailable()}")
        # a restored continuation sees this sandbox's folder at the parent's path (and nothing of
        # the host's /tmp): host paths of the sandbox are given as the instance sees them
        argv = [self.inside(a) for a in argv]
        # the working folder is set by `env -C` once inside the namespaces: nsenter's --wd=PATH opens PATH
        # before it enters them, i.e. on the host's side, which for a restored continuation is the
        # parent's live work folder (its relative writes would land in the parent)
        cmd = ["nsenter", "-t", str(self.holder_pid), *ns, "--", *confine, "env", "-C", self.inside(self.work),
               *argv]
        env = {"DISPLAY": f":{self.display}", "HOME": self.inside(self.home), "TMPDIR": self.inside(self.tmp)}
        if not as_sandbox_user:
            env["DRUMSBENCH_UNO"] = self.uno_connection()
        # nsenter needs root: the sandbox runs its commands as its own uid, this launcher as root
        return self.launching.exec_launcher(cmd, timeout=timeout, cwd=self.box.paths.work, env=env, stdin=stdin,
                                      output_limit=output_limit)

    def shell_unavailable(self) -> str | None:
        """Why a policy's shell action is not offered in this instance (None: it is). It needs the
        sandbox's own uid (process): on bwrap and overlay the sandbox's root keeps CAP_DAC_OVERRIDE,
        and the instance's X and LibreOffice sockets are reachable through other paths of the same
        folder, so a shell action there could drive or blank the screen or reach LibreOffice."""
        if self.launching.uid is None:
            return (f"shell actions are not offered on {self.box.substrate}: a shell action needs a uid of its "
                    "own to be kept from the instance's X server and LibreOffice (use process)")
        return None


# Run as root in a policy shell action's own mount namespace before its privileges drop: covers the
# instance's X sockets (an empty tmpfs over /tmp/.X11-unix) and LibreOffice's pipes (/dev/null bound
# over each /tmp/OSL_PIPE_* socket); fails closed (exit 126) when a cover cannot be put, then runs "$@".
HIDE_SOCKETS = (
    'if [ -d /tmp/.X11-unix ]; then mount -t tmpfs -o size=4k,mode=755 drumsbench-hidden /tmp/.X11-unix '
    '|| { echo "desktop: cannot hide the X sockets" >&2; exit 126; }; fi; '
    'for s in /tmp/OSL_PIPE_*; do if [ -S "$s" ]; then mount --bind /dev/null "$s" '
    '|| { echo "desktop: cannot hide $s" >&2; exit 126; }; fi; done; exec "$@"'
)


def single_office_pipe(uid: int, user_installation: str) -> str:
    """The name of LibreOffice's single-instance IPC pipe for a user installation URL:
    ``OSL_PIPE_<uid>_SingleOfficeIPC_`` + the MD5 of the URL's UTF-16LE code units, each byte in hex
    without a leading zero (``CreateMD5FromString`` in LibreOffice's desktop/source/app/officeipcthread.cxx;
    checked against the pipe LibreOffice 7 makes)."""
    digest = hashlib.md5(user_installation.encode("utf-16-le")).digest()
    return f"OSL_PIPE_{uid}_SingleOfficeIPC_" + "".join(format(b, "x") for b in digest)


class _SharedFolder:
    """A host folder some instances of this process need while they run (``/tmp/.X11-unix``): made
    when missing, removed when the last of them is done if it is empty — whichever process made it
    (two harnesses sharing it left it behind when the one that made it finished first; an X server
    still using it keeps its socket there, so the removal fails harmlessly, and one starting later
    makes it again)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._users = 0
        self._made = False

    def claim(self) -> None:
        with self._lock:
            if not self.path.is_dir():
                self.path.mkdir(parents=True, exist_ok=True)
                self.path.chmod(0o1777)
                self._made = True
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users == 0:
                self._made = False
                with contextlib.suppress(OSError):  # not empty: another process's X server uses it
                    self.path.rmdir()


_HOST_X11 = _SharedFolder("/tmp/.X11-unix")


def _free_display() -> int:
    """A display number no other X server on the host uses (checkpointable instances share /tmp/.X11-unix)."""
    import random

    for _ in range(1000):
        n = random.randint(1000, 29999)
        if not os.path.exists(f"/tmp/.X11-unix/X{n}") and not os.path.exists(f"/tmp/.X{n}-lock"):
            return n
    raise SubstrateError("desktop: no free display number")


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
