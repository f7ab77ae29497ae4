// The profile's "Notifications on this device": ask the browser for permission, subscribe
// with the deployment's VAPID key, and hand the subscription to Tollgate.
"use strict";

function keyBytes(base64url) {
  const padded = base64url.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - base64url.length % 4) % 4);
  return Uint8Array.from(atob(padded), (c) => c.charCodeAt(0));
}

document.addEventListener("DOMContentLoaded", () => {
  const button = document.getElementById("push-on");
  const status = document.getElementById("push-status");
  if (!button) return;
  if (!("serviceWorker" in navigator) || !("PushManager" in window)) {
    status.textContent = "This browser cannot receive push notifications.";
    button.disabled = true;
    return;
  }
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      if (await Notification.requestPermission() !== "granted") {
        throw new Error("notifications are blocked for this site in the browser's settings");
      }
      const registration = await navigator.serviceWorker.register("/sw.js", {scope: "/"});
      await navigator.serviceWorker.ready;
      const subscription = await registration.pushManager.subscribe({
        userVisibleOnly: true, applicationServerKey: keyBytes(button.dataset.key)});
      const answer = await fetch(button.dataset.url, {
        method: "POST", credentials: "same-origin",
        headers: {"Content-Type": "application/json", "X-CSRFToken": button.dataset.csrf},
        body: JSON.stringify(subscription)});
      if (!answer.ok) throw new Error((await answer.json()).detail || answer.statusText);
      window.location.reload();
    } catch (error) {
      status.textContent = "Notifications were not turned on: " + error.message;
      button.disabled = false;
    }
  });
});
