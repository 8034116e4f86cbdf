"""The substrate interface: where sandboxes run.

A ``Substrate`` creates ``Sandbox`` objects for one run. A sandbox offers exec with a timeout,
file reads and writes, an optional in-place reset, a tree digest, a canary scan and destroy.

Contracts every substrate keeps (checked by ``drumsbench.substrates.conformance``):

- ``exec`` never raises for what happens *inside* the sandbox: a failing, crashing or silent
  command returns an ``ExecResult``. It raises ``SubstrateError`` only when the substrate itself
  fails (the sandbox is gone, the daemon does not answer).
- On timeout every process the command started is killed, and the result has ``timed_out``.
- Output is bounded: at most ``output_limit`` bytes of each stream are kept — when more was
  produced, the first half and the **last** half of the limit (``exec_core.HeadTail``), so a
  command's final lines survive; the totals say how much was produced.
- Paths given to file methods are absolute paths *as seen inside the sandbox*; ``paths`` says
  where the work, home, tmp and verify folders are.
- ``destroy`` is idempotent and leaves no process, mount or container behind.
- Everything a substrate creates is labelled with the run id, so ``gc`` can remove what a
  crashed run left.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel

from drumsbench.core.answer_keys import harness_places
from drumsbench.core.canary_scan import SCAN_SCRIPT
from drumsbench.core.errors import SubstrateError, UsageError
from drumsbench.core.fingerprint import DIGEST_SCRIPT

DEFAULT_OUTPUT_LIMIT = 64 * 1024
# the folders of every sandbox, below its root (``SandboxPaths``)
SANDBOX_FOLDERS = ("work", "home", "tmp", "verify")


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Per-sandbox bounds a substrate enforces from the host (``None``: that bound is off).

    ``pids``: processes (and threads) at once; ``memory_mb``: resident memory in MiB, including a
    sandbox's tmpfs pages; ``disk_mb``: what the sandbox may write, in MiB; ``cpus``: CPU time, in
    CPUs (0.5: half of one), off unless a task asks for it (``within``). Each substrate states
    its mechanism per bound (``Substrate.limit_mechanisms``; docs/substrates.md has the table); the
    disk bound enforced is ``disk_bound_mb`` (below the memory bound by the verifier's reserve); a
    bound the substrate cannot enforce on this host is named there as not enforced, never claimed.
    The settings are environment variables (``LIMIT_VARS``; ``0`` turns a bound off)."""

    pids: int | None = 2048
    memory_mb: int | None = 4096
    disk_mb: int | None = 4096
    cpus: float | None = None

    def within(self, *, memory_mb: int | None = None, disk_mb: int | None = None,
               cpus: float | None = None) -> SandboxLimits:
        """These bounds tightened by a task's own (a Harbor task's ``[environment]``): each bound the
        smaller of the two where both are on; a task never loosens the run's bounds, only asks for
        tighter ones (``None``: the task names none)."""
        def least(run: float | None, task: float | None) -> float | None:
            return task if run is None else run if task is None else min(run, task)
        memory, disk = least(self.memory_mb, memory_mb), least(self.disk_mb, disk_mb)
        return replace(self, memory_mb=None if memory is None else int(memory),
                       disk_mb=None if disk is None else int(disk), cpus=least(self.cpus, cpus))

    @property
    def disk_bound_mb(self) -> int | None:
        """The disk bound a substrate enforces: ``disk_mb``, but with the memory bound on at most
        ``memory_mb - VERIFIER_RESERVE_MB`` (never below half the memory bound). A tmpfs disk bound's
        pages are charged to the sandbox's memory group, and the verifier runs in that group after the
        policy's turn: filled to the brim, the group would leave the verifier nothing (an escape from
        a 0: the policy's own writes made the verification impossible). The reserve keeps it room."""
        if self.disk_mb is None or self.memory_mb is None:
            return self.disk_mb
        return min(self.disk_mb, max(self.memory_mb - VERIFIER_RESERVE_MB, self.memory_mb // 2))

    @classmethod
    def off(cls) -> SandboxLimits:
        return cls(None, None, None)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SandboxLimits:
        """The defaults, overridden by ``DRUMSBENCH_LIMIT_PIDS``, ``..._MEMORY_MB``, ``..._DISK_MB``.

        ``UsageError`` (one line naming the variable and the fix) for a value that is not a whole
        number >= 0."""
        env = os.environ if environ is None else environ
        default = cls()
        values: dict[str, int | None] = {}
        for field, var in LIMIT_VARS.items():
            raw = env.get(var)
            if raw is None or raw.strip() == "":
                values[field] = getattr(default, field)
                continue
            try:
                n = int(raw)
            except ValueError:
                n = -1
            if n < 0:
                raise UsageError(f"{var}={raw!r}: a whole number >= 0 (0 turns the bound off)")
            values[field] = n or None
        return cls(values["pids"], values["memory_mb"], values["disk_mb"])

    def describe(self) -> str:
        def one(v: int | None, unit: str) -> str:
            return "off" if v is None else f"{v}{unit}"
        cpus = "" if self.cpus is None else f", cpus {self.cpus:g}"
        return (f"pids {one(self.pids, '')}, memory {one(self.memory_mb, ' MiB')}, "
                f"disk {one(self.disk_bound_mb, ' MiB')}{self.reserve_note()}{cpus}")

    def reserve_note(self) -> str:
        """"" or, when the disk bound is below its setting, a parenthesis saying why."""
        bound = self.disk_bound_mb
        if bound == self.disk_mb or bound is None or self.memory_mb is None:
            return ""
        return (f" (the setting {self.disk_mb} MiB, kept {self.memory_mb - bound} MiB below the memory bound "
                "for the verifier)")


# MiB of the memory bound the disk bound leaves free for the verifier (``SandboxLimits.disk_bound_mb``).
VERIFIER_RESERVE_MB = 512

LIMIT_VARS = {"pids": "DRUMSBENCH_LIMIT_PIDS", "memory_mb": "DRUMSBENCH_LIMIT_MEMORY_MB",
              "disk_mb": "DRUMSBENCH_LIMIT_DISK_MB"}


class Isolation(StrEnum):
    NONE = "none"
    NAMESPACES = "namespaces"
    CONTAINER = "container"
    VM = "vm"


class ResetStrategy(StrEnum):
    RECREATE = "recreate"
    IN_PLACE = "in_place"


class Capabilities(BaseModel, frozen=True):
    """What a substrate declares about itself; reports quote it."""

    isolation: Isolation
    reset_strategies: tuple[ResetStrategy, ...]
    snapshot: bool = False
    network: bool = False  # True: a sandbox can reach a network (no isolation of the network)
    notes: str = ""


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int  # -N when killed by signal N
    stdout: bytes
    stderr: bytes
    stdout_total: int
    stderr_total: int
    timed_out: bool
    duration_s: float

    @property
    def truncated(self) -> bool:
        return self.stdout_total > len(self.stdout) or self.stderr_total > len(self.stderr)


@dataclass(frozen=True, slots=True)
class ExecRequest:
    """One command for a sandbox: ``argv`` (a string command already under ``/bin/sh -c``) and
    the in-sandbox working folder ``cwd``; ``env`` is the caller's additions only."""

    argv: list[str]
    timeout: float
    cwd: str
    env: Mapping[str, str] | None = None
    stdin: bytes | None = None
    output_limit: int = DEFAULT_OUTPUT_LIMIT


@dataclass(frozen=True, slots=True)
class SandboxPaths:
    """Folders of a sandbox as commands inside it see them."""

    root: str
    work: str
    home: str
    tmp: str
    verify: str

    @classmethod
    def under(cls, root: str) -> SandboxPaths:
        """The four folders (``SANDBOX_FOLDERS``) directly below ``root``."""
        work, home, tmp, verify = (f"{root}/{name}" for name in SANDBOX_FOLDERS)
        return cls(root=root, work=work, home=home, tmp=tmp, verify=verify)


class Sandbox(ABC):
    """One isolated instance on a substrate."""

    substrate: str
    run_id: str
    id: str
    paths: SandboxPaths

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
        """Run ``command`` (a string runs under ``/bin/sh -c``) in the sandbox; cwd defaults to work.

        The built-in substrates implement ``_run`` (the request made here, cwd resolved); a
        substrate may override ``exec`` itself instead."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        return self._run(ExecRequest(argv, timeout, cwd or self.paths.work, env, stdin, output_limit))

    def _run(self, req: ExecRequest) -> ExecResult:
        """Run one command for ``exec``: the substrate's own part."""
        raise NotImplementedError(f"{type(self).__name__} implements neither exec nor _run")

    @abstractmethod
    def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` at absolute in-sandbox ``path``, creating parent folders."""

    @abstractmethod
    def read_file(self, path: str, limit: int | None = None) -> bytes:
        """Read at most ``limit`` bytes of ``path``; ``FileNotFoundError`` when it does not exist."""

    @abstractmethod
    def destroy(self) -> None:
        """Kill everything in the sandbox and remove it. Idempotent."""

    def put_files(self, base: str, files: Mapping[str, bytes]) -> None:
        """Write many files under ``base`` (relative path -> bytes). Substrates may batch this."""
        for rel, data in files.items():
            self.write_file(f"{base}/{rel}", data)

    def reset_in_place(self) -> None:
        """Kill the sandbox's processes and empty work, home, tmp and verify, keeping the sandbox
        (and the harness's own kept helpers: ``Helpers``).

        Only for substrates that declare ``ResetStrategy.IN_PLACE``.
        """
        raise NotImplementedError(f"{self.substrate} has no in-place reset")

    @abstractmethod
    def end_processes(self) -> None:
        """Kill every process that the sandbox's commands started, keeping its files (and the
        harness's own kept helpers: ``Helpers``), and leave the sandbox usable.

        Called before every verifier is staged, so nothing the policy left running (a background
        process) can touch the verifier or its output; ``conformance`` checks it."""

    def empty_folder(self, path: str, timeout: float = 30.0) -> None:
        """Remove everything below the in-sandbox folder ``path``, keeping it; links are removed,
        never followed. The default runs ``find`` in the sandbox (its uid, its view of links);
        a substrate whose files are the host's may do it from the host."""
        self.exec(["find", path, "-mindepth", "1", "-delete"], timeout=timeout, cwd=self.paths.root)

    def probe(self, timeout: float = 5.0) -> str | None:
        """Gate-side evidence that the sandbox itself is unavailable, or ``None`` when it is alive.

        Used after a step, episode or verifier timeout to attribute it: a live sandbox that answers
        means the policy's own action or code hung (failed); evidence here means infrastructure
        (invalid). Evidence must be out of the policy's reach: the substrate's own records (a frozen
        cgroup, a paused or dead container, an OOM kill by the host) or a liveness command that
        the substrate could not run in time. It never changes the sandbox. The default runs ``true``;
        the built-in substrates override it with their records only, since a liveness command runs
        under the sandbox's own limits, which the policy can exhaust."""
        from drumsbench.core.errors import SubstrateError

        try:
            res = self.exec(["true"], timeout=timeout, cwd=self.paths.root)
        except SubstrateError as e:
            return f"liveness probe could not run: {e}"
        if res.timed_out:
            return f"the sandbox did not answer a liveness probe within {timeout:g} s"
        return None

    def _run_checked(self, command: Sequence[str], what: str, timeout: float = 60.0) -> str:
        from drumsbench.core.errors import SubstrateError

        res = self.exec(command, timeout=timeout, cwd=self.paths.root)
        if res.exit_code != 0 or res.timed_out:
            raise SubstrateError(
                f"{self.substrate}: {what} failed (exit {res.exit_code}): "
                f"{res.stderr.decode(errors='replace')[-300:]}"
            )
        return res.stdout.decode().strip()

    def tree_digest(self, path: str) -> str:
        """``fingerprint.tree_digest`` of an in-sandbox folder, computed inside the sandbox."""
        return self._run_checked(["python3", "-c", DIGEST_SCRIPT, path], "tree digest")

    def scan(self, folders: Sequence[str], tokens: Sequence[str]) -> set[str]:
        """Which of ``tokens`` occur in any file below ``folders`` (in-sandbox paths).

        The tokens travel on the command's stdin, never in its argv or environment (which a runtime
        may write to host files, e.g. runc's ``/tmp/runc-process*``), and come back as indices."""
        from drumsbench.core.canary_scan import scan_hits, scan_request
        from drumsbench.core.errors import SubstrateError

        if not tokens:
            return set()
        tokens = list(tokens)
        res = self.exec(
            ["python3", "-c", SCAN_SCRIPT],
            timeout=60.0,
            cwd=self.paths.root,
            stdin=scan_request(folders, tokens),
        )
        if res.exit_code != 0 or res.timed_out:
            raise SubstrateError(
                f"{self.substrate}: canary scan failed (exit {res.exit_code}): "
                f"{res.stderr.decode(errors='replace')[-300:]}"
            )
        return scan_hits(res.stdout.decode(), tokens)

    def describe(self) -> str:
        return f"{self.substrate}:{self.id}"


class SandboxFrozen(SubstrateError):
    """Raised by ``exec`` of a substrate that refuses to run in a sandbox the host froze (e.g. docker:
    "container is paused") instead of waiting; the rollout treats it as the timeout it stands for."""


class Freezable(ABC):
    """A sandbox the host can freeze and thaw as a whole (cgroup freezer, ``docker pause``, a VM
    stop). Fault injection freezes sandboxes through it, as a real host stall would; the gate
    never calls it (it reads the substrate's state through ``Sandbox.probe``)."""

    @abstractmethod
    def freeze(self) -> None:
        """Stop every process of the sandbox, including ones started later, until ``thaw``."""

    @abstractmethod
    def thaw(self) -> None:
        """Undo ``freeze``; idempotent. ``destroy`` thaws first where the substrate needs it."""


class HostFolders(ABC):
    """Capability of a sandbox: its folders are plain host folders under ``host_root``, which the
    harness (never the policy) may read from the host without going through the sandbox."""

    host_root: Path

    @abstractmethod
    def host_path(self, path: str) -> Path:
        """Host path of an in-sandbox absolute path; ``SubstrateError`` for a path outside the
        sandbox or a destroyed sandbox."""


class RootCommands(ABC):
    """Capability of a sandbox whose commands run as its image's user (a task image's ``USER``, which
    may be another than root): it can also run a harness-made command as uid 0 *inside* it — set-up
    the policy never issues (staging a verifier, a fault injector's act). A sandbox without it runs
    every command as its root already."""

    @abstractmethod
    def exec_as_root(self, argv: Sequence[str], *, timeout: float, cwd: str,
                     stdin: bytes | None = None) -> ExecResult:
        """``Sandbox.exec`` of ``argv`` as uid 0 of the sandbox (never the host's root)."""


def exec_as_root(box: Sandbox, argv: Sequence[str], *, timeout: float, cwd: str,
                 stdin: bytes | None = None) -> ExecResult:
    """``argv`` as the sandbox's root: ``RootCommands.exec_as_root`` where the sandbox has it, else
    its plain ``exec`` (which runs as its root)."""
    if isinstance(box, RootCommands):
        return box.exec_as_root(argv, timeout=timeout, cwd=cwd, stdin=stdin)
    return box.exec(list(argv), timeout=timeout, cwd=cwd, stdin=stdin)


class HostLaunching(ABC):
    """Capability of a sandbox whose processes are host processes (in namespaces or not): an
    environment may build its own isolation around it (the desktop's namespaces) by running a
    *harness-made* launcher with the harness's privileges. ``uid`` is the host user the sandbox's
    own commands run as (None: the harness's, or root of the sandbox's own view)."""

    RUN_VAR: ClassVar[str] = "DRUMSBENCH_RUN"  # labels of every process a sandbox starts
    SANDBOX_VAR: ClassVar[str] = "DRUMSBENCH_SANDBOX"

    @property
    @abstractmethod
    def uid(self) -> int | None: ...

    @abstractmethod
    def exec_launcher(self, argv: Sequence[str], *, timeout: float, cwd: str | None = None,
                      env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                      output_limit: int = DEFAULT_OUTPUT_LIMIT) -> ExecResult:
        """Run the launcher as the harness (root), in the sandbox's cgroup, labelled, bounded, killed on
        timeout and by ``end_processes``/``destroy``; never a policy's command line as such."""


class Helper(ABC):
    """A harness-made process kept in one sandbox (``Helpers.start_helper``), answering requests.

    Protocol: each request is bytes written to the helper's stdin; the helper answers with output
    that ends in one line ``HELPER_END <exit code>`` (``HELPER_END`` below). ``call`` returns that
    output before the line as ``stdout`` and the code as ``exit_code``. A helper that ends without
    the line, or runs past ``timeout``, is stopped: ``call`` returns what it wrote, with its exit
    status (``-9`` when stopped) or ``timed_out``, and ``alive`` is False from then on."""

    HELPER_END: ClassVar[bytes] = b"DRUMSBENCH_HELPER_END"

    @property
    @abstractmethod
    def pid(self) -> int:
        """The helper's host pid (the harness is its parent: the pid is not reused while it is held)."""

    @abstractmethod
    def alive(self) -> bool:
        """Whether the helper still runs and answers (False after any failed ``call`` or ``stop``)."""

    @abstractmethod
    def call(self, request: bytes, *, timeout: float, output_limit: int = DEFAULT_OUTPUT_LIMIT) -> ExecResult:
        """Send one request and read its answer (see the class)."""

    @abstractmethod
    def stop(self) -> None:
        """Kill the helper and whatever it started; idempotent."""


class Helpers(ABC):
    """Capability of a sandbox that can keep a harness-made process alive across the policy's turn.

    ``start_helper`` runs ``argv`` (a command of the harness, never a policy's command line) **as
    the harness's uid**, out of reach of the sandbox's own uid (it cannot signal, ptrace or read
    it), inside the sandbox's cgroups and limits (freezing the sandbox freezes it), labelled,
    its stdin and stdout held by the harness (no channel in the sandbox's files), its stderr joined
    to stdout. ``end_processes`` and ``reset_in_place`` spare it (and only it: what it started is
    killed with the rest); ``destroy`` and ``gc`` kill it. Whatever the helper runs *as the
    sandbox's uid* it must drop to that uid itself (``helper_uid``). ``SubstrateError`` when the
    sandbox cannot keep one (e.g. its commands run as the harness's own uid)."""

    @property
    @abstractmethod
    def helper_uid(self) -> int:
        """The uid a helper's children must drop to before they touch the sandbox's files."""

    @abstractmethod
    def start_helper(self, argv: Sequence[str], *, cwd: str, pass_fds: Sequence[int] = ()) -> Helper:
        """Start ``argv`` in the sandbox as described in the class; ``cwd`` is an in-sandbox folder
        that outlives resets (the sandbox's root); ``pass_fds``: descriptors of the harness the
        helper inherits under the same numbers (e.g. a Unix socket to hand it descriptors)."""


class Stream(ABC):
    """A command running in a sandbox whose stdin and stdout the harness holds as OS pipe fds
    (``Streaming.open_stream``).

    - ``stdin_fd`` is the write end of a pipe to the command's stdin, ``stdout_fd`` the read end of a
      pipe from its stdout: real pipes (``os.read``/``os.write``, ``select``, a subprocess's
      ``pass_fds``), blocking, not inheritable. The stream owns them: the caller never closes them
      itself but calls ``close_stdin`` (the command reads EOF) or ``close``; a closed end's property
      raises ``ValueError``. The command's stderr is discarded.
    - ``stdout_fd`` reads EOF once the command, and whatever it started that kept its stdout, ended
      (killed by ``close``, or by the sandbox's ``end_processes``, ``reset_in_place`` or ``destroy``,
      which treat it as any command of the sandbox). Writes to ``stdin_fd`` after the command ended
      fail (``BrokenPipeError``) or are lost.
    - ``poll``: the exit status once the command ended (``-N`` when killed by signal N, as ``exec``),
      else ``None``.
    - ``close``: close both ends, kill the command and everything it started (also what left its
      session), reap it; the exit status when known within ``timeout`` s (a frozen sandbox's command
      dies only when thawed: ``None``). Idempotent (later calls return the first's answer); never
      raises for a sandbox that is gone.

    A stream is one caller's: ``close`` may be called from any thread once the others stopped using
    the descriptors."""

    @property
    @abstractmethod
    def stdin_fd(self) -> int:
        """The write end: bytes written here go to the command's stdin."""

    @property
    @abstractmethod
    def stdout_fd(self) -> int:
        """The read end: the command's stdout."""

    @abstractmethod
    def close_stdin(self) -> None:
        """Close the write end (the command reads EOF); idempotent."""

    @abstractmethod
    def poll(self) -> int | None:
        """The command's exit status once it ended, else ``None``; never waits (beyond asking the
        engine, for a container)."""

    @abstractmethod
    def close(self, timeout: float = 5.0) -> int | None:
        """Close both ends, kill the command's tree, reap it; its exit status when known (see the class)."""

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Streaming(ABC):
    """Capability of a sandbox: start ``argv`` in the sandbox as the sandbox's own uid, exactly as
    ``exec`` would run it (same uid, confinement, cgroup and limits, the environment of
    ``exec_core.sandbox_env`` plus ``env``, working folder ``cwd``, by default the work folder),
    with stdin and stdout as pipes held by the harness (``Stream``), for as long as the harness
    talks to it: a trusted verifier's judge speaking line by line to an untrusted server.

    The command is labelled and tracked like every command of the sandbox: ``end_processes``,
    ``reset_in_place``, ``destroy`` (and ``gc`` after a crash) kill it and what it started. It has no
    timeout of its own: the caller bounds its reads and calls ``Stream.close``. Nothing is left in
    the host's shared places (``/tmp``)."""

    @abstractmethod
    def open_stream(self, argv: Sequence[str], *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None) -> Stream:
        """Start ``argv`` (see the class). A command that cannot start inside the sandbox gives a
        stream that ends at once with a non-zero status (126 when its working folder is gone, as
        ``exec``; a missing program: the status the substrate's own starter gives, 127 or 126 or 1,
        and a container engine may say why on stdout). ``SubstrateError`` when the substrate itself
        fails (the sandbox is destroyed or gone, the engine does not answer)."""


@dataclass(frozen=True)
class LaunchView:
    """How an environment starts its own long-lived process tree inside a sandbox's confinement
    (``ViewLaunching.launch_view``; valid until the sandbox's next reset).

    - ``prefix``: argv that runs the command appended to it as root in new pid, ipc, uts and
      network namespaces (only ``lo``) and a private mount namespace showing the sandbox's file view
      (its folders at ``inside_root``; nothing outside them writable, except where ``prefix`` is the
      ``process`` substrate's, which confines nothing), with ``CAP_SYS_ADMIN`` and ``CAP_NET_ADMIN``
      inside those namespaces for the command's own set-up (binds, host name). The command must drop
      both from its bounding set before it starts anything else (``drop_admin``).
    - ``host_root``: the sandbox's root folder as the harness reaches it from the host (as root).
    - ``inside_root``: the same folder as the launched processes see it.
    - ``confine``: argv prefix that gives a command entered into those namespaces (``nsenter``) the
      privileges of the sandbox's own commands (empty: the caller drops them, e.g. to a uid).
    - ``drop_admin``: whether the launched command must drop ``CAP_SYS_ADMIN``/``CAP_NET_ADMIN``.
    - ``keep_caps``: when set, the bounding set (a bit mask, bit n = capability n) of the sandbox's
      own commands: the launched command must drop every other capability from its bounding set,
      and set no_new_privs, before it starts anything (a container's processes: the launcher runs
      as the host's root, the container's commands with the engine's reduced set).
    """

    prefix: tuple[str, ...]
    host_root: Path
    inside_root: str
    confine: tuple[str, ...] = ()
    drop_admin: bool = False
    keep_caps: int | None = None
    # ``InitLaunching.init_view``: the tree is a child of this host pid (the sandbox's init), the
    # launcher returns at once, and the tree's /tmp is the sandbox's own, reached at ``host_tmp``
    init_pid: int | None = None
    host_tmp: Path | None = None
    # (uid, gid) the tree's applications run as, once its set-up is done (its X server stays root):
    # a uid of the sandbox's that is not its commands' uid, so a policy's command can neither signal
    # nor trace them, and whose gid is the sandbox's (its folders are group-writable for it).
    # None: they run as the view's root (the view confines them)
    app_ids: tuple[int, int] | None = None
    # The view's system is writable to its root (a container's own layer): the launched command must
    # make its mount namespace's root read-only, all but ``inside_root`` and /tmp (the places the
    # sandbox's reset empties), before it starts anything — a root LibreOffice's Save As or its font
    # cache would otherwise change what every later attempt in the sandbox sees
    read_only_system: bool = False


# A leased sandbox's second uid (``LaunchView.app_ids``) is its own uid + APP_UID_OFFSET: a
# checkpoint restored into another sandbox maps one to the other (envs/desktop/restore.py)
APP_UID_OFFSET = 1_000_000


class ViewLaunching(ABC):
    """Capability of a sandbox in which an environment may start a long-lived process tree of its own
    (the desktop's X server and LibreOffice) with the sandbox's confinement: same file view, no
    network. Processes started through it must carry the sandbox's labels
    (``HostLaunching.RUN_VAR``/``SANDBOX_VAR``): the sandbox's reset, ``end_processes`` and
    ``destroy`` (and ``drumsbench gc`` after a crash) kill them."""

    @abstractmethod
    def launch_view(self) -> LaunchView:
        """Where and how to launch now; ``SubstrateError`` for a destroyed sandbox."""


class InitLaunching(ABC):
    """Capability of a sandbox whose engine checkpoints it whole (a podman container): an
    environment may launch its own tree *in the sandbox's own namespaces* (no new ones) as a
    descendant of the sandbox's init, so that the engine's checkpoint carries it and a restore
    brings it back in a new sandbox.

    ``init_view().prefix`` runs the appended command detached: in the sandbox's cgroups and
    namespaces, stdio on the sandbox's /dev/null and no other descriptor of the harness, a child of
    the sandbox's init (``LaunchView.init_pid``); the launcher itself exits at once. The tree's /tmp
    is the sandbox's own (``LaunchView.host_tmp``). Confinement as ``ViewLaunching`` (``drop_admin``,
    ``keep_caps``)."""

    @abstractmethod
    def init_view(self) -> LaunchView:
        """Where and how to launch a tree under the sandbox's init; ``SubstrateError`` when destroyed."""


class GuestLaunching(ABC):
    """Capability of a sandbox that is a whole machine of its own (``vm``): its commands run as the
    guest's root under a guest kernel no other sandbox shares, and the harness reaches the guest
    only through the sandbox's own channel (``exec``, ``read_file``, ``put_files``). An environment
    may keep its own long-lived processes there (the desktop's X server and LibreOffice)."""

    @abstractmethod
    def launch_detached(self, argv: Sequence[str], *, env: Mapping[str, str], log: str) -> int:
        """Start ``argv`` in a session of its own that outlives the call (stdin /dev/null, stdout
        and stderr to the guest file ``log``); returns its guest pid. It ends with the sandbox's
        ``end_processes``, ``reset_in_place`` and ``destroy``, like every command's processes."""


BASE_ARGS = {"debian": "DRUMSBENCH_BASE_DEBIAN", "python": "DRUMSBENCH_BASE_PYTHON"}


@dataclass(frozen=True)
class ImageRecipe:
    """A start state given as a Dockerfile (a task's own), built on this machine (``RecipeImages``).

    ``dockerfile``'s stages start from an earlier stage of its own or from ``${DRUMSBENCH_BASE_DEBIAN}``
    (this machine's Debian rootfs) or ``${DRUMSBENCH_BASE_PYTHON}`` (that plus Debian's Python 3 as
    ``python``/``python3``, pip and venv, pip free to install as in the python images): build
    arguments the builder gives (``BASE_ARGS``), declared by ``ARG`` before the first ``FROM``.
    ``context``: the build context's files as the task has them (relative POSIX path -> bytes; its
    own Dockerfile among them, unchanged: a ``COPY .`` copies what ``docker build`` would);
    ``executables``: which of them have the executable bit (every other file is
    0644); ``timeout_s``: the build's time limit. ``RUN`` steps reach the package registries this
    machine reaches (the bases trust this machine's certificate authorities); the policy never runs
    at build time."""

    dockerfile: str
    context: Mapping[str, bytes]
    timeout_s: float
    executables: frozenset[str] = frozenset()

    def digest(self) -> str:
        """Names the recipe's content: the Dockerfile and every context file (path and bytes)."""
        h = hashlib.sha256(b"recipe-v1\0" + self.dockerfile.encode() + b"\0")
        for rel in sorted(self.context):
            mode = b"x" if rel in self.executables else b"-"
            h.update(rel.encode() + b"\0" + mode + hashlib.sha256(self.context[rel]).digest())
        return h.hexdigest()


class RecipeImages(ABC):
    """Capability of a substrate that builds a task's own image from an ``ImageRecipe``."""

    @abstractmethod
    def build_recipe(self, recipe: ImageRecipe) -> str:
        """The image of ``recipe`` (its reference on this substrate), built once per
        ``recipe.digest()`` and reused after; ``ImageBuildError`` when a step fails or the time
        limit passes (nothing half-built is kept under the reference)."""

    @abstractmethod
    def create_from_image(self, image: str, limits: SandboxLimits | None = None) -> Sandbox:
        """A sandbox (as ``Substrate.create`` makes one: no network, the substrate's limits and
        labels, its reaper as pid 1) of ``image``, a reference ``build_recipe`` returned, with the
        sandbox's folders (``SandboxPaths``) added on top of it once per image; the image's own
        files, ``WORKDIR`` and ``USER`` are kept. ``limits``: this sandbox's bounds instead of the
        substrate's (a task's own, ``SandboxLimits.within``). ``SubstrateError`` when it cannot be
        made."""

    def raw_floor_of(self, image: str) -> list[str] | None:
        """``Substrate.raw_floor`` for ``image`` (a reference ``build_recipe`` returned): what a
        hand-written harness runs to start a sandbox of it and run ``true`` there; None when the
        substrate names none."""
        return None


class ImageFlavors(ABC):
    """Capability of a substrate whose sandboxes run from an image it builds (``drumsbench.images``
    flavors): an environment that needs system parts beyond the base image (the desktop's X server
    and LibreOffice: ``Environment.image_flavor``) chooses its flavor before the first ``create``."""

    @abstractmethod
    def use_flavor(self, flavor: str) -> None:
        """Sandboxes created from now on run the image of ``flavor``; ``SubstrateError`` for an
        unknown one. The image is built on first use when absent."""


def with_flavor(sub: Substrate, flavor: str) -> Substrate:
    """``sub``, told the image flavor its sandboxes need when it builds images (``ImageFlavors``);
    every place that makes a substrate for an environment goes through here (``make_substrate``,
    a Ray node's)."""
    if isinstance(sub, ImageFlavors):
        sub.use_flavor(flavor)
    return sub


class Snapshotting(ABC):
    """Capability of a sandbox: capture its live state; the substrate (a ``Forking`` one) makes new
    sandboxes from the returned id."""

    @abstractmethod
    def snapshot(self) -> str:
        """Capture this sandbox's state now; returns an id for ``Forking.fork``. The sandbox goes on."""


class Forking(ABC):
    """Capability of a substrate: new sandboxes that start from a snapshot of a live one.

    A substrate that declares ``capabilities.snapshot`` must be ``Forking`` and its sandboxes
    ``Snapshotting``; the conformance suite then checks that a fork starts from the snapshot's files
    and that fork and parent are separate."""

    @abstractmethod
    def fork(self, snapshot_id: str) -> Sandbox:
        """A new sandbox whose start state is the snapshot ``snapshot_id``."""

    @abstractmethod
    def snapshots(self) -> list[str]:
        """Ids of the snapshots still held."""

    @abstractmethod
    def drop_snapshot(self, snapshot_id: str) -> None:
        """Free a snapshot (forks already made are not affected); an unknown id is ignored."""


class PortableSnapshots(ABC):
    """Capability of a ``Forking`` substrate: a snapshot as bytes, so that another instance of the
    substrate (another Ray node, another host) can fork from it without sharing a disk path.

    ``import_snapshot(export_snapshot(id))`` on another instance yields an id whose forks start from
    the same files as forks of ``id`` here. The bytes hold the snapshot's own layers only (what the
    substrate's base image, present on every node, does not)."""

    @abstractmethod
    def export_snapshot(self, snapshot_id: str) -> bytes:
        """The snapshot ``snapshot_id`` as bytes; ``SubstrateError`` for an unknown id."""

    @abstractmethod
    def import_snapshot(self, data: bytes) -> str:
        """Install bytes from ``export_snapshot`` (of any instance); returns a snapshot id for ``fork``."""


class Substrate(ABC):
    """A kind of place to run sandboxes. One instance serves one run.

    ``sandbox_class``: the class of the sandboxes ``create`` returns, so what they can do (their
    capability interfaces) is known before one is made (an environment's requirements are checked
    up front; the conformance suite checks that ``create`` keeps to it)."""

    name: ClassVar[str]
    # declared by each class; an instance may refine it once it knows more (the vm: its accelerator)
    capabilities: Capabilities
    sandbox_class: ClassVar[type[Sandbox] | None] = None  # None: not declared (a plugin may leave it)

    def __init__(self, run_id: str, state_dir: Path) -> None:
        self.run_id = run_id
        self.state_dir = state_dir
        # Bounds of the sandboxes ``create`` makes from now on; a caller may replace them first.
        self.limits = SandboxLimits.from_env()
        # Host folders holding answer keys (``core.answer_keys``), out of every sandbox's sight where
        # its file view is the host's (process, bwrap); ``hide`` adds a run's suite folder.
        self.hidden: list[Path] = list(harness_places())

    def answer_keys_exposed(self) -> str | None:
        """Why this substrate's sandboxes could read host folders in ``hidden`` (one line), or None
        when they cannot (their own root file system, or the folders covered). A run refuses a
        suite where it is not None (``experiments.run.make_substrate``)."""
        return None

    def hide(self, *folders: Path) -> None:
        """Keep ``folders`` (a run's task folders) out of the sight of the sandboxes made from now on."""
        self.hidden += [Path(os.path.realpath(f)) for f in folders]

    def limit_mechanisms(self) -> dict[str, str]:
        """Per bound (``pids``, ``memory_mb``, ``disk_mb``): how this substrate enforces it here, or
        why it does not ("not enforced: ..."). Read only; the built-in substrates override it."""
        return {field: "not enforced: the substrate declares no mechanism" for field in LIMIT_VARS}

    @classmethod
    @abstractmethod
    def missing(cls) -> str | None:
        """``None`` when usable here, else one line: what is missing and how to install it."""

    @abstractmethod
    def create(self) -> Sandbox:
        """A new sandbox with empty work, home, tmp and verify folders. ``SubstrateError`` on failure."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the substrate holds for the run (after every sandbox is destroyed)."""

    def raw_floor(self) -> list[str] | None:
        """The cheapest host command line that does what create + first command + destroy does,
        the way harnesses commonly do it (``true`` for processes, ``docker run --rm IMAGE true``
        for docker, ...). ``drumsbench coldstart`` measures it side by side as the floor."""
        return None

    def leftovers(self) -> list[str]:
        """Processes, containers, mounts or folders of this run that still exist (one line each)."""
        return []

    @classmethod
    def gc(cls, state_dir: Path, dead_runs: set[str]) -> list[str]:
        """Remove what runs in ``dead_runs`` left behind; returns one line per thing removed."""
        return []


def sh_quote(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
