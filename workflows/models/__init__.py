"""The workflows models, by aggregate: specs, runs (steps, approvals, checkpoints), gate
rules, accounts, schedules, delivery and operations. Import them from here."""

from workflows.models.accounts import (  # noqa: F401
    ApiToken,
    ApiTokenManager,
    ChatIdentity,
    Passkey,
    Preference,
    SsoIdentity,
)
from workflows.models.delivery import (  # noqa: F401
    ChatInteraction,
    ChatMessage,
    DeliveryStatus,
    MailReply,
    Notification,
    OutboxJob,
    OutboxMessage,
    PushSubscription,
    Webhook,
    WebhookDelivery,
)
from workflows.models.gates import GateRule  # noqa: F401
from workflows.models.operations import (  # noqa: F401
    AuditSeal,
    AuditTimestamp,
    PeriodicRun,
    Worker,
)
from workflows.models.runs import (  # noqa: F401
    DONE_STEP_STATUSES,
    OPEN_RUN_STATUSES,
    OPEN_STEP_STATUSES,
    STEP_FRONTIER,
    TERMINAL_RUN_STATUSES,
    UNDER_WAY_STEP_STATUSES,
    Approval,
    ApprovalQuerySet,
    Channel,
    Checkpoint,
    CheckpointKind,
    CheckpointQuerySet,
    Compensation,
    CompensationStatus,
    Decision,
    GoalTally,
    HeldByProcess,
    Run,
    RunDay,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
)
from workflows.models.schedules import (  # noqa: F401
    FireOutcome,
    MissedPolicy,
    OverlapPolicy,
    Schedule,
    ScheduleFire,
)
from workflows.models.specs import (  # noqa: F401
    SpecOwner,
    SpecStatus,
    WorkflowSpec,
)
