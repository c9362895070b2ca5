// A step's prompts load when their <details> is opened, on both consoles (the operators' and
// the host's). Inline, every step's prompts made a long task's page megabytes; the link inside
// leads to their own page, which works without script, and here that page's body takes its
// place. Shared (webui/static) so the two consoles cannot drift apart; a page that merges
// fresh steps in place (live.js) calls `amcPrompts.loadOpen()` after each merge, so a step
// replaced by its fresh copy keeps its open prompts.
(function () {
  "use strict";

  function load(box) {
    if (!box.open || box.hasAttribute("data-loaded")) return;
    box.setAttribute("data-loaded", "");
    fetch(box.getAttribute("data-src"), { headers: { Accept: "text/html" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        var fresh = html && new DOMParser().parseFromString(html, "text/html").querySelector(".prompts-body");
        var mine = box.querySelector(".prompts-body");
        if (fresh && mine) mine.replaceWith(document.importNode(fresh, true));
        else box.removeAttribute("data-loaded");  // closing and opening it asks again
      })
      .catch(function () { box.removeAttribute("data-loaded"); });
  }

  function loadOpen() {
    document.querySelectorAll("details.prompts[data-src][open]").forEach(load);
  }

  document.addEventListener("toggle", function (e) {
    var box = e.target;
    if (box.matches && box.matches("details.prompts[data-src]")) load(box);
  }, true);
  window.amcPrompts = { loadOpen: loadOpen };
  loadOpen();
})();
