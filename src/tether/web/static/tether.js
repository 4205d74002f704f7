// The Tether dashboard's only script. Every page works without it (a reload refreshes,
// forms post as they are); with it: the live refresh of the overview (pausable), a
// confirmation before destructive writes, and "select all" for bulk dead-letter actions.
// No inline script anywhere: the pages' Content-Security-Policy forbids it.
"use strict";

(function () {
  var PAUSED_KEY = "tether.live.paused";

  function stored(key) {
    try { return window.localStorage.getItem(key); } catch (e) { return null; }
  }

  function store(key, value) {
    try {
      if (value === null) { window.localStorage.removeItem(key); }
      else { window.localStorage.setItem(key, value); }
    } catch (e) { /* private mode: the choice lasts for this page only */ }
  }

  // The pages give every time in UTC, 24-hour (tether.web._format.utc): so does this one.
  function clock() {
    return new Date().toISOString().slice(11, 19) + " UTC";
  }

  // -- live refresh: fetch the region's fragment every few seconds, never two at once ---
  function live(region) {
    var control = document.querySelector("[data-live-control]");
    var status = control && control.querySelector("[data-live-status]");
    var toggle = control && control.querySelector("[data-live-toggle]");
    var interval = parseInt(region.getAttribute("data-live-interval"), 10) || 2000;
    var url = region.getAttribute("data-live");
    var paused = stored(PAUSED_KEY) === "1";
    var stopped = false;
    var timer = null;

    function show(state, words) {
      if (!control) { return; }
      control.setAttribute("data-state", state);
      if (status) { status.textContent = words; }
      if (toggle) { toggle.textContent = paused ? "Resume updates" : "Pause updates"; }
    }

    function schedule() {
      window.clearTimeout(timer);
      if (!stopped && !paused) { timer = window.setTimeout(refresh, interval); }
    }

    function refresh() {
      if (paused || stopped) { return; }
      if (document.hidden) { schedule(); return; }  // a hidden tab costs the server nothing
      fetch(url, {
        headers: { "Accept": "text/html", "X-Requested-With": "fetch" },
        credentials: "same-origin",
        cache: "no-store"
      }).then(function (response) {
        if (response.ok && response.headers.get("X-Tether-Fragment") === "1") {
          return response.text().then(function (html) {
            region.innerHTML = html;
            show("live", "Live · updated " + clock());
          });
        }
        if (response.status === 401 || response.status === 403 || response.ok) {
          // A login page instead of the fragment: the session ended.
          stopped = true;
          show("error", "Signed out: reload the page to sign in again");
          return null;
        }
        show("error", "Refresh failed (" + response.status + "), retrying");
        return null;
      }, function () {
        show("error", "The dashboard cannot be reached, retrying");
      }).then(schedule, schedule);
    }

    if (control) { control.hidden = false; }
    if (toggle) {
      toggle.addEventListener("click", function () {
        paused = !paused;
        store(PAUSED_KEY, paused ? "1" : null);
        if (paused) {
          window.clearTimeout(timer);
          show("paused", "Paused");
        } else {
          show("live", "Live");
          refresh();
        }
      });
    }
    document.addEventListener("visibilitychange", function () {
      if (!document.hidden && !paused && !stopped) { refresh(); }
    });
    show(paused ? "paused" : "live", paused ? "Paused" : "Live · updated " + clock());
    schedule();
  }

  // -- confirmation before a destructive write -------------------------------------------
  document.addEventListener("submit", function (event) {
    var button = event.submitter;
    var words = (button && button.getAttribute("data-confirm")) ||
      event.target.getAttribute("data-confirm");
    if (words && !window.confirm(words)) { event.preventDefault(); }
  });

  // -- bulk selection: "select all", and bulk buttons enabled by a selection -------------
  function selection(form) {
    var boxes = form.querySelectorAll("input[type=checkbox][name=ids]");
    var chosen = 0;
    boxes.forEach(function (box) { if (box.checked) { chosen += 1; } });
    form.querySelectorAll("[data-needs-selection]").forEach(function (button) {
      button.disabled = chosen === 0;
    });
    var all = form.querySelector("input[data-select-all]");
    if (all) {
      all.checked = chosen > 0 && chosen === boxes.length;
      all.indeterminate = chosen > 0 && chosen < boxes.length;
    }
    var counter = form.querySelector("[data-selected-count]");
    if (counter) { counter.textContent = chosen ? chosen + " selected" : ""; }
  }

  document.addEventListener("change", function (event) {
    var target = event.target;
    var form = target.form;
    if (!form) { return; }
    if (target.hasAttribute("data-select-all")) {
      form.querySelectorAll("input[type=checkbox][name=ids]").forEach(function (box) {
        box.checked = target.checked;
      });
    }
    if (target.name === "ids" || target.hasAttribute("data-select-all")) { selection(form); }
    if (target.hasAttribute("data-autosubmit")) { form.submit(); }
  });

  function start() {
    document.querySelectorAll("form[data-bulk]").forEach(selection);
    var region = document.querySelector("[data-live]");
    if (region) { live(region); }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
