#!/usr/bin/env bash
# Makes the NATS credentials of a deployment: one random password per user, in deploy/secrets/
# (git ignores it), kept once made. Roles read theirs from a file mounted at
# /run/secrets/nats_password; nats-server reads the roles' from secrets/nats.env, and its users
# file from secrets/nats/accounts.conf.
#
# Every runner has a user of its own (`runner-<id>`, which may write only what names it): runners
# runner-1 .. runner-N get secrets/runners/runner-<k>, and the users file is written again with
# one user per file in secrets/runners/ (`turnpike nats-accounts`). A running NATS cluster takes
# a new users file on SIGHUP (deploy/cluster.sh scale does this).
# Usage: bash deploy/secrets.sh [RUNNERS]   (default 3; delete the folder to rotate everything)
set -euo pipefail
cd "$(dirname "$0")"
runners=${1:-3}
umask 077
mkdir -p secrets/runners secrets/nats
chmod 700 secrets
secret() { [ -s "$1" ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$1"; }
roles="admin dispatcher coordinator dashboard chat sys route"
for user in $roles; do
  secret "secrets/$user"
done
for k in $(seq 1 "$runners"); do
  secret "secrets/runners/runner-$k"
done
{
  for user in $roles; do
    echo "TURNPIKE_${user^^}_PASSWORD=$(cat "secrets/$user")"
  done
  for k in 1 2 3; do
    echo "TURNPIKE_ROUTE_$k=nats-route://route:$(cat secrets/route)@${TURNPIKE_ROUTE_HOST_PREFIX:-nats-}$k:6222"
  done
} > secrets/nats.env
# The users file: one user per runner password, rendered by the turnpike image (cluster.sh
# builds it first), replaced at once so a node reloading it never reads half of it.
for f in secrets/runners/*; do
  if [ -s "$f" ]; then echo "$(basename "$f") $(cat "$f")"; fi
done | docker run --rm -i turnpike:latest nats-accounts > secrets/nats/accounts.conf.next
mv secrets/nats/accounts.conf.next secrets/nats/accounts.conf
# The dashboard: a session key, and one operator `admin` with a random password (in
# secrets/dashboard_operator). Add operators to secrets/dashboard_users as `name:hash` lines
# (`turnpike dashboard hash-password` makes the hash).
[ -s secrets/dashboard_session_key ] ||
  head -c 48 /dev/urandom | od -An -tx1 | tr -d ' \n' > secrets/dashboard_session_key
if [ ! -s secrets/dashboard_users ]; then
  [ -s secrets/dashboard_operator ] ||
    head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > secrets/dashboard_operator
  hash=$(docker run --rm -i turnpike:latest dashboard hash-password < secrets/dashboard_operator)
  echo "admin:$hash" > secrets/dashboard_users
fi
mounted="secrets/admin secrets/dispatcher secrets/coordinator secrets/dashboard secrets/chat secrets/dashboard_users secrets/dashboard_session_key secrets/nats/accounts.conf $(ls secrets/runners/* 2>/dev/null | tr '\n' ' ')"
# Roles and nodes run as uid 65534 inside their containers: what they mount must be readable to
# it. The folder stays 0700, so other users of this host still cannot read any of it.
if [ "$(id -u)" = 0 ]; then
  chown 65534:65534 $mounted secrets/nats
  chmod 400 $mounted
  chmod 500 secrets/nats
else
  chmod 444 $mounted
  chmod 755 secrets/nats
fi
echo "secrets in deploy/secrets/ ($runners runners; NATS admin password: deploy/secrets/admin; dashboard operator admin: deploy/secrets/dashboard_operator)"
