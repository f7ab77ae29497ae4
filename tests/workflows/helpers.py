from workflows.models import Checkpoint, Run


def seqs(run: Run) -> list[int]:
    return list(Checkpoint.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))


def kinds(run: Run) -> list[str]:
    return list(Checkpoint.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))


def status(run: Run) -> dict[str, str]:
    run.refresh_from_db()
    return {"run": run.status, **{s.key: s.status for s in run.steps.order_by("index")}}


def work(run: Run, key: str, outcome: str = "completed", *, summary: str = "", evidence=None,
         state_patch=None, actor=None):
    """Run a worker step as its worker would: start it, then complete or fail it for good."""
    from workflows import engine

    engine.start_step(run, key, actor=actor)
    if outcome == "completed":
        return engine.complete_step(run, key, actor=actor, summary=summary, evidence=evidence,
                                    state_patch=state_patch)
    return engine.fail_step(run, key, actor=actor, summary=summary, evidence=evidence,
                            retryable=False)


def waiting_releases(spec, requester, count: int) -> list[Run]:
    """`count` runs of the release spec (tests/conftest.py) opened by `requester`, titled
    "Release 0" on, each built and its QA gate waiting, the oldest first."""
    from workflows import engine

    runs = []
    for i in range(count):
        run = engine.open_run(spec, actor=requester, title=f"Release {i}").run
        work(run, "build")
        runs.append(run)
    return runs
