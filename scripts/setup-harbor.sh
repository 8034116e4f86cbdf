#!/usr/bin/env bash
# Harbor (the field's task format; `harbor` on PyPI, pinned) in a virtual environment of its own,
# .venv-harbor beside the project's .venv: Harbor needs Python >= 3.12 and brings ~120 packages
# (litellm, ...) DrumsBench itself never imports. DrumsBench calls this interpreter as a separate
# process to parse and check task folders with Harbor's own models (docs/harbor.md). Idempotent.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.venv-harbor"
PIN="harbor==0.26.0"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import harbor.models.task.task' >/dev/null 2>&1 \
    && [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("harbor"))')" = "${PIN#harbor==}" ]; then
  echo "setup-harbor: $PIN ready in $VENV"
  exit 0
fi
PY=""
for cand in python3.13 python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /root/.pyenv/versions/3.13*/bin/python3.13; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    PY="$(command -v "$cand")"; break
  fi
done
if [ -z "$PY" ]; then
  # not fatal for the rest of the set-up: the Harbor tests then say what is missing (and fail
  # under DRUMSBENCH_REQUIRE_ALL=1, as CI runs them)
  echo "setup-harbor: no Python >= 3.12 here (Harbor needs it): Harbor task folders cannot be read;" \
       "install python3.12 and run scripts/setup-harbor.sh again" >&2
  exit 0
fi
echo "setup-harbor: creating $VENV with $PY, installing $PIN (about a minute)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "$PIN"
"$VENV/bin/python" -c 'import harbor.models.task.task'
echo "setup-harbor: $PIN ready in $VENV"
