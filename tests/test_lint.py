"""The code stays clean: ruff on everything, mypy on the package, ``mypy --strict`` on the core
packages (substrates/base, envs/base, rollout, ledger, measure)."""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT

STRICT = ["src/drumsbench/substrates/base.py", "src/drumsbench/envs/base.py", "src/drumsbench/rollout/attempt.py",
          "src/drumsbench/ledger.py", "src/drumsbench/measure", "src/drumsbench/core"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_ruff():
    proc = _run("ruff", "check", "--no-cache", "src", "tests", "benchmarks", "examples")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_mypy(tmp_path):
    """Both runs at once (each is one process; the machine has two cores and nothing else runs)."""
    args = {"all": ["src"], "strict": ["--strict", *STRICT]}
    procs = {name: subprocess.Popen([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / name), *a],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
             for name, a in args.items()}
    outs = {name: proc.communicate(timeout=600)[0] for name, proc in procs.items()}
    failed = {name: outs[name][-4000:] for name, proc in procs.items() if proc.returncode != 0}
    assert not failed, failed
