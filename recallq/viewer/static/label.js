// recallq labelling page: `y` and `n` answer the claim shown (as its buttons do), unless the
// reader is typing a note. The page works without this file, by clicking.
(function () {
  "use strict";
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) {
      return;
    }
    var target = event.target;
    if (target && (target.tagName === "INPUT" || target.tagName === "TEXTAREA")) {
      return;
    }
    var key = (event.key || "").toLowerCase();
    var button = document.querySelector('form.answer button[data-key="' + key + '"]');
    if (button) {
      event.preventDefault();
      button.click();
    }
  });
})();
