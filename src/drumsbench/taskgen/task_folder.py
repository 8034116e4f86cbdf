"""A made task as a Harbor task folder (the ``harbor`` environment kind loads it).

Contract of ``write(folder, made)``: ``folder`` holds exactly

- ``task.toml`` — Harbor's schema 1.4; ``[metadata]`` names the source (``NAME==VERSION``), the
  operator, the file and the FAIL_TO_PASS / PASS_TO_PASS counts;
- ``instruction.md`` — what fails (the FAIL_TO_PASS test ids, at most ``SHOWN`` of them), never
  the fix, where or how the code was changed;
- ``environment/Dockerfile`` and ``environment/project/`` — the project's sdist with the bug in it,
  installed nowhere (on ``PYTHONPATH``), its tests' requirements installed from the registry;
- ``solution/solve.sh`` and ``solution/original/<file>`` — the oracle puts the file back;
- ``tests/test.sh``, ``tests/score.py``, ``tests/expected.json`` and ``tests/project/<tests>`` —
  the verifier puts the project's own tests back as they were (the agent's edits to them do not
  count), runs them with pytest and scores 1 only when every FAIL_TO_PASS and PASS_TO_PASS test id
  is reported ``PASSED`` (skipped, xfail or absent never pass).

The bytes depend only on ``made`` (sorted members, no dates): the same pins give the same folders.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SHOWN = 12  # FAIL_TO_PASS ids the instruction lists
PYTEST = ("python3", "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-rA", "-q")

# The verifier's scorer, run as `python3 -I -S score.py EXPECTED REPORT` (no site, no working
# folder on the path: nothing of the agent's is imported). It writes Harbor's reward.json itself.
SCORE = '''"""Score a pytest -rA report: 1 when every expected test id is reported PASSED, else 0."""
import json
import sys

expected = json.load(open(sys.argv[1]))
ids = expected["fail_to_pass"] + expected["pass_to_pass"]
passed = set()
for line in open(sys.argv[2], errors="replace"):
    if line.startswith("PASSED "):
        passed.add(line[len("PASSED "):].rstrip("\\n"))
missing = [i for i in ids if i not in passed]
print(f"{len(ids) - len(missing)} of {len(ids)} expected tests passed")
for i in missing[:20]:
    print("not passed:", i)
with open("/logs/verifier/reward.json", "w") as f:
    json.dump({"reward": 0 if missing or not ids else 1}, f)
'''


@dataclass(frozen=True)
class MadeTask:
    """One task: the project's files with the bug (``files``), the file fixed back (``rel``,
    ``original``), the test paths, the ids, and how it was made."""

    task_id: str
    pin: str
    operator: str
    rel: str
    original: bytes
    files: Mapping[str, bytes]
    tests: tuple[str, ...]
    pythonpath: str
    requires: tuple[str, ...]
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]


def _dockerfile(made: MadeTask) -> str:
    path = "/app" + (f"/{made.pythonpath}" if made.pythonpath else "")
    pip = " ".join(shlex.quote(r) for r in made.requires)
    return ("FROM python:3.11-slim\n"
            + (f"RUN python3 -m pip install --no-cache-dir {pip}\n" if pip else "")
            + f"ENV PYTHONDONTWRITEBYTECODE=1 PYTHONPATH={path}\n"
            "WORKDIR /app\n"
            "COPY project/ /app/\n")


def _test_sh(made: MadeTask) -> str:
    restore = "\n".join(f"rm -rf /app/{shlex.quote(t)}\ncp -a /tests/project/{shlex.quote(t)} /app/{shlex.quote(t)}"
                        for t in made.tests)
    run = " ".join([*PYTEST, *(shlex.quote(t) for t in made.tests)])
    return ("#!/bin/bash\n"
            "# made by `drumsbench tasks make`: the project's own tests, put back as they were, then scored\n"
            "mkdir -p /logs/verifier\n"
            "cd /app\n"
            f"{restore}\n"
            f"PYTHONDONTWRITEBYTECODE=1 {run} > /logs/verifier/pytest.txt 2>&1\n"
            "python3 -I -S /tests/score.py /tests/expected.json /logs/verifier/pytest.txt\n")


def _instruction(made: MadeTask) -> str:
    name, _, version = made.pin.partition("==")
    shown = "\n".join(f"- `{t}`" for t in made.fail_to_pass[:SHOWN])
    more = len(made.fail_to_pass) - SHOWN
    return (f"The folder `/app` holds the Python project {name} {version}; its own test suite runs with\n"
            f"`python3 -m pytest -o addopts= {' '.join(made.tests)}` from `/app`. These tests of the suite\n"
            "fail:\n\n"
            f"{shown}\n" + (f"- and {more} more\n" if more > 0 else "") +
            "\nFind the fault in the project's code and fix it so that they pass, without making any other\n"
            "test of the suite fail. Do not change the tests: the project's own tests are put back before\n"
            "scoring.\n")


def _task_toml(made: MadeTask) -> str:
    return ('schema_version = "1.4"\n\n'
            "[metadata]\n"
            'category = "python"\n'
            f'drumsbench_source = "{made.pin}"\n'
            f'drumsbench_operator = "{made.operator}"\n'
            f"drumsbench_file = {json.dumps(made.rel)}\n"
            f"drumsbench_fail_to_pass = {len(made.fail_to_pass)}\n"
            f"drumsbench_pass_to_pass = {len(made.pass_to_pass)}\n\n"
            "[verifier]\ntimeout_sec = 300.0\n\n"
            "[agent]\ntimeout_sec = 1800.0\n\n"
            "[environment]\nbuild_timeout_sec = 900.0\n")


def _put(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)


def _under(rel: str, top: str) -> bool:
    return rel == top or rel.startswith(top.rstrip("/") + "/")


def write(folder: Path, made: MadeTask) -> None:
    """Write ``made`` into ``folder``, replacing what was there (module contract)."""
    if folder.exists():
        shutil.rmtree(folder)
    _put(folder / "task.toml", _task_toml(made))
    _put(folder / "instruction.md", _instruction(made))
    _put(folder / "environment" / "Dockerfile", _dockerfile(made))
    for rel in sorted(made.files):
        _put(folder / "environment" / "project" / rel, made.files[rel])
    _put(folder / "solution" / "original" / made.rel, made.original)
    _put(folder / "solution" / "solve.sh",
         f"#!/bin/bash\ncp /solution/original/{shlex.quote(made.rel)} /app/{shlex.quote(made.rel)}\n", 0o755)
    _put(folder / "tests" / "test.sh", _test_sh(made), 0o755)
    _put(folder / "tests" / "score.py", SCORE)
    _put(folder / "tests" / "expected.json",
         json.dumps({"fail_to_pass": list(made.fail_to_pass), "pass_to_pass": list(made.pass_to_pass)}, indent=1)
         + "\n")
    for rel in sorted(made.files):
        if any(_under(rel, t) for t in made.tests):  # the tests are never the changed file
            _put(folder / "tests" / "project" / rel, made.files[rel])
