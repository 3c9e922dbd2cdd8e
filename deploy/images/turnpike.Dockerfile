# Every Turnpike role and the operator CLI: one static binary, nothing else (no shell, no libc).
# Runners reach the Docker Engine through a mounted socket; see deploy/compose.yaml.
FROM scratch
COPY turnpike /turnpike
# A writable, empty /tmp (the build context's empty `data` folder): a runner spools each attempt's
# attachments there, on the container's disk layer rather than in memory.
COPY --chown=65534:65534 data /tmp
USER 65534:65534
ENTRYPOINT ["/turnpike"]
