# The test agent: one static binary, nothing else (no shell, no libc, no users).
FROM scratch
COPY agent /agent
# Tests run it with --entrypoint /llm: an OpenAI-compatible stand-in on their own network.
COPY llm /llm
USER 65534:65534
ENTRYPOINT ["/agent"]
