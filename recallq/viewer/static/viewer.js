// recallq viewer: optional niceties. Every page works without this file, except that an
// active run's page refreshes itself only with it.
(function () {
  "use strict";

  // an active run's page reloads itself, unless the reader has left the tab
  var refresh = document.body.getAttribute("data-refresh-seconds");
  if (refresh) {
    var seconds = Math.max(2, parseInt(refresh, 10) || 5);
    setInterval(function () {
      if (document.visibilityState === "visible") {
        window.location.reload();
      }
    }, seconds * 1000);
  }

  // choosing a metadata field (or a filter marked so) applies it at once
  document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
    select.addEventListener("change", function () {
      if (select.form) {
        select.form.requestSubmit();
      }
    });
  });

  // a form marked so (Cancel run) asks before it is sent
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.getAttribute("data-confirm"))) {
        event.preventDefault();
      }
    });
  });

  // times in the reader's own zone (a time without a zone is UTC, as the server stores it)
  document.querySelectorAll("time[datetime]").forEach(function (node) {
    var text = node.getAttribute("datetime");
    var zoned = /(Z|[+-]\d\d:?\d\d)$/.test(text);
    var moment = new Date(zoned ? text : text + "Z");
    if (!isNaN(moment.getTime())) {
      node.title = node.textContent;
      node.textContent = moment.toLocaleString();
    }
  });
})();
