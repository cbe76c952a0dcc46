"""What an operator does when a platform says "we never got it": look (:mod:`.listing`), replay
(:mod:`.replay`), recover and redrive (:mod:`.jobs`), and watch or control a subscription
(:mod:`.subscriptions`). Free of FastAPI; imports ``engine`` and ``storage``. Why they work as they
do: docs/architecture.md, "Operator verbs".
"""

from usp_workers.operations.errors import Conflict, InvalidRequest, NotFound, OperationError
from usp_workers.operations.jobs import (
    JOB_BATCH,
    MAX_JOB_RESENDS,
    get_job,
    reclaim_stale_jobs,
    resume_job,
    run_job,
    start_recover,
    start_redrive,
    step_job,
)
from usp_workers.operations.listing import (
    dead_letter,
    event_detail,
    list_events,
    list_notices,
    list_subscriptions,
    platform_deliveries,
)
from usp_workers.operations.query import MAX_PAGE, SHORTENED_ID, decode_cursor, encode_cursor, find_ids
from usp_workers.operations.replay import replay_event
from usp_workers.operations.subscriptions import (
    DELETED,
    DISABLED_BY_OPERATOR,
    HEALTH_WINDOW,
    LEASE_LAPSED,
    MAX_RATE_LIMIT,
    blocked_subjects,
    lapse_leases,
    set_rate_limit,
    set_subscription_state,
    subscription_health,
)
from usp_workers.operations.views import (
    AttemptView,
    DeadLetterFilter,
    DeliveryView,
    EventDetail,
    EventFilter,
    EventSummary,
    JobKind,
    JobView,
    NoticeView,
    Page,
    Replayed,
    SubscriptionHealth,
)

__all__ = [
    "DELETED",
    "DISABLED_BY_OPERATOR",
    "HEALTH_WINDOW",
    "JOB_BATCH",
    "LEASE_LAPSED",
    "MAX_JOB_RESENDS",
    "MAX_PAGE",
    "MAX_RATE_LIMIT",
    "SHORTENED_ID",
    "AttemptView",
    "Conflict",
    "DeadLetterFilter",
    "DeliveryView",
    "EventDetail",
    "EventFilter",
    "EventSummary",
    "InvalidRequest",
    "JobKind",
    "JobView",
    "NotFound",
    "NoticeView",
    "OperationError",
    "Page",
    "Replayed",
    "SubscriptionHealth",
    "blocked_subjects",
    "dead_letter",
    "decode_cursor",
    "encode_cursor",
    "event_detail",
    "find_ids",
    "get_job",
    "lapse_leases",
    "list_events",
    "list_notices",
    "list_subscriptions",
    "platform_deliveries",
    "reclaim_stale_jobs",
    "replay_event",
    "resume_job",
    "run_job",
    "set_rate_limit",
    "set_subscription_state",
    "start_recover",
    "start_redrive",
    "step_job",
    "subscription_health",
]
