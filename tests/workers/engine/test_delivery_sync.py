"""The synchronous facade: one background loop and one client per process, shared by threads,
rebuilt after a fork."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest
from sqlalchemy.engine import Engine

from tests.workers.endpoints import Blocking, Hub, UspReceiver
from tests.workers.support import Endpoints, add_subscription, attempts, delivery, emit_event
from usp_dispatcher.cli.config import Settings
from usp_receiver import JWKS
from usp_workers.engine.background import background_runtime, close_background_runtime
from usp_workers.engine.delivery import BatchReport, deliver_batch, deliver_batch_sync
from usp_workers.engine.transport import make_client
from usp_workers.storage.models import DeliveryStatus


@pytest.fixture(autouse=True)
def _runtime_closed() -> Iterator[None]:
    yield
    close_background_runtime()


def test_threads_share_one_loop_and_one_client(
    database: Engine, settings: Settings, jwks: JWKS, endpoints: Endpoints, hub: Hub
) -> None:
    receiver = UspReceiver(jwks)
    add_subscription(database, endpoints.add("sync", receiver))
    batches = [[i for _ in range(10) for i in emit_event(database)[1]] for _ in range(4)]

    with ThreadPoolExecutor(4) as pool:
        reports: list[BatchReport] = list(
            pool.map(lambda ids: deliver_batch_sync(database, settings, ids), batches)
        )

    assert [r.succeeded for r in reports] == [10, 10, 10, 10]
    assert len(receiver.handled) == len(set(receiver.handled)) == 40
    assert len(hub.seen(endpoints.path("sync"))) == 40
    runtime = background_runtime(settings)
    assert background_runtime(settings) is runtime
    client = runtime.client
    deliver_batch_sync(database, settings, batches[0])  # nothing due: no error, same client
    assert background_runtime(settings).client is client
    for ids in batches:
        for delivery_id in ids:
            assert delivery(database, delivery_id).status == DeliveryStatus.SUCCEEDED
            assert len(attempts(database, delivery_id)) == 1


def test_closing_the_runtime_closes_its_client_and_the_next_call_builds_a_new_one(
    settings: Settings,
) -> None:
    runtime = background_runtime(settings)
    client = runtime.client
    close_background_runtime()
    assert client.is_closed
    assert runtime.loop.is_closed()
    assert background_runtime(settings) is not runtime


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_builds_its_own_runtime() -> None:
    # In a subprocess: forking this test process (with the server threads) would be unsafe.
    script = textwrap.dedent(
        """
        import asyncio, os, sys
        from usp_workers.engine.background import background_runtime, close_background_runtime
        from usp_dispatcher.cli.config import Settings

        settings = Settings(_env_file=None)
        parent = background_runtime(settings)
        assert parent.run(asyncio.sleep(0, result=1)) == 1
        pid = os.fork()
        if pid == 0:
            child = background_runtime(settings)
            ok = child is not parent and child.pid == os.getpid() and child.client is not parent.client
            ok = ok and child.run(asyncio.sleep(0, result=2)) == 2
            close_background_runtime()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert parent.run(asyncio.sleep(0, result=3)) == 3  # the parent's loop is untouched
        close_background_runtime()
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_calling_from_the_loop_itself_is_refused(settings: Settings) -> None:
    runtime = background_runtime(settings)

    async def nested() -> None:
        async def inner() -> None:
            return None

        runtime.run(inner())

    with pytest.raises(RuntimeError, match="own loop"):
        runtime.run(nested())


@pytest.mark.parametrize("variant", ["sync", "async"])
def test_an_outcome_is_recorded_when_its_try_ends_not_when_the_batch_does(
    database: Engine, settings: Settings, jwks: JWKS, endpoints: Endpoints, variant: str
) -> None:
    """A fast success that shares a batch with a hung try is committed within RECORD_DELAY of
    its end, while the hung one is still out: a worker dying then would not send it again."""
    slow = Blocking(status=204)
    fast_subscription = add_subscription(database, endpoints.add("fast", UspReceiver(jwks)))
    add_subscription(database, endpoints.add("slow", slow))
    _, ids = emit_event(database)
    [fast] = [i for i in ids if delivery(database, i).subscription_id == fast_subscription.id]

    def run() -> BatchReport:
        if variant == "sync":
            return deliver_batch_sync(database, settings, ids)
        return anyio.run(_deliver_async, database, settings, ids)

    with ThreadPoolExecutor(1) as pool:
        batch = pool.submit(run)
        assert slow.entered.wait(10)
        deadline = time.monotonic() + 5
        while delivery(database, fast).status != DeliveryStatus.SUCCEEDED:
            assert time.monotonic() < deadline, "the fast success waited for the slow try"
            time.sleep(0.02)
        assert not batch.done()
        [slow_id] = [i for i in ids if i != fast]
        assert delivery(database, slow_id).status == DeliveryStatus.IN_FLIGHT
        slow.release.set()
        report = batch.result(15)
    assert report.succeeded == 2
    assert {r.delivery_id for r in report.results} == set(ids)
    for delivery_id in ids:
        assert delivery(database, delivery_id).status == DeliveryStatus.SUCCEEDED
        assert len(attempts(database, delivery_id)) == 1


async def _deliver_async(database: Engine, settings: Settings, ids: list[str]) -> BatchReport:
    async with make_client(settings) as client:
        return await deliver_batch(database, settings, ids, client=client)
