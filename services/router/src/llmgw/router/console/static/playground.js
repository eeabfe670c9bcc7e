// llmgw console, the playground with JavaScript on: the form's answer is streamed (server-sent
// events in OpenAI's chunks, usage last) and shown as it comes, with the time to the first token
// and tokens a second. Without it the form is answered whole by the server.
"use strict";

(function () {
  var form = document.getElementById("play-form");
  var out = document.getElementById("play-answer");
  var stats = document.getElementById("play-stats");
  var words = document.getElementById("play-words");
  if (!form || !out || !stats || !words) return;

  function say(name, values) {
    var text = words.getAttribute("data-" + name) || "";
    Object.keys(values).forEach(function (k) { text = text.split("{" + k + "}").join(values[k]); });
    return text;
  }

  function show(parts) {
    stats.textContent = "";
    parts.forEach(function (p) {
      var span = document.createElement("span");
      span.id = "stat-" + p[0];
      span.textContent = p[1];
      stats.appendChild(span);
    });
  }

  function fail(message) {
    out.textContent = say("failed", {}) + " " + message;
    out.setAttribute("data-failed", "1");
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var button = form.querySelector("button[type=submit]");
    button.disabled = true;
    out.textContent = "";
    out.removeAttribute("data-failed");
    out.removeAttribute("data-done");
    stats.textContent = "";
    var started = performance.now();
    var first = null;
    var usage = null;
    fetch(form.getAttribute("data-stream"), {
      method: "POST",
      body: new URLSearchParams(new FormData(form)),
      credentials: "same-origin",
    }).then(function (response) {
      if (!response.ok || !response.body) {
        return response.json().then(function (body) {
          fail((body && body.error && body.error.message) || String(response.status));
        }, function () { fail(String(response.status)); });
      }
      var reader = response.body.getReader();
      var decoder = new TextDecoder();
      var held = "";
      function event(block) {
        var data = block.split("\n").filter(function (l) { return l.indexOf("data:") === 0; })
          .map(function (l) { return l.slice(5).trim(); }).join("");
        if (!data || data === "[DONE]") return;
        var chunk = JSON.parse(data);
        if (chunk.error) { fail(chunk.error.message); return; }
        if (chunk.usage) usage = chunk.usage;
        var choice = chunk.choices && chunk.choices[0];
        var piece = choice && choice.delta && choice.delta.content;
        if (piece) {
          if (first === null) first = performance.now();
          out.textContent += piece;
        }
      }
      function pump() {
        return reader.read().then(function (got) {
          if (got.done) return;
          held += decoder.decode(got.value, { stream: true });
          var blocks = held.split("\n\n");
          held = blocks.pop();
          blocks.forEach(event);
          return pump();
        });
      }
      return pump().then(function () {
        var ended = performance.now();
        var parts = [];
        if (usage) parts.push(["tokens", say("tokens", { prompt: usage.prompt_tokens, completion: usage.completion_tokens })]);
        if (first !== null) parts.push(["ttft", say("ttft", { ms: Math.round(first - started) })]);
        if (usage && first !== null && ended > first) {
          parts.push(["speed", say("speed", { tps: (usage.completion_tokens / ((ended - first) / 1000)).toFixed(1) })]);
        }
        parts.push(["time", say("took", { seconds: ((ended - started) / 1000).toFixed(2) })]);
        show(parts);
        out.setAttribute("data-done", "1");
      });
    }).catch(function (err) { fail(String(err)); })
      .then(function () { button.disabled = false; });
  });
})();
