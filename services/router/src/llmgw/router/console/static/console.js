// llmgw console: what a page does better with JavaScript on; every form works without it.
"use strict";

// A form (or the button pressed) with data-confirm asks first.
document.addEventListener("submit", function (e) {
  var b = e.submitter;
  var msg = (b && b.getAttribute("data-confirm")) || e.target.getAttribute("data-confirm");
  if (msg && !window.confirm(msg)) { e.preventDefault(); }
});

// Parts of a page marked data-live follow the fleet: the page (body's data-refresh) is asked again every few seconds
// and each such part (by id) replaced with its new self, except a part holding a form being
// filled in (one with a changed field, or the field in focus): that is never refreshed away.
(function () {
  var every = 3000;
  var dirty = new WeakSet();
  document.addEventListener("input", function (e) { if (e.target.form) dirty.add(e.target.form); });
  function busy(part) {
    if (part.contains(document.activeElement) && document.activeElement !== document.body) return true;
    var forms = part.querySelectorAll("form");
    for (var i = 0; i < forms.length; i++) { if (dirty.has(forms[i])) return true; }
    return false;
  }
  function refresh() {
    var parts = document.querySelectorAll("[data-live][id]");
    var url = document.body.getAttribute("data-refresh");
    if (!parts.length || !url || document.hidden) return;
    fetch(url, { credentials: "same-origin" })
      .then(function (r) { return r.ok && !r.redirected ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html");
        parts.forEach(function (part) {
          var next = fresh.getElementById(part.id);
          if (next && !busy(part) && next.innerHTML !== part.innerHTML) {
            part.innerHTML = next.innerHTML;
            part.dispatchEvent(new CustomEvent("console:refreshed", { bubbles: true }));
          }
        });
      })
      .catch(function () {});
  }
  setInterval(refresh, every);
})();
