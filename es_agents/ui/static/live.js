// The model's answer as it streams (server-sent events from /runs/RUN/stream),
// shown until the conversation has it. Text only: never parsed as markup.
(function () {
  var script = document.currentScript;
  var run = script.getAttribute("data-run");
  var url = "/runs/" + encodeURIComponent(run) + "/stream";
  var box = document.getElementById("live");
  var text = document.getElementById("live-text");
  var call = null;

  function connect() {
    var source = new EventSource(url);
    source.addEventListener("start", function (e) {
      var d = JSON.parse(e.data);
      call = d.step + ":" + d.attempt; // a new call, or the same asked again
      text.textContent = "";
      box.hidden = false;
    });
    source.addEventListener("text", function (e) {
      var d = JSON.parse(e.data);
      if (call === d.step + ":" + d.attempt) text.textContent += d.text;
    });
    source.addEventListener("end", function () {
      setTimeout(function () { box.hidden = true; }, 1500);
    });
    source.addEventListener("done", function () {
      source.close(); // the run waits or ended: look again in a while
      setTimeout(connect, 1000);
    });
    source.onerror = function () {
      source.close();
      setTimeout(connect, 3000);
    };
  }
  connect();
})();
