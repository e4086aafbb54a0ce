// Signed decisions (es_agents/ui/signing.py): the approver's private key file is
// read here and never leaves the page. Its key id is derived from its public half
// as `es-agents keys` does ("ed25519:" + the first 16 hex digits of SHA-256 of the
// raw public key); the bytes signed are the server's, the id put in their slot.
(function () {
  var SLOT = '"__KEY_ID__"';

  function bytes(b64) {
    var raw = atob(b64), out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out;
  }

  function b64(buffer) {
    var view = new Uint8Array(buffer), s = "";
    for (var i = 0; i < view.length; i++) s += String.fromCharCode(view[i]);
    return btoa(s);
  }

  function hex(buffer) {
    return Array.from(new Uint8Array(buffer))
      .map(function (b) { return b.toString(16).padStart(2, "0"); }).join("");
  }

  async function keyOf(file) {
    var pem = await file.text();
    var body = pem.replace(/-----[^-]+-----/g, "").replace(/\s+/g, "");
    var key = await crypto.subtle.importKey(
      "pkcs8", bytes(body), { name: "Ed25519" }, true, ["sign"]);
    var jwk = await crypto.subtle.exportKey("jwk", key);
    var pub = bytes(jwk.x.replace(/-/g, "+").replace(/_/g, "/") +
      "===".slice((jwk.x.length + 3) % 4));
    var digest = await crypto.subtle.digest("SHA-256", pub);
    return { key: key, id: "ed25519:" + hex(digest).slice(0, 16) };
  }

  function say(text) {
    var box = document.getElementById("verdict");
    var p = document.createElement("p");
    p.className = "refused";
    p.textContent = text; // text only: never parsed as markup
    box.replaceChildren(p);
  }

  document.addEventListener("click", async function (e) {
    var button = e.target.closest("button.sign");
    if (!button) return;
    var file = document.getElementById("key-file").files[0];
    if (!file) { say("refused: pick your private key file first"); return; }
    var action = button.getAttribute("data-action");
    try {
      var found = await keyOf(file);
      var template = document.getElementById("payload-" + action).value;
      var payload = template.replace(SLOT, JSON.stringify(found.id));
      var signature = await crypto.subtle.sign(
        { name: "Ed25519" }, found.key, new TextEncoder().encode(payload));
      var form = new FormData();
      form.append("csrf", document.querySelector("input[name=csrf]").value);
      form.append("key_id", found.id);
      form.append("signature", b64(signature));
      form.append("expires_at", document.getElementById("expires-at").value);
      var reason = document.getElementById("reason");
      if (reason && reason.value) form.append("reason", reason.value);
      var run = button.getAttribute("data-run");
      var answer = await fetch("/runs/" + encodeURIComponent(run) + "/" + action, {
        method: "POST", body: form, credentials: "same-origin",
        headers: { "HX-Request": "true" },
      });
      document.getElementById("verdict").innerHTML = await answer.text();
    } catch (err) {
      say("refused: the key file could not sign (" + err + ")");
    }
  });
})();
