"""Verifier runner, copied into a sandbox's verify folder and run there as ``python3 runner.py DIR``.

It runs the hidden unittest files in ``DIR/tests`` with the current directory (the work folder)
first on ``sys.path``, and prints exactly one verdict line on stdout:

    DRUMSBENCH_VERDICT {"tests": N, "failures": F, "errors": E, "skipped": S, "passed": true|false}

It prints ``DRUMSBENCH_VERIFIER_READY`` first: a run without READY never started (unavailable),
a run with READY and no verdict crashed (unavailable). Failing or erroring tests — including an
import error in the policy's code — are a valid "not done".
"""

import io
import json
import os
import sys
import unittest


def main() -> None:
    print("DRUMSBENCH_VERIFIER_READY", flush=True)
    verify_dir = os.path.abspath(sys.argv[1])
    sys.path.insert(0, os.getcwd())
    suite = unittest.TestLoader().discover(os.path.join(verify_dir, "tests"), pattern="test_*.py",
                                           top_level_dir=os.path.join(verify_dir, "tests"))
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
    verdict = {
        "tests": result.testsRun,
        "failures": len(result.failures),
        "errors": len(result.errors),
        "skipped": len(result.skipped),
        "passed": result.testsRun > 0 and result.wasSuccessful(),
    }
    sys.stdout.write("DRUMSBENCH_VERDICT " + json.dumps(verdict) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
