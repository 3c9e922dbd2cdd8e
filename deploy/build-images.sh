#!/usr/bin/env bash
# Builds Turnpike's images locally, with no registry: static binaries packaged FROM scratch.
#   turnpike-test-agent:latest   the scriptable test agent (the default agent_image)
# Usage: bash deploy/build-images.sh
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-unknown-linux-gnu
# A static-pie binary (no musl target is needed); --target keeps RUSTFLAGS off build scripts.
RUSTFLAGS='-C target-feature=+crt-static' cargo build --quiet --release --target "$target" \
  -p turnpike-test-agent --bin turnpike-test-agent
bin="target/$target/release/turnpike-test-agent"

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$bin" "$ctx/agent"
cp deploy/images/test-agent.Dockerfile "$ctx/Dockerfile"
# The classic builder works offline; BuildKit may want to fetch its frontend.
if ! DOCKER_BUILDKIT=0 docker build --quiet --label turnpike.image=test-agent -t turnpike-test-agent:latest "$ctx" >"$ctx/build.log" 2>&1; then
  cat "$ctx/build.log" >&2
  exit 1
fi
echo "built turnpike-test-agent:latest ($(du -h "$bin" | cut -f1) static binary)"
