"""LibreOffice's macro lock (issue 30): the settings that keep a GUI policy's hands off code
execution inside LibreOffice are finalized in a system layer, so no profile change can undo them.

The policy's route to them is Tools > Options > Advanced > Open Expert Configuration, which writes
through the configuration API (``ConfigurationUpdateAccess``). The test takes that API against a
real LibreOffice on a copy of the real template profile: with the lock each write is refused and the
value stays; positive control, the same LibreOffice with the lock's file hidden from it (a private
mount namespace whose ``/etc/libreoffice/registry`` lacks it), where every write takes.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest

from drumsbench import images, office_lockdown
from drumsbench.envs.desktop import instance
from drumsbench.envs.desktop.profile import SOFFICE, copy_profile
from drumsbench.substrates.containers import common

from conftest import require

# run by the system's Python (python3-uno): tries to flip every locked property, prints what it saw
PROBE = textwrap.dedent('''
    import sys, time
    sys.path.append("/usr/lib/python3/dist-packages")
    import uno
    from com.sun.star.beans import PropertyValue
    local = uno.getComponentContext()
    resolver = local.ServiceManager.createInstanceWithContext("com.sun.star.bridge.UnoUrlResolver", local)
    end = time.monotonic() + 60
    while True:
        try:
            ctx = resolver.resolve(f"uno:pipe,name={sys.argv[1]};urp;StarOffice.ComponentContext")
            break
        except Exception:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)
    provider = ctx.ServiceManager.createInstanceWithContext("com.sun.star.configuration.ConfigurationProvider", ctx)

    def access(path, update):
        arg = PropertyValue()
        arg.Name, arg.Value = "nodepath", path
        kind = "ConfigurationUpdateAccess" if update else "ConfigurationAccess"
        return provider.createInstanceWithArguments("com.sun.star.configuration." + kind, (arg,))

    seen = {}
    for path, prop, value in eval(sys.argv[2]):
        before = access(path, False).getPropertyValue(prop)
        refused = None
        try:
            node = access(path, True)
            node.setPropertyValue(prop, value)
            node.commitChanges()
        except Exception as e:
            refused = type(e).__name__ + ": " + str(e)[:120]
        seen[prop] = (before, access(path, False).getPropertyValue(prop), refused)
    print(repr(seen), flush=True)
    # pyuno can corrupt the heap while its objects are freed in the interpreter's teardown
    # ("malloc_consolidate(): unaligned fastbin chunk detected", exit 134, about 1 run in 10 under
    # load): the answer is out, so skip the teardown
    import os
    os._exit(0)
''')


def _typed(value: str) -> bool | int:
    return value == "true" if value in ("true", "false") else int(value)


def _flipped(value: str) -> bool | int:
    return value != "true" if value in ("true", "false") else 0


WRITES = [(f"/{package}.{component}/{node}", prop, _flipped(value))
          for package, component, node, prop, value in office_lockdown.LOCKED]


# LibreOffice and the probe in one private mount namespace (the test's folder at /mnt) whose /tmp
# is the test's own:
# LibreOffice puts its pipes (OSL_PIPE_*) and temporary files in /tmp whatever TMPDIR says, and a
# killed one leaves them there; with the lock hidden, the registry is a copy without the layer
SCRIPT = """
mount --bind "$RUN" /mnt || exit 90
mount --bind /mnt/tmp /tmp || exit 91
if [ -n "$HIDE_LOCK" ]; then mount --bind /mnt/registry /etc/libreoffice/registry || exit 92; fi
"$SOFFICE" --headless --invisible --norestore -env:UserInstallation=file:///mnt/profile \
    "--accept=pipe,name=$PIPE;urp;" >/dev/null 2>&1 &
office=$!
"$PYTHON" /mnt/probe.py "$PIPE" "$WRITES"
status=$?
kill -9 "$office"  # the launcher; the test ends the rest of the session
exit $status
"""


def try_writes(tmp_path: Path, hide_lock: bool) -> dict[str, tuple[object, object, str | None]]:
    """Start LibreOffice (headless, UNO on a pipe) on a copy of the template profile, run PROBE
    against it, end it; with ``hide_lock`` the registry it reads lacks the lock."""
    run = tmp_path / f"run-{uuid.uuid4().hex[:6]}"
    (run / "tmp").mkdir(parents=True)
    (run / "tmp").chmod(0o1777)
    copy_profile(run / "profile")
    (run / "probe.py").write_text(PROBE)
    if hide_lock:
        shutil.copytree(office_lockdown.path("/").parent, run / "registry")
        (run / "registry" / office_lockdown.XCD_NAME).unlink()
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "RUN": str(run), "HIDE_LOCK": "1" if hide_lock else "",
           "SOFFICE": SOFFICE, "PIPE": "drumsbench-lock", "PYTHON": instance.SYSTEM_PYTHON,
           "WRITES": repr(WRITES), "HOME": "/mnt", "TMPDIR": "/tmp"}
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", SCRIPT], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        # LibreOffice's launcher leaves soffice.bin behind when killed: end the whole session
        subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], check=False)
        proc.wait(timeout=30)
    assert proc.returncode == 0, (proc.returncode, err[-600:], out[-300:])
    return ast.literal_eval(out.strip().splitlines()[-1])


@pytest.fixture
def office(tmp_path):
    require(instance.missing())
    return tmp_path


def test_the_host_carries_the_lock_and_the_desktop_refuses_to_start_without_it(office, tmp_path):
    assert office_lockdown.missing("/") is None
    assert office_lockdown.missing(tmp_path) is not None  # a system without it
    office_lockdown.install(tmp_path)
    assert office_lockdown.missing(tmp_path) is None
    office_lockdown.path(tmp_path).write_text(office_lockdown.xcd_text().replace("true", "false"))
    assert "out of date" in (office_lockdown.missing(tmp_path) or "")


def test_no_profile_change_turns_macros_back_on(office):
    locked = try_writes(office, hide_lock=False)
    assert set(locked) == {prop for _, prop, _ in WRITES}
    for _, prop, value in WRITES:
        before, after, refused = locked[prop]
        assert before == after != value, (prop, locked[prop])
        assert refused is not None and "finalized" in refused, (prop, refused)
    assert locked["DisableMacrosExecution"][1] is True
    # positive control: the same writes against the same LibreOffice and profile, the lock hidden
    open_ = try_writes(office, hide_lock=True)
    for _, prop, value in WRITES:
        before, after, refused = open_[prop]
        assert refused is None and after == value, (prop, open_[prop])
    assert open_["DisableMacrosExecution"][0] is True  # the profile's own setting: what a policy undid


def test_the_desktop_images_carry_the_lock():
    """The desktop rootfs (docker, podman, the vm's guest disk) and the docker image made from it."""
    rootfs = images.rootfs_dir("desktop")
    require(None if (rootfs / ".drumsbench-complete").exists() else
            "the desktop rootfs is not built: scripts/setup-desktop.sh")
    assert office_lockdown.missing(rootfs) is None
    require(None if shutil.which("docker") else "docker is missing: scripts/setup.sh")
    tag = common.sandbox_tag("desktop")
    res = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat", tag,
                          "/" + office_lockdown.REGISTRY + "/" + office_lockdown.XCD_NAME],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-400:]
    assert res.stdout == office_lockdown.xcd_text()
