// The inbox from the keyboard: j / k move between gates, a approves the current one, r and c
// go to its reject reason and approval comment, ? shows the keys; once a gate is decided the
// next waiting one is current. Keys typed into a field
// are the field's; Esc leaves it.
(function () {
  "use strict";
  const help = document.getElementById("inbox-keys");
  if (!help) return;

  function cards() {
    return Array.from(document.querySelectorAll("#gate-list article.card.gate:not(.decided)"));
  }

  let lastId = "";  // the current card's id: a decided card keeps its place in the list

  function current() {
    return document.querySelector("#gate-list article.card.gate.current:not(.decided)");
  }

  function select(card) {
    if (!card) return;
    cards().forEach((other) => other.classList.remove("current"));
    card.classList.add("current");
    lastId = card.id;
    card.focus({preventScroll: true});
    card.scrollIntoView({block: "nearest"});
  }

  function move(step) {
    // From the current card, or the place of the one just decided, to the next undecided.
    const all = Array.from(document.querySelectorAll("#gate-list article.card.gate"));
    let at = all.findIndex((card) => card.id === lastId);
    if (at < 0) at = step > 0 ? -1 : all.length;
    for (let i = at + step; i >= 0 && i < all.length; i += step) {
      if (!all[i].classList.contains("decided")) {
        select(all[i]);
        return;
      }
    }
  }

  function approve(card) {
    const form = card.querySelector(".decide form:first-child");
    const first = form && form.querySelector(".gate-form input, .gate-form select, .gate-form textarea");
    if (first) {
      first.focus(); // a form to fill in first; Enter then approves
    } else if (form) {
      form.requestSubmit();
    }
  }

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const typing = event.target.closest("input, textarea, select, [contenteditable]");
    if (typing) {
      if (event.key === "Escape") {
        event.target.blur();
        const card = event.target.closest("article.card.gate");
        if (card) select(card);
      }
      return;
    }
    if (event.key === "?") {
      help.open ? help.close() : help.showModal();
      event.preventDefault();
      return;
    }
    if (help.open) return;
    const card = current();
    const keys = {
      j: () => move(1),
      k: () => move(-1),
      a: () => card && approve(card),
      r: () => card && card.querySelector(".decide form:last-child [name=comment]").focus(),
      c: () => card && card.querySelector(".decide form:first-child [name=comment]").focus(),
    };
    if (keys[event.key]) {
      keys[event.key]();
      event.preventDefault();
    }
  });

  // A card decided from the keyboard (or its buttons) comes back decided: the next waiting
  // card becomes the current one, so a, r and j go on from there.
  document.body.addEventListener("htmx:afterSettle", (event) => {
    const swapped = event.detail && event.detail.elt;
    const card = swapped && swapped.closest && swapped.closest("#gate-list article.card.gate");
    if (!card || card.id !== lastId || !card.classList.contains("decided")) return;
    const before = document.querySelectorAll("#gate-list article.card.gate:not(.decided)");
    if (!before.length) return;
    move(1);
    if (!current()) move(-1);
  });

  // A card clicked into becomes the current one.
  document.addEventListener("focusin", (event) => {
    const card = event.target.closest && event.target.closest("#gate-list article.card.gate");
    if (card && !card.classList.contains("decided") && !card.classList.contains("current")) {
      cards().forEach((other) => other.classList.remove("current"));
      card.classList.add("current");
      lastId = card.id;
    }
  });
})();
