"""One verdict channel: every runner signs with ``core/verdict_lines.py``, checked by ``core/verdict_channel.py``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import drumsbench
from drumsbench.core import verdict_lines
from drumsbench.core.verdict_channel import authentic_verdict, new_secret, runner_source, saw_ready
from drumsbench.envs.coding import env as coding_env
from drumsbench.envs.desktop import env as desktop_env

PACKAGE = Path(drumsbench.__file__).parent
SHIPPED = {"coding": coding_env.RUNNER, "desktop": desktop_env.RUNNER}


def _imported_modules(source: str) -> set[str]:
    tree = ast.parse(source)
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}


@pytest.mark.parametrize("kind", sorted(SHIPPED))
def test_a_shipped_runner_carries_the_channel_and_imports_nothing_of_drumsbench(kind: str) -> None:
    source = SHIPPED[kind].decode()
    assert not [m for m in _imported_modules(source) if m.split(".")[0] == "drumsbench"]
    assert source.count("def verdict_line(") == 1 and source.count("def ready_line(") == 1


def test_no_other_module_computes_the_mac() -> None:
    """The HMAC is computed in one place: a second copy (the state before 2026-12-05: three, with
    two ready words) is what this test refuses."""
    computing = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                       if "hmac.new(" in p.read_text())
    assert computing == ["core/verdict_lines.py"]


def test_lines_signed_by_a_standalone_process_are_accepted_and_nothing_else_is(tmp_path: Path) -> None:
    """The shipped text in a Python that cannot import drumsbench (isolated mode, another folder)
    signs lines the harness accepts; the same lines under another secret, the desktop runner's
    old ready word and an unsigned verdict are refused."""
    runner = tmp_path / "runner.py"
    runner.write_text("import sys\n"
                      "from drumsbench.core.verdict_lines import ready_line, verdict_line\n"
                      "secret = bytes.fromhex(sys.stdin.readline().strip())\n"
                      "print(ready_line(secret))\n"
                      "print(verdict_line(secret, sys.stdin.readline().strip()))\n")
    shipped = tmp_path / "shipped.py"
    shipped.write_bytes(runner_source(runner))
    secret, verdict = new_secret(), json.dumps({"status": "passed", "reason": ""})
    out = subprocess.run([sys.executable, "-I", str(shipped)], input=f"{secret.hex()}\n{verdict}\n",
                         capture_output=True, text=True, timeout=30, cwd=tmp_path, check=True).stdout
    lines = out.splitlines()
    assert saw_ready(lines, secret) and authentic_verdict(lines, secret) == json.loads(verdict)
    other = new_secret()
    assert not saw_ready(lines, other) and authentic_verdict(lines, other) is None
    old_word = [line.replace(verdict_lines.READY_WORD, "DRUMSBENCH_VERIFIER_READY") for line in lines]
    assert not saw_ready(old_word, secret)
    assert authentic_verdict([f"{verdict_lines.VERDICT_WORD} {'0' * 64} {verdict}"], secret) is None


def test_a_runner_without_the_import_line_is_refused(tmp_path: Path) -> None:
    runner = tmp_path / "runner.py"
    runner.write_text("print('no channel')\n")
    with pytest.raises(ValueError, match="expected one line"):
        runner_source(runner)
