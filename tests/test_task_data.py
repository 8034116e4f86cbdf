"""The built-in suite's data is right: start states fail the hidden tests, golden patches pass,
wrong patches fail, visible tests never reveal a bug (experiments/coding_data.py, real runs)."""

import subprocess
import sys

from helpers import ROOT


def test_check_tasks_passes():
    proc = subprocess.run([sys.executable, "-m", "drumsbench.experiments.coding_data",
                           str(ROOT / "src" / "drumsbench" / "tasks" / "coding")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "all checks passed" in proc.stdout
