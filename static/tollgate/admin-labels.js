// What the admin's own widgets leave unnamed for assistive technology, named: autocomplete
// fields (select2 draws a combobox and a textbox without names) take their field's label;
// a tabular inline's fields take their column's header, its empty headers become plain
// cells, and its table, when it scrolls sideways, can be reached from the keyboard; the
// filter widget's help icons are images with a name.
"use strict";
(function () {
  function nameAutocompletes(root) {
    root.querySelectorAll("select.admin-autocomplete").forEach(function (select) {
      const label = document.querySelector('label[for="' + select.id + '"]');
      const container = select.parentElement;
      if (!label || !container) return;
      label.id = label.id || select.id + "-label";
      container.querySelectorAll(".select2-selection[role=combobox], " +
                                 ".select2-selection__rendered[role=textbox]")
        .forEach(function (box) {
          const names = (box.getAttribute("aria-labelledby") || "").split(" ");
          if (!names.includes(label.id)) {
            box.setAttribute("aria-labelledby", [label.id].concat(names).join(" ").trim());
          }
        });
    });
  }

  function unnamed(control) {
    return !control.getAttribute("aria-label") && !control.labels.length &&
      control.type !== "hidden";
  }

  function tidyInlines(root) {
    root.querySelectorAll(".tabular table").forEach(function (table) {
      const headers = Array.from(table.querySelectorAll("thead tr > *")).map(function (th) {
        return th.textContent.trim();
      });
      table.querySelectorAll("thead th").forEach(function (th) {
        if (th.textContent.trim()) return;
        const cell = document.createElement("td");
        cell.className = th.className;
        th.replaceWith(cell);
      });
      table.querySelectorAll("tbody tr").forEach(function (row, number) {
        Array.from(row.children).forEach(function (cell, column) {
          cell.querySelectorAll("input, select, textarea").forEach(function (control) {
            if (headers[column] && unnamed(control)) {
              control.setAttribute("aria-label", headers[column] + ", row " + (number + 1));
            }
          });
        });
      });
      const wrapper = table.parentElement;
      if (wrapper && wrapper.scrollWidth > wrapper.clientWidth && !wrapper.hasAttribute("tabindex")) {
        wrapper.setAttribute("tabindex", "0");
      }
    });
  }

  function nameHelpIcons(root) {
    root.querySelectorAll(".help-tooltip[aria-label]:not([role])").forEach(function (icon) {
      icon.setAttribute("role", "img");
    });
  }

  function tidy(root) {
    nameAutocompletes(root);
    tidyInlines(root);
    nameHelpIcons(root);
  }

  // After the admin's own ready handlers, which draw the select2 and filter widgets.
  function whenDrawn() { window.setTimeout(function () { tidy(document); }, 0); }
  if (window.django && django.jQuery) {
    django.jQuery(whenDrawn);
  } else {
    document.addEventListener("DOMContentLoaded", whenDrawn);
  }
  window.addEventListener("load", whenDrawn);  // the filter widgets draw themselves at load
  document.addEventListener("formset:added", function (event) { tidy(event.target); });
})();
