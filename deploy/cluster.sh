#!/usr/bin/env bash
# Turnpike's cluster deployment (deploy/compose.yaml) on this Docker host.
#   bash deploy/cluster.sh up [RUNNERS]   build images, make secrets, start; waits until healthy
#   bash deploy/cluster.sh scale N        run N runners (adds or removes runners only)
#   bash deploy/cluster.sh status         containers with their health, then `turnpike status`
#   bash deploy/cluster.sh cli ARGS...    the turnpike CLI as admin, e.g. `cli send --chat c hi`
#   bash deploy/cluster.sh down           stop and remove containers, network and volumes
# Works with `docker compose` (v2) and Debian's `docker-compose` 1.29 (v1). v1 fails to recreate
# containers on newer engines (KeyError: 'ContainerConfig'), so `up` always starts from `down -v`
# and `scale` never recreates.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
project=${TURNPIKE_PROJECT:-turnpike}
DOCKER_GID=$(stat -c %g /var/run/docker.sock)
export DOCKER_GID

compose() {
  if docker compose version >/dev/null 2>&1; then
    docker compose -p "$project" -f "$here/compose.yaml" "$@"
  else
    docker-compose -p "$project" -f "$here/compose.yaml" "$@"
  fi
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
    bash "$here/secrets.sh"
    compose down -v --remove-orphans >/dev/null 2>&1 || true
    compose up -d --scale "runner=$runners"
    # The setup service exits 0 once the topology exists; its exit code is in `docker inspect`.
    wait_healthy 300
    ;;
  scale)
    compose up -d --no-recreate --scale "runner=${1:?how many runners}" runner
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
