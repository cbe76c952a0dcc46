"""``/admin``: recover and redrive jobs: their progress, and resuming one the broker refused."""

from __future__ import annotations

from fastapi import APIRouter

from usp_dispatcher.api.admin.common import problems, run, started
from usp_dispatcher.api.admin.models import JobOut
from usp_dispatcher.web.deps import SessionDep
from usp_workers import operations

__all__ = ["router"]

router = APIRouter()


@router.get("/jobs/{job_id}", response_model=JobOut, responses=problems(404))
async def get_job(job_id: str, session: SessionDep) -> JobOut:
    """A recover or redrive job and its progress."""
    return JobOut.model_validate(await run(operations.get_job, session, job_id))


@router.post("/jobs/{job_id}/resume", status_code=202, response_model=JobOut, responses=problems(404, 503))
async def resume_job(job_id: str, session: SessionDep) -> JobOut:
    """Send a running or failed job to the workers again (its worker died, its hand-off or a
    batch failed): it continues after its last committed batch. A finished job is answered as is."""
    job = await run(operations.resume_job, session, job_id)
    return await started(job)
