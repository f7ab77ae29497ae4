from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import Group, Permission, User
from django.core.management.base import BaseCommand
from django.db import transaction

from goals.models import Goal, GoalStatus
from workflows import engine
from workflows.models import Preference, Run
from workflows.specs.storage import store_spec
from workflows.specs.validation import parse_spec_file

PASSWORD = "tollgate-demo"
USERS = {
    # username: (groups, is_staff, is_superuser, what they do)
    "admin": ([], True, True, "superuser: the Django admin"),
    "alice": (["operators"], True, False, "requests runs; may retry and cancel"),
    "bob": (["qa", "team-leads"], False, False, "QA approver and team lead"),
    "carol": (["qa", "release-managers", "finance"], False, False,
              "QA approver, release manager and finance"),
    "dave": (["managers"], False, False, "manager: sees everything, changes nothing"),
}


class Command(BaseCommand):
    help = "Load demo users, groups, goals, specs and runs in every state (idempotent)."

    def handle(self, *args, **options):
        with transaction.atomic():
            users = self._users()
            specs = self._specs()
            goals = self._goals(users)
        if not Run.objects.filter(idempotency_key__startswith="demo-").exists():
            # One transaction: consumers already running (a container stack) see the demo's
            # runs only in the states it leaves them in, never a step it is about to start.
            with transaction.atomic():
                self._runs(users, specs, goals)
        where = settings.TOLLGATE_BASE_URL or "http://127.0.0.1:8000"
        self.stdout.write(f"Demo data is loaded. Sign in at {where}/ as:")
        for name, (_, _, _, role) in USERS.items():
            self.stdout.write(f"  {name:<6} / {PASSWORD}   {role}")

    def _users(self) -> dict[str, User]:
        operate = Permission.objects.filter(
            codename__in=["operate_run", "add_run", "add_workflowspec", "author_command_spec"],
            content_type__app_label="workflows")
        groups = {}
        for name in ["qa", "release-managers", "operators", "managers", "team-leads",
                     "finance"]:
            groups[name], _ = Group.objects.get_or_create(name=name)
        groups["operators"].permissions.add(*operate)
        groups["managers"].permissions.add(Permission.objects.get(codename="export_audit"))
        users = {}
        for name, (member_of, staff, superuser, _) in USERS.items():
            user, created = User.objects.get_or_create(
                username=name, defaults={"email": f"{name}@example.com"})
            if created:
                user.set_password(PASSWORD)
            user.is_staff, user.is_superuser = staff, superuser
            user.save()
            user.groups.set([groups[g] for g in member_of])
            users[name] = user
        # dave is alice's manager: the payment spec's last stage waits on him.
        Preference.objects.update_or_create(user=users["alice"],
                                            defaults={"manager": users["dave"]})
        return users

    def _specs(self) -> dict:
        examples = Path(settings.BASE_DIR, "examples")
        specs = {}
        for path in sorted(examples.glob("*.*")):
            spec, _ = store_spec(parse_spec_file(path))
            specs[spec.name] = spec
        return specs

    def _goals(self, users) -> dict[str, Goal]:
        def goal(title, parent=None, **fields):
            obj, _ = Goal.objects.get_or_create(title=title, parent=parent, defaults=fields)
            return obj

        root = goal("Ship Tollgate 1.0", owner=users["alice"], priority="high",
                    objective="A durable workflow runtime teams trust with releases.",
                    success_signal="Three teams run their releases through it")
        return {
            "root": root,
            "release": goal("Release pipeline", root, owner=users["alice"], priority="critical",
                            next_action="Get QA sign-off on the release candidate"),
            "onboarding": goal("Onboard new engineers", root, owner=users["carol"]),
            "data": goal("Monthly data releases", root, owner=users["dave"],
                         status=GoalStatus.BLOCKED,
                         blocker_reason="Waiting on the warehouse migration"),
            "docs": goal("Write the operator handbook", root, owner=users["alice"],
                         priority="low"),
        }

    def _runs(self, users, specs, goals) -> None:
        alice, bob, carol = users["alice"], users["bob"], users["carol"]
        worker = "demo worker"

        def work(run, key, outcome="completed", **reported):
            """A step as a worker runs it: started, then completed or failed for good."""
            engine.start_step(run, key, actor=worker)
            if outcome == "completed":
                engine.complete_step(run, key, actor=worker, **reported)
            else:
                engine.fail_step(run, key, actor=worker, retryable=False, **reported)

        def open_(key, spec="release", goal="release", **kw):
            return engine.open_run(spec, actor=alice, goal=goals[goal],
                                   idempotency_key=f"demo-{key}", **kw).run

        run = open_("completed", title="Release 0.9")
        work(run, "build", summary="Built in 3m", state_patch={"artifact": "0.9.tar.gz"})
        engine.approve(run, "qa", user=bob, comment="Smoke tests pass")
        engine.approve(run, "qa", user=carol)
        work(run, "deploy")
        work(run, "notify")

        run = open_("waiting", title="Release 1.0-rc1")
        work(run, "build", summary="Built", evidence={"log": "all green"})
        engine.approve(run, "qa", user=bob, comment="Looks good to me")

        run = open_("failed", title="Release 1.0-rc0")
        work(run, "build", "failed", summary="Compiler error in engine.py")

        run = open_("cancelled", title="Release 0.8-hotfix")
        engine.cancel_run(run, actor=alice, reason="Superseded by 0.9")

        run = open_("running", "onboarding", "onboarding", title="Onboard Erin")
        engine.start_step(run, "accounts", actor=worker)

        run = open_("blocked", "data-release", "data", title="November data release")
        engine.record_transition(run, "snapshot", actor="warehouse job", step_status="blocked",
                                 summary="Warehouse credentials expired")

        open_("open", "data-release", "data", title="December data release")

        # Approval rules: over 10,000, the team lead and finance, then alice's manager.
        run = open_("payment", "payment", title="Pay the data vendor",
                    params={"payee": "Acme Data", "amount": 24000})
        engine.approve(run, "pay", user=bob, comment="Budgeted in Q4")

        run = open_("form", "rollout", title="Roll out release 3.1")
        work(run, "build", summary="Built and tested",
             evidence={"stdout": "built release 3.1\n12 tests passed\n"})

        # A gate that must be signed: carol (a release manager) signs it with her password
        # or a passkey she adds on her profile.
        run = open_("signed", "hotfix", title="Hotfix 1.0.1", params={"version": "1.0.1"})
        work(run, "build", summary="Built", evidence={"stdout": "built hotfix 1.0.1\n"})
