"""The coding suite's data checks, with real runs on the host (see docs/tasks.md for the format);
part of ``drumsbench tasks check`` for coding suites (``taskcheck.check_coding``).

For every project under ``SUITE/projects/``: its visible tests (``tests/``) pass.

For every task folder (one holding ``task.toml``):

* ``task.toml`` has the documented fields, the id matches the folder, all files exist;
* the start state (project copy without ``__pycache__``/``*.pyc``, plus ``git apply bug.patch``)
  has the stored ``start_fingerprint`` and no empty directories;
* every patch is ``git diff`` output that applies exactly (no offsets) with ``git apply``;
* the hidden tests FAIL on the start state (assertion failures or errors inside tests, not a
  test module that cannot be imported), PASS on start + ``golden.patch``, FAIL on start + each
  wrong patch, and PASS on the correct project;
* the visible tests pass on the start state and on the golden state (they must not reveal the bug);
* the hidden tests hold 2 to 6 test methods and run in under 0.5 s.

Hidden tests run like at verification: copied into a verify folder outside the work folder,
with the work folder as the current directory and on ``PYTHONPATH``:
``python3 -m unittest discover -s VERIFY -t VERIFY``.

Alone: ``python -m drumsbench.experiments.coding_data SUITE_DIR [--task ID]... [-v]``. Prints one
line per project and per task; exits 1 if any check failed, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drumsbench.core.errors import UsageError
from drumsbench.core.fingerprint import tree_digest
from drumsbench.envs.coding import test_style

ID_RE = re.compile(r"[a-z0-9-]+")
REQUIRED = {
    "id": str,
    "project": str,
    "description": str,
    "bug_patch": str,
    "golden_patch": str,
    "wrong_patches": list,
    "hidden_tests": list,
    "start_fingerprint": str,
}
OPTIONAL = {"verify": dict}
MIN_TESTS, MAX_TESTS = 2, 6
MAX_TEST_SECONDS = 0.5
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")




# ------------------------------------------------------------------------------------ runs


@dataclass
class TestRun:
    """Outcome of one ``unittest`` run."""

    verdict: str  # PASS, FAIL, LOADERROR, NOTESTS, TIMEOUT
    ran: int = 0
    seconds: float = 0.0  # as reported by unittest (test execution only)
    output: str = ""

    def brief(self) -> str:
        return f"{self.verdict}({self.ran})"


_RAN = re.compile(r"^Ran (\d+) tests? in ([0-9.]+)s$", re.MULTILINE)


def run_unittest(args: list[str], cwd: Path, extra_path: Path, timeout: float) -> TestRun:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(extra_path)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONSTARTUP", None)
    cmd = [sys.executable, "-m", "unittest", *args]
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        parts = [p.decode(errors="replace") if isinstance(p, bytes) else p for p in (exc.stdout, exc.stderr) if p]
        return TestRun("TIMEOUT", output="".join(parts))
    output = proc.stdout + proc.stderr
    match = _RAN.search(output)
    ran, seconds = (int(match.group(1)), float(match.group(2))) if match else (0, 0.0)
    if "Failed to import test module" in output or "ImportError: Failed to import" in output:
        verdict = "LOADERROR"
    elif ran == 0:
        verdict = "NOTESTS"
    elif proc.returncode == 0 and re.search(r"^OK\b", output, re.MULTILINE):
        verdict = "PASS"
    else:
        verdict = "FAIL"
    return TestRun(verdict, ran, seconds, output)


_PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b")


def run_pytest(files: list[Path], cwd: Path, extra_path: Path, timeout: float) -> TestRun:
    """pytest on ``files`` (its own config: no ini file or plugin of anyone else's); PASS only when
    every test passed: a skip, an xfail or an unexpected pass is FAIL, as in the judge."""
    env = {**os.environ, "PYTHONPATH": str(extra_path), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    ini = files[0].parent / ".drumsbench-pytest.ini"
    ini.write_text("[pytest]\naddopts =\npython_files = *.py\n")
    cmd = [sys.executable, "-m", "pytest", *map(str, files), "-c", str(ini), "--rootdir", str(files[0].parent),
           "-q", "-rN", "-p", "no:cacheprovider", "--basetemp", str(files[0].parent / ".tmp")]
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        parts = [p.decode(errors="replace") if isinstance(p, bytes) else p for p in (exc.stdout, exc.stderr) if p]
        return TestRun("TIMEOUT", output="".join(parts))
    output = proc.stdout + proc.stderr
    lines = output.strip().splitlines()
    counts = {k.rstrip("s") if k.startswith("error") else k: int(n)
              for n, k in _PYTEST_COUNTS.findall(lines[-1] if lines else "")}
    ran = sum(counts.values())
    if proc.returncode in (2, 3, 4) or counts.get("error"):
        verdict = "LOADERROR" if proc.returncode == 2 else "FAIL"
    elif proc.returncode == 5 or ran == 0:
        verdict = "NOTESTS"
    elif proc.returncode == 0 and counts.get("passed", 0) == ran:
        verdict = "PASS"
    else:
        verdict = "FAIL"
    return TestRun(verdict, ran, 0.0, output)


def run_hidden(work: Path, hidden: list[Path], scratch: Path, timeout: float) -> TestRun:
    """Run the hidden tests against ``work`` from a verify folder outside it (with pytest when they
    are pytest-style: ``envs.coding.test_style``)."""
    verify = Path(tempfile.mkdtemp(prefix="verify-", dir=scratch))
    for test in hidden:
        shutil.copy2(test, verify / test.name)
    trees = {t.name: ast.parse(t.read_bytes(), filename=t.name) for t in hidden}
    if test_style.is_pytest_style(trees):
        files = [verify / t.name for t in hidden if t.name != test_style.CONFTEST]
        return run_pytest(files, cwd=work, extra_path=work, timeout=timeout)
    return run_unittest(
        ["discover", "-s", str(verify), "-t", str(verify), "-p", "test_*.py"],
        cwd=work,
        extra_path=work,
        timeout=timeout,
    )


def run_visible(work: Path, timeout: float) -> TestRun:
    return run_unittest(["discover", "-s", "tests"], cwd=work, extra_path=work, timeout=timeout)


def git_apply(patch: Path, work: Path) -> str | None:
    """Apply ``patch`` in ``work`` exactly; return an error message or None."""
    text = patch.read_text(encoding="utf-8")
    if not text.startswith("diff --git a/"):
        return f"{patch.name} is not git diff output"
    env = dict(os.environ)
    # never let git discover an enclosing repository: paths stay relative to ``work``
    env["GIT_CEILING_DIRECTORIES"] = str(work.parent)
    for args in (["--check"], []):
        proc = subprocess.run(
            ["git", "apply", "--verbose", *args, str(patch)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            return f"{patch.name} does not apply: {proc.stderr.strip().splitlines()[-1:]}"
        hunks = re.findall(r"Hunk #\d+ succeeded at .*", proc.stdout + proc.stderr)
        if hunks:
            return f"{patch.name} applies only with an offset: {' '.join(hunks)}"
    return None


def copy_project(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=IGNORE)


def empty_dirs(root: Path) -> list[str]:
    return [
        os.path.relpath(d, root)
        for d, dirs, files in os.walk(root)
        if not dirs and not files and Path(d) != root
    ]


# ------------------------------------------------------------------------------------ checks


@dataclass
class Report:
    name: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    def problem(self, message: str, run: TestRun | None = None) -> None:
        self.problems.append(message)
        if run is not None and run.output:
            tail = run.output.strip().splitlines()[-25:]
            self.details.append(f"--- {message}\n" + "\n".join("    " + line for line in tail))


def check_project(suite: Path, project: str, scratch: Path) -> Report:
    report = Report(f"project {project}")
    src = suite / "projects" / project
    if not (src / "tests").is_dir():
        report.problem("no tests/ folder")
        return report
    if not any((child / "__init__.py").is_file() for child in src.iterdir() if child.is_dir()):
        report.problem("no package (folder with __init__.py) at the project root")
    if empty_dirs(src):
        report.problem(f"empty directories: {empty_dirs(src)}")
    work = scratch / f"project-{project}"
    copy_project(src, work)
    run = run_visible(work, 60)
    report.notes.append(f"visible {run.brief()}")
    if run.verdict != "PASS":
        report.problem(f"visible tests {run.verdict} on the correct project", run)
    return report


def load_task(task_dir: Path, report: Report) -> dict[str, Any] | None:
    try:
        data = tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        report.problem(f"task.toml unreadable: {exc}")
        return None
    for key, kind in REQUIRED.items():
        if not isinstance(data.get(key), kind):
            report.problem(f"task.toml: {key} missing or not a {kind.__name__}")
    for key in data:
        if key not in REQUIRED and key not in OPTIONAL:
            report.problem(f"task.toml: unknown key {key!r}")
    if report.problems:
        return None
    if data["id"] != task_dir.name or not ID_RE.fullmatch(data["id"]):
        report.problem(f"id {data['id']!r} must match the folder name and [a-z0-9-]+")
    if not data["description"].strip():
        report.problem("empty description")
    if not data["wrong_patches"]:
        report.problem("wrong_patches is empty")
    if not data["hidden_tests"]:
        report.problem("hidden_tests is empty")
    for key in data.get("verify", {}):
        if key != "timeout_s":
            report.problem(f"task.toml: unknown key verify.{key}")
    timeout = data.get("verify", {}).get("timeout_s", 60)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        report.problem("verify.timeout_s must be a positive number")
    files = [data["bug_patch"], data["golden_patch"], *data["wrong_patches"], *data["hidden_tests"]]
    for rel in files:
        if not isinstance(rel, str) or not (task_dir / rel).is_file():
            report.problem(f"missing file {rel!r}")
    for rel in data["hidden_tests"]:
        if isinstance(rel, str) and not re.fullmatch(r"hidden/(test_[A-Za-z0-9_]+|conftest)\.py", rel):
            report.problem(f"hidden test {rel!r} is not hidden/test_*.py (or pytest's hidden/conftest.py)")
    listed = {Path(rel).name for rel in data["hidden_tests"] if isinstance(rel, str)}
    for path in sorted((task_dir / "hidden").glob("test_*.py")):
        if path.name not in listed:
            report.problem(f"hidden/{path.name} is not listed in hidden_tests")
    if not (task_dir.parent / "projects" / data["project"]).is_dir():
        report.problem(f"unknown project {data['project']!r}")
    return None if report.problems else data


def check_task(task_dir: Path, scratch: Path) -> Report:
    report = Report(task_dir.name)
    data = load_task(task_dir, report)
    if data is None:
        return report
    project = task_dir.parent / "projects" / data["project"]
    hidden = [task_dir / rel for rel in data["hidden_tests"]]
    timeout = float(data.get("verify", {}).get("timeout_s", 60))

    def state(name: str, *patches: str) -> Path | None:
        work = scratch / task_dir.name / name / "work"
        copy_project(project, work)
        for rel in patches:
            error = git_apply(task_dir / rel, work)
            if error:
                report.problem(f"{name}: {error}")
                return None
        return work

    # correct project: hidden tests describe its behaviour
    correct = state("correct")
    assert correct is not None
    run = run_hidden(correct, hidden, scratch, timeout)
    if run.verdict != "PASS":
        report.problem(f"hidden tests {run.verdict} on the correct project", run)

    # start state
    start = state("start", data["bug_patch"])
    if start is None:
        return report
    digest = tree_digest(str(start))
    if digest != data["start_fingerprint"]:
        report.problem(f"start_fingerprint differs: stored {data['start_fingerprint']}, got {digest}")
    if empty_dirs(start):
        report.problem(f"start state has empty directories: {empty_dirs(start)}")
    if digest == tree_digest(str(correct)):
        report.problem("bug.patch does not change the project")
    start_run = run_hidden(start, hidden, scratch, timeout)
    if start_run.verdict != "FAIL":
        report.problem(f"hidden tests {start_run.verdict} on the start state (want FAIL)", start_run)
    if start_run.verdict == "FAIL" and not MIN_TESTS <= start_run.ran <= MAX_TESTS:
        report.problem(f"hidden tests hold {start_run.ran} tests (want {MIN_TESTS}-{MAX_TESTS})")
    visible = run_visible(start, 60)
    if visible.verdict != "PASS":
        report.problem(f"visible tests {visible.verdict} on the start state", visible)

    # golden
    golden_digest = None
    golden = state("golden", data["bug_patch"], data["golden_patch"])
    if golden is not None:
        golden_digest = tree_digest(str(golden))
        golden_run = run_hidden(golden, hidden, scratch, timeout)
        if golden_run.verdict != "PASS":
            report.problem(f"hidden tests {golden_run.verdict} after golden.patch", golden_run)
        if golden_run.seconds > MAX_TEST_SECONDS:
            report.problem(f"hidden tests take {golden_run.seconds:.3f}s (> {MAX_TEST_SECONDS}s)")
        golden_visible = run_visible(golden, 60)
        if golden_visible.verdict != "PASS":
            report.problem(f"visible tests {golden_visible.verdict} after golden.patch", golden_visible)

    # wrong patches
    wrong_runs = []
    for i, rel in enumerate(data["wrong_patches"]):
        wrong = state(f"wrong{i}", data["bug_patch"], rel)
        if wrong is None:
            continue
        wrong_digest = tree_digest(str(wrong))
        if wrong_digest in (digest, golden_digest):
            report.problem(f"{rel} leaves the start state unchanged or equals the golden fix")
        run = run_hidden(wrong, hidden, scratch, timeout)
        wrong_runs.append(run.brief())
        if run.verdict != "FAIL":
            report.problem(f"hidden tests {run.verdict} after {rel} (want FAIL)", run)

    report.notes.append(
        f"start {start_run.brief()} | golden {'PASS' if golden_digest else '-'}"
        f" | wrong {' '.join(wrong_runs) or '-'} | visible {visible.verdict}"
    )
    return report


def check_data(suite: Path, task_ids: Sequence[str] = ()) -> tuple[list[Report], list[str], int]:
    """Every project's and task's data checks: (reports, folders without task.toml, projects checked).

    ``UsageError`` when the suite has no projects/, git is missing or a task id is unknown."""
    suite = suite.resolve()
    if not (suite / "projects").is_dir():
        raise UsageError(f"{suite} has no projects/ folder; a coding suite holds projects/ and task folders")
    if shutil.which("git") is None:
        raise UsageError("git is needed to apply the patches; install git")
    task_dirs = sorted(p for p in suite.iterdir() if (p / "task.toml").is_file())
    strays = sorted(
        p.name
        for p in suite.iterdir()
        if p.is_dir() and p.name not in ("projects", "__pycache__") and not (p / "task.toml").exists()
    )
    if task_ids:
        unknown = set(task_ids) - {p.name for p in task_dirs}
        if unknown:
            raise UsageError(f"--task: unknown task(s): {', '.join(sorted(unknown))}")
        task_dirs = [p for p in task_dirs if p.name in task_ids]
        strays = []
    reports: list[Report] = []
    with tempfile.TemporaryDirectory(prefix="check-tasks-") as tmp:
        scratch = Path(tmp)
        projects = sorted(p.name for p in (suite / "projects").iterdir() if p.is_dir())
        for project in projects:
            reports.append(check_project(suite, project, scratch))
        for task_dir in task_dirs:
            reports.append(check_task(task_dir, scratch))
    return reports, strays, len(projects)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("suite", type=Path, help="suite folder (holds projects/ and task folders)")
    parser.add_argument("--task", action="append", default=[], help="check only this task id")
    parser.add_argument("-v", "--verbose", action="store_true", help="show test output on problems")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        reports, strays, projects = check_data(args.suite, args.task)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    width = max([len(r.name) for r in reports] + [20])
    for r in reports:
        print_report(r, width, args.verbose)
    problems = sum(len(r.problems) for r in reports)
    if strays:
        problems += 1
        print(f"FAIL  folders without task.toml: {', '.join(strays)}")
    tasks = sum(not r.name.startswith("project ") for r in reports)
    summary = f"{tasks} tasks, {projects} projects checked in {time.monotonic() - started:.1f}s: "
    print(summary + ("all checks passed" if not problems else f"{problems} problem(s)"))
    return 1 if problems else 0


def print_report(report: Report, width: int, verbose: bool) -> None:
    if not report.problems:
        print(f"ok    {report.name:<{width}}  {'; '.join(report.notes)}")
        return
    print(f"FAIL  {report.name:<{width}}  {'; '.join(report.problems)}")
    if verbose:
        for detail in report.details:
            print(detail)


if __name__ == "__main__":
    sys.exit(main())
