"""Push in a real browser: Chromium registers Tollgate's service worker from the profile's
page, a push message is delivered to it through the DevTools protocol (as a push service
would deliver it), and the worker shows the notification with Approve and Reject; pressing
it is the decision page's job, with the choice made (tests/workflows/delivery/test_push.py)."""

from __future__ import annotations

import json

import pytest

from tests.support.processes import wait_for

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOWN = """async () => {
  const registration = await navigator.serviceWorker.ready;
  const shown = await registration.getNotifications();
  return shown.map((n) => ({title: n.title, body: n.body, tag: n.tag, url: n.data.url,
                            actions: n.actions.map((a) => a.action + ":" + a.title)}));
}"""


def test_the_service_worker_shows_a_pushed_gate_with_approve_and_reject(
        browser, live_server, people, settings, tmp_path):
    settings.TOLLGATE_VAPID_KEY_FILE = str(tmp_path / "vapid.pem")
    context = browser.new_context(base_url=live_server.url, permissions=["notifications"])
    page = context.new_page()
    try:
        login(page, "bob")
        page.goto("/profile/#push")
        assert page.locator("#push-on").is_visible()
        scope = page.evaluate("""async () => {
          const registration = await navigator.serviceWorker.register("/sw.js");
          await navigator.serviceWorker.ready;
          return registration.scope;
        }""")
        assert scope == f"{live_server.url}/"
        devtools = context.new_cdp_session(page)
        registrations = []
        devtools.on("ServiceWorker.workerRegistrationUpdated",
                    lambda event: registrations.extend(event["registrations"]))
        devtools.send("ServiceWorker.enable")

        def registered():
            page.wait_for_timeout(50)  # Playwright hands over DevTools events while it waits
            return next((r["registrationId"] for r in registrations
                         if r["scopeURL"] == scope), None)

        registration = wait_for(registered, 30, 0, what="the worker's registration")
        message = {"title": "QA sign-off waits on you", "body": "#7 Release 1.0: 0 of 2",
                   "url": f"{live_server.url}/decide/abc/", "tag": "gate-7-1",
                   "choices": True}
        devtools.send("ServiceWorker.deliverPushMessage", {
            "origin": live_server.url, "registrationId": registration,
            "data": json.dumps(message)})
        shown = wait_for(lambda: page.evaluate(SHOWN), 30, 0.2, what="the notification")
        assert shown == [{"title": "QA sign-off waits on you", "body": "#7 Release 1.0: 0 of 2",
                          "tag": "gate-7-1", "url": f"{live_server.url}/decide/abc/",
                          "actions": ["approve:Approve", "reject:Reject"]}]
    finally:
        context.close()
