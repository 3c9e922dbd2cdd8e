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
for user in admin dispatcher coordinator runner chat sys route; do
  f=secrets/$user
  [ -s "$f" ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$f"
done
{
  for user in admin dispatcher coordinator runner chat sys route; do
    echo "TURNPIKE_${user^^}_PASSWORD=$(cat secrets/$user)"
  done
  for k in 1 2 3; do
    echo "TURNPIKE_ROUTE_$k=nats-route://route:$(cat secrets/route)@${TURNPIKE_ROUTE_HOST_PREFIX:-nats-}$k:6222"
  done
} > secrets/nats.env
# Roles run as uid 65534 inside their containers: the files they mount must be readable to it.
# The folder stays 0700, so other users of this host still cannot read them.
if [ "$(id -u)" = 0 ]; then
  chown 65534:65534 secrets/admin secrets/dispatcher secrets/coordinator secrets/runner secrets/chat
  chmod 400 secrets/admin secrets/dispatcher secrets/coordinator secrets/runner secrets/chat
else
  chmod 444 secrets/admin secrets/dispatcher secrets/coordinator secrets/runner secrets/chat
fi
echo "secrets in deploy/secrets/ (admin password: deploy/secrets/admin)"
