#!/usr/bin/env bash
# Provide CRIU >= 4 (live checkpoint/restore for the branch experiment).
# - Debian 13 and newer: the distribution's package.
# - Debian 12: criu 3.17 fails on this kernel (vDSO), so take Debian 13's criu and the libraries it
#   needs with `apt-get download` from the same mirror apt already uses (a private apt configuration,
#   the system's sources untouched), unpack them with dpkg -x into a private folder and run criu
#   through that folder's own dynamic loader; the system's libc is untouched.
# Result: $CRIU_HOME/criu (a wrapper) answering `criu check` with "Looks good". Idempotent.
set -euo pipefail
CRIU_HOME=${CRIU_HOME:-/opt/drumsbench/criu}
want_major=4

have_criu() {
  local bin=$1
  [ -x "$bin" ] || command -v "$bin" >/dev/null 2>&1 || return 1
  local v
  v=$("$bin" --version 2>/dev/null | awk '/^Version:/{print $2}')
  [ -n "$v" ] && [ "${v%%.*}" -ge "$want_major" ]
}

if have_criu "$CRIU_HOME/criu"; then
  echo "setup-criu: $("$CRIU_HOME/criu" --version | head -1) at $CRIU_HOME/criu"
  exit 0
fi

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
if [ "$codename" != "bookworm" ]; then
  apt-get install -y -qq criu >/dev/null
  if have_criu criu; then
    mkdir -p "$CRIU_HOME"
    ln -sf "$(command -v criu)" "$CRIU_HOME/criu"
    echo "setup-criu: distribution criu $(criu --version | awk '/^Version:/{print $2}')"
    exit 0
  fi
fi

# Debian 12: Debian 13's criu in a private folder.
mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" > "$work/sources.list"
opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=- -o "Dir::State::Lists=$work/lists"
      -o "Dir::Cache=$work/cache" -o Debug::NoLocking=1 -o Dir::State::status=/dev/null -o APT::Sandbox::User=root -qq)
echo "setup-criu: fetching criu 4 from the trixie suite into $CRIU_HOME"
apt-get "${opts[@]}" update
pkgs=$(apt-cache "${opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
        --no-replaces --no-enhances criu | grep -v '^[ <]' | sort -u)
(cd "$work/debs" && apt-get "${opts[@]}" download $pkgs 2>/dev/null)
rm -rf "$CRIU_HOME.new"
mkdir -p "$CRIU_HOME.new"
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$CRIU_HOME.new/root"; done
cat > "$CRIU_HOME.new/criu" <<WRAP
#!/bin/sh
# Debian 13's criu, run through its own loader and libraries (see scripts/setup-criu.sh).
R=$CRIU_HOME/root
exec "\$R/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "\$R/usr/lib/x86_64-linux-gnu" "\$R/usr/sbin/criu" "\$@"
WRAP
chmod +x "$CRIU_HOME.new/criu"
rm -rf "$CRIU_HOME"
mv "$CRIU_HOME.new" "$CRIU_HOME"
"$CRIU_HOME/criu" --version | head -1
"$CRIU_HOME/criu" check 2>&1 | tail -1
