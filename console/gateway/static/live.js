// Live updates for the console pages, fed by server-sent events (ProgressService.WatchProgress,
// FleetService.WatchHosts). No framework, no build: pages are server-rendered; this script
// patches them in place. Fields are patched from the event; a section that needs the server
// (a new task row, a new attempt or step, a host's phones) is fetched and merged block by
// block (blocks keyed by id), so the header is never redrawn, unchanged blocks are left alone,
// open <details> stay open and keyboard focus stays where it was. Status changes are said in
// the page's polite live region (#announcer) for screen readers.
(function () {
  "use strict";

  var body = document.body;
  var mode = body.dataset.live;

  // --- wording: the same as console/wording.py and console/gateway/present.py -------------

  var STEP_WORDS = {
    perceiving: "looking at the screen",
    planning: "planning",
    acting: "acting",
    succeeded: "action done",
    failed: "action failed"
  };
  var TERMINAL = { succeeded: true, failed: true, cancelled: true };

  // wording.step_line: what the step did, never the task's status.
  function stepLine(p, status) {
    if (!p) return "";
    if (!p.step_index) return p.summary || "";
    var terminal = !!TERMINAL[status];
    var head = terminal ? "last step " + p.step_index
      : "step " + p.step_index + (p.max_steps ? " of at most " + p.max_steps : "");
    var parts = [head];
    if (STEP_WORDS[p.step_status]) parts.push(STEP_WORDS[p.step_status]);
    var prefix = "step " + p.step_index + ": ";
    var text = p.summary || "";
    if (text.indexOf(prefix) === 0) text = text.slice(prefix.length);
    if (text && text !== STEP_WORDS[p.step_status]) parts.push(text);
    return parts.join(" · ");
  }

  function pad2(n) { return (n < 10 ? "0" : "") + n; }

  // wording.duration
  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    if (seconds < 1) return Math.round(seconds * 1000) + " ms";
    var whole = Math.floor(seconds);
    if (whole < 60) return whole + " s";
    if (whole < 3600) return Math.floor(whole / 60) + "m " + pad2(whole % 60) + "s";
    return Math.floor(whole / 3600) + "h " + pad2(Math.floor((whole % 3600) / 60)) + "m";
  }

  // wording.tokens
  function tokens(n) {
    if (n < 1000) return String(n);
    if (n < 1000000) return (n / 1000).toFixed(1) + "k";
    return (n / 1000000).toFixed(1) + "M";
  }

  // planner.decision.billed_tokens
  function totalTokens(t) {
    return t.input_tokens + t.output_tokens + t.cache_read_input_tokens +
      t.cache_creation_input_tokens;
  }

  // planner.budget.dollars
  function usd(v) {
    if (v < 1) return "$" + v.toFixed(4);
    return "$" + v.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  }

  // present.totals_line
  function totalsLine(t) {
    var parts = [t.steps + " step" + (t.steps === 1 ? "" : "s")];
    if (totalTokens(t)) {
      parts.push(tokens(totalTokens(t)) + " tokens");
      if (t.usage.cost_usd) parts.push(usd(t.usage.cost_usd));
    }
    parts.push(duration(t.wall_time_s));
    return parts.join(" · ");
  }

  // _cost.html's budget_line, after its "of the budget:"
  function budgetLine(b, t) {
    var parts = [];
    if (b.max_tokens) {
      parts.push(" " + totalTokens(t).toLocaleString("en-US") + " / " +
        b.max_tokens.toLocaleString("en-US") + " tokens");
    }
    if (b.max_cost_usd) parts.push(" " + usd(t.usage.cost_usd) + " / " + usd(b.max_cost_usd));
    return " of the budget:" + parts.join(";");
  }

  // present.attempt_label
  function attemptLabel(t) {
    if (!t.attempt) return "not assigned yet (" + t.max_attempts + " allowed)";
    return "attempt " + t.attempt + " of " + t.max_attempts;
  }

  // present.ago
  function ago(iso) {
    var s = Math.max(0, Math.floor((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return s + "s ago";
    if (s < 3600) return Math.floor(s / 60) + "m ago";
    if (s < 86400) return Math.floor(s / 3600) + "h ago";
    return Math.floor(s / 86400) + "d ago";
  }

  // present.when: the moment in full, UTC (a relative time's title)
  function when(iso) {
    var d = new Date(iso);
    return isNaN(d.getTime()) ? "" : d.toISOString().slice(0, 19).replace("T", " ") + " UTC";
  }

  // A relative time moved to a new moment: its text, and its title saying when in full.
  function setAgo(el, iso) {
    el.dataset.ago = iso;
    el.textContent = ago(iso);
    el.title = when(iso);
  }

  // present.until
  function until(iso) {
    var s = Math.trunc((Date.parse(iso) - Date.now()) / 1000);
    if (s >= 0) return "in " + (s ? duration(s) : "0 s");
    return duration(-s) + " ago";
  }

  // Keep every relative time on the page (or in a fetched fragment) current.
  function tick(root) {
    (root || document).querySelectorAll("time[data-ago]").forEach(function (el) {
      if (el.dataset.ago) el.textContent = ago(el.dataset.ago);
    });
    (root || document).querySelectorAll("time[data-until]").forEach(function (el) {
      if (el.dataset.until) el.textContent = until(el.dataset.until);
    });
  }
  setInterval(tick, 1000);

  // --- screen readers -----------------------------------------------------------------------

  var announcer = document.getElementById("announcer");
  function announce(text) {
    if (!announcer) return;
    // A repeat of the same words is still read: clear first, then say it on the next frame.
    announcer.textContent = "";
    window.requestAnimationFrame(function () { announcer.textContent = text; });
  }

  // --- keyboard focus across a merge ----------------------------------------------------------

  // Where focus is, as (closest id, tag, index among that tag inside it): found again after
  // the block around it was replaced by a fresh copy.
  function focusKey() {
    var el = document.activeElement;
    if (!el || el === document.body) return null;
    var anchor = el.id ? el : el.closest("[id]");
    if (!anchor) return null;
    var index = el === anchor ? -1
      : Array.prototype.indexOf.call(anchor.querySelectorAll(el.tagName), el);
    return { id: anchor.id, tag: el.tagName, index: index };
  }

  function restoreFocus(key) {
    if (!key) return;
    var active = document.activeElement;
    if (active && active !== document.body && document.contains(active)) return;
    var anchor = document.getElementById(key.id);
    if (!anchor) return;
    var el = key.index < 0 ? anchor : anchor.querySelectorAll(key.tag)[key.index];
    if (el && el.focus) el.focus({ preventScroll: true });
  }

  // --- merging a fresh copy of a section --------------------------------------------------------

  // The fresh copy keeps the operator's open/closed <details>.
  function keepOpen(current, fresh) {
    fresh.querySelectorAll("details[id]").forEach(function (d) {
      var mine = document.getElementById(d.id);
      if (mine && current.contains(mine)) d.open = mine.open;
    });
    if (fresh.tagName === "DETAILS" && current.tagName === "DETAILS") fresh.open = current.open;
  }

  // Make `current` look like `fresh`: children of a [data-keyed] element are matched by id
  // (new ones inserted in place, gone ones removed, the rest merged); any other element is
  // replaced only when it differs. `insertOnly` leaves existing keyed children as they are.
  function merge(current, fresh, insertOnly) {
    if (current.hasAttribute("data-keyed")) {
      mergeChildren(current, fresh, insertOnly);
      return current;
    }
    keepOpen(current, fresh);
    if (current.isEqualNode(fresh)) return current;
    var copy = document.importNode(fresh, true);
    current.replaceWith(copy);
    return copy;
  }

  // Merge `fresh`, which holds some of `current`'s keyed children (the last ones shown and
  // those after them), into it: known ones merged where they are, new ones placed after the
  // fresh child before them, none removed.
  function upsertChildren(current, fresh) {
    var previous = null;
    Array.prototype.forEach.call(fresh.children, function (freshChild) {
      var node = freshChild.id ? document.getElementById(freshChild.id) : null;
      if (node && current.contains(node)) {
        node = merge(node, freshChild, false);
      } else if (freshChild.id) {
        node = document.importNode(freshChild, true);
        current.insertBefore(node, previous ? previous.nextElementSibling : null);
      } else {
        return;
      }
      previous = node;
    });
  }

  // Whether `mine` (a task row as live events patched it) shows a later moment of its task
  // than `fetched`: a fetch of the page that read its rows before an event's change, answered
  // after the event was patched in, would put the older step back (until the next change).
  function newer(mine, fetched) {
    var a = mine.querySelector('[data-field="updated"]');
    var b = fetched.querySelector('[data-field="updated"]');
    return !!(a && b && a.dataset.ago && b.dataset.ago &&
      Date.parse(a.dataset.ago) > Date.parse(b.dataset.ago));
  }

  function mergeChildren(current, fresh, insertOnly) {
    var existing = {};
    Array.prototype.forEach.call(current.children, function (child) {
      if (child.id) existing[child.id] = child;
    });
    var wanted = {};
    var previous = null;
    Array.prototype.forEach.call(fresh.children, function (freshChild) {
      var node = freshChild.id ? existing[freshChild.id] : null;
      if (node) {
        if (!insertOnly && !newer(node, freshChild)) node = merge(node, freshChild, false);
      } else {
        node = document.importNode(freshChild, true);
      }
      if (freshChild.id) wanted[freshChild.id] = true;
      var place = previous ? previous.nextElementSibling : current.firstElementChild;
      if (node !== place) current.insertBefore(node, place);
      previous = node;
    });
    Array.prototype.slice.call(current.children).forEach(function (child) {
      if (!child.id || !wanted[child.id]) child.remove();
    });
  }

  // Fetch this page again (or `part`: the URL of a fragment of it, and the selectors whose
  // children it holds only some of, merged by upsertChildren) and merge the given sections
  // (coalesced: one fetch at a time, and one more if asked meanwhile).
  var fetching = false;
  var again = null;
  function refresh(selectors, insertOnly, done, part) {
    if (fetching) { again = [selectors, insertOnly, done, part]; return; }
    fetching = true;
    var url = part ? part.url : window.location.href;
    fetch(url, { headers: { Accept: "text/html" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        // Both copies' relative times read the same moment, so a block that only ticked
        // since it was drawn is left alone rather than replaced.
        tick(doc);
        tick();
        var key = focusKey();
        selectors.forEach(function (selector) {
          var current = document.querySelector(selector);
          var fresh = doc.querySelector(selector);
          if (!current || !fresh) return;
          if (part && part.upsert.indexOf(selector) >= 0) upsertChildren(current, fresh);
          else merge(current, fresh, insertOnly);
        });
        restoreFocus(key);
        window.amcPrompts.loadOpen();  // webui/static/prompts.js
        if (done) done();
      })
      .catch(function () { /* the next event retries */ })
      .finally(function () {
        fetching = false;
        if (again) { var next = again; again = null; refresh(next[0], next[1], next[2], next[3]); }
      });
  }

  // --- patching one task's fields -------------------------------------------------------------

  function field(root, name) {
    return root.querySelector('[data-field="' + name + '"]');
  }

  function setText(root, name, text) {
    var el = field(root, name);
    if (el && el.textContent !== text) el.textContent = text;
    return el;
  }

  // _cost.html's unsettled_note beside the task page's cost: model calls of unknown cost
  // (decision 0080) appear while one is under way and go once it is recorded.
  function unsettledNote(root, u) {
    var cost = field(root, "cost");
    var el = field(root, "unsettled");
    if (!u || !u.calls) {
      if (el) el.remove();
      return;
    }
    if (!cost) return;
    if (!el) {
      el = document.createElement("span");
      el.className = "pill warn";
      el.dataset.field = "unsettled";
      el.title = "model calls a cloud started and never recorded (it stopped or died during " +
        "them): the provider may have billed them, up to this";
      cost.parentNode.append(" ", el);
    }
    var text = (u.calls === 1 ? "1 call" : u.calls.toLocaleString("en-US") + " calls") +
      " of unknown cost (at most " + usd(u.at_most.cost_usd) + ")";
    if (el.textContent !== text) el.textContent = text;
  }

  function timeUntil(iso) {
    var el = document.createElement("time");
    el.dataset.until = iso;
    el.textContent = until(iso);
    return el;
  }

  // Patch every field of one task shown under `root` (a list row or the task page's summary);
  // returns true when its status changed.
  function patch(root, t) {
    var changed = root.dataset.status !== t.status;
    root.dataset.status = t.status;
    var el = field(root, "status");
    if (el) {
      el.className = "pill status-" + t.status;
      setText(root, "status", t.status + (t.cancel_requested ? " · cancelling" : ""));
    }
    el = field(root, "progress");
    if (el) {
      var text = stepLine(t.progress, t.status);
      setText(root, "progress", text || "no step yet");
      el.classList.toggle("empty", !text);
    }
    setText(root, "attempt", attemptLabel(t));
    setText(root, "host", t.host_id || "—");
    setText(root, "device", t.device_serial || (root.tagName === "TR" ? "" : "—"));
    el = field(root, "updated");
    if (el && t.updated_at) setAgo(el, t.updated_at);
    if (t.totals) {
      setText(root, "totals", totalsLine(t.totals));
      setText(root, "steps", String(t.totals.steps));
      setText(root, "decisions", String(t.totals.decisions));
      setText(root, "wall", duration(t.totals.wall_time_s));
      setText(root, "run", duration(t.totals.run_time_s));
      el = field(root, "tokens");
      if (el && totalTokens(t.totals)) {
        var tt = t.totals;
        el.textContent = tokens(totalTokens(tt)) + " ";
        var detail = document.createElement("span");
        detail.className = "muted small";
        // The cache part is reads and writes: the parts add up to the total.
        detail.textContent = "(in " + tokens(tt.input_tokens) + " · out " +
          tokens(tt.output_tokens) + " · cache " +
          tokens(tt.cache_read_input_tokens + tt.cache_creation_input_tokens) + ")";
        el.appendChild(detail);
        el.title = "input " + tt.input_tokens + " · output " + tt.output_tokens +
          " · cache read " + tt.cache_read_input_tokens + " · cache write " +
          tt.cache_creation_input_tokens + " · thinking " + tt.thinking_tokens;
      }
      setText(root, "cost", usd(t.totals.usage.cost_usd));
      if (t.budget) setText(root, "budget", budgetLine(t.budget, t.totals));
      if (root.tagName !== "TR") unsettledNote(root, t.totals.unsettled);
    }
    el = field(root, "lease");
    if (el) {
      el.textContent = "";
      if (t.lease_expires_at) {
        el.append("runs out ", timeUntil(t.lease_expires_at), " unless renewed");
      } else {
        el.textContent = "none live";
      }
    }
    el = field(root, "result");
    if (el) {
      el.hidden = !t.result_summary;
      if (t.result_summary) setText(root, "result", t.result_summary);
      el.className = "result status-" + t.status;
      // The task page draws who asked to cancel after the result, once someone has.
      if (t.cancelled_by && !field(root, "cancelled-by")) {
        var asked = document.createElement("p");
        asked.className = "small muted";
        asked.dataset.field = "cancelled-by";
        el.after(asked);
      }
    }
    if (t.cancelled_by) setText(root, "cancelled-by", "Cancel asked by " + t.cancelled_by + ".");
    if (t.finished_at) setText(root, "finished", when(t.finished_at));
    if (changed && root.tagName === "TR") {
      root.classList.remove("flash");
      void root.offsetWidth; // restart the highlight animation
      root.classList.add("flash");
    }
    return changed;
  }

  // --- connection state -------------------------------------------------------------------------

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

  // A stream the console refused (401) closes with no reason given. When the page itself now
  // leads to the login (logged out in another tab, or the console restarted), say so and link
  // the login that brings the operator back here, instead of "disconnected — reload".
  function sessionEnded() {
    fetch(window.location.href, { credentials: "same-origin", redirect: "manual", cache: "no-store" })
      .then(function (r) {
        if (r.type !== "opaqueredirect") return;
        liveState("logged out — ", "off");
        var link = document.createElement("a");
        link.href = "/login?next=" + encodeURIComponent(window.location.pathname + window.location.search);
        link.textContent = "log in again";
        link.dataset.field = "log-in-again";
        document.getElementById("live-state").appendChild(link);
      })
      .catch(function () { /* the console is unreachable: "disconnected" stays */ });
  }

  // `on` maps event names ("task", "host", "thinking", "end") to handlers of their JSON data;
  // `on.open` runs each time the stream (re)opens.
  function listen(url, on) {
    var source = new EventSource(url);
    source.onopen = function () {
      liveState("live", "on");
      if (on.open) on.open();
    };
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED) {
        liveState("disconnected — reload the page", "off");
        sessionEnded();
      } else {
        liveState("reconnecting…", "off");
      }
    };
    ["task", "host", "thinking", "scope"].forEach(function (name) {
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
      // Reconnecting would be refused the same way (INVALID_ARGUMENT: a page token the cloud
      // does not take for this listing).
      if (err.grpc_code === "NOT_FOUND" || err.grpc_code === "PERMISSION_DENIED" ||
          err.grpc_code === "INVALID_ARGUMENT") {
        source.close();
        liveState(err.detail, "off");
      }
    });
    // The console itself failed (its log says why): reconnecting would fail the same way.
    source.addEventListener("stream-error", function (e) {
      source.close();
      liveState(JSON.parse(e.data).detail + " — reload the page", "off");
    });
    window.addEventListener("pagehide", function () { source.close(); });
    return source;
  }

  // --- a link to a step (#step-<decision id>) opens that step ---------------------------------

  function openFromHash() {
    var target = window.location.hash && document.getElementById(window.location.hash.slice(1));
    if (target && target.tagName === "DETAILS") {
      target.open = true;
      target.scrollIntoView({ block: "start" });
    }
  }
  openFromHash();
  window.addEventListener("hashchange", openFromHash);

  // --- the model's thinking as it streams (session mode) ----------------------------------------

  // Shown while a step is planned, cleared when the step moves on (its decision, with the
  // stored thinking, appears in the history).
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

  // present.host_signature
  function hostSignature(h) {
    var phones = h.devices.map(function (d) {
      return d.serial + "=" + d.state + "=" + d.model + "=" + (d.reason || "");
    });
    var busy = (h.busy_phones || []).map(function (b) {
      return b.device_serial + "=" + b.task_id + "=" + b.attempt;
    });
    return (h.connected ? (h.stopping_since ? "stopping" : "on") : "off") + "|" + h.planner_transport + "|" + h.agent_version +
      "|" + phones.join(";") + "|" + busy.join(";") + "|" + (h.outbox ? h.outbox.items : "") +
      "|" + (h.held_back ? h.held_back.task_id : "");
  }

  // --- host fields: suggestions as the operator types --------------------------------------------

  // The page draws a host field's first suggestions (pages.host_choices: one page of hosts,
  // never the fleet); typing asks /api/hosts for a page of those whose id holds the text and
  // fills the field's list, and a phone field's with those hosts' phones. Without this script
  // the field takes any id all the same.
  function option(value, label) {
    var el = document.createElement("option");
    el.value = value;
    el.textContent = label;
    return el;
  }
  document.querySelectorAll("input[data-suggest-hosts]").forEach(function (input) {
    var hostList = document.getElementById(input.getAttribute("list"));
    var phoneList = input.dataset.suggestPhones
      ? document.getElementById(input.dataset.suggestPhones) : null;
    var asked = input.value.trim();
    var timer = null;
    var latest = 0;
    input.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () {
        var text = input.value.trim().slice(0, 128);
        if (text === asked) return;
        asked = text;
        var mine = ++latest;
        var url = "/api/hosts?page_size=" + encodeURIComponent(input.dataset.suggestHosts) +
          "&q=" + encodeURIComponent(text);
        fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
          .then(function (r) { return r.ok ? r.json() : null; })
          .then(function (page) {
            if (!page || mine !== latest) return; // an answer to an older text
            if (hostList) {
              hostList.replaceChildren.apply(hostList, page.hosts.map(function (h) {
                return option(h.host_id, h.connected ? "connected" : "disconnected");
              }));
            }
            if (phoneList) {
              var phones = [];
              page.hosts.forEach(function (h) {
                h.devices.forEach(function (d) {
                  phones.push(option(d.serial, h.host_id + " · " + d.state));
                });
              });
              phoneList.replaceChildren.apply(phoneList, phones);
            }
          })
          .catch(function () { /* the suggestions stay as they were */ });
      }, 200);
    });
  });

  // history.verdict_counts over the steps an attempt's history shows (a live fragment holds
  // only its last steps), plus those of its earlier steps the page leaves out (`data-earlier`:
  // their verdicts no longer change).
  function recount(attempt) {
    var box = document.getElementById("steps-" + attempt);
    var line = box && box.querySelector(".verdict-counts");
    if (!line) return;
    var counts = { "met": 0, "not met": 0, "unknown": 0, "unchecked": 0 };
    var earlier = line.dataset.earlier ? JSON.parse(line.dataset.earlier) : {};
    Object.keys(counts).forEach(function (k) { counts[k] += earlier[k] || 0; });
    box.querySelectorAll("details.step[data-verdict]").forEach(function (d) {
      if (counts.hasOwnProperty(d.dataset.verdict)) counts[d.dataset.verdict] += 1;
    });
    ["met", "not met", "unknown"].forEach(function (k) {
      var el = line.querySelector('[data-count="' + k + '"]');
      if (el) el.textContent = counts[k] + " " + k;
    });
    var unchecked = line.querySelector('[data-count="unchecked"]');
    if (counts.unchecked && !unchecked) {
      unchecked = document.createElement("span");
      unchecked.className = "pill muted";
      unchecked.dataset.count = "unchecked";
      line.append(" ", unchecked);
    }
    if (unchecked && counts.unchecked) unchecked.textContent = counts.unchecked + " not checked yet";
    else if (unchecked) unchecked.remove();
  }

  // --- the pages ------------------------------------------------------------------------------

  if (mode === "tasks") {
    var insert = body.dataset.liveInsert === "1";
    // Without the stream's snapshot (every unfinished task in the cloud, thousands on a busy
    // fleet, for rows mostly not on this page): the rows are fetched again instead whenever
    // the stream (re)opens, which also catches up on what changed while it was down.
    listen("/api/events?snapshot=false", { open: function () {
      refresh(["#task-rows"], false);
    }, task: function (t) {
      var row = document.getElementById("task-" + t.task_id);
      if (row) {
        if (patch(row, t)) announce(row.dataset.goal + ": " + t.status);
      } else if (insert) {
        refresh(["#task-rows"], true, function () {
          if (document.getElementById("task-" + t.task_id)) {
            announce("New task: " + t.goal + " (" + t.status + ")");
          }
        });
      }
    } });
  } else if (mode === "task") {
    var id = body.dataset.taskId;
    var summary = document.getElementById("summary");
    var live = document.getElementById("live-task");
    listen("/api/tasks/" + encodeURIComponent(id) + "/events", { task: function (t) {
      if (summary && patch(summary, t)) {
        announce("Task " + t.status + (t.result_summary ? ": " + t.result_summary : ""));
      }
      if (TERMINAL[t.status]) {
        var cancel = document.querySelector('[data-field="cancel"]');
        if (cancel) {
          var hadFocus = document.activeElement === cancel;
          cancel.remove();
          if (hadFocus) document.getElementById("task-title").focus({ preventScroll: true });
        }
        // An ended task can be submitted again (the page's template draws the same link),
        // by an operator: a viewer's page (data-read-only) has no link to submit or cancel.
        var actions = document.querySelector(".heading .actions");
        if (actions && !actions.dataset.readOnly && !field(actions, "again")) {
          var again = document.createElement("a");
          again.className = "button";
          again.href = "/tasks/new?again=" + encodeURIComponent(id);
          again.dataset.field = "again";
          again.title = "The submit form filled in from this task: its goal, target, " +
            "attempts and replay choice";
          again.textContent = "Submit again…";
          actions.appendChild(again);
        }
      }
      if (!live) return;
      var step = t.progress ? t.progress.step_index + "·" + t.progress.step_status : "0·unspecified";
      if (live.dataset.step !== step) {
        // A renewal saying "planning" may arrive after the thinking began: keep the text then.
        if (!t.progress || t.progress.step_status !== "planning") clearThinking();
      }
      live.dataset.step = step;
      live.dataset.status = t.status;
      live.dataset.attempt = String(t.attempt);
      live.dataset.decisions = String(t.totals ? t.totals.decisions : 0);
      // Every change may bring a lease event, a renewal or a decision. A step of the attempt
      // whose steps the page shows fetches that attempt's card and its steps from
      // the last one shown on (its outcome, verdict and screenshots may have come since),
      // not the whole page and log again; anything else (a new attempt, its first step, the
      // end with its totals and notes) merges the attempts and the history from the page.
      var stepsBox = document.getElementById("steps-" + t.attempt);
      var shown = stepsBox ? stepsBox.querySelectorAll("details.step[data-step]") : [];
      if (shown.length && !TERMINAL[t.status]) {
        var last = Number(shown[shown.length - 1].dataset.step);
        var box = "#steps-" + t.attempt;
        // Earlier attempts' cards do not change while this one runs.
        refresh(["#attempt-" + t.attempt, box], false, function () { recount(t.attempt); }, {
          url: "/tasks/" + encodeURIComponent(id) + "/live?attempt=" + t.attempt +
            "&after_step=" + Math.max(0, last - 1),
          upsert: [box]
        });
      } else {
        refresh(["#attempts", "#history"], false);
      }
    }, end: clearThinking, thinking: showThinking });
  } else if (mode === "fleet") {
    // A host's "last seen" is patched in place; anything else that differs from its card (a
    // new host, connected or not, its phones, busy or idle) merges this page of the fleet
    // from the server, which also keeps the order (by id). A host without a card is this
    // page's when it is in the page's filter (and, from a cloud before scopes, between its
    // first and last host: `onThisPage`). Without the
    // stream's snapshot (this page's hosts): the page is fetched again whenever the
    // stream (re)opens, which also catches up on what changed while it was down. A page of
    // the connected (or disconnected) hosts only: a host without a card that is not such is
    // not this page's; one with a card that stopped being such differs from its card, and the
    // page fetched again (its URL keeps the filter) leaves it out.
    // The stream is this page's (its connection, page size and token: the cloud sends the
    // changes of the hosts in the page's range of ids only, not the fleet's). Its `scope`
    // event says where the cloud fixed that range's end; once the page fetched again ends
    // elsewhere (hosts that left it pulled later ones on), the page watches again.
    var source = null;
    var streamLast = null;  // the stream's last key, once its `scope` event came
    var scoped = function () {
      var pager = document.getElementById("fleet-pager");
      if (pager && streamLast !== null && pager.dataset.lastKey !== streamLast) watch();
    };
    // A scoped stream carries this page's range only, which starts after the previous page's
    // last host: a host added before this page's first card is this page's all the same
    // (ListHosts lists it here now). Its range is checked here only for a cloud from before
    // scopes (no `scope` event), which streams every host.
    var onThisPage = function (h) {
      var pager = document.getElementById("fleet-pager");
      var key = h.host_id;  // as present.host_key: ListHosts' order
      var first = pager ? pager.dataset.firstKey : "";
      var last = pager ? pager.dataset.lastKey : "";
      var connection = pager ? pager.dataset.connection : "any";
      if (connection === "connected" && !h.connected) return false;
      if (connection === "disconnected" && h.connected) return false;
      if (streamLast !== null) return true;
      return (!first || key >= first) && (!last || key <= last);
    };
    var onHost = function (h) {
      var card = document.getElementById("host-" + h.host_id);
      var signature = hostSignature(h);
      if (!card && !onThisPage(h)) return;
      if (!card || card.dataset.sig !== signature) {
        var was = card ? card.dataset.sig.split("|")[0] : null;
        var now = h.connected ? "on" : "off";
        refresh(["#live-fleet", "#fleet-pager"], false, function () {
          if (was !== null && was !== now) {
            announce("Host " + h.host_id + (h.connected ? " connected" : " disconnected"));
          }
          scoped();
        });
        return;
      }
      var seen = card.querySelector("time[data-ago]");
      if (seen && h.last_seen_at) setAgo(seen, h.last_seen_at);
    };
    var watch = function () {
      if (source) source.close();
      streamLast = null;
      var url = "/api/hosts/events?snapshot=false";
      var pager = document.getElementById("fleet-pager");
      if (pager) {
        url += "&connection=" + encodeURIComponent(pager.dataset.connection || "any") +
          "&page_size=" + encodeURIComponent(pager.dataset.pageSize || "0") +
          "&page_token=" + encodeURIComponent(pager.dataset.pageToken || "");
      }
      source = listen(url, { open: function () {
        refresh(["#live-fleet", "#fleet-pager"], false, scoped);
      }, host: onHost, scope: function (s) {
        streamLast = s.last_key;
        scoped();
      } });
    };
    watch();
  }
})();
