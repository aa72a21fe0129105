// The console's only script (the Content-Security-Policy allows no other): it refreshes
// the overview's and the groups' counts from the JSON API without reloading the page, and
// selects messages with the list's checkboxes.
(function () {
  "use strict";
  function getJSON(api) {
    return fetch(api, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); });
  }
  function set(row, field, value) {
    var cell = row.querySelector('[data-field="' + field + '"]');
    if (cell) { cell.textContent = value; }
  }

  // The overview.
  var table = document.getElementById("queues");
  if (table) {
    var api = table.getAttribute("data-api");
    var refresh = function () {
      if (document.hidden) { return; }
      getJSON(api)
        .then(function (ov) {
          (ov.queues || []).forEach(function (q) {
            var row = table.querySelector('tr[data-queue="' + CSS.escape(q.queue) + '"]');
            if (!row) { return; }
            set(row, "ready", q.ready);
            set(row, "consumers", q.consumers);
            set(row, "unacked", q.unacked === null ? "–" : q.unacked);
            set(row, "dlq", q.dlq);
            set(row, "archive", q.archive);
            set(row, "error", q.error || "");
            row.querySelector('[data-field="dlq"]').className = q.dlq > 0 ? "bad" : "";
          });
          document.getElementById("unrouted").textContent = ov.unrouted === null ? "not declared" : ov.unrouted;
          document.getElementById("refreshed").textContent = "Last refresh " + new Date().toLocaleTimeString();
        })
        .catch(function (e) {
          document.getElementById("refreshed").textContent = "Refresh failed: " + e.message;
        });
    };
    setInterval(refresh, 2000);
  }

  // A queue's failure groups: counts updated in place; a group that appeared is announced
  // (a reload shows it), one that is gone shows 0.
  var groups = document.getElementById("groups");
  if (groups && groups.getAttribute("data-api")) {
    var gapi = groups.getAttribute("data-api");
    var stamp = document.getElementById("groups-refreshed");
    var news = document.getElementById("groups-new");
    var refreshGroups = function () {
      // Each refresh reads the whole queue: none while the page is not seen.
      if (document.hidden) { return; }
      getJSON(gapi)
        .then(function (res) {
          var seen = {};
          var fresh = 0;
          (res.groups || []).forEach(function (g) {
            seen[g.id] = true;
            var row = groups.querySelector('tr[data-group="' + CSS.escape(g.id) + '"]');
            if (!row) { fresh++; return; }
            set(row, "count", g.count);
          });
          groups.querySelectorAll("tr[data-group]").forEach(function (row) {
            if (!seen[row.getAttribute("data-group")]) { set(row, "count", 0); }
          });
          document.getElementById("groups-total").textContent = res.total;
          news.textContent = fresh > 0 ? fresh + " new group(s): reload to see them." : "";
          stamp.textContent = "Last refresh " + new Date().toLocaleTimeString();
        })
        .catch(function (e) { stamp.textContent = "Refresh failed: " + e.message; });
    };
    setInterval(refreshGroups, 5000);
  }

  // The message list's selection.
  var all = document.getElementById("select-all");
  var selection = document.getElementById("selection");
  if (selection) {
    var count = document.getElementById("selected-count");
    var boxes = function () { return selection.querySelectorAll("input.select"); };
    var update = function () {
      var n = selection.querySelectorAll("input.select:checked").length;
      count.textContent = n > 0 ? n + " selected" : "select messages with the checkboxes";
      selection.querySelectorAll(".selection-ops button[name=op]").forEach(function (b) { b.disabled = n === 0; });
    };
    if (all) {
      all.addEventListener("change", function () {
        boxes().forEach(function (b) { if (!b.disabled) { b.checked = all.checked; } });
        update();
      });
    }
    selection.addEventListener("change", update);
    update();
  }
})();
