"""Which ``FROM`` images a Harbor task may name here, and what each becomes.

This machine reaches no image registry: a task's base image is built from this machine's Debian
packages (``drumsbench.images``), so only names that such a build honestly stands for are taken.
Contract of ``resolve(ref)``: a ``BaseImage`` for

- ``debian:<codename>``, ``debian:<codename>-slim``, ``debian:<version>``, ``debian:<version>-slim``
  where codename/version is this machine's Debian release (``bookworm``/``12``): the project's
  Debian root filesystem;
- ``python:<X.Y>`` with an optional ``-slim`` and an optional ``-<codename>`` of this release, where
  ``X.Y`` is the Python of this Debian release (3.11 on bookworm): that root filesystem with
  Debian's Python, pip and venv;

with an optional ``docker.io/`` or ``docker.io/library/`` or ``library/`` in front. Anything else
is a one-line ``UsageError`` naming the image and what to write instead: another distribution, a
floating tag (``latest``, ``stable``: whatever is newest when pulled), a patch-pinned Python
(``3.11.9``: not the bytes Debian has), a digest (``@sha256:``: bytes this machine cannot fetch),
another registry.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

from drumsbench.core.errors import UsageError

# Debian releases: codename -> (version, the Python 3 of that release)
DEBIAN_RELEASES: dict[str, tuple[str, str]] = {"bookworm": ("12", "3.11"), "trixie": ("13", "3.13")}
DOC = "docs/harbor.md"


class BaseImage(BaseModel):
    """What a task's ``FROM`` becomes here: the Debian release's root filesystem (``flavor`` debian)
    or that plus Debian's Python (``flavor`` python, ``python`` its X.Y)."""

    model_config = ConfigDict(frozen=True)

    ref: str  # as the Dockerfile wrote it
    flavor: Literal["debian", "python"]
    debian: str  # the codename
    python: str | None = None


def _name_and_tag(ref: str) -> tuple[str, str | None]:
    """``(repository, tag)`` of an image reference (no digest: ``resolve`` refuses those first) with
    Docker Hub's default prefixes taken off; another registry is refused by ``resolve`` (the name
    keeps its host then)."""
    name, _, tag = ref.partition(":")
    if "/" in tag:  # the colon was a registry's port: no tag
        name, tag = ref, ""
    for prefix in ("docker.io/library/", "docker.io/", "library/"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return name, tag or None


def resolve(ref: str, suite: str, where: str) -> BaseImage:
    """The ``BaseImage`` for ``ref`` on a machine whose Debian release is ``suite`` (module
    contract); ``where`` names the line for the error (``"<Dockerfile>:3: FROM"``)."""
    version, python = DEBIAN_RELEASES.get(suite, ("", ""))
    instead = f"debian:{suite}" + (f" or python:{python}-slim" if python else "")

    def refuse(why: str) -> UsageError:
        return UsageError(f"{where} {ref}: {why}; use {instead} (base images are built here from this "
                          f"machine's Debian packages; see {DOC})")

    if "@" in ref:
        raise refuse("a digest names bytes this machine cannot fetch (no image registry here)")
    name, tag = _name_and_tag(ref)
    if name == "debian":
        if tag in {suite, f"{suite}-slim", version, f"{version}-slim"} and version:
            return BaseImage(ref=ref, flavor="debian", debian=suite)
        if tag in (None, "latest", "stable", "testing", "unstable", "sid", "stable-slim"):
            raise refuse("a floating tag (whatever Debian is newest when pulled) cannot be had here")
        raise refuse(f"this machine's Debian is {suite} ({version})")
    if name == "python":
        m = re.fullmatch(r"(\d+\.\d+)(\.\d+)?(-slim)?(?:-([a-z]+))?", tag or "")
        if m is None:
            raise refuse("only python:X.Y[-slim][-codename] tags can be had here")
        if m.group(2):
            raise refuse(f"a patch-pinned Python is not what Debian ships (it has {python})")
        if m.group(4) not in (None, suite):
            raise refuse(f"this machine's Debian is {suite}")
        if m.group(1) != python:
            raise refuse(f"this machine's Debian ({suite}) has Python {python}")
        return BaseImage(ref=ref, flavor="python", debian=suite, python=python)
    raise refuse("cannot be had on this machine (no image registry here)")
