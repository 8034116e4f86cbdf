#!/usr/bin/env bash
# Install the system components DrumsBench's substrates and tests need (idempotent).
set -euo pipefail
need=()
for pkg in git procps; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
echo "setup: system ready"
