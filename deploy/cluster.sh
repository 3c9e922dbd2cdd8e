#!/usr/bin/env bash
# Turnpike's cluster deployment (deploy/compose.yaml) on this Docker host.
#   bash deploy/cluster.sh up [RUNNERS]   build images, make secrets, start; waits until healthy
#   bash deploy/cluster.sh scale N        run N runners (adds or removes runners only)
#   bash deploy/cluster.sh status         containers with their health, then `turnpike status`
#   bash deploy/cluster.sh cli ARGS...    the turnpike CLI as admin, e.g. `cli send --chat c hi`
#   bash deploy/cluster.sh down           stop and remove containers, network and volumes
# Works with `docker compose` (v2) and Debian's `docker-compose` 1.29 (v1). v1 fails to recreate
# containers on newer engines (KeyError: 'ContainerConfig'), so `up` always starts from `down -v`
# and `scale` never recreates. Each runner is its own service, with its own NATS user: `scale`
# adds their users, reloads the NATS nodes' users file (SIGHUP), then starts or stops runners.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
project=${TURNPIKE_PROJECT:-turnpike}
DOCKER_GID=$(stat -c %g /var/run/docker.sock)
export DOCKER_GID

# What runs is secrets/compose.yaml: compose.yaml with its runner block written once per runner
# (runner-1 .. runner-N), each with its own id, NATS user and password file. Paths in it are
# relative to this folder.
compose() {
  if docker compose version >/dev/null 2>&1; then
    docker compose -p "$project" --project-directory "$here" -f "$here/secrets/compose.yaml" "$@"
  else
    docker-compose -p "$project" --project-directory "$here" -f "$here/secrets/compose.yaml" "$@"
  fi
}

# secrets/compose.yaml with runners 1..$1.
write_compose() {
  awk -v n="$1" '
    /# @runner-begin/ { inblock = 1; print; next }
    /# @runner-end/ {
      for (k = 1; k <= n; k++) { b = block; gsub(/runner-1/, "runner-" k, b); printf "%s", b }
      inblock = 0; print; next
    }
    inblock { block = block $0 "\n"; next }
    { print }' "$here/compose.yaml" > "$here/secrets/compose.yaml.next"
  mv "$here/secrets/compose.yaml.next" "$here/secrets/compose.yaml"
}

# Runners that have a password file: their ids' numbers.
runner_numbers() {
  ls "$here/secrets/runners" 2>/dev/null | sed -n 's/^runner-\([0-9][0-9]*\)$/\1/p' | sort -n
}

# Every running NATS node reads its users file again (it takes a new runner's user, or drops a
# removed one's) without a restart.
reload_users() {
  compose kill -s SIGHUP nats-1 nats-2 nats-3 >/dev/null
}

# The CLI in a container on the cluster's network, as the admin user.
cli() {
  docker run --rm --network "${project}_turnpike" \
    -e TURNPIKE_NATS_URL=nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222 \
    -e TURNPIKE_NATS_USER=admin -e TURNPIKE_NATS_PASSWORD_FILE=/run/secrets/nats_password \
    -e TURNPIKE_MANAGE_TOPOLOGY=false \
    -v "$here/secrets/admin:/run/secrets/nats_password:ro" \
    turnpike:latest "$@"
}

# Wait (bounded) until setup has exited 0 and every long-running container is healthy.
wait_healthy() {
  local deadline=$(( $(date +%s) + ${1:-240} )) ids bad
  while :; do
    ids=$(compose ps -q)
    bad=$(docker inspect --format '{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}} {{.State.ExitCode}}' $ids |
      awk '$1 ~ /setup/ { if (!($2 == "exited" && $3 == "0")) print; next } $3 != "healthy" { print }')
    [ -z "$bad" ] && { echo "cluster healthy"; return 0; }
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "not healthy in time:" >&2; echo "$bad" >&2; compose logs --tail 30 >&2; return 1
    fi
    sleep 3
  done
}

cmd=${1:-}
shift || true
case "$cmd" in
  up)
    runners=${1:-3}
    bash "$here/build-images.sh"
    bash "$here/secrets.sh" "$runners"
    if [ -f "$here/secrets/compose.yaml" ]; then
      compose down -v --remove-orphans >/dev/null 2>&1 || true
    fi
    write_compose "$runners"
    compose up -d
    # The setup service exits 0 once the topology exists; its exit code is in `docker inspect`.
    wait_healthy 300
    ;;
  scale)
    runners=${1:?how many runners}
    # New runners' users first, so they are let in when they start.
    bash "$here/secrets.sh" "$runners" >/dev/null
    reload_users
    # Removed runners drain (up to 40 s: no new work, running attempts finish) and stop first,
    # while the running file still names them: compose removes orphans with a kill.
    removed=""
    for k in $(runner_numbers); do
      if [ "$k" -gt "$runners" ]; then removed="$removed runner-$k"; fi
    done
    if [ -n "$removed" ]; then compose stop --timeout 40 $removed; fi
    write_compose "$runners"
    compose up -d --no-recreate --remove-orphans
    # Then their users go too.
    for k in $(runner_numbers); do
      if [ "$k" -gt "$runners" ]; then rm -f "$here/secrets/runners/runner-$k"; fi
    done
    bash "$here/secrets.sh" "$runners" >/dev/null
    reload_users
    echo "$runners runners"
    ;;
  status)
    compose ps
    cli status
    ;;
  cli)
    cli "$@"
    ;;
  down)
    compose down -v --remove-orphans
    ;;
  *)
    sed -n '2,10p' "$0" >&2
    exit 2
    ;;
esac
