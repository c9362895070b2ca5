// The host console's only script: keep the "now" page's phones panel fresh (no framework).
// It re-fetches the server-rendered panel about once a second; a lost session reloads the
// page, which then redirects to the login form.
(function () {
  "use strict";
  var panel = document.getElementById("phones");
  if (!panel) return;
  var url = panel.dataset.poll;
  var every = Math.min(Number(panel.dataset.pollMs) || 1000, 1000);
  var state = document.getElementById("live-state");
  var busy = false;

  function mark(on) {
    if (!state) return;
    state.dataset.state = on ? "on" : "off";
    state.textContent = on ? "live · every " + (every / 1000).toFixed(1) + " s" : "offline — retrying";
  }

  function poll() {
    if (busy || document.hidden) return;
    busy = true;
    fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "text/html" } })
      .then(function (r) {
        if (r.status === 401) { window.location.reload(); return null; }
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        if (html === null) return;
        panel.innerHTML = html;
        mark(true);
      })
      .catch(function () { mark(false); })
      .then(function () { busy = false; });
  }
  setInterval(poll, every);
})();
