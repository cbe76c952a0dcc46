"""The processes: the Celery app, its tasks and worker, the scheduler's relay, the embedded broker,
readiness, metrics, logs. May import ``operations``, ``engine`` and ``storage``."""
