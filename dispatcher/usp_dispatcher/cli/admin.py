"""The operator's commands of ``usp-webhooks``: they talk to a running service's admin API.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.cli.admin``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from usp_dispatcher.cli.helptext import LabelledGroup, grouped
from usp_dispatcher.cli.output import Column, Json, add_row, age, fitted_table, print_json, short_id, table
from usp_dispatcher.durations import parse_duration, parse_retry_schedule
from usp_dispatcher.webhooks.samples import sample_event
from usp_schemas import EVENT_TYPES
from usp_workers.operations import SHORTENED_ID

__all__ = ["AdminClient", "register"]

#: Everything printed comes from the API or an endpoint: plain text, never Rich markup (a
#: response excerpt holding "[/]" must neither restyle the terminal nor crash the command).
# soft_wrap: a message holding a full id is never broken across lines (tables still fit the width).
console = Console(highlight=False, soft_wrap=True)

events_app = typer.Typer(
    cls=LabelledGroup, help="Events the service accepted, and what became of them.", no_args_is_help=True
)
dead_letter_app = typer.Typer(
    cls=LabelledGroup, help="Deliveries that exhausted their schedule.", no_args_is_help=True
)
subscriptions_app = typer.Typer(
    cls=LabelledGroup, help="Where events go, and how each endpoint is doing.", no_args_is_help=True
)
jobs_app = typer.Typer(cls=LabelledGroup, help="Recover and redrive jobs.", no_args_is_help=True)

Url = Annotated[
    str,
    typer.Option("--url", envvar="USP_ADMIN_URL", show_envvar=True, help="Base URL of the service's API."),
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="USP_ADMIN_TOKEN",
        show_envvar=True,
        show_default=False,
        help="The admin bearer token (never printed).",
    ),
]
Since = Annotated[
    str | None,
    typer.Option(help="From: RFC 3339 with offset (2026-03-14T22:00:00Z) or an age (90m, 2h, 7d)."),
]
Until = Annotated[str | None, typer.Option(help="Until (exclusive), as --since.")]
Limit = Annotated[int, typer.Option(min=1, max=200, help="Rows per page.")]
Cursor = Annotated[str | None, typer.Option(help="Continue after this page (printed under a table).")]
Wait = Annotated[bool, typer.Option("--wait/--no-wait", help="Follow the job with a progress bar.")]

DEFAULT_URL = "http://127.0.0.1:8000"
#: Characters of a response excerpt shown in ``events show`` (the API has the whole excerpt).
_EXCERPT = 80
#: How often a followed job is polled.
POLL_SECONDS = 0.5


def register(app: typer.Typer) -> None:
    """Add the operator commands to ``app``."""
    app.add_typer(events_app, name="events")
    app.add_typer(dead_letter_app, name="dead-letter")
    app.add_typer(subscriptions_app, name="subscriptions")
    app.add_typer(jobs_app, name="jobs")
    app.command()(replay)
    app.command()(recover)
    app.command(epilog="Event types:\n\n" + grouped(EVENT_TYPES))(trigger)
    app.command("portal-link")(portal_link)
    app.command()(probe)


# ------------------------------------------------------------------------------- the API


class AdminClient:
    """The admin API over httpx: answers as JSON, refusals printed as the problem says and
    turned into exit code 1 (2 when the API cannot be reached)."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0) -> None:
        if not token:
            fail("no admin token: pass --token or set USP_ADMIN_TOKEN", code=2)
        self.base = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.base, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.http.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The API's JSON answer. Ids shortened as tables print them (``evt_…7203eef7``), in the
        path, the query or the JSON body, are first looked up (``GET /admin/ids``)."""
        path = "/".join(self.full_id(part) for part in path.split("/"))
        for name in ("params", "json"):
            if isinstance(kwargs.get(name), dict):
                kwargs[name] = {k: self.full_id(v) for k, v in kwargs[name].items()}
        return self._answer(method, path, **kwargs)

    def full_id(self, value: Any) -> Any:
        """``value`` itself, or the one full id a shortened one stands for (else exit 1)."""
        if not isinstance(value, str) or not SHORTENED_ID.fullmatch(value):
            return value
        ids = self._answer("GET", "/admin/ids", params={"short": value})["ids"]
        if not ids:
            fail(f"no id ends as {value} does")
        if len(ids) > 1:
            fail(f"{value} is ambiguous: {', '.join(ids)} (give the full id)")
        return ids[0]

    def _answer(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            fail(f"cannot reach the API at {self.base}: {type(exc).__name__}", code=2)
        if response.is_success:
            return response.json() if response.content else None
        try:
            problem = response.json()
            text = f"{problem.get('reason', 'error')}: {problem.get('detail', response.reason_phrase)}"
        except ValueError:
            text = response.reason_phrase
        fail(f"{method} {path} answered {response.status_code} {text}")


def fail(message: str, *, code: int = 1) -> NoReturn:
    console.print(Text(message, style="red"))
    raise typer.Exit(code)


# ------------------------------------------------------------------------------- events


@events_app.command("list")
def events_list(
    url: Url = DEFAULT_URL,
    token: Token = None,
    event_type: Annotated[str | None, typer.Option("--type", help="Exact event type.")] = None,
    subject: Annotated[str | None, typer.Option(help="Booking, service or waitlist entry id.")] = None,
    correlation: Annotated[str | None, typer.Option(help="Correlation id.")] = None,
    status: Annotated[
        str | None,
        typer.Option(help="Only events with a delivery in this status (pending, dead, superseded, ...)."),
    ] = None,
    since: Since = None,
    until: Until = None,
    limit: Limit = 20,
    cursor: Cursor = None,
    as_json: Json = False,
) -> None:
    """Events, newest first, with their deliveries by status."""
    params = _params(
        event_type=event_type,
        subject_id=subject,
        correlation_id=correlation,
        delivery_status=status,
        since=_when(since),
        until=_when(until),
        limit=limit,
        cursor=cursor,
    )

    def row(item: dict[str, Any]) -> tuple[object, ...]:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(item["deliveries"].items())) or "-"
        return (
            short_id(item["id"]),
            item["event_type"],
            age(item["created_at"]),
            counts,
            short_id(item["subject_id"]),
        )

    _list(
        AdminClient(url, token),
        "/admin/events",
        params,
        as_json=as_json,
        title="events",
        columns=(
            Column("event"),
            Column("type"),
            Column("age"),
            Column("deliveries", flex=True),
            Column("subject", 1),
        ),
        row=row,
    )


@events_app.command("show")
def events_show(event_id: str, url: Url = DEFAULT_URL, token: Token = None, as_json: Json = False) -> None:
    """One event: its envelope, every delivery and every attempt."""
    with AdminClient(url, token) as api:
        detail = api.call("GET", f"/admin/events/{event_id}")
    if as_json:
        print_json(detail)
        return
    event = detail["event"]
    console.print(Text.assemble((event["id"], "bold"), " ", event["event_type"]))
    for name in ("subject_id", "correlation_id", "order_id", "audience", "occurred_at", "created_at"):
        console.print(f"  {name}: {event[name] if event[name] is not None else '-'}", markup=False)
    for delivery in detail["deliveries"]:
        status = delivery["status"]
        if delivery["superseded_by"]:
            status += f" by {short_id(delivery['superseded_by'])}"
        console.print(
            Text.assemble(
                "\ndelivery ",
                (short_id(delivery["id"]), "bold"),
                f" to {short_id(delivery['subscription_id'])}: {status}, {delivery['attempt_count']} tries",
            )
        )
        if not delivery["attempts"]:
            continue
        tries = table(None, "try", "age", "code", "ms", "outcome", "response / error")
        for attempt in delivery["attempts"]:
            # What the endpoint said, else what went wrong (a timeout, a refused connection).
            said = (attempt["response_excerpt"] or "")[:_EXCERPT] or attempt["error_class"] or ""
            add_row(
                tries,
                attempt["attempt_number"],
                age(attempt["started_at"]),
                attempt["status_code"] or "-",
                f"{attempt['duration_ms']:.0f}",
                attempt["outcome"],
                " ".join(said.split()),
            )
        console.print(tries)


def replay(
    event_id: str,
    subscription: Annotated[
        str | None, typer.Option(help="Only this subscription (back-fills one that never had it).")
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Deliver an event again (same event_id, signed afresh) to every subscription it matches, or
    one; earlier deliveries and their attempts are kept."""
    body = {"subscription_id": subscription} if subscription else {}
    with AdminClient(url, token) as api:
        result = api.call("POST", f"/admin/events/{event_id}/replay", json=body)
    if as_json:
        print_json(result)
        return
    if not result["deliveries"]:
        console.print(f"no active subscription takes {event_id}: nothing to replay", markup=False)
        return
    for delivery in result["deliveries"]:
        console.print(
            f"replaying {result['event_id']} to {delivery['subscription_id']}: delivery {delivery['id']}",
            markup=False,
        )


# ------------------------------------------------------------------------------- jobs


def recover(
    subscription: Annotated[str, typer.Option(help="The subscription whose endpoint missed events.")],
    since: Annotated[str, typer.Option(help="Events accepted from: RFC 3339 or an age (2h, 7d).")],
    until: Until = None,
    enable: Annotated[bool, typer.Option("--enable", help="Enable the subscription first.")] = False,
    wait: Wait = True,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Re-deliver every failed or dead delivery of a subscription in a time range, and back-fill
    the events it missed while disabled (a job, no cap)."""
    body = _params(since=_when(since), until=_when(until)) | ({"enable": True} if enable else {})
    with AdminClient(url, token) as api:
        job = api.call("POST", f"/admin/subscriptions/{subscription}/recover", json=body)
        _follow(api, job, wait=wait)


@dead_letter_app.command("list")
def dead_letter_list(
    subscription: Annotated[str | None, typer.Option(help="Only this subscription.")] = None,
    event_type: Annotated[str | None, typer.Option("--type", help="Only this event type.")] = None,
    since: Since = None,
    until: Until = None,
    limit: Limit = 20,
    cursor: Cursor = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Dead deliveries, newest first (``--json``: each with its attempts)."""
    params = _params(
        subscription_id=subscription,
        event_type=event_type,
        since=_when(since),
        until=_when(until),
        limit=limit,
        cursor=cursor,
    )
    _list(
        AdminClient(url, token),
        "/admin/dead-letter",
        params,
        as_json=as_json,
        title="dead letter",
        columns=(
            Column("event"),
            Column("type"),
            Column("tries"),
            Column("died"),
            Column("last answer", flex=True),
            Column("subscription", 1),
        ),
        row=lambda item: (
            short_id(item["event_id"]),
            item["event_type"] or "-",
            item["attempt_count"],
            age(item["completed_at"]),
            item["last_status_code"] or item["last_error"] or "-",
            short_id(item["subscription_id"]),
        ),
    )


@dead_letter_app.command("redrive")
def dead_letter_redrive(
    subscription: Annotated[str | None, typer.Option(help="Only this subscription.")] = None,
    event_type: Annotated[str | None, typer.Option("--type", help="Only this event type.")] = None,
    since: Since = None,
    until: Until = None,
    wait: Wait = True,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Re-deliver the dead letter (all of it, or filtered) to active subscriptions, as a job."""
    body = _params(
        subscription_id=subscription, event_type=event_type, since=_when(since), until=_when(until)
    )
    with AdminClient(url, token) as api:
        job = api.call("POST", "/admin/dead-letter/redrive", json=body)
        _follow(api, job, wait=wait)


@jobs_app.command("show")
def jobs_show(
    job_id: str,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Follow it with a progress bar.")] = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """A job's progress (``--wait``: until it ends)."""
    with AdminClient(url, token) as api:
        job = api.call("GET", f"/admin/jobs/{job_id}")
        if as_json:
            print_json(job)
            return
        _follow(api, job, wait=wait)


@jobs_app.command("resume")
def jobs_resume(job_id: str, wait: Wait = True, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Send a running or failed job to the workers again; it goes on after its last batch."""
    with AdminClient(url, token) as api:
        _follow(api, api.call("POST", f"/admin/jobs/{job_id}/resume"), wait=wait)


def _follow(api: AdminClient, job: dict[str, Any], *, wait: bool) -> None:
    """Print the job; with ``wait``, poll it under a progress bar until it ends (exit 1 if it failed)."""
    console.print(Text.assemble("job ", (job["id"], "bold"), f" ({job['kind']}): {job['total']} deliveries"))
    if wait and job["status"] == "running":
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=False) as progress:
            bar = progress.add_task(job["kind"], total=max(job["total"], 1))
            while job["status"] == "running":
                time.sleep(POLL_SECONDS)
                job = api.call("GET", f"/admin/jobs/{job['id']}")
                progress.update(bar, completed=job["processed"], total=max(job["total"], job["processed"], 1))
    if job["status"] == "failed":
        fail(f"job {job['id']} failed ({job['error']}); resume it: usp-webhooks jobs resume {job['id']}")
    if job["status"] == "succeeded":
        missed = f" ({job['backfilled']} of them missed while disabled)" if job["backfilled"] else ""
        console.print(f"job {job['id']} done: {job['processed']} deliveries re-sent{missed}", markup=False)
    else:
        console.print(
            f"job {job['id']} running: {job['processed']} of {job['total']} handled; "
            f"follow it: usp-webhooks jobs show {job['id']} --wait",
            markup=False,
        )


# ------------------------------------------------------------------------------- subscriptions


@subscriptions_app.command("list")
def subscriptions_list(
    state: Annotated[str | None, typer.Option(help="active or disabled")] = None,
    limit: Limit = 50,
    cursor: Cursor = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Subscriptions with their health: state (with an open breaker or a rate limit), success
    rate over 24 h, last success, failure streak, pending and dead deliveries."""

    def row(item: dict[str, Any]) -> tuple[object, ...]:
        rate = item["success_rate"]
        condition = [item["state"] + (f" ({item['disabled_reason']})" if item["disabled_reason"] else "")]
        if item["breaker_state"] != "closed":
            condition.append(f"breaker {item['breaker_state']}")
        if item["rate_limit"] is not None:
            condition.append(f"{item['rate_limit']}/s")
        return (
            short_id(item["id"]),
            ", ".join(condition),
            "-" if rate is None else f"{rate:.0%}/{item['recent_attempts']}",
            item["dead"],
            age(item["last_success_at"]),
            item["consecutive_failures"],
            item["pending"],
            item["url"],
        )

    _list(
        AdminClient(url, token),
        "/admin/subscriptions",
        _params(state=state, limit=limit, cursor=cursor),
        as_json=as_json,
        title="subscriptions",
        columns=(
            Column("id"),
            Column("state"),
            Column("ok 24h"),
            Column("dead", 1),
            Column("last ok", 2),
            Column("streak", 3),
            Column("pending", 4),
            Column("url", flex=True, least=32),
        ),
        row=row,
    )


@subscriptions_app.command("notices")
def subscriptions_notices(
    subscription_id: Annotated[
        str | None, typer.Argument(help="One subscription's; all when omitted.")
    ] = None,
    kind: Annotated[str | None, typer.Option(help="e.g. subscription.disabled")] = None,
    limit: Limit = 50,
    cursor: Cursor = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Health notices, newest first: disabled and why, enabled, breaker opened, re-opened after
    a failed probe, closed."""
    _list(
        AdminClient(url, token),
        "/admin/notices",
        _params(subscription_id=subscription_id, kind=kind, limit=limit, cursor=cursor),
        as_json=as_json,
        title="notices",
        columns=(Column("when"), Column("subscription"), Column("notice"), Column("detail", flex=True)),
        row=lambda item: (
            age(item["created_at"]),
            short_id(item["subscription_id"]),
            item["kind"].removeprefix("subscription."),
            item["detail"],
        ),
    )


@subscriptions_app.command("disable")
def subscriptions_disable(subscription_id: str, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Stop delivering to a subscription."""
    with AdminClient(url, token) as api:
        health = api.call("POST", f"/admin/subscriptions/{subscription_id}/disable")
    console.print(f"{health['id']} is {health['state']}", markup=False)


@subscriptions_app.command("enable")
def subscriptions_enable(subscription_id: str, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Deliver to a subscription again (failure streak cleared); then `recover` what it missed."""
    with AdminClient(url, token) as api:
        health = api.call("POST", f"/admin/subscriptions/{subscription_id}/enable")
    console.print(f"{health['id']} is {health['state']}", markup=False)


@subscriptions_app.command("create")
def subscriptions_create(
    endpoint: Annotated[str, typer.Argument(help="Where to deliver (http or https).")],
    event_types: Annotated[
        list[str] | None,
        typer.Option(
            "--event-type", metavar="TYPE", help="A type or glob (booking.*); repeat for more. Default: all."
        ),
    ] = None,
    payload_filter: Annotated[
        str | None,
        typer.Option(
            "--filter", metavar="JSON", help='Only events whose JSON passes it: {"path": ..., "eq": ...}.'
        ),
    ] = None,
    signatures: Annotated[
        list[str] | None,
        typer.Option(
            "--signatures",
            metavar="SCHEME",
            help="standard-webhooks and/or standard-webhooks-v1a, beside RFC 9421; repeat.",
        ),
    ] = None,
    jsonrpc: Annotated[bool, typer.Option("--jsonrpc", help="Send usp_webhook notifications.")] = False,
    header: Header = None,
    secret_header: SecretHeader = None,
    sign_headers: SignHeaders = False,
    retry_delays: RetryDelays = None,
    max_age: MaxAge = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Subscribe a URL to events of the business; a Standard Webhooks secret it asks for is
    printed once."""
    body: dict[str, Any] = {
        "url": endpoint,
        "event_types": event_types or ["*"],
        "transport": "jsonrpc" if jsonrpc else "rest",
        "signatures": ["rfc9421", *(s for s in signatures or () if s != "rfc9421")],
        "filter": _filter_json(payload_filter),
        "headers": _headers(header, secret_header),
        "sign_headers": sign_headers,
        "retry_schedule": _schedule(retry_delays, max_age),
    }
    with AdminClient(url, token) as api:
        created = api.call("POST", "/services/feed/subscriptions", json=body)
    if as_json:
        print_json(created)
        return
    console.print(f"{created['id']}: {created['url']} ({', '.join(created['event_types'])})", markup=False)
    if created.get("filter"):
        console.print(f"filter: {json.dumps(created['filter'])}", markup=False, soft_wrap=True)
    if created.get("webhook_secret"):
        console.print("Standard Webhooks secret (shown once, store it now):", markup=False)
        console.print(created["webhook_secret"], markup=False, soft_wrap=True)
    if created.get("webhook_public_key"):
        console.print(f"v1a public key: {created['webhook_public_key']}", markup=False, soft_wrap=True)


@subscriptions_app.command("filter")
def subscriptions_filter(
    subscription_id: str,
    filter_json: Annotated[str | None, typer.Argument(show_default=False, help="The new filter.")] = None,
    off: Annotated[bool, typer.Option("--off", help="Remove the filter.")] = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Replace a subscription's payload filter (JSON), or remove it (--off); events emitted from
    then on are judged by it."""
    if (filter_json is None) == (not off):
        fail("give either a filter (JSON) or --off", code=2)
    with AdminClient(url, token) as api:
        changed = api.call(
            "PUT",
            f"/services/feed/subscriptions/{subscription_id}/filter",
            json={"filter": _filter_json(filter_json)},
        )
    shown = json.dumps(changed["filter"]) if changed["filter"] else "no filter: every event of its types"
    console.print(f"{changed['id']}: {shown}", markup=False, soft_wrap=True)


@subscriptions_app.command("headers")
def subscriptions_headers(
    subscription_id: str,
    header: Header = None,
    secret_header: SecretHeader = None,
    sign_headers: SignHeaders = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Replace a subscription's own headers (none given: remove them); a secret value is sealed
    and shown masked from then on."""
    body = {"headers": _headers(header, secret_header), "signed": sign_headers}
    with AdminClient(url, token) as api:
        changed = api.call("PUT", f"/services/feed/subscriptions/{subscription_id}/headers", json=body)
    shown = ", ".join(f"{h['name']}: {h['value']}" for h in changed["headers"]) or "no headers of its own"
    signed = " (signed)" if changed["sign_headers"] else ""
    console.print(f"{changed['id']}: {shown}{signed}", markup=False, soft_wrap=True)


@subscriptions_app.command("auth")
def subscriptions_auth(
    subscription_id: str,
    token_url: Annotated[
        str | None,
        typer.Option("--oauth-token-url", metavar="URL", help="OAuth 2.0 client credentials: the token URL."),
    ] = None,
    client_id: Annotated[
        str | None, typer.Option("--client-id", metavar="ID", help="The OAuth client id.")
    ] = None,
    client_secret_file: Annotated[
        Path | None,
        typer.Option(
            "--client-secret-file",
            metavar="FILE",
            help="A file holding the OAuth client secret (kept off the command line).",
        ),
    ] = None,
    scope: Annotated[
        str | None, typer.Option("--scope", metavar="SCOPE", help="The OAuth scope to ask for.")
    ] = None,
    certificate: Annotated[
        Path | None, typer.Option("--certificate", metavar="FILE", help="mTLS: the client certificate (PEM).")
    ] = None,
    private_key: Annotated[
        Path | None, typer.Option("--private-key", metavar="FILE", help="mTLS: its private key (PEM).")
    ] = None,
    ca_certificate: Annotated[
        Path | None,
        typer.Option(
            "--ca-certificate", metavar="FILE", help="mTLS: trust the endpoint's certificate from this CA."
        ),
    ] = None,
    off: Annotated[bool, typer.Option("--off", help="Remove the endpoint authentication.")] = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """How a subscription's deliveries prove themselves to a gateway in front of its endpoint:
    OAuth 2.0 client credentials or a client certificate (mTLS); the secret is sealed and never
    shown again. --off removes it."""
    oauth_given = token_url is not None
    mtls_given = certificate is not None
    if sum((oauth_given, mtls_given, off)) != 1:
        fail(
            "give --oauth-token-url (with --client-id, --client-secret-file),"
            " --certificate (with --private-key) or --off",
            code=2,
        )
    auth: dict[str, Any] | None = None
    if oauth_given:
        if client_id is None or client_secret_file is None:
            fail("OAuth needs --client-id and --client-secret-file", code=2)
        auth = {
            "type": "oauth2_client_credentials",
            "token_url": token_url,
            "client_id": client_id,
            "client_secret": _read(client_secret_file).strip(),
            "scope": scope,
        }
    elif mtls_given:
        if private_key is None:
            fail("mTLS needs --private-key", code=2)
        auth = {
            "type": "mtls",
            "certificate": _read(certificate),
            "private_key": _read(private_key),
            "ca_certificate": None if ca_certificate is None else _read(ca_certificate),
        }
    with AdminClient(url, token) as api:
        changed = api.call("PUT", f"/services/feed/subscriptions/{subscription_id}/auth", json={"auth": auth})
    shown = changed["auth"]
    if shown is None:
        console.print(f"{changed['id']}: no endpoint authentication", markup=False)
    elif shown["type"] == "mtls":
        console.print(
            f"{changed['id']}: mTLS as {shown['certificate_subject']},"
            f" until {shown['certificate_not_after']}",
            markup=False,
        )
    else:
        console.print(
            f"{changed['id']}: OAuth 2.0 client credentials as {shown['client_id']}"
            f" from {shown['token_url']}",
            markup=False,
        )


def _read(path: Path | None) -> str:
    assert path is not None
    try:
        return path.read_text()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}", code=2)


@subscriptions_app.command("retry-schedule")
def subscriptions_retry_schedule(
    subscription_id: str,
    retry_delays: RetryDelays = None,
    max_age: MaxAge = None,
    default: Annotated[bool, typer.Option("--default", help="Back to the service's schedule.")] = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Give a subscription its own waits between tries and a maximum age, or put it back on the
    service's schedule (--default)."""
    if (retry_delays is None) == (not default):
        fail("give either --delays (and --max-age) or --default", code=2)
    body = {"retry_schedule": None if default else _schedule(retry_delays, max_age)}
    path = f"/services/feed/subscriptions/{subscription_id}/retry-schedule"
    with AdminClient(url, token) as api:
        changed = api.call("PUT", path, json=body)
    schedule = changed["retry_schedule"]
    if schedule is None:
        console.print(f"{changed['id']}: the service's retry schedule", markup=False)
        return
    waits = ", ".join(f"{d:g}s" for d in schedule["delays"])
    age = schedule["max_age_seconds"]
    limit = f", no try after {age:g}s" if age is not None else ""
    console.print(f"{changed['id']}: waits {waits}{limit}", markup=False)


RetryDelays = Annotated[
    str | None,
    typer.Option(
        "--delays", metavar="WAITS", help="Seconds to wait after each failed try, comma-separated: 5,30,300."
    ),
]
MaxAge = Annotated[
    str | None,
    typer.Option(
        "--max-age", metavar="AGE", help="No try later than this after the delivery was made (2h, 1d)."
    ),
]


def _schedule(delays: str | None, max_age: str | None) -> dict[str, Any] | None:
    try:
        return parse_retry_schedule(delays, max_age)
    except ValueError as exc:
        fail(f"--delays / --max-age: {exc}", code=2)


Header = Annotated[
    list[str] | None,
    typer.Option("--header", metavar="NAME=VALUE", help="A header of its own on every delivery; repeat."),
]
SecretHeader = Annotated[
    list[str] | None,
    typer.Option(
        "--secret-header", metavar="NAME=VALUE", help="The same, sealed at rest and shown masked; repeat."
    ),
]
SignHeaders = Annotated[
    bool, typer.Option("--sign-headers", help="Cover those headers with the RFC 9421 signature.")
]


def _headers(plain: list[str] | None, secret: list[str] | None) -> list[dict[str, Any]]:
    items = []
    for text, is_secret in [*((t, False) for t in plain or ()), *((t, True) for t in secret or ())]:
        name, equals, value = text.partition("=")
        if not equals:
            fail(f"{text.split('=')[0]!r}: give a header as NAME=VALUE", code=2)
        items.append({"name": name.strip(), "value": value, "secret": is_secret})
    return items


def _filter_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        fail(f"--filter is not JSON: {exc}", code=2)


@subscriptions_app.command("rotate-secret")
def subscriptions_rotate_secret(
    subscription_id: str,
    overlap: Annotated[
        str | None,
        typer.Option(
            help="How long the old secret keeps signing beside the new one (90m, 24h, 7d; default: the"
            " signing keys' overlap, USP_KEY_OVERLAP_SECONDS)."
        ),
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """A new Standard Webhooks secret for a subscription, printed once: give it to the receiver
    before the overlap ends (both secrets sign until then)."""
    asked: dict[str, int] = {}
    if overlap is not None:
        length = parse_duration(overlap)
        if length is None:
            fail(f"{overlap!r} is not a duration such as 90m, 24h or 7d", code=2)
        asked["overlap_seconds"] = int(length.total_seconds())
    with AdminClient(url, token) as api:
        rotated = api.call(
            "POST", f"/services/feed/subscriptions/{subscription_id}/secrets/rotate", json=asked
        )
    console.print(f"{rotated['id']}: new secret (shown once, store it now):", markup=False)
    if rotated["webhook_secret"]:
        console.print(rotated["webhook_secret"], markup=False, soft_wrap=True)
    if rotated["webhook_public_key"]:
        console.print(f"v1a public key: {rotated['webhook_public_key']}", markup=False, soft_wrap=True)
    console.print(f"the old one signs beside it for {overlap or 'the signing keys overlap'}", markup=False)


@subscriptions_app.command("rate-limit")
def subscriptions_rate_limit(
    subscription_id: str,
    per_second: Annotated[
        int | None, typer.Argument(show_default=False, help="Deliveries started per second at most.")
    ] = None,
    off: Annotated[bool, typer.Option("--off", help="Lift the limit.")] = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Limit how many deliveries to a subscription start in any second, across every worker
    (N), or lift the limit (--off)."""
    if (per_second is None) == (not off):
        fail("give either a limit (deliveries per second) or --off", code=2)
    with AdminClient(url, token) as api:
        health = api.call(
            "PUT", f"/admin/subscriptions/{subscription_id}/rate-limit", json={"per_second": per_second}
        )
    limit = health["rate_limit"]
    shown = "no rate limit" if limit is None else f"at most {limit} deliveries per second"
    console.print(f"{health['id']}: {shown}", markup=False)


# ------------------------------------------------------------------------------- portal


def portal_link(
    platform: Annotated[
        str, typer.Argument(help="The platform's profile URI (the platform_profile of its subscriptions).")
    ],
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Print a link into the platform portal for one platform, valid 15 minutes: its own
    subscriptions, deliveries, test events, replays and verification snippets. Whoever opens it
    acts as that platform there: send it to the platform only."""
    with AdminClient(url, token) as api:
        link = api.call("POST", "/admin/portal-links", json={"platform": platform})
    typer.echo(link["url"])  # unwrapped: a terminal must be able to copy it whole
    typer.echo(f"valid until {link['expires_at']}")


# ------------------------------------------------------------------------------- probe


def probe(
    target: Annotated[
        str | None, typer.Argument(show_default=False, help="The endpoint URL (or give --subscription).")
    ] = None,
    subscription: Annotated[
        str | None, typer.Option("--subscription", help="Probe this subscription's URL, in its format.")
    ] = None,
    transport: Annotated[
        str | None, typer.Option("--format", help="rest or jsonrpc (default: the subscription's, else rest).")
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Find out whether a webhook endpoint really verifies what it receives: a battery of signed
    deliveries, most of them wrong on purpose, each judged by the answer (2xx or 4xx). Exits 1
    when any answer is wrong, so a platform can run it in CI against a staging endpoint."""
    if (target is None) == (subscription is None):
        fail("give an endpoint URL or --subscription, not both", code=2)
    if transport not in (None, "rest", "jsonrpc"):
        fail("--format is rest or jsonrpc", code=2)
    request = {"url": target, "subscription_id": subscription, "format": transport}
    with AdminClient(url, token, timeout=300.0) as api:
        run = api.call("POST", "/admin/probes", json={k: v for k, v in request.items() if v is not None})
    if as_json:
        typer.echo(json.dumps(run, indent=2))
    else:
        table = Table(title=f"probe of {run['target']} ({run['transport']})", title_justify="left")
        for column in ("case", "expected", "answer", "", "what it means"):
            table.add_column(column, overflow="fold")
        for case in run["results"]:
            answer = str(case["status"]) if case["status"] is not None else (case["error"] or "none")
            mark = Text("ok", style="green") if case["ok"] else Text("WRONG", style="bold red")
            table.add_row(case["case"], case["expected"], answer, mark, Text(case["finding"]))
        console.print(table)
        style = "green" if run["problems"] == 0 else "bold red"
        console.print(Text(run["verdict"], style=style))
    if run["problems"]:
        raise typer.Exit(1)


# ------------------------------------------------------------------------------- trigger, listen


def trigger(
    event_type: Annotated[str, typer.Argument(help="A USP event type, e.g. booking.confirmed.")],
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Post a realistic sample event (fresh event_id, timestamp now) to POST /events."""
    try:
        event = sample_event(event_type)
    except ValueError as exc:
        fail(str(exc), code=2)
    with AdminClient(url, token) as api:
        accepted = api.call("POST", "/events", content=event, headers={"Content-Type": "application/json"})
    console.print(
        f"{event_type} {accepted['event_id']} accepted: {accepted['deliveries']} deliveries", markup=False
    )


# ------------------------------------------------------------------------------- helpers


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _when(text: str | None) -> str | None:
    """An RFC 3339 moment with offset, or an age such as ``2h`` (that long before now)."""
    if text is None:
        return None
    age = parse_duration(text)
    if age is not None:
        return (datetime.now(UTC) - age).isoformat()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(f"{text!r} is neither RFC 3339 (2026-03-14T22:00:00Z) nor an age (90m, 2h, 7d)", code=2)
    if moment.tzinfo is None:
        fail(f"{text!r} has no UTC offset: add Z or +hh:mm", code=2)
    return moment.isoformat()


def _list(
    client: AdminClient,
    path: str,
    params: dict[str, Any],
    *,
    as_json: bool,
    title: str,
    columns: tuple[Column, ...],
    row: Callable[[dict[str, Any]], tuple[object, ...]],
) -> None:
    """One page of an admin listing: as JSON, or as a table of ``row(item)`` per item followed
    by the cursor of the next page."""
    with client as api:
        page = api.call("GET", path, params=params)
    if as_json:
        print_json(page)
        return
    # The terminal's width now (COLUMNS when set), not what the console found when it was made.
    width = shutil.get_terminal_size((console.width, 24)).columns
    shown = fitted_table(title, columns, [row(item) for item in page["items"]], width)
    Console(highlight=False, soft_wrap=True, width=width).print(shown)
    if page.get("next_cursor"):
        console.print(f"more: --cursor {page['next_cursor']}", markup=False)
