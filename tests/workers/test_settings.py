"""One settings object per process kind: each reads its own ``USP_*`` variables, every setting
is declared by exactly one kind, and ``Settings`` (all of them) is accepted wherever a kind is."""

from __future__ import annotations

import pydantic
import pytest

from tests.generated_docs import own_fields
from usp_core.settings import CommonSettings
from usp_dispatcher.cli.config import Settings
from usp_dispatcher.settings import ApiSettings
from usp_workers.settings import SchedulerSettings, WorkerSettings

KINDS: tuple[type[CommonSettings], ...] = (CommonSettings, ApiSettings, WorkerSettings, SchedulerSettings)


def test_each_kind_reads_its_own_variables_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USP_DATABASE_URL", "sqlite:///kinds.sqlite3")
    monkeypatch.setenv("USP_RETRY_SCHEDULE", "1, 2,3")
    monkeypatch.setenv("USP_ADMIN_TOKEN", "t0ken")
    monkeypatch.setenv("USP_AUTH_MECHANISMS", "bearer")
    monkeypatch.setenv("USP_RETENTION_DAYS", "7")
    monkeypatch.setenv("USP_PRIVATE_TARGET_ALLOWLIST", "10.1.0.0/16,192.168.0.0/24")

    for kind in KINDS:
        settings = kind()
        assert settings.database_url == "sqlite:///kinds.sqlite3"
        assert settings.private_target_allowlist == ("10.1.0.0/16", "192.168.0.0/24")
    api, worker, scheduler = ApiSettings(), WorkerSettings(), SchedulerSettings()
    assert api.admin_token is not None
    assert api.admin_token.get_secret_value() == "t0ken"
    assert api.auth_mechanisms == ("bearer",)
    assert worker.retry_schedule == (1.0, 2.0, 3.0)
    assert (scheduler.retry_schedule, scheduler.retention_days) == ((1.0, 2.0, 3.0), 7.0)
    # A worker never holds the admin token, the API no retry schedule.
    assert not hasattr(worker, "admin_token")
    assert not hasattr(scheduler, "admin_token")
    assert not hasattr(api, "retry_schedule")
    assert not hasattr(api, "retention_days")
    everything = Settings()
    assert (everything.retry_schedule, everything.retention_days, everything.auth_mechanisms) == (
        (1.0, 2.0, 3.0),
        7.0,
        ("bearer",),
    )


def test_every_setting_is_declared_by_exactly_one_kind() -> None:
    declared: dict[str, list[str]] = {}
    for kind in KINDS:
        for name in own_fields(kind):
            declared.setdefault(name, []).append(kind.__name__)
    assert set(declared) == set(Settings.model_fields), "Settings adds nothing of its own"
    assert {name: kinds for name, kinds in declared.items() if len(kinds) > 1} == {}
    assert all(issubclass(Settings, kind) for kind in KINDS), "`up` passes Settings to every process"


@pytest.mark.parametrize(
    ("kind", "variable", "value"),
    [
        (CommonSettings, "USP_PRIVATE_TARGET_ALLOWLIST", "10.0.0.0/33"),
        (WorkerSettings, "USP_RETRY_SCHEDULE", "5,soon"),
        (ApiSettings, "USP_AUTH_MECHANISMS", "bearer,telepathy"),
        (SchedulerSettings, "USP_RETENTION_DAYS", "-1"),
    ],
)
def test_a_bad_value_is_refused_by_the_kind_that_reads_it(
    monkeypatch: pytest.MonkeyPatch, kind: type[CommonSettings], variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises((pydantic.ValidationError, ValueError)):
        kind()
