#!/usr/bin/env bash
# DrumsBench set-up: the one script that installs and starts what the substrates need.
#
# Idempotent and quiet: it prints one line per thing it does and nothing for what is already in
# place, so re-running it is cheap. Runs as root on Debian 12 (bookworm) and 13 (trixie).
#
#   1. Debian packages (one `apt-get update`, only when something is missing).
#   2. The project's virtual environment .venv (editable install with the test extras).
#   3. dockerd in the background when `docker info` does not answer
#      (`--bridge=none --iptables=false`: sandboxes never get a network).
#   4. podman's project-private configuration (runc runtime, ulimits, private storage).
#   5. The container images: the Debian rootfs (debootstrap, cached) imported into docker and
#      podman, and the sandbox image derived from it.
#   6. Every scripts/setup-*.sh (CRIU, the desktop, Harbor, the report's browser, the VM, ...).
#
# Environment: DRUMSBENCH_SKIP_IMAGES=1 skips step 5; DRUMSBENCH_DOCKERD_LOG sets dockerd's log.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
DOCKERD_LOG=${DRUMSBENCH_DOCKERD_LOG:-/var/log/drumsbench-dockerd.log}
DOCKERD_WAIT_S=60

say() { echo "setup: $*"; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it installs Debian packages and starts dockerd)"
command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian 12 and 13"

# -- 1. Debian packages ---------------------------------------------------------------------------
PKGS=(
  docker.io      # dockerd + containerd (the docker substrate talks to it through the Python SDK)
  podman         # the podman substrate (CLI)
  runc           # OCI runtime for both (crun fails on hybrid cgroup layouts)
  catatonit      # podman's init, used when a podman container is run with --init
  tini           # docker-init
  conmon         # podman's container monitor
  uidmap         # newuidmap/newgidmap
  bubblewrap     # the bwrap substrate
  debootstrap    # builds the Debian rootfs the container images are made from
  procps         # ps/pkill on the host
  iproute2       # ip, for network checks
  tar
  ca-certificates
)
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  PKGS+=(python3-venv)
fi
missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Keep package scripts from starting services (we start dockerd ourselves, with our flags).
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  apt_log=$(mktemp /tmp/drumsbench-apt.XXXXXX)
  # Wait (up to 5 minutes) for another apt or dpkg holding the lock instead of failing.
  lock=(-o DPkg::Lock::Timeout=300)
  if ! { apt-get "${lock[@]}" update -qq &&
      apt-get "${lock[@]}" install -y -qq --no-install-recommends "${missing[@]}"; } \
      >"$apt_log" 2>&1; then
    [ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
    tail -n 20 "$apt_log" >&2
    die "apt-get failed (full log: $apt_log)"
  fi
  [ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  rm -f "$apt_log"
fi

# -- 2. The virtual environment -------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import drumsbench, docker, pytest' >/dev/null 2>&1; then
  say "installing the project into $VENV (pip install -e '.[test]')"
  "$VENV/bin/pip" install -q --disable-pip-version-check -e "$ROOT[test]"
fi

# -- 3. dockerd -----------------------------------------------------------------------------------
# Debian's client (/usr/bin/docker) matches Debian's daemon; another client may come first on PATH.
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=docker
docker_ok() { timeout 10 "$DOCKER" info >/dev/null 2>&1; }
if ! docker_ok; then
  say "starting dockerd --bridge=none --iptables=false (log: $DOCKERD_LOG)"
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  setsid nohup dockerd --bridge=none --iptables=false >>"$DOCKERD_LOG" 2>&1 </dev/null &
  waited=0
  until docker_ok; do
    if [ "$waited" -ge "$((DOCKERD_WAIT_S * 2))" ]; then
      tail -n 20 "$DOCKERD_LOG" >&2 || true
      die "dockerd did not answer 'docker info' within ${DOCKERD_WAIT_S} s (log: $DOCKERD_LOG)"
    fi
    sleep 0.5
    waited=$((waited + 1))
  done
  say "dockerd is up ($("$DOCKER" version -f '{{.Server.Version}}' 2>/dev/null))"
fi

# -- 4 and 5. podman configuration and the images (Python, shared with the substrates) ----------
"$VENV/bin/python" -m drumsbench.substrates.containers.podman configure
if [ "${DRUMSBENCH_SKIP_IMAGES:-0}" != 1 ]; then
  "$VENV/bin/python" -m drumsbench.substrates.containers.docker ensure-image
  "$VENV/bin/python" -m drumsbench.substrates.containers.podman ensure-image
fi
# -- 6. Components of other parts, each with its own idempotent script ---------------------------
for part in "$ROOT"/scripts/setup-*.sh; do
  [ -e "$part" ] || continue
  PYTHON="$VENV/bin/python" bash "$part" || die "$(basename "$part") failed"
done
say "ok"
