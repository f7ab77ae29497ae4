"""Both chat platforms behind one small driver, so the contract tests say once what deciding
in chat means and run it on Slack and on Teams: who presses, what they send (a button and
its form on Slack, a card's fields and a button on Teams), and what they see after."""

from __future__ import annotations

import json

from workflows.chat import interactions
from workflows.models import ChatIdentity

from . import fake_slack, fake_teams


class SlackDriver:
    name = "slack"
    provider_name = "slack"
    group_channels = {"qa": "C-QA", "ops": "C-OPS"}

    def __init__(self, fake, url):
        self.fake, self.url = fake, url

    def label(self, name: str) -> str:
        return f"Slack (@{name})"

    def account(self, name: str, email: str = "") -> str:
        chat_user = f"U-{name.upper()}"
        if email:
            self.fake.emails[chat_user] = email
        return chat_user

    def link(self, user) -> None:
        ChatIdentity.objects.create(provider="slack", team=fake_slack.TEAM,
                                    chat_user=self.account(user.username), user=user,
                                    name=user.username, matched_by="link")

    def press(self, gate, decision: str, name: str, *, values=None, comment="",
              form: bool = False):
        """What a person does to decide: a button, and its form's submission when the gate
        has one or it is a reject. (status, answer) of the last request."""
        chat_user = self.account(name)
        answer = self.fake.press(self.url, fake_slack.button(gate, decision, chat_user, name))
        if form or decision == "reject":
            slack_values = {k: ({"type": "static_select", "selected_option": {"value": v}}
                                if k == "rollout" else v) for k, v in (values or {}).items()}
            answer = self.fake.press(self.url, fake_slack.submission(
                gate, decision, chat_user, name, values=slack_values, comment=comment))
        return answer

    def handled(self) -> list[str]:
        outcomes = [interactions.handle_any(pk) for pk in self.fake.doorbells]
        self.fake.doorbells.clear()
        return outcomes

    def forms_opened(self) -> int:
        return len(self.fake.calls_of("views.open"))

    def posted_channels(self) -> list[str]:
        return [p["channel"] for p in self.fake.calls_of("chat.postMessage")
                if not p.get("thread_ts") and p["channel"].startswith("C-")]

    def shown(self, channel: str) -> str:
        """The gate's message in the channel as everyone sees it now."""
        ts = self.fake.posted[channel][0]["ts"]
        updates = [u for u in self.fake.calls_of("chat.update") if u["ts"] == ts]
        post = next(p for p in self.fake.calls_of("chat.postMessage")
                    if p["channel"] == channel and not p.get("thread_ts"))
        return json.dumps((updates[-1] if updates else post)["blocks"])

    def has_buttons(self, shown: str) -> bool:
        return "tollgate_approve" in shown

    def told(self, name: str) -> list[str]:
        """What was said to this person alone (privately in the channel, or directly)."""
        chat_user = self.account(name)
        return ([e["text"] for e in self.fake.calls_of("chat.postEphemeral")
                 if e["user"] == chat_user]
                + [m["text"] for m in self.fake.calls_of("chat.postMessage")
                   if m["channel"] == chat_user])

    def forge(self, gate, name: str):
        return self.fake.press(self.url, fake_slack.button(gate, "approve",
                                                           self.account(name), name),
                               secret="not-the-secret")

    def replay(self, gate, name: str):
        body = self.fake.body(fake_slack.button(gate, "approve", self.account(name), name))
        headers = self.fake.signed(body)
        return [self.fake.send(self.url, body, headers)[0] for _ in range(2)]


class TeamsDriver:
    name = "teams"
    provider_name = "teams"
    group_channels = {"qa": "19:qa@thread.tacv2", "ops": "19:ops@thread.tacv2"}

    def __init__(self, fake, url):
        self.fake, self.url = fake, url
        self.members: dict[str, dict] = {}

    def label(self, name: str) -> str:
        return f"Teams ({name.capitalize()} Smith)"

    def account(self, name: str, email: str = "") -> str:
        if name not in self.members:
            self.members[name] = self.fake.member(name, email)
        elif email:
            self.members[name]["email"] = email
        return self.members[name]["aadObjectId"]

    def link(self, user) -> None:
        ChatIdentity.objects.create(provider="teams", team=fake_teams.TENANT,
                                    chat_user=self.account(user.username), user=user,
                                    name=f"{user.username.capitalize()} Smith",
                                    matched_by="link")

    def press(self, gate, decision: str, name: str, *, values=None, comment="",
              form: bool = False):
        """One press on the card, its fields filled in (Teams sends them with the press)."""
        self.account(name)
        data = {"comment": comment}
        for field, value in (values or {}).items():
            if isinstance(value, bool):
                data[f"flag_{field}"] = "true" if value else "false"
            else:
                data[f"field_{field}"] = str(value)
        return self.fake.send(self.url, self.fake.activity(
            gate, f"tollgate.{decision}", self.members[name], data=data))

    def view(self, gate, name: str):
        """The card as this person sees it when it refreshes for them."""
        self.account(name)
        status, answer = self.fake.send(self.url, self.fake.activity(
            gate, "tollgate.refresh", self.members[name]))
        assert status == 200, answer
        return answer

    def handled(self) -> list[str]:
        outcomes = [interactions.handle_any(pk) for pk in self.fake.doorbells]
        self.fake.doorbells.clear()
        return outcomes

    def forms_opened(self) -> int:
        return 0  # a card carries its fields: there is nothing to open

    def posted_channels(self) -> list[str]:
        return [c["channelData"]["channel"]["id"]
                for c in self.fake.calls_of("POST", r"v3/conversations") if c.get("isGroup")]

    def shown(self, channel: str) -> str:
        # As a reader sees it: the zero-width spaces that keep values from becoming links
        # are invisible.
        return json.dumps(self.fake.cards(channel)[0], ensure_ascii=False).replace(
            "\u200b", "")

    def has_buttons(self, shown: str) -> bool:
        return "tollgate.approve" in shown

    def told(self, name: str) -> list[str]:
        self.account(name)
        member = self.members[name]
        return (self.fake.personal.get(member["id"], [])
                + self.fake.personal.get(member["aadObjectId"], []))

    def forge(self, gate, name: str):
        self.account(name)
        return self.fake.send(self.url, self.fake.activity(gate, "tollgate.approve",
                                                           self.members[name]),
                              token=self.fake.token(key=fake_teams.new_key()))

    def replay(self, gate, name: str):
        self.account(name)
        activity = self.fake.activity(gate, "tollgate.approve", self.members[name])
        return [self.fake.send(self.url, activity)[0] for _ in range(2)]
