// The host console's only script (no framework, no build): keeps two pages live by polling.
// - "now": re-fetches the server-rendered phones panel about once a second;
// - a running task's timeline: fetches the steps recorded since, appends them (so a step a
//   person opened stays open) and updates status and progress, until the task ends.
// A lost session (401: logged out in another tab, the console restarted, the session's age
// reached) stops the polling and says "session ended — log in again", the link leading to the
// login and back to this page, as the operators' console's live pages say it; a failed poll
// marks the page offline until one succeeds again.
// A step's prompts load when its "Prompts" is opened (on the timeline and its earlier steps).
(function () {
  "use strict";

  // Where the page says its session ended: the phones' live state, a timeline's live note, or
  // a line of its own atop the page. The page stays as it was (a reload went straight to the
  // login form, the page and the reason gone without a word).
  function sessionEnded() {
    var el = document.getElementById("live-state") ||
      document.querySelector('[data-field="live-note"]');
    if (!el) {
      el = document.createElement("p");
      el.className = "note small";
      var main = document.querySelector("main") || document.body;
      main.insertBefore(el, main.firstChild);
    }
    el.dataset.state = "off";
    el.textContent = "session ended — ";
    var link = document.createElement("a");
    link.href = "/login?next=" + encodeURIComponent(window.location.pathname + window.location.search);
    link.textContent = "log in again";
    link.dataset.field = "log-in-again";
    el.appendChild(link);
  }

  function poller(url, every, onText, onState) {
    var busy = false;
    var timer = null;
    var over = false;
    function tick() {
      if (busy || over || document.hidden) return;
      busy = true;
      fetch(url(), { credentials: "same-origin", cache: "no-store" })
        .then(function (r) {
          if (r.status === 401) {
            over = true;
            clearInterval(timer);
            sessionEnded();
            return null;
          }
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.text();
        })
        .then(function (text) {
          if (text === null) return;
          if (onText(text) === false) clearInterval(timer);
          if (onState) onState(true);
        })
        .catch(function () { if (onState) onState(false); })
        .then(function () { busy = false; });
    }
    timer = setInterval(tick, Math.min(every || 1000, 1000));
  }

  // --- now ---
  var panel = document.getElementById("phones");
  if (panel && panel.dataset.poll) {
    var state = document.getElementById("live-state");
    var every = Math.min(Number(panel.dataset.pollMs) || 1000, 1000);
    poller(function () { return panel.dataset.poll; }, every, function (html) {
      panel.innerHTML = html;
    }, function (on) {
      if (!state) return;
      state.dataset.state = on ? "on" : "off";
      state.textContent = on ? "live · every " + (every / 1000).toFixed(1) + " s" : "offline — retrying";
    });
  }

  // --- a running task's timeline ---
  var OFFLINE_NOTE = "Offline: this console cannot be reached, retrying. " +
    "The status and steps shown may be out of date.";
  var timeline = document.getElementById("timeline");
  if (timeline && timeline.dataset.poll) {
    var field = function (name) { return document.querySelector('[data-field="' + name + '"]'); };
    var note = field("live-note");
    var runningNote = note ? note.textContent : "";
    var ended = false;
    poller(function () {
      return timeline.dataset.poll + "&after=" + timeline.dataset.count;
    }, Number(timeline.dataset.pollMs), function (text) {
      var live = JSON.parse(text);
      if (live.html) timeline.insertAdjacentHTML("beforeend", live.html);
      timeline.dataset.count = String(live.count);
      var el = field("steps");
      if (el) el.textContent = String(live.count);
      el = field("verdict-counts");
      if (el && live.verdicts_html !== undefined) el.innerHTML = live.verdicts_html;
      el = field("cost");
      if (el && live.cost !== undefined) el.textContent = live.cost;
      el = field("progress");
      if (el) el.textContent = live.progress;
      el = field("status");
      if (el) {
        el.textContent = live.status;
        el.className = "pill big status-" + live.status;
      }
      var box = field("thinking-box");
      if (box) {
        box.hidden = !live.thinking || live.status !== "running";
        var pre = field("thinking");
        if (pre.textContent !== live.thinking) pre.textContent = live.thinking || "";
      }
      if (live.status !== "running") {
        ended = true;
        if (note) note.textContent = "Ended: " + (live.summary || live.status) + ".";
        return false;
      }
      return true;
    }, function (on) {
      // A failed poll said nothing: the page kept showing "running" and its last step as if
      // live while the console was unreachable. It says so until a poll succeeds again.
      if (!note || ended) return;
      note.dataset.state = on ? "on" : "off";
      note.textContent = on ? runningNote : OFFLINE_NOTE;
    });
  }
})();
