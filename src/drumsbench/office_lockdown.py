"""LibreOffice's locked settings: a finalized configuration layer in the system's LibreOffice.

The desktop's policy is an adversary whose only way into LibreOffice is meant to be the keyboard
and the mouse. The template profile turns macros off (``envs/desktop/profile.py``), but a profile
is the user layer of LibreOffice's configuration: Tools > Options > Advanced > Open Expert
Configuration edits it, so a policy could turn macros back on and run code as LibreOffice's uid.
A ``.xcd`` file in ``/etc/libreoffice/registry`` (a layer Debian's LibreOffice reads below the
user's) whose properties carry ``oor:finalized="true"`` cannot be changed by any later layer:
Expert Configuration shows them read-only, and a write through the configuration API
(``ConfigurationUpdateAccess``, which the dialog uses) is refused.

Where it is installed: on the host by ``scripts/setup-desktop.sh`` (process, bwrap and overlay
instances use the host's LibreOffice), and into the ``desktop`` rootfs by ``images.ensure_rootfs``
(docker, podman, the vm's guest). ``missing(root)`` says when a system lacks it: the desktop then
refuses to start instead of running with macros one dialog away.

Command line: ``python -m drumsbench.office_lockdown install [ROOT]`` (ROOT defaults to ``/``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from xml.sax.saxutils import escape

REGISTRY = "etc/libreoffice/registry"  # below a system's root
XCD_NAME = "drumsbench-lockdown.xcd"

# (package, component, node path, property, value): each finalized in the layer
LOCKED: list[tuple[str, str, str, str, str]] = [
    # no macro runs: not from a document, not from the Basic IDE, not at any security level
    ("org.openoffice.Office", "Common", "Security/Scripting", "DisableMacrosExecution", "true"),
    ("org.openoffice.Office", "Common", "Security/Scripting", "MacroSecurityLevel", "3"),
    # no extension (an .oxt carries UNO components in Python: code inside LibreOffice) is added
    ("org.openoffice.Office", "ExtensionManager", "ExtensionSecurity", "DisableExtensionInstallation", "true"),
    # Expert Configuration (the dialog that edits any setting) is not offered at all
    ("org.openoffice.Office", "Common", "Security", "EnableExpertConfiguration", "false"),
    # no Java (nothing of the built-in tasks needs it; it is another runtime inside LibreOffice)
    ("org.openoffice.Office", "Java", "VirtualMachine", "Enable", "false"),
]


def xcd_text() -> str:
    """The layer's text: one ``component-data`` per component, each property finalized."""
    parts = ['<?xml version="1.0" encoding="UTF-8"?>',
             '<!-- DrumsBench: settings no later layer may change (drumsbench.office_lockdown) -->',
             '<oor:data xmlns:xs="http://www.w3.org/2001/XMLSchema" '
             'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xmlns:oor="http://openoffice.org/2001/registry">',
             '<dependency file="main"/>']  # read after main.xcd, which declares these properties
    for package, component, node, prop, value in LOCKED:
        nodes = node.split("/")
        opened = "".join(f'<node oor:name="{escape(n)}">' for n in nodes)
        closed = "</node>" * len(nodes)
        parts.append(f'<oor:component-data oor:package="{escape(package)}" oor:name="{escape(component)}">'
                     f'{opened}<prop oor:name="{escape(prop)}" oor:finalized="true" oor:op="fuse">'
                     f'<value>{escape(value)}</value></prop>{closed}</oor:component-data>')
    parts.append("</oor:data>")
    return "\n".join(parts) + "\n"


def path(root: str | Path = "/") -> Path:
    return Path(root) / REGISTRY / XCD_NAME


def install(root: str | Path = "/") -> Path:
    """Write the layer into the system at ``root`` (root-owned, 0644; replaced atomically)."""
    target = path(root)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{XCD_NAME}.{os.getpid()}")
    tmp.write_text(xcd_text())
    tmp.chmod(0o644)
    os.replace(tmp, target)
    return target


def missing(root: str | Path = "/") -> str | None:
    """Why the system at ``root`` lacks the layer (absent, or not this version's text), else None."""
    target = path(root)
    try:
        text = target.read_text()
    except OSError:
        return f"LibreOffice's macro lock {target} is missing: run scripts/setup-desktop.sh"
    if text != xcd_text():
        return f"LibreOffice's macro lock {target} is out of date: run scripts/setup-desktop.sh"
    return None


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or argv[0] != "install":
        print("usage: python -m drumsbench.office_lockdown install [ROOT]", file=sys.stderr)
        return 2
    print(f"office_lockdown: {install(argv[1] if len(argv) == 2 else '/')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
