# The example LLM agent (deploy/images/python-agent/agent.py) on a Debian userland with Python,
# turnpike-python-base:bookworm (deploy/build-python-base.sh builds it from Debian's packages).
FROM turnpike-python-base:bookworm
COPY agent.py /agent/agent.py
USER 65534:65534
# Unbuffered: each JSON line reaches the runner as it is printed.
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["python3", "/agent/agent.py"]
