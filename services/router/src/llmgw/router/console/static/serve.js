// llmgw console, the serve form with JavaScript on: the catalog's plan is asked again as the
// context, cores, slots or the judge box change and its part of the form swapped in (the rest of the form, being
// filled in, is left as it is); the "run on the CPU anyway" box follows the way chosen. Without
// it the Recompute button does the same.
"use strict";

(function () {
  var form = document.getElementById("serve-form");
  var part = document.getElementById("serve-plan");
  if (!form || !part) return;
  var timer = null;
  var asked = 0;

  function query() {
    var q = new URLSearchParams();
    ["source", "context", "cores", "slots"].forEach(function (name) { q.set(name, form.elements[name].value); });
    var way = form.querySelector("input[name=way]:checked");
    if (way) q.set("way", way.value);
    var box = form.querySelector("input[name=cpu_anyway]");
    if (box && box.checked) q.set("cpu_anyway", "1");
    if (form.elements.judge && form.elements.judge.checked) q.set("judge", "1");
    return q.toString();
  }

  // The box is shown where the way chosen needs it (each radio says whether it does).
  function followWay() {
    var way = form.querySelector("input[name=way]:checked");
    var box = document.getElementById("serve-anyway");
    if (box) box.hidden = !(way && way.getAttribute("data-anyway") === "1");
  }

  function ask() {
    var mine = ++asked;
    part.setAttribute("aria-busy", "true");
    fetch(form.getAttribute("data-plan") + "?" + query(), { credentials: "same-origin" })
      .then(function (r) { return r.redirected ? null : r.text(); })
      .then(function (html) {
        if (html === null || mine !== asked) return;
        part.innerHTML = html;
        followWay();
      })
      .catch(function () {})
      .then(function () { if (mine === asked) part.removeAttribute("aria-busy"); });
  }

  form.addEventListener("input", function (e) {
    if (["context", "cores", "slots"].indexOf(e.target.name) < 0) return;
    clearTimeout(timer);
    timer = setTimeout(ask, 400);
  });
  form.addEventListener("change", function (e) {
    if (e.target.name === "way") followWay();
    if (e.target.name === "judge") ask();  // a judge's ways are ordered by how soon a verdict comes
  });
})();
