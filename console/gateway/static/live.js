// Live updates for the console pages, fed by server-sent events (ProgressService.WatchProgress,
// FleetService.WatchHosts).
// No framework, no build: pages are server-rendered; this script only patches them in place.
(function () {
  "use strict";

  var body = document.body;
  var mode = body.dataset.live;

  // Same wording as console/gateway/present.py:progress_badge.
  function badge(p) {
    if (!p || !p.step_index) return "";
    var parts = ["step " + p.step_index];
    if (p.step_status && p.step_status !== "unspecified") parts.push(p.step_status);
    if (p.summary) parts.push(p.summary);
    return parts.join(" · ");
  }

  function attemptLabel(t) {
    if (!t.attempt) return "not assigned yet (" + t.max_attempts + " allowed)";
    return "attempt " + t.attempt + " of " + t.max_attempts;
  }

  function ago(iso) {
    var s = Math.max(0, Math.floor((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return s + "s ago";
    if (s < 3600) return Math.floor(s / 60) + "m ago";
    if (s < 86400) return Math.floor(s / 3600) + "h ago";
    return Math.floor(s / 86400) + "d ago";
  }

  function tick() {
    document.querySelectorAll("time[data-ago]").forEach(function (el) {
      if (el.dataset.ago) el.textContent = ago(el.dataset.ago);
    });
  }
  setInterval(tick, 1000);

  // A link to a step (#step-<decision id>) opens that step.
  function openFromHash() {
    var target = window.location.hash && document.getElementById(window.location.hash.slice(1));
    if (target && target.tagName === "DETAILS") {
      target.open = true;
      target.scrollIntoView({ block: "start" });
    }
  }
  openFromHash();
  window.addEventListener("hashchange", openFromHash);

  function field(root, name) {
    return root.querySelector('[data-field="' + name + '"]');
  }

  // Patch every field of one task shown under `root`.
  function patch(root, t) {
    var el = field(root, "status");
    if (el) {
      el.className = "pill status-" + t.status;
      el.textContent = t.status + (t.cancel_requested ? " · cancelling" : "");
    }
    el = field(root, "progress");
    if (el) {
      var text = badge(t.progress);
      el.textContent = text || "no step yet";
      el.classList.toggle("empty", !text);
    }
    el = field(root, "attempt");
    if (el) el.textContent = attemptLabel(t);
    el = field(root, "host");
    if (el) el.textContent = t.host_id || "—";
    el = field(root, "device");
    if (el) el.textContent = t.device_serial || (root.tagName === "TR" ? "" : "—");
    el = field(root, "updated");
    if (el && t.updated_at) {
      el.dataset.ago = t.updated_at;
      el.textContent = ago(t.updated_at);
    }
    el = field(root, "result");
    if (el && t.result_summary) el.textContent = t.result_summary;
    root.classList.remove("flash");
    void root.offsetWidth; // restart the highlight animation
    root.classList.add("flash");
  }

  // Re-render one section from the server, keeping the operator's open <details>.
  var busy = {};
  function refresh(selector) {
    if (busy[selector]) { busy[selector] = "again"; return; }
    busy[selector] = true;
    fetch(window.location.href, { headers: { Accept: "text/html" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector(selector);
        var current = document.querySelector(selector);
        if (!fresh || !current) return;
        var open = [];
        current.querySelectorAll("details[open][id]").forEach(function (d) { open.push(d.id); });
        current.replaceWith(fresh);
        open.forEach(function (id) {
          var d = document.getElementById(id);
          if (d) d.open = true;
        });
        tick();
      })
      .catch(function () { /* the next event retries */ })
      .finally(function () {
        var again = busy[selector] === "again";
        busy[selector] = false;
        if (again) refresh(selector);
      });
  }

  function liveState(text, cls) {
    var el = document.getElementById("live-state");
    if (!el) {
      el = document.createElement("span");
      el.id = "live-state";
      var header = document.querySelector("header.top");
      if (header) header.appendChild(el);
    }
    el.textContent = text;
    el.className = "live-state " + cls;
  }

  // The model's thinking as it streams (session mode): shown while a step is planned, cleared
  // when the step moves on (its decision, with the stored thinking, appears in the history).
  var thinkingBox = document.getElementById("live-thinking");
  function showThinking(t) {
    if (!thinkingBox) return;
    var key = t.task_id + "·" + t.attempt;
    var pre = field(thinkingBox, "thinking");
    if (thinkingBox.dataset.key !== key) { pre.textContent = ""; thinkingBox.dataset.key = key; }
    pre.textContent += t.delta;
    pre.scrollTop = pre.scrollHeight;
    thinkingBox.hidden = false;
  }
  function clearThinking() {
    if (!thinkingBox) return;
    thinkingBox.hidden = true;
    thinkingBox.dataset.key = "";
    field(thinkingBox, "thinking").textContent = "";
  }

  // Same as console/gateway/present.py:host_signature.
  function hostSignature(h) {
    var phones = h.devices.map(function (d) { return d.serial + "=" + d.state + "=" + d.model; });
    return (h.connected ? "on" : "off") + "|" + h.planner_transport + "|" + h.agent_version +
      "|" + phones.join(";") + "|" + (h.outbox ? h.outbox.items : "");
  }

  // `on` maps event names ("task", "host", "thinking", "end") to handlers of their JSON data.
  function listen(url, on) {
    var source = new EventSource(url);
    source.onopen = function () { liveState("live", "on"); };
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED) {
        liveState("disconnected — reload the page", "off"); // e.g. the session ended
      } else {
        liveState("reconnecting…", "off");
      }
    };
    ["task", "host", "thinking"].forEach(function (name) {
      if (on[name]) {
        source.addEventListener(name, function (e) { on[name](JSON.parse(e.data)); });
      }
    });
    source.addEventListener("end", function () {
      source.close();
      liveState("ended", "off");
      if (on.end) on.end();
    });
    source.addEventListener("cloud-error", function (e) {
      var err = JSON.parse(e.data);
      if (err.grpc_code === "NOT_FOUND" || err.grpc_code === "PERMISSION_DENIED") {
        source.close();
        liveState(err.detail, "off");
      }
    });
    window.addEventListener("pagehide", function () { source.close(); });
    return source;
  }

  if (mode === "tasks") {
    var insert = body.dataset.liveInsert === "1";
    listen("/api/events", { task: function (t) {
      var row = document.querySelector('tr[data-task-id="' + CSS.escape(t.task_id) + '"]');
      if (row) patch(row, t);
      else if (insert) refresh("#task-rows");
    } });
  } else if (mode === "task") {
    var id = body.dataset.taskId;
    listen("/api/tasks/" + encodeURIComponent(id) + "/events", { task: function (t) {
      var root = document.getElementById("live-task");
      if (!root) return;
      patch(root.querySelector(".summary") || root, t);
      // A decision is logged while the step is planned, so every step-status change may
      // bring a new one: re-render the attempts and history then.
      var step = t.progress ? t.progress.step_index + "·" + t.progress.step_status : "0·unspecified";
      if (root.dataset.step !== step || root.dataset.status !== t.status ||
          root.dataset.attempt !== String(t.attempt)) {
        root.dataset.step = step;
        root.dataset.status = t.status;
        root.dataset.attempt = String(t.attempt);
        // A renewal saying "planning" may arrive after the thinking began: keep the text then.
        if (!t.progress || t.progress.step_status !== "planning") clearThinking();
        refresh("#live-task");
      }
    }, end: clearThinking, thinking: showThinking });
  } else if (mode === "fleet") {
    // A host's "last seen" is patched in place; anything else that differs from the card (a new
    // host, connected or not, its phones) re-renders the fleet from the server, which also keeps
    // the order (connected first). Each (re)connection starts with every host, so nothing that
    // changed while the stream was down stays stale.
    listen("/api/hosts/events", { host: function (h) {
      var card = document.querySelector('section[data-host-id="' + CSS.escape(h.host_id) + '"]');
      if (!card || card.dataset.sig !== hostSignature(h)) {
        refresh("#live-fleet");
        return;
      }
      var seen = card.querySelector("time[data-ago]");
      if (seen && h.last_seen_at) {
        seen.dataset.ago = h.last_seen_at;
        seen.textContent = ago(h.last_seen_at);
      }
    } });
  }
})();
