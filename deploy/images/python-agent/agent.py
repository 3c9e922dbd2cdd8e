#!/usr/bin/env python3
"""An example Turnpike agent: answers a chat message with an OpenAI-compatible model.

The template for agents of your own (docs/agents.md). Standard library only. It:

- reads the input document on stdin (the prompt, with the retry note on a retry; the chat's
  history; the deadline);
- calls `$LLM_URL/chat/completions` with streaming (model `$LLM_MODEL`, key from the
  `OPENAI_API_KEY` variable or the file `$TURNPIKE_SECRETS/openai_key`), through the proxy in
  `HTTPS_PROXY`/`HTTP_PROXY` when the run has an egress list (urllib reads them);
- sends `status` lines while the answer streams in;
- keeps `notes.md` in its workspace (`$TURNPIKE_WORKSPACE`) when it has one, and shows the model
  its last notes;
- posts what it has as a summary when its deadline comes near (`SUMMARY_MARGIN` seconds before,
  30 by default): a reply that landed is never retried, a run stopped mid-thought is.

Endings (docs/protocol.md): a reply and exit 0 is done; an error the model will repeat on a retry
(a refused key, a bad request) is reported as `{"type":"result","status":"error"}` and exit 0 (not
retried); anything a retry may cure (the endpoint down, cut off, too slow) is exit 1 (retried).
"""

import datetime
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

NOTES = "notes.md"
NOTES_SHOWN = 2000  # characters of the notes file the model sees
STATUS_EVERY = 1.0  # seconds between progress lines


def emit(kind, **fields):
    sys.stdout.write(json.dumps({"type": kind, **fields}) + "\n")
    sys.stdout.flush()


def log(text):
    # stderr becomes the runner's debug log, tagged with the turn.
    sys.stderr.write(f"python-agent: {text}\n")
    sys.stderr.flush()


def api_key():
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        return key
    secrets = os.environ.get("TURNPIKE_SECRETS", "/run/secrets")
    try:
        with open(os.path.join(secrets, "openai_key"), encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def seconds_left(deadline):
    if not deadline:
        return None
    at = datetime.datetime.fromisoformat(deadline.replace("Z", "+00:00"))
    return (at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()


def read_notes(workspace):
    if not workspace:
        return ""
    try:
        with open(os.path.join(workspace, NOTES), encoding="utf-8") as f:
            return f.read()[-NOTES_SHOWN:]
    except OSError:
        return ""


def write_note(workspace, doc, text):
    if not workspace:
        return
    first = (doc["message"].get("text") or "").strip().splitlines()[:1]
    line = f"- turn {doc['turn']}: asked {first[0] if first else '(nothing)'!r}; answered {len(text)} characters\n"
    try:
        with open(os.path.join(workspace, NOTES), "a", encoding="utf-8") as f:
            f.write(line)
    except OSError as e:
        log(f"cannot keep notes: {e}")


def messages_for(doc, notes):
    system = "You are a helpful assistant in a chat."
    if notes:
        system += "\nYour notes from earlier turns of this chat:\n" + notes
    out = [{"role": "system", "content": system}]
    for h in doc.get("history", []):
        if h.get("role") == "user":
            out.append({"role": "user", "content": h["text"]})
        elif h.get("role") == "bot":
            out.append({"role": "assistant", "content": h["text"]})
    out.append({"role": "user", "content": doc["prompt"]})
    return out


class Stream:
    """One streamed completion, read by a thread of its own: the main thread keeps the clock (a
    read blocked on a silent endpoint cannot hold up the summary)."""

    def __init__(self, url, model, key, messages):
        body = json.dumps({"model": model, "messages": messages, "stream": True}).encode()
        self.request = urllib.request.Request(
            url.rstrip("/") + "/chat/completions",
            data=body,
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {key}",
                "Accept": "text/event-stream",
            },
            method="POST",
        )
        self.parts = []
        self.complete = False
        self.error = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            # No read waits longer than this; the deadline is the main thread's.
            with urllib.request.urlopen(self.request, timeout=120) as response:
                for raw in response:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        self.complete = True
                        return
                    for choice in json.loads(data).get("choices", []):
                        self.parts.append((choice.get("delta") or {}).get("content") or "")
            self.error = ConnectionError("the stream ended before [DONE]")
        except Exception as e:  # handed to the main thread, which decides
            self.error = e

    def text(self):
        return "".join(self.parts)

    def wait(self, stop_at):
        """True when the stream ended (well or not) before `stop_at`; status lines meanwhile."""
        said = 0
        while self.thread.is_alive():
            left = stop_at - time.monotonic()
            if left <= 0:
                return False
            self.thread.join(min(STATUS_EVERY, left))
            have = len(self.text())
            if self.thread.is_alive() and have != said:
                emit("status", text=f"thinking… {have} characters so far")
                said = have
        return True


def main():
    doc = json.load(sys.stdin)
    url = os.environ.get("LLM_URL", "https://api.openai.com/v1")
    model = os.environ.get("LLM_MODEL", "gpt-4o-mini")
    margin = float(os.environ.get("SUMMARY_MARGIN", "30"))
    workspace = os.environ.get("TURNPIKE_WORKSPACE")
    key = api_key()
    if not key:
        emit("result", status="error", error="no API key: give the agent the secret openai_key")
        return 0
    left = seconds_left(doc.get("deadline"))
    # Keep the margin, but never more than half the run: a short run still gets to think.
    stop_at = time.monotonic() + (max(left - min(margin, left / 2), 1.0) if left else 3600.0)
    emit("status", text="thinking…")
    stream = Stream(url, model, key, messages_for(doc, read_notes(workspace)))
    if not stream.wait(stop_at):
        text = stream.text().strip()
        summary = "I ran out of time before finishing."
        if text:
            summary += " What I had so far:\n\n" + text
        emit("message", text=summary)
        write_note(workspace, doc, summary)
        emit("result", status="ok")
        return 0
    e = stream.error
    if isinstance(e, urllib.error.HTTPError) and e.code in (400, 401, 403, 404):
        # The same request would be refused again: a failure, not retried.
        emit("result", status="error", error=f"the model endpoint refused the request ({e.code})")
        return 0
    if e is not None:
        # Down, cut off, garbled, 5xx: a retry may cure it.
        log(f"calling the model failed: {e.__class__.__name__}: {e}")
        return 1
    answer = stream.text()
    if not answer.strip():
        log("the model said nothing")
        return 1
    emit("message", text=answer.strip())
    write_note(workspace, doc, answer)
    emit("result", status="ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
