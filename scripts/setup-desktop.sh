#!/usr/bin/env bash
# Install what the desktop environment needs (idempotent): a virtual X server, a window manager,
# an input tool, LibreOffice Writer and Calc, its Python bridge (UNO) and the fonts the built-in
# task documents use. util-linux (unshare, nsenter) is part of every Debian system.
set -euo pipefail
pkgs=(xvfb openbox xdotool libreoffice-writer libreoffice-calc python3-uno fonts-liberation fonts-dejavu-core
      util-linux)
need=()
for pkg in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup-desktop: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# LibreOffice's finalized settings (macros, extensions, Expert Configuration, Java): a layer in
# /etc/libreoffice/registry no profile can override. Without it the desktop refuses to start.
# (standard library only: run alone, without setup.sh's PYTHON, the system's python3 does it)
if [ -n "${PYTHON:-}" ]; then
  "$PYTHON" -m drumsbench.office_lockdown install / >/dev/null
else
  PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/src" python3 -m drumsbench.office_lockdown install / >/dev/null
fi

# The desktop image of the container substrates (the Debian rootfs with the packages above, added
# from the host apt's cache): built once, cached (drumsbench.images, flavor "desktop").
if [ -n "${PYTHON:-}" ] && [ "${DRUMSBENCH_SKIP_IMAGES:-0}" != 1 ]; then
  "$PYTHON" -m drumsbench.substrates.containers.docker ensure-desktop-image
  "$PYTHON" -m drumsbench.substrates.containers.podman ensure-desktop-image
fi
echo "setup-desktop: desktop environment ready"
