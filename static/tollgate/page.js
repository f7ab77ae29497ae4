// What every page does in the browser: times that move, comment fields that send on Enter,
// and a polite announcement of what changed (for screen readers).
(function () {
  // The same words the server writes (specs.values.duration, the `countdown` filter).
  function words(seconds) {
    if (seconds < 10) return Math.max(seconds, 0).toFixed(1) + " s";
    if (seconds < 60) return Math.round(seconds) + " s";
    var minutes = Math.floor(seconds / 60), hours = Math.floor(minutes / 60), days = Math.floor(hours / 24);
    minutes %= 60; hours %= 24;
    if (days) return hours ? days + " d " + hours + " h" : days + " d";
    if (hours) return minutes ? hours + " h " + minutes + " min" : hours + " h";
    return minutes + " min";
  }
  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-countdown]").forEach(function (el) {
      var left = (Date.parse(el.dataset.countdown) - now) / 1000;
      el.textContent = left >= 0 ? el.dataset.then + " in " + words(left)
        : "overdue by " + words(-left) + ": it " + el.dataset.then + " at the next check";
      el.closest(".deadline") && el.closest(".deadline").classList.toggle("overdue", left < 0);
    });
    // "waiting 3 min", "approved 12 s ago": how long since, kept true as time goes.
    document.querySelectorAll("time[data-since]").forEach(function (el) {
      el.textContent = words((now - Date.parse(el.dataset.since)) / 1000);
    });
  }
  setInterval(tick, 1000);
  document.addEventListener("htmx:afterSettle", tick);

  // A comment or reason field is several lines long: Enter sends its form, Shift+Enter
  // starts a new line.
  document.addEventListener("keydown", function (event) {
    var field = event.target;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing
        || !field.matches || !field.matches("textarea.comment")) return;
    event.preventDefault();
    if (field.form && field.form.reportValidity()) field.form.requestSubmit();
  });

  // Say what a press did and what arrived: the page's notices and new cards, once each.
  var said = new WeakSet();
  function announce() {
    var live = document.getElementById("live");
    if (!live) return;
    var lines = [];
    document.querySelectorAll("[data-announce]").forEach(function (el) {
      if (said.has(el)) return;
      said.add(el);
      lines.push(el.dataset.announce || el.textContent.trim());
    });
    if (lines.length) live.textContent = lines.join(". ");
  }
  document.addEventListener("htmx:afterSettle", announce);

  // Each checkpoint once: a poll whose answer crossed a decision's may bring one the page
  // shows already; the later copy goes.
  document.addEventListener("htmx:afterSettle", function () {
    var seen = {};
    document.querySelectorAll("#timeline-list > li[id^='cp-']").forEach(function (li) {
      if (seen[li.id]) li.remove();
      seen[li.id] = true;
    });
  });

  // A poller's next request sends the versions its last answer gave (workflows.live): a
  // poll that finds nothing of them changed is answered without reading the database.
  document.addEventListener("htmx:afterRequest", function (event) {
    var xhr = event.detail.xhr, elt = event.detail.elt;
    if (!xhr || !elt || !elt.querySelector) return;
    ["Watch", "Seen"].forEach(function (name) {
      var value = xhr.getResponseHeader("Tollgate-" + name);
      var input = elt.querySelector("input[name=" + name.toLowerCase() + "]");
      if (value !== null && input) input.value = value;
    });
    if (elt.id && (streams[elt.id] || fallBacks[elt.id])) listen(elt);  // with the new versions
  });

  // A poller with a stream (tollgate.events) asks when its stream says something changed,
  // then opens a new stream with the versions the answer gave; while its stream is down it
  // asks each second, as a page without one does. One stream per poller, by its id (an
  // answer may put a new poller in the old one's place).
  var streams = {}, fallBacks = {};
  function ask(id) {
    var elt = document.getElementById(id);
    if (elt) htmx.trigger(elt, "tollgate:changed");
  }
  function stop(id) {
    if (streams[id]) streams[id].close();
    clearInterval(fallBacks[id]);
    delete streams[id];
    delete fallBacks[id];
  }
  function listen(elt) {
    var id = elt.id, now = id && document.getElementById(id);
    if (!now || !window.htmx) return;
    stop(id);
    if (!now.dataset.events) return;
    var watch = now.querySelector("input[name=watch]"), seen = now.querySelector("input[name=seen]");
    if (!window.EventSource || !watch || !seen || !seen.value) return fallBack(id);
    var stream = streams[id] = new EventSource(now.dataset.events + "?page="
      + encodeURIComponent(location.pathname) + "&watch=" + encodeURIComponent(watch.value)
      + "&seen=" + encodeURIComponent(seen.value));
    // The server says "still" every few seconds: a stream silent for three of them (the
    // events server frozen, a proxy holding it) is down, and so is one the server ends
    // with "down" (it cannot read the versions: Redis away). The page then asks each
    // second, and each answer tries a new stream.
    var quiet = null;
    function heard() {
      clearTimeout(quiet);
      quiet = setTimeout(function () { stream.close(); fallBack(id); }, 15000);
    }
    // Counted from the start, not from the stream's opening: a server frozen before it
    // answered leaves the stream connecting, with neither an open nor an error to hear.
    heard();
    stream.onopen = function () { heard(); clearInterval(fallBacks[id]); delete fallBacks[id]; };
    stream.addEventListener("still", heard);
    stream.addEventListener("changed", function () { clearTimeout(quiet); stream.close(); ask(id); });
    stream.addEventListener("down", function () { clearTimeout(quiet); stream.close(); fallBack(id); });
    stream.onerror = function () { clearTimeout(quiet); fallBack(id); };
  }
  // A stream that ended (it said "changed", or went down) is listened to again when its
  // poller comes back: an answer that replaces the poller (the run page's, out of band)
  // fires its htmx:afterRequest on the old, detached element, which no listener hears.
  function needsStream(elt) {
    var stream = streams[elt.id];
    return !stream || stream.readyState === 2;
  }
  function fallBack(id) {
    if (!fallBacks[id]) fallBacks[id] = setInterval(function () { ask(id); }, 1000);
  }
  document.addEventListener("htmx:load", function (event) {
    var root = event.detail.elt;
    Object.keys(streams).concat(Object.keys(fallBacks)).forEach(function (id) {
      var now = document.getElementById(id);
      if (!now || !now.dataset.events) stop(id);  // the poller went, or polls no more
    });
    if (root.matches && root.matches("[data-events]") && needsStream(root)) listen(root);
    if (root.querySelectorAll) root.querySelectorAll("[data-events]").forEach(function (elt) {
      if (needsStream(elt)) listen(elt);
    });
  });
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-announce]").forEach(function (el) { said.add(el); });
  });
})();
