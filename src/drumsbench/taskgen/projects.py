"""The pinned real projects tasks are made from (``projects.toml``) and their source distributions.

Contract: ``load()`` reads the manifest into ``Project`` models (a malformed entry is a one-line
``UsageError`` naming it); ``Project.sdist()`` is the pinned source distribution, downloaded once
from the package registry's simple index (PEP 691; no build code of the project runs) into the cache
(``images.cache_dir()/sdists``) and refused unless its SHA-256 is the pin's; ``Project.files()``
its members (regular files only, paths inside the distribution's one top folder, none through a
link or ``..``), with that top folder stripped.
Nothing of a project is ever committed to this repository: only its name, version and digest.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import posixpath
import tarfile
import tomllib
import urllib.parse
import urllib.request
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from drumsbench import images
from drumsbench.core.errors import UsageError

MANIFEST = Path(__file__).with_name("projects.toml")
MAX_SDIST_BYTES = 64 << 20


class Project(BaseModel):
    """One pinned project (the manifest's comments say what each field is)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: str
    sha256: str
    source: tuple[str, ...]
    tests: tuple[str, ...]
    pythonpath: str = ""
    requires: tuple[str, ...] = ()

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    def cached(self) -> Path | None:
        """The pinned sdist when the cache holds it (its digest checked), else None."""
        path = images.cache_dir() / "sdists" / f"{self.name}-{self.version}.tar.gz"
        return path if path.is_file() and _sha256(path) == self.sha256 else None

    def sdist(self) -> Path:
        """The pinned sdist in the cache, downloaded first when absent (module contract)."""
        known = self.cached()
        if known is not None:
            return known
        folder = images.cache_dir() / "sdists"
        folder.mkdir(parents=True, exist_ok=True)
        data = _download(self)
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise UsageError(f"{self.pin}: the registry's sdist has SHA-256 {digest}, the manifest pins "
                             f"{self.sha256}: refused (fix the pin in projects.toml only if the new file is trusted)")
        target = folder / f"{self.name}-{self.version}.tar.gz"
        staging = target.with_name(f".{target.name}.{os.getpid()}")
        staging.write_bytes(data)
        staging.replace(target)  # whole or absent: a crash leaves no half file under the name
        return target

    def files(self) -> dict[str, bytes]:
        """The sdist's regular files by path below its top folder (module contract)."""
        return _members(str(self.sdist()), self.sha256)


def _download(project: Project) -> bytes:
    """The pinned sdist's bytes from the registry's simple index (PEP 691 JSON): the file of that
    version whose index digest is the pin's. No build backend runs (``pip download`` would run the
    project's own build code on the host to read its metadata)."""
    index = os.environ.get("DRUMSBENCH_SDIST_INDEX", "https://pypi.org/simple")
    url = f"{index.rstrip('/')}/{project.name.lower().replace('_', '-')}/"
    try:
        req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            listing = json.load(r)
        files = [f for f in listing.get("files", []) if f.get("hashes", {}).get("sha256") == project.sha256]
        if not files:
            raise UsageError(f"{project.pin}: no file with the pinned SHA-256 in {url}; check the pin")
        with urllib.request.urlopen(urllib.parse.urljoin(url, files[0]["url"]), timeout=300) as r:
            data: bytes = r.read(MAX_SDIST_BYTES + 1)
    except (OSError, ValueError) as e:
        raise UsageError(f"{project.pin}: the source distribution could not be downloaded from {url} ({e}); "
                         "check the package registry is reachable") from None
    if len(data) > MAX_SDIST_BYTES:
        raise UsageError(f"{project.pin}: the sdist is over {MAX_SDIST_BYTES >> 20} MiB; not a small project")
    return data


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def _members(path: str, digest: str) -> dict[str, bytes]:
    del digest  # part of the cache key: a file replaced under the same name is read again
    out: dict[str, bytes] = {}
    total = 0
    with tarfile.open(path, "r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            parts = member.name.split("/", 1)
            rel = posixpath.normpath(parts[1]) if len(parts) == 2 else ""
            if not rel or rel.startswith(("/", "..")) or posixpath.isabs(rel):
                continue
            total += member.size
            if total > MAX_SDIST_BYTES:
                raise UsageError(f"{path}: more than {MAX_SDIST_BYTES >> 20} MiB unpacked; not a small project")
            f = tar.extractfile(member)
            if f is not None:
                out[rel] = f.read()
    return out


def load(path: Path = MANIFEST) -> list[Project]:
    """The manifest's projects (module contract)."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"{path}: cannot read the project manifest: {e}") from None
    out = []
    for i, entry in enumerate(raw.get("project", [])):
        try:
            out.append(Project.model_validate(entry))
        except ValidationError as e:
            err = e.errors()[0]
            raise UsageError(f"{path}: project {i + 1} ({entry.get('name', '?')}): field "
                             f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    return out


def find(pin: str, path: Path = MANIFEST) -> Project:
    """The manifest's project of ``NAME==VERSION`` (or ``NAME``: its one pinned version)."""
    name, _, version = pin.partition("==")
    known = load(path)
    for p in known:
        if p.name == name and (not version or p.version == version):
            return p
    pins = ", ".join(p.pin for p in known)
    raise UsageError(f"--from: {pin} is not pinned in the project manifest (pinned: {pins}); add it to "
                     f"{MANIFEST.name} with its sdist's SHA-256")


def main() -> None:
    """``python -m drumsbench.taskgen.projects``: every pinned sdist into the cache (set-up time:
    scripts/setup-taskgen.sh), so that making tasks later needs no registry."""
    for p in load():
        print(f"taskgen: {p.pin}: {p.sdist()}")


if __name__ == "__main__":
    try:
        main()
    except UsageError as e:
        raise SystemExit(f"error: {e}") from None
