// Tollgate's service worker, served at /sw.js so that it controls the whole site. It shows
// the notifications Tollgate pushes and opens the gate's decision page when one is pressed;
// Approve and Reject open that page with the choice made, where one press decides. Nothing
// here decides anything.
"use strict";

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

self.addEventListener("push", (event) => {
  let message = {};
  try {
    message = event.data ? event.data.json() : {};
  } catch (error) {
    message = {title: "Tollgate", body: event.data ? event.data.text() : ""};
  }
  const options = {
    body: message.body || "",
    tag: message.tag || "",
    icon: "{{ icon }}",
    badge: "{{ icon }}",
    data: {url: message.url || "/"},
    actions: message.choices ? [{action: "approve", title: "Approve"},
                                {action: "reject", title: "Reject"}] : [],
  };
  event.waitUntil(self.registration.showNotification(message.title || "Tollgate", options));
});

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  const url = new URL(event.notification.data.url, self.location.origin);
  if (url.origin !== self.location.origin) {
    return;  // only this Tollgate's own pages
  }
  url.searchParams.set("via", "push");
  if (event.action === "approve" || event.action === "reject") {
    url.searchParams.set("choice", event.action);
  }
  event.waitUntil(self.clients.openWindow(url.href));
});
