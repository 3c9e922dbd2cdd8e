#!/usr/bin/env bash
# Makes the NATS credentials of a deployment, once: one random password per user, in
# deploy/secrets/ (git ignores it). Roles read theirs from a file mounted at
# /run/secrets/nats_password; nats-server reads all of them from secrets/nats.env.
# Usage: bash deploy/secrets.sh        (keeps existing secrets; delete the folder to rotate)
set -euo pipefail
cd "$(dirname "$0")"
umask 077
mkdir -p secrets
chmod 700 secrets
for user in admin dispatcher coordinator runner dashboard chat sys route; do
  f=secrets/$user
  [ -s "$f" ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$f"
done
{
  for user in admin dispatcher coordinator runner dashboard chat sys route; do
    echo "TURNPIKE_${user^^}_PASSWORD=$(cat secrets/$user)"
  done
  for k in 1 2 3; do
    echo "TURNPIKE_ROUTE_$k=nats-route://route:$(cat secrets/route)@${TURNPIKE_ROUTE_HOST_PREFIX:-nats-}$k:6222"
  done
} > secrets/nats.env
# The dashboard: a session key, and one operator `admin` with a random password (in
# secrets/dashboard_operator). Add operators to secrets/dashboard_users as `name:hash` lines
# (`turnpike dashboard hash-password` makes the hash). Needs the turnpike image (cluster.sh
# builds it first).
[ -s secrets/dashboard_session_key ] ||
  head -c 48 /dev/urandom | od -An -tx1 | tr -d ' \n' > secrets/dashboard_session_key
if [ ! -s secrets/dashboard_users ]; then
  [ -s secrets/dashboard_operator ] ||
    head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > secrets/dashboard_operator
  hash=$(docker run --rm -i turnpike:latest dashboard hash-password < secrets/dashboard_operator)
  echo "admin:$hash" > secrets/dashboard_users
fi
mounted="secrets/admin secrets/dispatcher secrets/coordinator secrets/runner secrets/dashboard secrets/chat secrets/dashboard_users secrets/dashboard_session_key"
# Roles run as uid 65534 inside their containers: the files they mount must be readable to it.
# The folder stays 0700, so other users of this host still cannot read them.
if [ "$(id -u)" = 0 ]; then
  chown 65534:65534 $mounted
  chmod 400 $mounted
else
  chmod 444 $mounted
fi
echo "secrets in deploy/secrets/ (NATS admin password: deploy/secrets/admin; dashboard operator admin: deploy/secrets/dashboard_operator)"
