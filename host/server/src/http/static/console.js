// keel console: keeps server-rendered pages live. The server renders (and escapes) every
// fragment; this script only fetches fragments and swaps them in.
"use strict";

// Says on the page that the login no longer stands (its token was revoked, or it ended), and
// stops keeping the page live.
let accessEnded = false;
function endAccess() {
  accessEnded = true;
  const banner = document.getElementById("access-ended");
  if (banner) banner.hidden = false;
  document.body.dataset.accessEnded = "1";
}

function refresh(el, url) {
  if (accessEnded) return Promise.resolve();
  return fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
    .then((r) => {
      // A login that no longer stands is sent to the login page.
      if (r.status === 401 || (r.redirected && new URL(r.url).pathname === "/login")) {
        endAccess();
        return Promise.reject(r.status);
      }
      return r.ok ? r.text() : Promise.reject(r.status);
    })
    .then((html) => {
      // Keep what the person is typing in a reason field of the fragment.
      const active = document.activeElement;
      if (active && el.contains(active) && active.tagName === "INPUT") return;
      el.innerHTML = html;
    })
    .catch(() => {});
}

// A session's timeline follows the session's events stream; each new event re-renders the
// fragment (coalesced), and the stream resumes where it stopped after a dropped connection
// (the browser sends Last-Event-ID).
function followSession(el) {
  const id = el.dataset.session;
  const after = el.dataset.after || "0";
  const url = "/sessions/" + encodeURIComponent(id) + "/fragment";
  let pending = null;
  const source = new EventSource(
    "/api/v1/sessions/" + encodeURIComponent(id) + "/events?after=" + encodeURIComponent(after)
  );
  // The text a model is writing, as it arrives (as text, never markup), until the durable
  // reply replaces it.
  const live = document.getElementById("live-text");
  source.addEventListener("text_delta", (e) => {
    if (!live) return;
    try {
      const piece = JSON.parse(e.data);
      if (piece.restart) live.textContent = "";
      live.textContent += piece.text;
      live.hidden = false;
    } catch (_) {}
  });
  // The stream ends with a `failure` event when the token is revoked or the login ends.
  source.addEventListener("failure", (e) => {
    try {
      if (JSON.parse(e.data).error.kind === "unauthorized") {
        source.close();
        endAccess();
      }
    } catch (_) {}
  });
  source.onmessage = (e) => {
    try {
      const kind = JSON.parse(e.data).kind;
      if (live && (kind === "model_call_finished" || kind === "model_call_failed" || kind === "answer")) {
        live.textContent = "";
        live.hidden = true;
      }
    } catch (_) {}
    if (pending) return;
    pending = setTimeout(() => {
      pending = null;
      refresh(el, url);
    }, 100);
  };
  document.body.dataset.live = "1";
}

function poll(el) {
  const url = el.dataset.refresh;
  setInterval(() => refresh(el, url), 2000);
}

// A form that deletes or revokes asks first.
document.addEventListener("submit", (e) => {
  const form = e.target;
  if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
    e.preventDefault();
  }
});

document.addEventListener("DOMContentLoaded", () => {
  const timeline = document.getElementById("timeline");
  if (timeline) followSession(timeline);
  document.querySelectorAll("[data-refresh]").forEach(poll);
});
