from workflows.models import Checkpoint, Run


def seqs(run: Run) -> list[int]:
    return list(Checkpoint.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))


def kinds(run: Run) -> list[str]:
    return list(Checkpoint.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))


def status(run: Run) -> dict[str, str]:
    run.refresh_from_db()
    return {"run": run.status, **{s.key: s.status for s in run.steps.order_by("index")}}
