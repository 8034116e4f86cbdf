"""What the desktop environment drives: a running desktop (X server, window manager, LibreOffice).

Two kinds implement it: ``instance.DesktopInstance`` (host processes in their own namespaces,
reached through host paths and ``nsenter``: process, bwrap, overlay, docker, podman) and
``guest.GuestInstance`` (inside a VM guest, reached only through the sandbox's channel: vm). The
environment (``env.py``) sees the sandbox's files and the screen only through this interface, so
its gates (start fingerprint, black and frozen screen, stale locks) are the same on every substrate.

Paths given to and returned by these methods are as the instance's processes see them (``inside``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from drumsbench.envs.desktop.settle import Frame, SettleReport
from drumsbench.substrates.base import DEFAULT_OUTPUT_LIMIT, ExecResult, Sandbox

if TYPE_CHECKING:
    from drumsbench.envs.desktop.instance import Settings


class RunningDesktop(ABC):
    box: Sandbox
    settings: Settings  # as this instance runs them (a guest's allow for software emulation)
    display: int
    t_launch: float  # time.monotonic() at launch
    restored: bool  # restored from a checkpoint (CRIU), not started here
    holder_pid: int | None  # host pid of the instance's pid 1, when its processes are host processes
    last_settle: SettleReport | None

    # -- life cycle ------------------------------------------------------------------------------
    @abstractmethod
    def prepare(self) -> None:
        """Private folders and a fresh copy of the template profile (never its lock)."""

    @abstractmethod
    def launch(self, document: str) -> None:
        """Start the X server, the window manager and LibreOffice on ``document`` (its file name in
        the sandbox's work folder)."""

    @abstractmethod
    def alive(self) -> bool:
        """Is the instance's pid 1 (the holder) running?"""

    @abstractmethod
    def stop(self) -> None:
        """Kill the whole instance. Idempotent."""

    @abstractmethod
    def launch_said(self) -> str:
        """The end of what the launcher and the holder wrote to stderr ('' when nothing)."""

    @abstractmethod
    def sandbox_gone(self) -> bool:
        """True when the sandbox was destroyed behind the environment's back."""

    @abstractmethod
    def app_exit(self) -> int | None:
        """LibreOffice's exit status once it has exited (0: closed by the user), else None."""

    @abstractmethod
    def app_running(self) -> bool:
        """Is a LibreOffice process (``soffice.bin``) alive in this instance?"""

    # -- files -----------------------------------------------------------------------------------
    @abstractmethod
    def work_files(self) -> dict[str, bytes]:
        """Every file below the sandbox's work folder: relative POSIX path -> content."""

    @abstractmethod
    def write_work(self, name: str, data: bytes) -> None:
        """Write ``data`` to ``name`` in the work folder (made when missing)."""

    @abstractmethod
    def remove_stale(self) -> None:
        """Remove what an earlier attempt may have left: document locks, the profile's lock, the X socket."""

    @abstractmethod
    def profile_lock(self) -> str | None:
        """The text of the profile's ``.lock`` (None when there is none)."""

    @abstractmethod
    def inside(self, path: str | Path) -> str:
        """The path the instance's processes see for a sandbox path given as the harness reaches it."""

    @property
    @abstractmethod
    def work_inside(self) -> str:
        """The work folder as the instance's processes see it."""

    @property
    @abstractmethod
    def profile_inside(self) -> Path:
        """The profile folder as the instance's processes (and the lock files) name it."""

    @property
    @abstractmethod
    def app_exit_inside(self) -> str:
        """The file LibreOffice's exit wrapper writes its status to, as the instance sees it."""

    # -- the screen ------------------------------------------------------------------------------
    @abstractmethod
    def grab(self, timeout: float | None = None) -> Frame:
        """The whole screen and the active window's title; ``xcb.XTimeout`` when the X server does
        not answer in time, ``xcb.XError`` when it cannot be reached."""

    @abstractmethod
    def region(self, left: int, top: int, width: int, height: int,
               timeout: float | None = None) -> tuple[np.ndarray, str]:
        """A rectangle of the screen and the active title (polled during start-up)."""

    @abstractmethod
    def title(self, timeout: float | None = None) -> str:
        """The active window's title ('' when none)."""

    @abstractmethod
    def settle(self, deadline: float, first: Frame | None = None,
               quiet_s: float | None = None) -> tuple[Frame, bool]:
        """Wait until the step is over (``settle.py``); the last frame and whether it settled."""

    # -- fault injection (acts on the X server itself) ---------------------------------------------
    @abstractmethod
    def blank(self) -> None:
        """Force the X server's screen saver on: a black window over everything."""

    @property
    @abstractmethod
    def office_runs_as(self) -> str:
        """Who LibreOffice runs as, in a few words, for the report (docs/desktop.md, "Who runs what")."""

    @abstractmethod
    def screen_saver(self) -> str:
        """The X server's screen-saver state as it says (``saver.py``: "on", "off", "disabled");
        ``xcb.XError`` when it does not answer."""

    @abstractmethod
    def freeze_display(self) -> None:
        """Stop the X server (SIGSTOP)."""

    # -- commands --------------------------------------------------------------------------------
    @abstractmethod
    def exec_inside(self, argv: list[str], timeout: float, *, all_namespaces: bool = False,
                    output_limit: int = DEFAULT_OUTPUT_LIMIT, stdin: bytes | None = None,
                    as_sandbox_user: bool = False) -> ExecResult:
        """Run ``argv`` where the instance's clients run (its display, its UNO connection in
        ``DRUMSBENCH_UNO``), killed on timeout, bounded output; ``as_sandbox_user``: a policy's
        shell action, only where ``shell_unavailable`` is None."""

    @abstractmethod
    def shell_unavailable(self) -> str | None:
        """Why a policy's shell action is not offered in this instance (None: it is)."""

    @property
    @abstractmethod
    def policy_uid(self) -> int | None:
        """The uid a policy's shell actions run as (None: none run)."""

    def xdotool(self, args: list[str], timeout: float) -> ExecResult:
        return self.exec_inside(["xdotool", *args], timeout)
