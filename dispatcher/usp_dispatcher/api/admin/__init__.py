"""``/admin/*``: what on-call needs when a platform says "we never got it" (admin token).

A thin layer over :mod:`usp_workers.operations`: it parses, calls, and shapes the answer as
typed models (so ``/docs`` documents every field). Long operations (recover, redrive) answer
``202`` with a job at once; the job runs in a worker (``usp.run_job``), and ``GET
/admin/jobs/{id}`` shows its progress.
"""

from __future__ import annotations

from fastapi import APIRouter

from usp_dispatcher.api.admin import dead_letter, events, jobs, keys, portal_links, probes, subscriptions
from usp_dispatcher.api.admin.common import problems
from usp_dispatcher.web.auth import AdminDep

__all__ = ["router"]

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep], responses=problems(401, 422))
for _resource in (events, dead_letter, jobs, subscriptions, keys, portal_links, probes):
    router.include_router(_resource.router)
