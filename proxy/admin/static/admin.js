// memory-proxy admin: progressive enhancement only; every page works without it.
"use strict";

// A form marked data-busy-label shows that its post is running (Compact calls the model).
document.addEventListener("submit", function (event) {
  var form = event.target;
  var label = form.getAttribute("data-busy-label");
  var button = form.querySelector("button[type=submit]");
  if (!label || !button) {
    return;
  }
  window.setTimeout(function () {
    button.disabled = true;
    button.textContent = label;
  }, 0);
});
