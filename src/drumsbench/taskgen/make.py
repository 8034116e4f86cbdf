"""``drumsbench tasks make``: task instances from real projects' own test suites.

For each pinned project (``projects``): its sdist's files; a baseline task folder of the unchanged
project (``task_folder``) whose image the substrate builds (the ``harbor`` kind's recipe: the
project on ``PYTHONPATH``, its tests' requirements from the registry); one sandbox of it, where
the project's suite runs twice (``BASELINE_RUNS``): a test that passes in one run and not the other
is flaky and left out, and the tests that pass in both are the ones a task may ask for. Then each
mutation (``mutate.candidates`` of every source file, in the order of their stable keys) is written
into the sandbox, the suite run once, the file put back:

- FAIL_TO_PASS: tests that passed on the original and do not pass here; PASS_TO_PASS: those that
  still pass;
- kept when FAIL_TO_PASS is not empty and not every test (a change that breaks the whole suite
  says nothing of where the fault is), else dropped with the reason; a suite past its time limit
  is dropped too.

Kept mutations become Harbor task folders in ``out`` (``task_folder.write``), at most ``max_tasks``
per project, and every try is counted in the yield table (``Yield``), also written to
``out/yield.json``. The substrate runs the projects' code (never the host): docker or podman.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from drumsbench.core.errors import SubstrateError, UsageError
from drumsbench.envs.harbor.task import load_suite
from drumsbench.substrates import registry
from drumsbench.substrates.base import RecipeImages, Sandbox, Substrate
from drumsbench.taskgen import mutate, task_folder
from drumsbench.taskgen.projects import Project

BASELINE_RUNS = 2
SUITE_TIMEOUT_S = 120.0
OUTPUT_LIMIT = 16 << 20
_PASSED = re.compile(r"^PASSED (.+)$", re.MULTILINE)


@dataclass
class Yield:
    """One project's tries: how many mutations it had, how many were tried, kept, and why the
    others were dropped; the flaky tests left out and the baseline's passing count."""

    pin: str
    candidates: int = 0
    tried: int = 0
    kept: int = 0
    baseline_passed: int = 0
    flaky: list[str] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    by_operator: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        return {"pin": self.pin, "candidates": self.candidates, "tried": self.tried, "kept": self.kept,
                "baseline_passed": self.baseline_passed, "flaky": sorted(self.flaky),
                "dropped": dict(sorted(self.dropped.items())),
                "kept_by_operator": dict(sorted(self.by_operator.items()))}


def passed_ids(report: str) -> set[str]:
    """The test ids a ``pytest -rA`` report says PASSED."""
    return {m.rstrip() for m in _PASSED.findall(report)}


def _run_suite(box: Sandbox, project: Project) -> tuple[set[str], bool]:
    path = "/app" + (f"/{project.pythonpath}" if project.pythonpath else "")
    res = box.exec([*task_folder.PYTEST, *project.tests], cwd="/app", timeout=SUITE_TIMEOUT_S,
                   env={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": path}, output_limit=OUTPUT_LIMIT)
    return passed_ids(res.stdout.decode(errors="replace")), res.timed_out


def _is_test(rel: str, project: Project) -> bool:
    return any(rel == t or rel.startswith(t.rstrip("/") + "/") for t in project.tests)


def _sources(project: Project, files: dict[str, bytes]) -> list[str]:
    return sorted(rel for rel in files if rel.endswith(".py") and not _is_test(rel, project)
                  and any(rel == s or rel.startswith(s.rstrip("/") + "/") for s in project.source))


def _task(project: Project, files: dict[str, bytes], m: mutate.Mutation | None,
          f2p: tuple[str, ...] = (), p2p: tuple[str, ...] = ()) -> task_folder.MadeTask:
    rel = m.rel if m else _sources(project, files)[0]
    changed = dict(files)
    if m is not None:
        changed[rel] = m.apply(files[rel])
    stem = f"{project.name}-{project.version.replace('.', '-')}"
    name = f"{stem}-{m.operator.replace('_', '-')}-{m.key}" if m else "baseline"
    return task_folder.MadeTask(name, project.pin, m.operator if m else "none", rel, files[rel], changed,
                                project.tests, project.pythonpath, project.requires, f2p, p2p)


def make_project(project: Project, out: Path, substrate: Substrate, max_tasks: int, max_tries: int | None,
                 progress: Callable[[str], None]) -> Yield:
    """The tasks of one project (module contract)."""
    if not isinstance(substrate, RecipeImages):
        raise UsageError(f"--substrate: {substrate.name} cannot build task images (choose "
                         f"{', '.join(registry.having(RecipeImages))})")
    files = project.files()
    missing = [p for p in (*project.source, *project.tests)
               if not any(rel == p or rel.startswith(p.rstrip("/") + "/") for rel in files)]
    if missing:
        raise UsageError(f"{project.pin}: the manifest names {', '.join(missing)}, absent from its sdist")
    y = Yield(project.pin)
    cands = sorted((m for rel in _sources(project, files) for m in mutate.candidates(rel, files[rel])),
                   key=lambda m: m.key)
    y.candidates = len(cands)
    with tempfile.TemporaryDirectory(prefix=".baseline-", dir=out) as tmp:
        base = Path(tmp) / "baseline"
        task_folder.write(base, _task(project, files, None))
        recipe = load_suite(str(base))[0].start_recipe
        progress(f"{project.pin}: building its image on {substrate.name}")
        box = substrate.create_from_image(substrate.build_recipe(recipe))
    try:
        runs = [_run_suite(box, project) for _ in range(BASELINE_RUNS)]
        if any(timed_out for _, timed_out in runs):
            raise UsageError(f"{project.pin}: its test suite ran past {SUITE_TIMEOUT_S:g} s unchanged; "
                             "not a task source")
        stable = set.intersection(*(p for p, _ in runs))
        y.flaky = sorted(set.union(*(p for p, _ in runs)) - stable)
        y.baseline_passed = len(stable)
        if not stable:
            raise UsageError(f"{project.pin}: no test of its suite passes unchanged here; check the manifest's "
                             "tests and requires")
        progress(f"{project.pin}: {len(stable)} tests pass unchanged ({len(y.flaky)} flaky, left out); "
                 f"{len(cands)} mutations to try")
        for m in cands:
            if y.kept >= max_tasks or (max_tries is not None and y.tried >= max_tries):
                break
            y.tried += 1
            target = f"/app/{m.rel}"
            box.write_file(target, m.apply(files[m.rel]))
            try:
                passed, timed_out = _run_suite(box, project)
            finally:
                box.write_file(target, files[m.rel])
            f2p, p2p = tuple(sorted(stable - passed)), tuple(sorted(stable & passed))
            reason = ("the suite ran past its time limit" if timed_out else "no test fails" if not f2p
                      else "every test fails" if not p2p else None)
            if reason:
                y.dropped[reason] += 1
                continue
            made = _task(project, files, m, f2p, p2p)
            task_folder.write(out / made.task_id, made)
            y.kept += 1
            y.by_operator[m.operator] += 1
            progress(f"{project.pin}: kept {made.task_id} ({len(f2p)} fail, {len(p2p)} still pass) "
                     f"[{y.kept}/{max_tasks}, {y.tried} tried]")
    except SubstrateError as e:
        raise UsageError(f"{project.pin}: the sandbox failed while its suite ran: {e}") from None
    finally:
        box.destroy()
    return y


def make(projects: list[Project], out: Path, substrate: Substrate, max_tasks: int, max_tries: int | None,
         progress: Callable[[str], None]) -> list[Yield]:
    """Every project's tasks into ``out`` and the yield table into ``out/yield.json``."""
    out.mkdir(parents=True, exist_ok=True)
    yields = [make_project(p, out, substrate, max_tasks, max_tries, progress) for p in projects]
    (out / "yield.json").write_text(json.dumps([y.as_dict() for y in yields], indent=1) + "\n")
    return yields
