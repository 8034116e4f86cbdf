"""The trusted judge on pytest-style hidden tests beside the same tests written for unittest, and
beside a bare pytest of them, side by side in one run.

    .venv/bin/python benchmarks/judge_pytest.py [--rounds 30] [--substrate process]

One coding task (the test suite's mini ``add-sign``: the golden fix applied by the oracle), its
hidden tests written twice — unittest classes and pytest functions/parametrised cases/a class, the
same 6 checks — in two suites made in a scratch folder. Per round, in rotating order: an oracle
attempt on each suite (one slot each; ``run_verifier``'s own time is the verify figure: the boundary
server's start in the sandbox, the judge's fork, the tests, the verdict), and a bare pytest of the
pytest file against the fixed project on the host: ``pytest.main`` in a fork of this interpreter,
which has imported pytest already, with no plugin autoloaded (as in the judge): what the tests
themselves cost, with no judge, no boundary, no sandbox. Printed: p50 with its 95% interval
(order statistics) per arm and each judge arm's p50 over the bare one's. Every attempt must succeed
and be decided by the judge. The load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from drumsbench.core.outcome import Outcome
from drumsbench.envs.base import VerifierResult
from drumsbench.envs.coding.env import CodingEnv
from drumsbench.envs.coding.task import CodingTask, load_suite
from drumsbench.measure.stats import quantile
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry

MINI = Path(__file__).resolve().parents[1] / "tests" / "data" / "mini"
UNITTEST = '''import unittest

from calc.ops import add


class TestAdd(unittest.TestCase):
    def test_cases(self):
        for a, b, total in [(2, 3, 5), (-2, 3, 1), (0, 0, 0)]:
            self.assertEqual(add(a, b), total)

    def test_pair(self):
        self.assertEqual(add(4, 6), 10)

    def test_commutes(self):
        self.assertEqual(add(3, 7), add(7, 3))

    def test_twice(self):
        self.assertEqual(add(add(1, 1), 1), 3)
'''
PYTEST = '''import pytest

from calc.ops import add


@pytest.mark.parametrize("a,b,total", [(2, 3, 5), (-2, 3, 1), (0, 0, 0)])
def test_cases(a, b, total):
    assert add(a, b) == total


def test_pair():
    assert add(4, 6) == 10


class TestOrder:
    def test_commutes(self):
        assert add(3, 7) == add(7, 3)

    def test_twice(self):
        assert add(add(1, 1), 1) == 3
'''


class TimedEnv(CodingEnv):
    """A coding environment that keeps how long each ``run_verifier`` took."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    def run_verifier(self, task: CodingTask, timeout: float) -> VerifierResult:
        t0 = time.perf_counter()
        try:
            return super().run_verifier(task, timeout)
        finally:
            self.seconds.append(time.perf_counter() - t0)


def _suite(root: Path, name: str, hidden: str) -> Path:
    suite = root / name
    shutil.copytree(MINI, suite)
    (suite / "add-sign" / "hidden" / "test_add.py").write_text(hidden)
    return suite


def _bare_pytest(project: Path, tests: Path) -> float:
    """One ``pytest.main`` of ``tests`` against ``project`` in a fork of this interpreter (seconds)."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            sys.path.insert(0, str(project))
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # as the judge: no entry-point plugin
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            code = int(pytest.main([str(tests), "-q", "-p", "no:cacheprovider", "--capture=sys",
                                    "-c", str(tests.parent / "pytest.ini"), "--rootdir", str(tests.parent)]))
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit("the bare pytest did not pass on the fixed project")
    return seconds


def _row(name: str, xs: list[float], base: float | None) -> str:
    p50 = quantile([x * 1000 for x in xs], 0.5)
    assert p50.value is not None
    ratio = f"  {p50.value / base:5.2f}x bare" if base else ""
    return f"  {name:<22} p50 {p50.fmt('.1f', 'ms')} (n={p50.n}){ratio}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--substrate", default="process")
    args = ap.parse_args()
    if args.rounds < 3:
        raise SystemExit("--rounds: at least 3")
    scratch = Path(tempfile.mkdtemp(prefix="judge-pytest-", dir=os.environ.get("DRUMSBENCH_SCRATCH")))
    cls = registry.get(args.substrate)
    if (why := cls.missing()) is not None:
        raise SystemExit(f"--substrate {args.substrate}: {why}")
    substrate = cls(f"jp{os.getpid()}", scratch / "state")
    try:
        slots = {style: Slot(substrate, TimedEnv(), worker=i) for i, style in enumerate(("unittest", "pytest"))}
        tasks = {style: load_suite(str(_suite(scratch, style, src)))[0]
                 for style, src in (("unittest", UNITTEST), ("pytest", PYTEST))}
        fixed = scratch / "fixed"
        shutil.copytree(MINI / "projects" / "calc", fixed / "project")
        (fixed / "tests").mkdir()
        (fixed / "tests" / "test_add.py").write_text(PYTEST)
        (fixed / "pytest.ini").write_text("[pytest]\naddopts =\n")
        cfg = RolloutConfig(step_timeout_s=10, episode_timeout_s=60, verify_timeout_s=30)
        bare: list[float] = []
        arms = ["unittest", "pytest", "bare"]
        for r in range(args.rounds):
            for arm in arms[r % 3:] + arms[:r % 3]:
                if arm == "bare":
                    bare.append(_bare_pytest(fixed / "project", fixed / "tests"))
                    continue
                rec = run_attempt(slots[arm], tasks[arm], make_policy("oracle"), cfg, CanaryRegistry(),
                                  run_id=substrate.run_id, seq=r, seed=r)
                if rec.outcome is not Outcome.SUCCESS or rec.extra.get("trust") != "judge":
                    raise SystemExit(f"{arm}: {rec.outcome.value} by {rec.extra.get('trust')}: {rec.detail}")
            print(f"\rround {r + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        base = quantile([x * 1000 for x in bare], 0.5).value
        print(f"verify phase, oracle on add-sign (6 checks), {args.substrate}, load {os.getloadavg()[0]:.2f}:")
        print(_row("judge, unittest style", slots["unittest"].env.seconds, base))  # type: ignore[attr-defined]
        print(_row("judge, pytest style", slots["pytest"].env.seconds, base))  # type: ignore[attr-defined]
        print(_row("bare pytest (fork)", bare, None))
        for slot in slots.values():
            slot.destroy()
    finally:
        substrate.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
