// Keeps a deadline's words true between page updates: "rejects itself in 3 h" counts down
// on the page, in the same words the server writes (the `countdown` template filter).
(function () {
  function words(seconds) {
    if (seconds < 10) return seconds.toFixed(1) + " s";
    if (seconds < 60) return Math.round(seconds) + " s";
    var minutes = Math.floor(seconds / 60), hours = Math.floor(minutes / 60), days = Math.floor(hours / 24);
    minutes %= 60; hours %= 24;
    if (days) return hours ? days + " d " + hours + " h" : days + " d";
    if (hours) return minutes ? hours + " h " + minutes + " min" : hours + " h";
    return minutes + " min";
  }
  function tick() {
    document.querySelectorAll("[data-countdown]").forEach(function (el) {
      var left = (Date.parse(el.dataset.countdown) - Date.now()) / 1000;
      el.textContent = left >= 0 ? el.dataset.then + " in " + words(left)
        : "overdue by " + words(-left) + ": it " + el.dataset.then + " at the next check";
      el.closest(".deadline") && el.closest(".deadline").classList.toggle("overdue", left < 0);
    });
  }
  setInterval(tick, 30000);
  document.addEventListener("htmx:afterSettle", tick);
})();
