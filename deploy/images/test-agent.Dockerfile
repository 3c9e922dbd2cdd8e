# The test agent: one static binary, nothing else (no shell, no libc, no users).
FROM scratch
COPY agent /agent
USER 65534:65534
ENTRYPOINT ["/agent"]
