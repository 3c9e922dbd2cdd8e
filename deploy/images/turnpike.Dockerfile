# Every Turnpike role and the operator CLI: one static binary, nothing else (no shell, no libc).
# Runners reach the Docker Engine through a mounted socket; see deploy/compose.yaml.
FROM scratch
COPY turnpike /turnpike
USER 65534:65534
ENTRYPOINT ["/turnpike"]
