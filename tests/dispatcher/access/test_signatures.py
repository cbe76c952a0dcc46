"""Agents authenticated by RFC 9421 signatures (Web Bot Auth): the key directory is fetched from
the Signature-Agent origin (a real uvicorn on 127.0.0.1) and the signature checked against it."""

from __future__ import annotations

import base64
import datetime
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from http_message_signatures import HTTPMessageVerifier, MappingKeyResolver, algorithms
from sqlalchemy.engine import Engine

from tests.dispatcher.access.conftest import Agent
from tests.dispatcher.conftest import ADMIN_TOKEN, MakeSettings
from usp_core import db
from usp_dispatcher.access import (
    AccessError,
    DirectoryCache,
    Identity,
    authenticate_http,
    issue_api_key,
    issue_booking_credential,
    verify_agent_signature,
)
from usp_dispatcher.access.signatures import parse_signature_agent, web_bot_auth_headers
from usp_dispatcher.cli.config import Settings
from usp_receiver import SigningKey, content_digest, jwk_thumbprint, sign_message

pytestmark = pytest.mark.anyio

URL = "https://shop.example/mcp"
BODY = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"usp_bookings_get"}}'
JSON = {"Content-Type": "application/json"}


def signed(
    agent: Agent, *, body: bytes = BODY, key: SigningKey | None = None, created: int | None = None
) -> dict[str, str]:
    return web_bot_auth_headers(
        "POST", URL, body, key or agent.key, signature_agent=agent.origin, created=created, digest=True
    )


async def verify(
    agent: Agent,
    headers: dict[str, str],
    settings: Settings,
    directories: DirectoryCache,
    *,
    body: bytes = BODY,
) -> Identity:
    return await verify_agent_signature(
        "POST", URL, headers, body, settings=settings, directories=directories
    )


async def refused(
    agent: Agent,
    headers: dict[str, str],
    settings: Settings,
    directories: DirectoryCache,
    *,
    body: bytes = BODY,
) -> str:
    with pytest.raises(AccessError) as caught:
        await verify(agent, headers, settings, directories, body=body)
    assert caught.value.code == -32001
    return caught.value.detail


async def test_valid_signature_is_the_agent(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    identity = await verify(agent, signed(agent), settings, directories)
    assert identity.principal == f"agent:{agent.origin}"
    assert identity.mechanism == "http_message_signatures"
    assert identity.key_thumbprint == jwk_thumbprint(agent.key.public.jwk)


async def test_directory_is_cached(agent: Agent, settings: Settings, directories: DirectoryCache) -> None:
    await verify(agent, signed(agent), settings, directories)
    await verify(agent, signed(agent), settings, directories)
    assert agent.fetches == 1


async def test_tampered_body_is_refused(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    headers = signed(agent)
    detail = await refused(agent, headers, settings, directories, body=BODY.replace(b"get", b"cancel"))
    assert "digest_mismatch" in detail


async def test_tampered_digest_and_body_are_refused(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    other = BODY.replace(b"get", b"cancel")
    headers = signed(agent) | {"Content-Digest": content_digest(other)}
    assert "bad_signature" in await refused(agent, headers, settings, directories, body=other)


async def test_other_path_is_refused(agent: Agent, settings: Settings, directories: DirectoryCache) -> None:
    with pytest.raises(AccessError):
        await verify_agent_signature(
            "POST",
            "https://shop.example/admin",
            signed(agent),
            BODY,
            settings=settings,
            directories=directories,
        )


async def test_unknown_key_is_refused(agent: Agent, settings: Settings, directories: DirectoryCache) -> None:
    stranger = SigningKey.generate()
    assert "unknown_key" in await refused(agent, signed(agent, key=stranger), settings, directories)


async def test_stale_signature_is_refused(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    headers = signed(agent, created=int(time.time()) - 301)
    assert "stale" in await refused(agent, headers, settings, directories)


async def test_future_signature_is_refused(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    headers = signed(agent, created=int(time.time()) + 120)
    assert "future" in await refused(agent, headers, settings, directories)


async def test_a_directory_without_the_key_is_refused(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    agent.directory = {"keys": [dict(SigningKey.generate().public.jwk)]}
    assert "unknown_key" in await refused(agent, signed(agent), settings, directories)


async def test_a_missing_directory_is_refused(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    agent.status = 404
    assert "404" in await refused(agent, signed(agent), settings, directories)


async def test_a_directory_that_is_not_a_jwks_is_refused(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    agent.directory = {"not": "a jwks"}
    assert "not a JWKS" in await refused(agent, signed(agent), settings, directories)


async def test_another_agents_directory_does_not_vouch(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    """A request signed by one agent but naming another's origin finds no key there."""
    impostor = SigningKey.generate()
    headers = web_bot_auth_headers("POST", URL, BODY, impostor, signature_agent=agent.origin, digest=True)
    assert "unknown_key" in await refused(agent, headers, settings, directories)


async def test_swapped_signature_agent_is_refused(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    """Signature-Agent is covered: pointing a captured request at a directory that republishes the
    public key (the directory is public) breaks the signature."""
    headers = signed(agent)
    copy_origin = agent.origin.replace("127.0.0.1", "localhost")
    headers["Signature-Agent"] = f'sig1="{copy_origin}"'
    with pytest.raises(AccessError):
        await verify(agent, headers, settings, directories)


async def test_signature_must_cover_signature_agent(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    headers = JSON | {"Signature-Agent": f'"{agent.origin}"', "Content-Digest": content_digest(BODY)}
    headers = hand_signed(headers, agent, ("@method", "@authority", "@path", "content-digest"))
    assert "Signature-Agent" in await refused(agent, headers, settings, directories)


async def test_signature_must_cover_the_digest_of_a_body(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    headers = JSON | {"Signature-Agent": f'"{agent.origin}"', "Content-Digest": content_digest(BODY)}
    headers = hand_signed(headers, agent, ("@method", "@authority", "@path", "signature-agent"), tag=None)
    assert "missing_component" in await refused(agent, headers, settings, directories)


async def test_dictionary_signature_agent(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    headers = JSON | {"Signature-Agent": f'agent1="{agent.origin}"', "Content-Digest": content_digest(BODY)}
    components = ("@method", "@authority", "@path", '"signature-agent";key="agent1"', "content-digest")
    headers = hand_signed(headers, agent, components)
    identity = await verify(agent, headers, settings, directories)
    assert identity.principal == f"agent:{agent.origin}"


async def test_other_tag_is_refused(agent: Agent, settings: Settings, directories: DirectoryCache) -> None:
    headers = hand_signed(
        JSON | {"Signature-Agent": f'"{agent.origin}"'},
        agent,
        ("@authority", "signature-agent"),
        tag="usp-webhook",
    )
    assert "tag_mismatch" in await refused(agent, headers, settings, directories)


async def test_signature_without_signature_agent_is_refused(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    headers = signed(agent)
    del headers["Signature-Agent"]
    assert "Signature-Agent" in await refused(agent, headers, settings, directories)


async def test_plain_http_agents_need_development_mode(
    agent: Agent, make_settings: MakeSettings, directories: DirectoryCache
) -> None:
    strict = make_settings(allow_private_targets=False)
    assert "https" in await refused(agent, signed(agent), strict, directories)
    assert agent.fetches == 0


async def test_private_addresses_are_not_fetched(
    agent: Agent, make_settings: MakeSettings, directories: DirectoryCache
) -> None:
    """With https required the name would still be checked: a loopback target is never fetched."""
    headers = web_bot_auth_headers("POST", URL, BODY, agent.key, signature_agent="https://127.0.0.1:1")
    assert "permitted" in await refused(
        agent, headers, make_settings(allow_private_targets=False), directories
    )


def test_parse_signature_agent_forms() -> None:
    assert parse_signature_agent('"https://A.example:443/x"').origin == "https://a.example"
    assert parse_signature_agent("https://a.example:8443").directory_url == (
        "https://a.example:8443/.well-known/http-message-signatures-directory"
    )
    for bad in (
        '"ftp://a.example"',
        '"https://u:p@a.example"',
        'a="https://a", b="https://b"',
        '"http://a.example"',
    ):
        with pytest.raises(AccessError):
            parse_signature_agent(bad)


# --------------------------------------------------------------------- authenticate_http


async def test_http_bearer_api_key(migrated: Engine, settings: Settings) -> None:
    with db.session(migrated) as session:
        token = issue_api_key(session, "acme")
    headers = {"Authorization": f"Bearer {token}"}
    identity = await authenticate_http("POST", URL, headers, BODY, engine=migrated, settings=settings)
    assert identity == Identity("key:acme", "bearer")


async def test_http_admin_token(migrated: Engine, settings: Settings) -> None:
    headers = {"authorization": f"bearer {ADMIN_TOKEN}"}
    identity = await authenticate_http("POST", URL, headers, BODY, engine=migrated, settings=settings)
    assert identity is not None
    assert identity.is_business


async def test_http_nothing_presented(migrated: Engine, settings: Settings) -> None:
    assert await authenticate_http("POST", URL, JSON, BODY, engine=migrated, settings=settings) is None


@pytest.mark.parametrize("value", ["Bearer uspk_nope", "Basic YWxhZGRpbjpvcGVuc2VzYW1l", "Bearer "])
async def test_http_bad_authorization(migrated: Engine, settings: Settings, value: str) -> None:
    with pytest.raises(AccessError) as caught:
        await authenticate_http(
            "POST", URL, {"Authorization": value}, BODY, engine=migrated, settings=settings
        )
    assert caught.value.code == -32001


async def test_http_signature(
    agent: Agent, migrated: Engine, settings: Settings, directories: DirectoryCache
) -> None:
    identity = await authenticate_http(
        "POST", URL, signed(agent), BODY, engine=migrated, settings=settings, directories=directories
    )
    assert identity is not None
    assert identity.principal == f"agent:{agent.origin}"


async def test_http_bad_signature_is_refused_even_with_a_good_bearer(
    agent: Agent, migrated: Engine, settings: Settings, directories: DirectoryCache
) -> None:
    headers = signed(agent, created=int(time.time()) - 1000) | {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with pytest.raises(AccessError):
        await authenticate_http(
            "POST", URL, headers, BODY, engine=migrated, settings=settings, directories=directories
        )


async def test_http_signatures_ignored_when_not_offered(
    agent: Agent, migrated: Engine, make_settings: MakeSettings, directories: DirectoryCache
) -> None:
    settings = make_settings(auth_mechanisms=("bearer",))
    identity = await authenticate_http(
        "POST", URL, signed(agent), BODY, engine=migrated, settings=settings, directories=directories
    )
    assert identity is None
    assert agent.fetches == 0


async def test_agent_key_rotation_is_picked_up_on_an_unknown_keyid(agent: Agent, settings: Settings) -> None:
    """A keyid the cached directory lacks refetches it (here at once: retry_after=0)."""
    cache = DirectoryCache(retry_after=0)
    await verify(agent, signed(agent), settings, cache)
    rotated = SigningKey.generate()
    agent.directory = {"keys": [dict(rotated.public.jwk)]}
    identity = await verify(agent, signed(agent, key=rotated), settings, cache)
    assert identity.key_thumbprint == jwk_thumbprint(rotated.public.jwk)
    assert agent.fetches == 2


async def test_unknown_keyid_does_not_refetch_within_retry_after(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    await verify(agent, signed(agent), settings, directories)
    for _ in range(3):
        await refused(agent, signed(agent, key=SigningKey.generate()), settings, directories)
    assert agent.fetches == 1


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_directory_is_kept_as_long_as_its_cache_control_says(
    agent: Agent, settings: Settings
) -> None:
    """``max-age`` past the default five minutes is honoured; clamped to ``max_ttl``."""
    clock = Clock()
    cache = DirectoryCache(clock=clock, max_ttl=1800)
    agent.cache_control = "public, max-age=900"
    await verify(agent, signed(agent), settings, cache)
    clock.now += 899
    await verify(agent, signed(agent), settings, cache)
    assert agent.fetches == 1
    clock.now += 2
    await verify(agent, signed(agent), settings, cache)
    assert agent.fetches == 2
    agent.cache_control = "max-age=86400"
    clock.now += 901
    await verify(agent, signed(agent), settings, cache)
    clock.now += 1801
    await verify(agent, signed(agent), settings, cache)
    assert agent.fetches == 4  # a day asked for, half an hour kept


async def test_no_cache_keeps_a_directory_for_retry_after_only(agent: Agent, settings: Settings) -> None:
    clock = Clock()
    cache = DirectoryCache(clock=clock, retry_after=10)
    agent.cache_control = "no-cache"
    await verify(agent, signed(agent), settings, cache)
    clock.now += 11
    await verify(agent, signed(agent), settings, cache)
    assert agent.fetches == 2


async def test_concurrent_lookups_of_a_cold_directory_share_one_fetch(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    identities: list[Identity] = []

    async def one() -> None:
        identities.append(await verify(agent, signed(agent), settings, directories))

    async with anyio.create_task_group() as group:
        for _ in range(8):
            group.start_soon(one)
    assert len(identities) == 8
    assert agent.fetches == 1


async def test_a_failed_refresh_serves_the_cached_keys_for_stale_if_error_only(
    agent: Agent, settings: Settings
) -> None:
    """The directory down: its last keys keep verifying (asked again every ``retry_after``) until
    ``stale_if_error`` past their freshness, then the agent is refused."""
    clock = Clock()
    cache = DirectoryCache(clock=clock, ttl=300, retry_after=10, stale_if_error=600)
    await verify(agent, signed(agent), settings, cache)
    agent.status = 503
    clock.now += 301
    await verify(agent, signed(agent), settings, cache)
    await verify(agent, signed(agent), settings, cache)
    assert agent.fetches == 2  # the failure is not asked again within retry_after
    clock.now += 11
    await verify(agent, signed(agent), settings, cache)
    assert agent.fetches == 3
    clock.now += 600
    assert "answered 503" in await refused(agent, signed(agent), settings, cache)
    agent.status = 200
    clock.now += 11
    await verify(agent, signed(agent), settings, cache)


async def test_a_directory_never_fetched_is_refused_while_down_and_not_asked_again_at_once(
    agent: Agent, settings: Settings
) -> None:
    clock = Clock()
    cache = DirectoryCache(clock=clock, retry_after=10)
    agent.status = 500
    for _ in range(3):
        await refused(agent, signed(agent), settings, cache)
    assert agent.fetches == 1
    clock.now += 11
    await refused(agent, signed(agent), settings, cache)
    assert agent.fetches == 2


async def test_http_booking_credential_as_bearer_is_not_an_identity(
    migrated: Engine, settings: Settings
) -> None:
    """Booking credentials travel in _meta.usp.authorization; in the header they count as absent."""
    with db.session(migrated) as session:
        issued = issue_booking_credential(session, settings, booking_id="bkg_1", profile=None, jkt="thumb")
    headers = {"Authorization": f"Bearer {issued['credential']}"}
    assert await authenticate_http("POST", URL, headers, BODY, engine=migrated, settings=settings) is None


# --------------------------------------------------------------------- Web Bot Auth as others sign


def minimum(agent: Agent, method: str, body: bytes, **fields: str) -> dict[str, str]:
    """Signed as Cloudflare's ``web-bot-auth`` signs by default: ``("@authority" "signature-agent")``
    with ``created``, ``expires``, a 64-byte nonce, ``keyid`` and ``tag``."""
    moment = int(time.time())
    return hand_signed(
        {"Signature-Agent": f'"{agent.origin}"', **fields},
        agent,
        ("@authority", "signature-agent"),
        method=method,
        expires=moment + 300,
        nonce=base64.b64encode(secrets.token_bytes(64)).decode(),
    )


def hand_signed(
    headers: dict[str, str],
    agent: Agent,
    components: tuple[str, ...],
    *,
    method: str = "POST",
    tag: str | None = "web-bot-auth",
    **params: Any,
) -> dict[str, str]:
    """``headers`` with one signature by ``agent`` over ``components``, made now."""
    member = sign_message(
        method,
        URL,
        headers,
        agent.key,
        label="sig1",
        components=components,
        created=int(time.time()),
        tag=tag,
        **params,
    )
    return headers | {"Signature-Input": member.signature_input, "Signature": member.signature}


@pytest.mark.parametrize(("method", "body"), [("GET", b""), ("POST", BODY)])
async def test_the_drafts_minimum_verifies(
    agent: Agent, settings: Settings, directories: DirectoryCache, method: str, body: bytes
) -> None:
    headers = minimum(agent, method, body, **(JSON if body else {}))
    identity = await verify_agent_signature(
        method, URL, headers, body, settings=settings, directories=directories
    )
    assert identity.principal == f"agent:{agent.origin}"


async def test_a_digest_that_is_sent_must_be_covered_and_match(
    agent: Agent, settings: Settings, directories: DirectoryCache
) -> None:
    uncovered = minimum(agent, "POST", BODY, **JSON, **{"Content-Digest": content_digest(BODY)})
    assert "content-digest" in await refused(agent, uncovered, settings, directories)


async def test_a_stricter_required_set_is_a_setting_and_the_refusal_names_what_is_missing(
    agent: Agent, make_settings: MakeSettings, directories: DirectoryCache
) -> None:
    strict = make_settings(agent_signature_components="@authority,@method,@path")
    detail = await refused(agent, minimum(agent, "POST", BODY, **JSON), strict, directories)
    assert "missing_component" in detail
    assert '"@method"' in detail
    assert '"@path"' in detail
    assert await verify(agent, signed(agent), strict, directories)  # ours covers them


def test_our_signature_verifies_with_http_message_signatures() -> None:
    """The ``http-message-signatures`` library (an independent RFC 9421 implementation) verifies
    our agent's requests, GET and POST."""
    key = SigningKey.generate()
    resolver = MappingKeyResolver(
        public_keys={jwk_thumbprint(key.public.jwk): key.public.key}, private_keys={}
    )
    verifier = HTTPMessageVerifier(signature_algorithm=algorithms.ED25519, key_resolver=resolver)
    for method, body in (("GET", b""), ("POST", BODY)):
        fields = web_bot_auth_headers(
            method, URL, body, key, signature_agent="https://registry.example/a.json"
        )
        message = LibraryRequest(method, URL, fields)
        (result,) = verifier.verify(
            message, max_age=datetime.timedelta(seconds=300), expect_tag="web-bot-auth"
        )
        assert result.parameters["keyid"] == jwk_thumbprint(key.public.jwk)
        assert '"signature-agent"' in str(result.covered_components)


@dataclass
class LibraryRequest:
    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
