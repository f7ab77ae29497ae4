"""The workflows models, by aggregate: specs, runs (steps, approvals, checkpoints), gate
rules, accounts, schedules, delivery and operations. Import them from here."""

from .accounts import (  # noqa: F401
    ApiToken,
    ApiTokenManager,
    ChatIdentity,
    Passkey,
    Preference,
    SsoIdentity,
)
from .delivery import (  # noqa: F401
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
from .gates import GateRule  # noqa: F401
from .operations import (  # noqa: F401
    AuditSeal,
    AuditTimestamp,
    PeriodicRun,
    Worker,
)
from .runs import (  # noqa: F401
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
from .schedules import (  # noqa: F401
    FireOutcome,
    MissedPolicy,
    OverlapPolicy,
    Schedule,
    ScheduleFire,
)
from .specs import (  # noqa: F401
    SpecOwner,
    SpecStatus,
    WorkflowSpec,
)
