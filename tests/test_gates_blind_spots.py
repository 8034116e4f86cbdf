"""The gates have no blind spots the policy can use: the start-state digest never skips an entry,
and every escape probe says whether it ran and is confirmed by a positive control.

Digest: an unreadable folder (chmod 000, digested by a non-root uid, as root would read through
it) makes ``tree_digest`` and the in-sandbox ``DIGEST_SCRIPT`` fail naming it; a planted fifo
changes the digest; ordinary trees digest exactly as before (a fixed value computed by the old
code, and ``files_digest``).

Escape probes: every probe's control (the same probe where nothing isolates) fires; on the
``process`` substrate each probe runs and is confirmed; a probe whose command is missing from the
sandbox's PATH is "did not run", never contained; ``drumsbench isolation`` prints, per probe and
substrate, the verdict, whether it ran, whether it was contained and the control.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from drumsbench.core.errors import SubstrateError
from drumsbench.core.fingerprint import DIGEST_SCRIPT, UnreadableEntry, files_digest, tree_digest
from drumsbench.experiments import escape
from drumsbench.substrates import registry

from conftest import require
from helpers import cli

NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by every uid (the venv's may sit below /root)
ORDINARY = {"a.txt": b"alpha\n", "src/m.py": b"print(1)\n", "src/pkg/__init__.py": b"", "z/y/x": b"\x00\xff"}


def _world_dir() -> Path:
    """A folder that the nobody uid can traverse (pytest's tmp_path may not be)."""
    d = Path(tempfile.mkdtemp(prefix="drumsbench-blind-"))
    os.chmod(d, 0o755)
    return d


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("setpriv") is None or not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("setpriv or /usr/bin/python3 missing")
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to the nobody uid")
    return subprocess.run([*NOBODY, *argv], capture_output=True, text=True, timeout=60)


@pytest.fixture
def world():
    d = _world_dir()
    yield d
    for dirpath, dirnames, _ in os.walk(d):
        for n in dirnames:
            os.chmod(os.path.join(dirpath, n), 0o755)
    shutil.rmtree(d, ignore_errors=True)


# -- digest ---------------------------------------------------------------------------------------

def test_ordinary_tree_digest_unchanged(world):
    _write(world, ORDINARY)
    got = tree_digest(str(world))
    assert got == files_digest(ORDINARY)
    # byte-identical to the pre-change implementation: recompute it with that code's source
    old = subprocess.run(["git", "show", "df41032:src/drumsbench/fingerprint.py"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    if old.returncode != 0:
        pytest.skip("old fingerprint.py not in this checkout's history")
    ns: dict = {}
    exec(compile(old.stdout.split("DIGEST_SCRIPT = (")[0], "old_fingerprint", "exec"), ns)  # our own earlier source
    assert got == ns["tree_digest"](str(world))
    # a symlink and an empty folder too
    os.symlink("a.txt", world / "link")
    (world / "empty").mkdir()
    assert tree_digest(str(world)) == ns["tree_digest"](str(world))
    # the in-sandbox script agrees with the host function
    out = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT, str(world)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == tree_digest(str(world))


def test_missing_root_is_empty_tree(world):
    assert tree_digest(str(world / "nope")) == files_digest({})


def test_unreadable_folder_fails_naming_it(world):
    _write(world, ORDINARY)
    locked = world / "src" / "locked"
    locked.mkdir()
    (locked / "hidden").write_bytes(b"x")
    os.chmod(locked, 0)
    # the in-sandbox script, as a non-root uid: exit 3, one line naming the folder
    proc = _as_nobody(SYSTEM_PYTHON, "-c", DIGEST_SCRIPT, str(world))
    assert proc.returncode == 3, proc
    assert proc.stdout == ""
    assert proc.stderr.strip() == f"unreadable entry {locked} in the start state: Permission denied"
    # the host function itself (the source, imported by a non-root python), raising UnreadableEntry
    code = ("import sys; sys.path.insert(0, sys.argv[2]); from drumsbench.core import fingerprint as f\n"
            "try:\n    f.tree_digest(sys.argv[1])\n"
            "except f.UnreadableEntry as e:\n    print(type(e).__name__, isinstance(e, OSError), e.path); print(e)\n")
    src = str(Path(__file__).resolve().parents[1] / "src")
    if not all(os.stat(p).st_mode & stat.S_IXOTH for p in [*Path(src).parents, Path(src)]):
        pytest.skip("the source tree is not readable by the nobody uid")
    proc = _as_nobody(SYSTEM_PYTHON, "-c", code, str(world), src)
    assert proc.stdout.splitlines() == [f"UnreadableEntry True {locked}",
                                        f"unreadable entry {locked} in the start state: Permission denied"], proc


def test_unlistable_and_unsearchable_folders(world):
    # r-- folder: its names can be listed but not stat'ed -> fails on the first entry
    _write(world, {"d/f": b"1"})
    os.chmod(world / "d", 0o444)
    proc = _as_nobody(SYSTEM_PYTHON, "-c", DIGEST_SCRIPT, str(world))
    assert proc.returncode == 3 and f"unreadable entry {world}/d/f in the start state" in proc.stderr
    # --x folder: it can be entered but not listed
    os.chmod(world / "d", 0o111)
    proc = _as_nobody(SYSTEM_PYTHON, "-c", DIGEST_SCRIPT, str(world))
    assert proc.returncode == 3 and f"unreadable entry {world}/d in the start state" in proc.stderr
    # an unreadable file
    os.chmod(world / "d", 0o755)
    os.chmod(world / "d" / "f", 0)
    proc = _as_nobody(SYSTEM_PYTHON, "-c", DIGEST_SCRIPT, str(world))
    assert proc.returncode == 3 and f"unreadable entry {world}/d/f in the start state" in proc.stderr


def test_unreadable_entry_is_an_oserror_naming_the_path(world, monkeypatch):
    # as root nothing is unreadable by mode: make the walk itself fail on one folder
    _write(world, ORDINARY)
    real = os.scandir

    def scandir(path="."):
        if str(path).endswith("/src/pkg"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(UnreadableEntry) as e:
        tree_digest(str(world))
    assert isinstance(e.value, OSError) and e.value.path == f"{world}/src/pkg"
    assert str(e.value) == f"unreadable entry {world}/src/pkg in the start state: Permission denied"
    # a caller walking a /proc/self/fd/N handle names the in-sandbox folder instead
    with pytest.raises(UnreadableEntry) as e:
        tree_digest(str(world), shown_root="/sandbox/work")
    assert e.value.path == "/sandbox/work/src/pkg" and "unreadable entry /sandbox/work/src/pkg " in str(e.value)


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_special_entries_change_the_digest(world, kind):
    _write(world, ORDINARY)
    before = tree_digest(str(world))
    target = world / "src" / "planted"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        import socket

        s = socket.socket(socket.AF_UNIX)
        s.bind(str(target))
        s.close()
    after = tree_digest(str(world))  # must not block on the fifo either
    assert after != before
    out = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT, str(world)], capture_output=True, text=True,
                         timeout=30)
    assert out.stdout.strip() == after
    target.unlink()
    assert tree_digest(str(world)) == before


def test_fifo_alone_in_a_folder_changes_the_digest(world):
    """Before, a folder holding only a fifo digested as nothing at all (no file, not empty)."""
    (world / "d").mkdir()
    empty_folder = tree_digest(str(world))
    os.mkfifo(world / "d" / "p")
    assert tree_digest(str(world)) not in (files_digest({}), empty_folder)


def test_docker_in_sandbox_digest_error(state_dir, run_id):
    """The docker path: DIGEST_SCRIPT through Sandbox._run_checked, as a non-root uid in the
    container (root in the container reads through modes)."""
    cls = registry.get("docker")
    require(cls.missing())
    sub = cls(run_id, state_dir)
    box = sub.create()
    try:
        box.write_file(f"{box.paths.work}/ok.txt", b"1")
        box.exec(f"mkdir {box.paths.work}/locked && chmod 755 {box.paths.work} && chmod 000 {box.paths.work}/locked",
                 timeout=30)
        with pytest.raises(SubstrateError) as e:
            box._run_checked([*NOBODY, "python3", "-c", DIGEST_SCRIPT, box.paths.work], "tree digest")
        assert str(e.value).strip() == (f"docker: tree digest failed (exit 3): unreadable entry "
                                        f"{box.paths.work}/locked in the start state: Permission denied")
    finally:
        box.destroy()
        sub.close()


# -- escape probes --------------------------------------------------------------------------------

SMALL = {"disk_mb": 8, "procs": 40}


def test_every_control_fires():
    control = escape.run_control(**SMALL)
    assert [c.probe for c in control] == list(escape.PROBES)
    for c in control:
        assert c.ran and c.contained is False, c


def test_process_probes_run_and_are_confirmed(state_dir, run_id):
    sub = registry.get("process")(run_id, state_dir)
    try:
        results = escape.probe_substrate(sub, **SMALL)
    finally:
        sub.close()
    assert [r.probe for r in results] == list(escape.PROBES)
    for r in results:
        assert r.ran and r.control == "fired", r
        assert r.verdict in ("contained", "NOT contained"), r
    by = {r.probe: r for r in results}
    # what process never contains: the host's shared places, disk and processes; its own view (as
    # root) keeps the host's loopback and network out of reach
    for name in ("write_outside", "fill_disk", "fork_bomb"):
        assert by[name].verdict == "NOT contained", by[name]
    for name in ("host_loopback", "network", "read_neighbour"):
        assert by[name].verdict == "contained", by[name]


def test_probe_with_missing_command_did_not_run(state_dir, run_id):
    """A sandbox whose PATH lacks the tools: the probes that need them say "did not run"."""
    tools = _world_dir()
    try:
        for t in ("cat", "wc", "rm", "kill", "readlink"):  # no dd, no sleep
            src = shutil.which(t)
            assert src, t
            os.symlink(src, tools / t)
        os.symlink(SYSTEM_PYTHON, tools / "python3")
        sub = registry.get("process")(run_id, state_dir)
        try:
            results = {r.probe: r for r in escape.probe_substrate(sub, env={"PATH": str(tools)}, **SMALL)}
            empty = {r.probe: r for r in escape.run_probes(sub, env={"PATH": str(tools / "none")}, **SMALL)}
        finally:
            sub.close()
    finally:
        shutil.rmtree(tools)
    for name in ("fill_disk", "fork_bomb"):
        r = results[name]
        assert not r.ran and r.contained is None and r.verdict == "did not run", r
        assert "is missing in the sandbox" in r.detail, r
        assert r.control == "not run"  # the control lacked the tool as well
    assert results["read_neighbour"].ran and results["network"].ran and results["host_loopback"].ran
    for name in ("read_neighbour", "host_loopback", "network", "fill_disk", "fork_bomb"):
        assert empty[name].verdict == "did not run" and "is missing" in empty[name].detail, empty[name]


def test_probe_that_crashes_did_not_run(state_dir, run_id):
    """Sandboxes that are gone (every exec raises SubstrateError), or that cannot be created:
    every probe says it did not run, none is contained."""
    base = registry.get("process")

    class Gone(base):  # type: ignore[misc,valid-type]
        def create(self):
            box = super().create()
            box.destroy()
            return box

    class NoSandbox(base):  # type: ignore[misc,valid-type]
        def create(self):
            raise SubstrateError("cannot create a sandbox here")

    for cls, why in ((Gone, "did not run: probe crashed: "), (NoSandbox, "could not create a sandbox")):
        sub = cls(run_id, state_dir)
        try:
            results = escape.run_probes(sub, **SMALL)
        finally:
            sub.close()
        assert [r.verdict for r in results] == ["did not run"] * len(escape.PROBES), results
        assert all(why in r.detail and r.contained is None for r in results), results


def test_contained_without_control_is_unconfirmed():
    r = escape.ProbeResult("network", True, True, "interfaces: lo")
    assert escape.with_control([r], [])[0].verdict == "unconfirmed"
    blind = escape.ProbeResult("network", True, True, "interfaces: lo")
    assert escape.with_control([r], [blind])[0].verdict == "unconfirmed"
    fired = escape.ProbeResult("network", True, False, "interfaces: lo, eth0")
    assert escape.with_control([r], [fired])[0].verdict == "contained"


def test_isolation_cli_prints_ran_contained_control(tmp_path):
    names = ["process", "bwrap", "docker"]
    for n in names:
        require(registry.get(n).missing())
    proc = cli("isolation", "--substrates", ",".join(names), "--disk-mb", "8", "--procs", "40",
               "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "i.json"),
               env={"DRUMSBENCH_STATE": str(tmp_path / "state"), "COLUMNS": "400"}, check=True)
    data = json.loads((tmp_path / "i.json").read_text())
    assert data["schema"] == "drumsbench.isolation/3"
    assert all(c["ran"] and not c["contained"] for c in data["control"])
    for name in names:
        probes = data["substrates"][name]["probes"]
        assert [p["probe"] for p in probes] == list(escape.PROBES)
        for p in probes:
            assert p["ran"] and p["control"] == "fired", (name, p)
            assert p["verdict"] in ("contained", "NOT contained")
    for name in ("bwrap", "docker"):
        by = {p["probe"]: p for p in data["substrates"][name]["probes"]}
        for probe in ("write_outside", "read_neighbour", "host_loopback", "network"):
            assert by[probe]["verdict"] == "contained", (name, by[probe])
    lines = proc.stdout.splitlines()
    for probe in escape.PROBES:
        row = next(ln for ln in lines if ln.lstrip("│┃ ").startswith(probe))
        assert row.count("ran: yes") == 3 and row.count("control: fired") == 3, row
        assert row.count("contained: ") == 3, row
