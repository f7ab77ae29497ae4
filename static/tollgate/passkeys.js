// Passkeys (WebAuthn): adding one on the profile, and signing a decision with one. The server
// makes every challenge (a decision's is the digest of the very form being sent); this only
// carries it to the authenticator and the answer back in a hidden field of the same form.
(function () {
  function csrf(form) {
    var field = form.querySelector("input[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }
  function say(form, text) {
    var out = form.querySelector("[data-passkey-error]");
    if (out) { out.textContent = text; out.hidden = !text; }
  }
  async function optionsFrom(url, form, body) {
    var response = await fetch(url, {method: "POST", body: body, credentials: "same-origin",
                                     headers: {"X-CSRFToken": csrf(form)}});
    var answer = await response.json();
    if (!response.ok) throw new Error(answer.error || "the server refused");
    return answer;
  }

  document.addEventListener("click", async function (event) {
    var button = event.target.closest("[data-passkey-sign], [data-passkey-add]");
    if (!button) return;
    event.preventDefault();
    var form = button.closest("form");
    say(form, "");
    if (!window.PublicKeyCredential) {
      say(form, "This browser cannot use passkeys: sign with your password.");
      return;
    }
    try {
      if (button.dataset.passkeySign !== undefined) {
        var data = new FormData(form);
        data.delete("signature_password");
        data.delete("signature_passkey");
        var request = await optionsFrom(button.dataset.passkeySign, form, data);
        var assertion = await navigator.credentials.get(
          {publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(request)});
        form.querySelector("input[name=signature_passkey]").value = JSON.stringify(assertion.toJSON());
        var password = form.querySelector("input[name=signature_password]");
        if (password) password.required = false;
      } else {
        if (!form.reportValidity()) return;  // the passkey's name first
        var creation = await optionsFrom(button.dataset.passkeyAdd, form, new FormData());
        var credential = await navigator.credentials.create(
          {publicKey: PublicKeyCredential.parseCreationOptionsFromJSON(creation)});
        form.querySelector("input[name=credential]").value = JSON.stringify(credential.toJSON());
      }
      form.requestSubmit();
    } catch (error) {
      say(form, "The passkey did not sign: " + (error.message || error.name) + ". Nothing was sent.");
    }
  });
})();
