// Refreshes the overview's counts from the JSON API without reloading the page.
(function () {
  "use strict";
  var table = document.getElementById("queues");
  if (!table) { return; }
  var api = table.getAttribute("data-api");
  function set(row, field, value) {
    var cell = row.querySelector('[data-field="' + field + '"]');
    if (cell) { cell.textContent = value; }
  }
  function refresh() {
    fetch(api, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
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
  }
  setInterval(refresh, 2000);
})();
