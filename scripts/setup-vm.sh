#!/usr/bin/env bash
# Install what the `vm` substrate needs (idempotent):
#   qemu-system-x86 (the emulator), qemu-utils (qemu-img), busybox-static (the initramfs's shell),
#   e2fsprogs (mkfs.ext4 -d), debootstrap (the shared Debian rootfs), gcc + libc6-dev (the guest
#   agent is C, compiled static when the image is built).
# The guest kernel is not installed on the host: the image builder fetches Debian's
# linux-image-<abi>-amd64 package with `apt-get download` into its cache and extracts it there.
# With a Python environment given (PYTHON=.venv/bin/python), also build the cached guest image and
# booted snapshot now, so the first test does not pay for it.
set -euo pipefail
pkgs=(qemu-system-x86 qemu-utils busybox-static e2fsprogs debootstrap gcc libc6-dev)
need=()
for pkg in "${pkgs[@]}"; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup-vm: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "setup-vm: $(qemu-system-x86_64 --version | head -1)"
if [ -n "${PYTHON:-}" ]; then
  "$PYTHON" -m drumsbench.substrates.vm.image
fi
echo "setup-vm: ready"
