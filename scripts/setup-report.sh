#!/usr/bin/env bash
# System components of the HTML report's tests (idempotent): Debian's chromium, which opens the
# report headless, screenshots it and logs its network requests. The report itself needs nothing.
set -euo pipefail
need=()
for pkg in chromium; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup-report: installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
echo "setup-report: chromium $(chromium --version 2>/dev/null | awk '{print $2}') ready"
