#!/usr/bin/env bash
# Builds turnpike-python-base:bookworm, a Debian bookworm userland with Python 3 and CA
# certificates, offline from a registry's point of view: mmdebstrap fetches Debian's packages from
# the mirror apt already uses, and `docker import` turns the root file system into an image. The
# tarball is cached (by default in ~/.cache/turnpike), so a machine builds it once.
# Usage: bash deploy/build-python-base.sh   (a no-op when the image is there)
set -euo pipefail
image=turnpike-python-base:bookworm
if docker image inspect "$image" >/dev/null 2>&1; then
  exit 0
fi
cache=${TURNPIKE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/turnpike}
tarball="$cache/python-base-bookworm.tar"
if [ ! -s "$tarball" ]; then
  if ! command -v mmdebstrap >/dev/null 2>&1; then
    echo "installing mmdebstrap (Debian's package) to build $image" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
  fi
  # The mirror apt's own sources name (deb822 or one-line format), else Debian's.
  mirror=$( (grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}';
             grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}') | grep -v security | head -n1 || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  mkdir -p "$cache"
  # The format follows the target's extension: the partial file ends in .tar too.
  mmdebstrap --quiet --variant=apt --include=python3,ca-certificates bookworm "$tarball.part.tar" "$mirror"
  mv "$tarball.part.tar" "$tarball"
fi
docker import --change 'CMD ["python3"]' "$tarball" "$image" >/dev/null
docker image inspect "$image" >/dev/null
echo "built $image"
