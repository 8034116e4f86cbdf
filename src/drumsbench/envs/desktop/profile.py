"""The LibreOffice template profile: built once, cached, copied into every instance's home.

A brand-new profile costs seconds at start-up; a copy of a finished one lets soffice show its
window in well under a second (docs/desktop.md has the figures). The template is built with
``soffice --headless --terminate_after_init`` under a private HOME, then the settings below are
written into its ``registrymodifications.xcu``. It lives in ``cache_dir()/desktop-profile-<hash>``
where the hash covers the settings and the LibreOffice version, and it is published complete (built
in a temporary folder, then renamed) under a file lock, so parallel workers build it once.

The settings make the desktop deterministic for scripted and learned policies alike: no tip of the
day or first-start dialogs, no document recovery after a kill, no autosave, no autocorrect or word
completion while typing (Writer) and no AutoInput (Calc), which would otherwise rewrite what a
policy types depending on what the document already holds.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from xml.sax.saxutils import escape

from drumsbench.core.errors import SubstrateError
from drumsbench.images import cache_dir

SOFFICE = "/usr/lib/libreoffice/program/soffice"
PROFILE_NAME = "lo-profile"  # folder in the instance's home

SETTINGS: list[tuple[str, str, str, str]] = [
    # (path, property, type, value)
    ("/org.openoffice.Office.Common/Misc", "ShowTipOfTheDay", "xs:boolean", "false"),
    ("/org.openoffice.Office.Common/Misc", "FirstRun", "xs:boolean", "false"),
    ("/org.openoffice.Office.Common/Misc", "UseSystemFileDialog", "xs:boolean", "false"),
    ("/org.openoffice.Office.Common/Load", "ShowOfficeUpdateDialog", "xs:boolean", "false"),
    ("/org.openoffice.Office.Recovery/RecoveryInfo", "Enabled", "xs:boolean", "false"),
    ("/org.openoffice.Office.Recovery/AutoSave", "Enabled", "xs:boolean", "false"),
    ("/org.openoffice.Office.Common/Save/Document", "AutoSave", "xs:boolean", "false"),
    ("/org.openoffice.Office.Writer/AutoFunction/Completion", "Enable", "xs:boolean", "false"),
    ("/org.openoffice.Office.Writer/AutoFunction/Format/ByInput", "Enable", "xs:boolean", "false"),
    ("/org.openoffice.Office.Calc/Input", "AutoInput", "xs:boolean", "false"),
    ("/org.openoffice.Office.Java/VirtualMachine", "Enable", "xs:boolean", "false"),
    # The policy is an adversary: no macro may run (not from a document, not from the Basic IDE),
    # so its only way into LibreOffice is the keyboard and the mouse (docs/attribution.md).
    ("/org.openoffice.Office.Common/Security/Scripting", "DisableMacrosExecution", "xs:boolean", "true"),
    ("/org.openoffice.Office.Common/Security/Scripting", "MacroSecurityLevel", "xs:int", "3"),
    ("/org.openoffice.Setup/Product", "ooSetupLastVersion", "xs:string", "{version}"),
]
RECIPE_VERSION = 2


@functools.cache
def soffice_version() -> str:
    """'7.4' for LibreOffice 7.4.x (asked once per process: ``soffice --version``)."""
    try:
        out = subprocess.run([SOFFICE, "--version"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    m = re.search(r"LibreOffice (\d+)\.(\d+)", out)
    return f"{m.group(1)}.{m.group(2)}" if m else "unknown"


def missing() -> str | None:
    if not os.path.exists(SOFFICE):
        return "LibreOffice is missing: apt-get install libreoffice-writer libreoffice-calc (scripts/setup-desktop.sh)"
    return None


def recipe_hash() -> str:
    full = {"settings": SETTINGS, "version": RECIPE_VERSION, "lo": soffice_version()}
    return hashlib.sha256(json.dumps(full).encode()).hexdigest()[:12]


def _xcu_items(version: str) -> str:
    items = []
    for path, prop, kind, value in SETTINGS:
        value = value.replace("{version}", version)
        items.append(f'<item oor:path="{escape(path)}"><prop oor:name="{escape(prop)}" oor:op="fuse" '
                     f'oor:type="{kind}"><value>{escape(value)}</value></prop></item>')
    return "\n".join(items)


def _write_settings(profile: Path) -> None:
    xcu = profile / "user" / "registrymodifications.xcu"
    text = xcu.read_text()
    marker = "</oor:items>"
    if marker not in text:
        raise SubstrateError(f"unexpected LibreOffice profile: no {marker} in {xcu}")
    xcu.write_text(text.replace(marker, _xcu_items(soffice_version()) + "\n" + marker))


COMPLETE = ".drumsbench-complete"  # written last into a built template: {"lo": version, "digest": ...}


def profile_digest(folder: Path) -> str:
    """sha256 over every entry of a profile folder (path, kind, mode, content or link target),
    the completion marker and LibreOffice's lock excepted."""
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if rel in (COMPLETE, ".lock"):
            continue
        st = path.lstat()
        h.update(f"{rel}\0{st.st_mode:o}\0".encode())
        if path.is_symlink():
            h.update(os.readlink(path).encode())
        elif path.is_file():
            h.update(path.read_bytes())
        h.update(b"\0")
    return "sha256:" + h.hexdigest()


def _recorded_digest(template: Path) -> str | None:
    try:
        digest = json.loads((template / COMPLETE).read_text()).get("digest")
    except (OSError, ValueError, AttributeError):
        return None
    return digest if isinstance(digest, str) else None


def template_profile() -> Path:
    """The cached template profile folder (its ``user/`` inside), built first when missing."""
    gone = missing()
    if gone:
        raise SubstrateError(gone)
    root = cache_dir()
    target = root / f"desktop-profile-{recipe_hash()}"
    if _recorded_digest(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".desktop-profile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _recorded_digest(target):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=".desktop-profile-", dir=root))
        try:
            home = tmp / "home"
            home.mkdir()
            prof = tmp / "profile"
            env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home), "LANG": "C.UTF-8"}
            proc = subprocess.run([SOFFICE, "--headless", "--terminate_after_init", "--norestore",
                                   f"-env:UserInstallation={prof.as_uri()}"],
                                  env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
            if not (prof / "user" / "registrymodifications.xcu").exists():
                raise SubstrateError(f"building the LibreOffice template profile failed (exit {proc.returncode}): "
                                     f"{proc.stderr.decode(errors='replace')[-300:]}")
            _write_settings(prof)
            (prof / ".lock").unlink(missing_ok=True)
            (prof / COMPLETE).write_text(json.dumps({"lo": soffice_version(), "digest": profile_digest(prof)}))
            if target.exists():
                shutil.rmtree(target)
            prof.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _discard(template: Path) -> None:
    """Remove a template whose content is not what was built (under the build lock)."""
    with open(template.parent / ".desktop-profile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(template, ignore_errors=True)


def _sound_template(fits: Callable[[Path, str | None], bool]) -> Path:
    """``template_profile()`` once ``fits(template, recorded digest)`` holds; a template that does
    not fit is removed and built again once; ``SubstrateError`` if even the new one does not."""
    for attempt in range(2):
        template = template_profile()
        if fits(template, _recorded_digest(template)):
            return template
        if attempt == 0:
            _discard(template)
    raise SubstrateError(f"the desktop template profile in {cache_dir()} differs from its recorded digest "
                         "even when built anew")


def verified_template() -> Path:
    """``template_profile()`` whose content matches the digest recorded at its build (else removed
    and built again; ``SubstrateError`` if even that differs)."""
    return _sound_template(lambda template, want: profile_digest(template) == want)


def copy_profile(dest: Path) -> None:
    """A private copy of the template at ``dest`` (dest must not exist), checked against the digest
    recorded when the template was built: a template changed since (a file saved into it by a
    LibreOffice that could reach it would reach every later instance of every run) is removed and
    built again, and the copy made anew; ``SubstrateError`` if even that copy differs."""
    def copied(template: Path, want: str | None) -> bool:
        shutil.copytree(template, dest, symlinks=True, ignore=shutil.ignore_patterns(COMPLETE))
        if want is not None and profile_digest(dest) == want:
            return True
        shutil.rmtree(dest, ignore_errors=True)
        return False

    _sound_template(copied)
