"""What every admin route shares: its problems, its query parameters, and running an operation
off the event loop (refusals become problems) or handing a job to the workers."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, TypeVar

from fastapi import Query
from fastapi.concurrency import run_in_threadpool

from usp_dispatcher.api.admin.models import JobOut, ProblemOut
from usp_dispatcher.errors import HTTPProblem
from usp_workers import operations, tasks

__all__ = ["Cursor", "Limit", "Since", "Until", "problems", "run", "started"]


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    what = {
        401: "no admin token, or a wrong one",
        404: "no such event, subscription or job",
        409: "the subscription cannot take it (disabled, deleted, not subscribed, not in the audience)",
        422: "invalid parameters (a cursor not ours, a time without offset, a range ending first, "
        "a rate limit out of range)",
        429: "a probe of this target ran less than 10 s ago (Retry-After says when to try)",
        503: "the job is recorded but the broker refused it: resume it later",
    }
    return {status: {"model": ProblemOut, "description": what[status]} for status in statuses}


_T = TypeVar("_T")
_STATUS: dict[type[operations.OperationError], tuple[int, str]] = {
    operations.NotFound: (404, "Not found"),
    operations.Conflict: (409, "Conflict"),
    operations.InvalidRequest: (422, "Invalid request"),
}

Cursor = Annotated[str | None, Query(max_length=256, description="next_cursor of the previous page")]
Limit = Annotated[int, Query(ge=1, le=operations.MAX_PAGE, description="items per page")]
Since = Annotated[datetime | None, Query(description="from this moment (inclusive, RFC 3339 with offset)")]
Until = Annotated[datetime | None, Query(description="until this moment (exclusive)")]


async def run(function: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """Run an operation off the event loop; its refusals become problems."""
    try:
        return await run_in_threadpool(function, *args, **kwargs)
    except operations.OperationError as exc:
        status, title = next(v for k, v in _STATUS.items() if isinstance(exc, k))
        raise HTTPProblem(status, exc.reason, title, exc.detail) from None


async def started(job: operations.JobView) -> JobOut:
    """Hand a recorded job to the workers; 503 (naming the job, to resume) when the broker refuses."""
    if job.status == "running" and not await run_in_threadpool(tasks.send_job, job.id):
        raise HTTPProblem(
            503,
            "broker_unavailable",
            "Service unavailable",
            f"job {job.id} is recorded but could not be sent to the workers; "
            f"POST /admin/jobs/{job.id}/resume once the broker is back",
            extra={"job_id": job.id},
        )
    return JobOut.model_validate(job)
