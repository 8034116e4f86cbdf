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


def template_profile() -> Path:
    """The cached template profile folder (its ``user/`` inside), built first when missing."""
    gone = missing()
    if gone:
        raise SubstrateError(gone)
    root = cache_dir()
    target = root / f"desktop-profile-{recipe_hash()}"
    if (target / ".drumsbench-complete").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".desktop-profile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".drumsbench-complete").exists():
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
            (prof / ".drumsbench-complete").write_text(json.dumps({"lo": soffice_version()}))
            if target.exists():
                shutil.rmtree(target)
            prof.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def copy_profile(dest: Path) -> None:
    """A private copy of the template at ``dest`` (dest must not exist)."""
    shutil.copytree(template_profile(), dest, symlinks=True, ignore=shutil.ignore_patterns(".drumsbench-complete"))
