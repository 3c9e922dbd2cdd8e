# The agent watchdog: one static binary. Never run from this image: a runner copies the file out
# at start and into every agent container, as its PID 1 (crates/agent-init).
FROM scratch
COPY turnpike-agent-init /turnpike-agent-init
