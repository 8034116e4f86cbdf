#!/usr/bin/env bash
# The pinned source distributions `drumsbench tasks make` builds tasks from (taskgen/projects.toml):
# downloaded once from the package registry into the cache, each checked against its pinned SHA-256.
# Nothing of those projects is in the repository. Idempotent (a cached sdist is not fetched again).
set -euo pipefail
"${PYTHON:-python3}" -m drumsbench.taskgen.projects
