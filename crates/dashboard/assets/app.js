// Turnpike dashboard: live updates and confirmations. No inline script (the CSP forbids it).
"use strict";

// Relative times and countdowns, kept current every second.
function relative(ms) {
  const future = ms > 0;
  const s = Math.floor(Math.abs(ms) / 1000);
  const amount = s < 60 ? s + "s" : s < 3600 ? Math.floor(s / 60) + "m"
    : s < 86400 ? Math.floor(s / 3600) + "h" : Math.floor(s / 86400) + "d";
  return future ? "in " + amount : amount + " ago";
}
function tick() {
  const now = Date.now();
  for (const el of document.querySelectorAll("time[data-at]")) {
    el.textContent = relative(Number(el.dataset.at) - now);
  }
  for (const el of document.querySelectorAll(".countdown[data-due]")) {
    const left = Number(el.dataset.due) - now;
    el.textContent = left > 0 ? "in " + Math.ceil(left / 1000) + "s" : "due";
  }
}
setInterval(tick, 1000);

// Every action asks first.
document.addEventListener("submit", (ev) => {
  const form = ev.target;
  const question = form.dataset && form.dataset.confirm;
  if (question && !window.confirm(question)) ev.preventDefault();
});

// Live: the server sends the name of each bucket that changed; the page re-draws its main
// part (the same URL, fragment only) when a bucket it shows changed, at most every 250 ms.
(function live() {
  const main = document.getElementById("main");
  if (!main || !window.EventSource) return;
  const watched = new Set((main.dataset.watch || "").split(" ").filter(Boolean));
  if (watched.size === 0) return;
  // Of some buckets the page shows only some keys (a turn's page: its own chat's output).
  let keys = {};
  try { keys = JSON.parse(main.dataset.keys || "{}"); } catch (_) { keys = {}; }
  let pending = false, running = false;
  // For operators' consoles and the browser tests: what the live view has seen.
  const stats = (window.turnpikeLive = { events: 0, redraws: 0, failures: 0, by: {} });
  async function redraw() {
    pending = false;
    if (running) { pending = true; return; }
    running = true;
    try {
      const r = await fetch(location.pathname + location.search, {
        headers: { "X-Turnpike-Fragment": "1" }, credentials: "same-origin",
      });
      if (r.status === 401) { location.reload(); return; }
      if (!r.ok) stats.failures++;
      if (r.ok) {
        stats.redraws++;
        const html = await r.text();
        // A form being filled in (a filter) is left alone.
        const focused = document.activeElement;
        if (!(focused && main.contains(focused) && focused.tagName === "INPUT")) {
          main.innerHTML = html;
          tick();
        }
      }
    } finally {
      running = false;
      if (pending) setTimeout(redraw, 250);
    }
  }
  const source = new EventSource("/events");
  // Browsers allow six connections per host over HTTP/1.1: a page kept in the back/forward
  // cache must not hold one open, or later pages of the dashboard would wait for a slot.
  window.addEventListener("pagehide", () => source.close());
  for (const bucket of watched) {
    const only = Array.isArray(keys[bucket]) ? new Set(keys[bucket]) : null;
    source.addEventListener(bucket, (ev) => {
      if (only && !only.has(ev.data)) return;
      stats.events++;
      stats.by[bucket] = (stats.by[bucket] || 0) + 1;
      if (!pending) { pending = true; setTimeout(redraw, 150); }
    });
  }
  // After a reconnect (a dashboard or NATS restart), changes may have been missed.
  stats.source = source;
  // A safety net, not the mechanism: should an event be lost (a connection slot not yet free,
  // a watch re-opened), the page still converges within a few seconds.
  setInterval(() => {
    if (!pending && document.visibilityState === "visible") { pending = true; setTimeout(redraw, 0); }
  }, 5000);
  source.addEventListener("hello", () => {
    stats.events++; if (!pending) { pending = true; setTimeout(redraw, 0); } });
})();
