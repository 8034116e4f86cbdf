"""NAIVE — for positive controls only; never a verifier of the benchmark.

The hidden tests run the way a naive harness runs them: in **one process with the code under
test**, ``unittest``'s stock loader and ``TestResult`` (made, as the real runner makes its own,
before the first test file is imported), no secret, no nonce, no audit hook, no check of the test
framework. ``python3 naive_runner.py TESTS_DIR FILE...`` in the work folder; it prints one
``DRUMSBENCH_VERDICT {json}`` line and exits 0 when ``wasSuccessful()`` (a skip is no failure),
else 1. Imports follow ``python -m unittest``: a module that raises ``SkipTest`` is a skipped
module (as ``discover`` has it), an ``Exception`` is an error, anything else (``SystemExit``)
ends the run as it would end ``python -m unittest NAME``.

Staged and read by ``drumsbench.testing.naive_verifier`` (see there for how its output is trusted).
"""

import importlib
import json
import os
import sys
import unittest


def main(tests_dir, names):
    sys.path[:0] = [os.getcwd(), tests_dir]
    loader, result = unittest.TestLoader(), unittest.TestResult()
    suite = unittest.TestSuite()
    for name in names:
        module = name[:-3] if name.endswith(".py") else name
        try:
            suite.addTests(loader.loadTestsFromModule(importlib.import_module(module)))
        except unittest.SkipTest as e:
            result.skipped.append((module, str(e)))
        except Exception as e:
            result.errors.append((module, f"{type(e).__name__}: {e}"))
    suite.run(result)
    passed = result.wasSuccessful()
    verdict = {"status": "passed" if passed else "failed", "run": result.testsRun,
               "failures": len(result.failures), "errors": len(result.errors), "skipped": len(result.skipped),
               "first": str((result.failures + result.errors or [("", "")])[0][1])[-300:]}
    print("DRUMSBENCH_VERDICT " + json.dumps(verdict), flush=True)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
