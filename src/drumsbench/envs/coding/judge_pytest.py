"""The trusted judge's pytest: runs pytest-style hidden tests (``test_style``) with pytest itself.

Called by ``judge.run_tests`` in the judge's own process (on the host, forked per verification;
never in a sandbox). The hidden files are written to a folder of this judge's own
(``workspace``: ``~/.cache/drumsbench/judge/<pid>``, mode 0700, removed when the verification ends;
one a killed judge left is removed by the next judge that starts) and pytest runs exactly those
files (a ``conftest.py`` among them is pytest's as usual), with:

- an ini file of its own in that folder (no ``pytest.ini``/``pyproject.toml`` of anyone else is
  found), no plugin loaded from entry points (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), no cache, its
  ``tmp_path`` folders under the workspace, output captured in memory and its terminal output
  discarded;
- the task's modules imported as ``RemoteModule``s (``judge.TaskModules``, already on
  ``sys.meta_path``): nothing of the work tree is on this machine's disk for pytest to find.

``Recorder`` (a pytest plugin object) records per test id (parameters stripped: every case of a
parametrised test must pass) ``pass``/``fail``/``error``/``skip``/``xfail``/``xpass`` — only a
``call`` phase that passed is a pass; a skip, an xfail or an unexpected pass never is — and the
first problem's last line. A file that does not collect is a ``collect_errors`` entry.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drumsbench.core.host_state import alive

if TYPE_CHECKING:
    from drumsbench.envs.coding.judge import Link

WORKSPACE_ROOT = "~/.cache/drumsbench/judge"
INI = "[pytest]\naddopts =\npython_files = *.py\n"


@contextlib.contextmanager
def workspace() -> Any:
    """This process's own folder (removed at the end), after removing those of judges that died."""
    root = Path(os.path.expanduser(WORKSPACE_ROOT))
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    for old in root.iterdir():
        if old.name.isdigit() and not alive(int(old.name)):
            shutil.rmtree(old, ignore_errors=True)
    mine = root / str(os.getpid())
    shutil.rmtree(mine, ignore_errors=True)
    mine.mkdir(mode=0o700)
    try:
        yield mine
    finally:
        shutil.rmtree(mine, ignore_errors=True)


class Recorder:
    """Statuses per test id (``file.py::Class::test``, parameters stripped), written only here."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.statuses: dict[str, list[str]] = {}
        self.problems: dict[str, str] = {}
        self.collect_errors: list[tuple[str, str]] = []

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.link.where = nodeid

    def pytest_runtest_logreport(self, report: Any) -> None:
        xfail = hasattr(report, "wasxfail")
        if report.when == "call":
            if xfail:
                status = "xfail" if report.skipped else "xpass"
            else:
                status = "pass" if report.passed else "skip" if report.skipped else "fail"
        elif report.failed:
            status = "error"  # its set-up or tear-down
        elif report.skipped:
            status = "xfail" if xfail else "skip"  # (skipped at set-up: no call phase follows)
        else:
            return
        tid = report.nodeid.split("[", 1)[0]
        self.statuses.setdefault(tid, []).append(status)
        if status in ("fail", "error") and tid not in self.problems:
            self.problems[tid] = _problem(report) or status

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.collect_errors.append((report.nodeid or "(collection)", _problem(report)))


def _problem(report: Any) -> str:
    """A report's failure in one line: pytest's crash message (``AssertionError: assert -1 == 5``)
    where it has one, else the last line of its text; no path of this judge's folder."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = str(getattr(crash, "message", "") or "")
    lines = [ln for ln in (text or str(report.longreprtext)).splitlines() if ln.strip()]
    line = (lines[0] if text else lines[-1]) if lines else ""
    root = os.path.expanduser(WORKSPACE_ROOT)
    return re.sub(re.escape(root) + r"/\d+/tests/", "", line)[:200]


def run_pytest(link: Link, sources: dict[str, str]) -> Recorder:
    """Run the hidden files ``sources`` ({file name: text}) with pytest; what it recorded."""
    import pytest

    recorder = Recorder(link)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    with workspace() as folder:
        tests = folder / "tests"
        tests.mkdir()
        for name, text in sources.items():
            (tests / name).write_text(text)
        (folder / "pytest.ini").write_text(INI)
        files = [str(tests / name) for name in sorted(sources) if name != "conftest.py"]
        args = [*files, "-c", str(folder / "pytest.ini"), "--rootdir", str(tests), "-q", "--no-header",
                "-p", "no:cacheprovider", "-p", "no:faulthandler", "--capture=sys",
                "--basetemp", str(folder / "tmp"), "-W", "ignore::pytest.PytestAssertRewriteWarning"]
        saved = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                pytest.main(args, plugins=[recorder])
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(devnull)
    return recorder
