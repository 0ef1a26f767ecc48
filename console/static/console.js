// Every <time> shows UTC; its title gives the reader's local time (also after htmx swaps).
(function () {
  function localize(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var at = new Date(el.getAttribute("datetime"));
      if (!isNaN(at)) el.title = at.toLocaleString() + " (local)";
    });
  }
  document.addEventListener("DOMContentLoaded", function () { localize(document); });
  document.addEventListener("htmx:afterSwap", function (e) { localize(e.target.parentNode || document); });
})();
