"""The ``/v1`` operations as one object the HTTP routes and the remote MCP tools both call: the
HTTP API is the source of truth, and a tool is the same operation reached another way (the seed:
"MCP tools SHOULD wrap the HTTP API"). Authentication differs only in where the signature is
(the ``/v1`` request's, or the MCP request's), and both go through the same verifier and nonce
store; rate limits, entitlements and every refusal are here, once.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.ucap.service``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

import anyio.to_thread
from sqlalchemy.engine import Engine
from sqlmodel import Session

from usp_core import db
from usp_core.clock import utcnow
from usp_core.ssrf import Resolver
from usp_dispatcher.access.nonces import nonces_for
from usp_dispatcher.errors import PaymentRefused, UcapError
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.ucap.agents import Agent, RateLimiter, authenticate_agent
from usp_dispatcher.ucap.answers import Answer
from usp_dispatcher.ucap.catalog import (
    LookupIn,
    SearchIn,
    find_post,
    lookup,
    parsed,
    post_by_url,
    read_content,
    search_catalog,
)
from usp_dispatcher.ucap.payments import (
    SandboxFacilitator,
    facilitator_for,
    stored_offer,
    usdc_requirement,
)
from usp_dispatcher.ucap.settings import UcapSettings
from usp_dispatcher.ucap.subscriptions import (
    Fulfilment,
    OfferLinks,
    SubscribeIn,
    cancel_entitlement,
    checkout_by_provider_ref,
    checkout_of,
    fulfil,
    list_entitlements,
    open_usdc_checkout,
    subscribe,
)
from usp_dispatcher.ucap.tables import TierRow
from usp_dispatcher.ucap.x402 import (
    PAYMENT_REQUIRED,
    PAYMENT_RESPONSE,
    V1_PAYMENT_RESPONSE,
    Payment,
    carries_payment,
    encode,
    payment_from_headers,
    payment_required,
)

__all__ = ["UcapService"]

_T = TypeVar("_T")


class UcapService:
    """Everything ``/v1`` does, for one database."""

    def __init__(
        self,
        engine: Engine,
        settings: ApiSettings,
        ucap: UcapSettings,
        *,
        resolver: Callable[[], Resolver | None] = lambda: None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.ucap = ucap
        self.base_url = settings.public_base_url.rstrip("/")
        admin = settings.admin_token.get_secret_value() if settings.admin_token is not None else None
        self.offers = OfferLinks.for_settings(ucap, admin, self.base_url)
        self.sandbox_facilitator = SandboxFacilitator()
        self.limiter = RateLimiter(ucap.rate_limit_per_minute)
        self.nonces = nonces_for(engine, settings)
        self._resolver = resolver

    # -------------------------------------------------------------------------------- who

    async def authenticate(self, method: str, url: str, headers: Mapping[str, str], body: bytes) -> Agent:
        """The agent a ``/v1`` request's signature proves (403 otherwise), counted against its
        rate limit (429)."""
        agent = await authenticate_agent(
            method, url, headers, body, settings=self.settings, nonces=self.nonces, resolver=self._resolver()
        )
        self.limiter.check(agent)
        return agent

    # -------------------------------------------------------------------------------- operations

    async def search(self, agent: Agent, arguments: Any) -> Answer:
        args: SearchIn = parsed(SearchIn, arguments)
        return await self._db(lambda s: search_catalog(s, args, base_url=self.base_url))

    async def lookup(self, agent: Agent, arguments: Any) -> Answer:
        args: LookupIn = parsed(LookupIn, arguments)
        return await self._db(lambda s: lookup(s, args.id, base_url=self.base_url))

    async def read(
        self, agent: Agent, publisher_id: str, post_id: str, headers: Mapping[str, str] | None = None
    ) -> Answer:
        """The post, or 402 with UCAP's offers and, for those a dollar buys, x402 v2's
        ``PAYMENT-REQUIRED``: a request that carries a ``PAYMENT-SIGNATURE`` for one of them
        subscribes, pays and reads in one exchange (answered with ``PAYMENT-RESPONSE``)."""

        def work(session: Session) -> tuple[Answer, list[TierRow]]:
            publication, post = find_post(session, publisher_id, post_id)
            answer = read_content(
                session, agent, publication, post, base_url=self.base_url, offer_link=self.offers.link
            )
            offered = [session.get(TierRow, o["tier_id"]) for o in answer.body.get("offers", ())]
            return answer, [t for t in offered if t is not None and t.currency.upper() == "USD"]

        answer, tiers = await self._db(work)
        if answer.status != 402 or not tiers:
            return answer
        resource = {
            "url": f"{self.base_url}/v1/content/{publisher_id}/{post_id}",
            "description": f"A subscription that unlocks {publisher_id}/{post_id}",
            "mimeType": "application/json",
        }
        accepts = [usdc_requirement(self.ucap, tier) for tier in tiers]
        asked = {PAYMENT_REQUIRED: encode(payment_required(resource, accepts, "payment_required"))}
        try:
            payment = payment_from_headers(headers or {})
            if payment is None:
                return replace(answer, headers=answer.headers | asked)
            if payment.version != 2:
                raise PaymentRefused("invalid_x402_version", "content is paid in x402 version 2")
            chosen = next((r for r in accepts if _accepts(payment, r)), None)
            if chosen is None:
                raise PaymentRefused(
                    "invalid_payment_requirements", "the payment accepted no offer of this post"
                )
            await self._verify(payment, chosen)  # before anything is written for it
            started = await self.subscribe(
                agent,
                {"publisher_id": publisher_id, "tier_id": chosen["extra"]["tier"], "payment_method": "usdc"},
            )
            checkout_id = started.body["checkout"]["session_id"]
            settled = await self._settle(payment, chosen)
        except PaymentRefused as exc:
            refused = {PAYMENT_REQUIRED: encode(payment_required(resource, accepts, exc.reason))}
            return replace(answer, headers=answer.headers | refused)
        await self._db(lambda s: fulfil(s, checkout_id, payment_nonce=payment.nonce))
        paid = await self.read(agent, publisher_id, post_id)
        return replace(paid, headers=paid.headers | {PAYMENT_RESPONSE: encode(settled)})

    async def read_url(self, agent: Agent, url: str) -> Answer:
        def work(session: Session) -> Answer:
            publication, post = post_by_url(session, url)
            return read_content(
                session, agent, publication, post, base_url=self.base_url, offer_link=self.offers.link
            )

        return await self._db(work)

    async def subscribe(
        self, agent: Agent, arguments: Any, headers: Mapping[str, str] | None = None
    ) -> Answer:
        """A pending subscription and its checkout; for ``usdc``, 402 with x402's requirements.
        The same request sent again with an x402 payment pays the checkout the first one opened
        (the one a v2 payment names, else the agent's newest for the tier; a new one if none):
        an x402 client subscribes and pays in one exchange."""
        args: SubscribeIn = parsed(SubscribeIn, arguments)
        if args.payment_method == "usdc" and headers is not None and carries_payment(headers):
            named = _named_checkout(headers, self.base_url)
            checkout_id = await self._db(lambda s: open_usdc_checkout(s, agent, args, named))
            if checkout_id is None:
                opened = await self._db(
                    lambda s: subscribe(s, agent, args, settings=self.ucap, base_url=self.base_url)
                )
                checkout_id = opened.body["checkout"]["session_id"]
            return await self.pay(checkout_id, headers)
        return await self._db(lambda s: subscribe(s, agent, args, settings=self.ucap, base_url=self.base_url))

    async def entitlements(self, agent: Agent) -> Answer:
        return await self._db(lambda s: list_entitlements(s, agent))

    async def cancel(self, agent: Agent, entitlement_id: str) -> Answer:
        return await self._db(lambda s: cancel_entitlement(s, agent, entitlement_id))

    async def pay(self, checkout_id: str, headers: Mapping[str, str]) -> Answer:
        """Pay a USDC checkout with an x402 payment (v2 ``PAYMENT-SIGNATURE`` or v1 ``X-PAYMENT``):
        the facilitator verifies and settles it, and only then is it fulfilled. Without a payment:
        402 asking in both versions. The same payment sent again (a retry after a lost answer) is
        answered as paid, not charged twice."""
        checkout = await self._db(lambda s: checkout_of(s, checkout_id))
        if checkout.provider != "usdc" or not checkout.requirements:
            raise UcapError(409, "not_a_usdc_checkout", "This checkout session is not paid with USDC.")
        offer = stored_offer(checkout.requirements)
        if checkout.status == "expired" or (checkout.status == "open" and checkout.expires_at <= utcnow()):
            raise UcapError(409, "checkout_expired", "The checkout session expired; subscribe again.")
        try:
            payment = payment_from_headers(headers)
            if payment is None:
                body, asked = offer.asked("X-PAYMENT header is required")
                return Answer(body, status=402, headers=asked)
            if checkout.status == "complete":
                if checkout.payment_nonce != payment.nonce:
                    raise UcapError(409, "checkout_complete", "This checkout session was paid already.")
                settled: dict[str, Any] = {"success": True, "transaction": None}
            else:
                requirements = offer.requirement if payment.version == 2 else offer.v1()
                settled = await self._settle(payment, requirements)
        except PaymentRefused as exc:
            body, asked = offer.asked(exc.reason)
            refused = body | {"message": f"The payment was refused: {exc.reason}."}
            return Answer(refused, status=402, headers=asked)
        done: Fulfilment = await self._db(lambda s: fulfil(s, checkout_id, payment_nonce=payment.nonce))
        receipt = PAYMENT_RESPONSE if payment.version == 2 else V1_PAYMENT_RESPONSE
        return Answer(
            {
                "status": "active",
                "subscription_id": done.subscription_id,
                "entitlement_id": done.entitlement_id,
                "transaction": settled.get("transaction"),
                "message": "Paid: the subscription is active." if done.granted else "Already paid.",
            },
            headers={receipt: encode(settled)},
        )

    async def _verify(self, payment: Payment, requirements: Mapping[str, Any]) -> None:
        """The facilitator's verification (``requirements`` in the payment's version)."""
        verdict = await facilitator_for(self.ucap, self.sandbox_facilitator).verify(payment.raw, requirements)
        if not verdict.get("isValid"):
            raise PaymentRefused(str(verdict.get("invalidReason") or "invalid_payment"), "not valid")

    async def _settle(self, payment: Payment, requirements: Mapping[str, Any]) -> dict[str, Any]:
        """The facilitator's verification, then its settlement: what it answered."""
        await self._verify(payment, requirements)
        settled = await facilitator_for(self.ucap, self.sandbox_facilitator).settle(payment.raw, requirements)
        if not settled.get("success"):
            raise PaymentRefused(str(settled.get("errorReason") or "unexpected_settle_error"), "not settled")
        return settled

    async def confirm(self, checkout_id: str) -> Fulfilment:
        """Complete a checkout session as its provider's webhook would (sandbox pages, the operator's
        ``payments confirm``)."""
        return await self._db(lambda s: fulfil(s, checkout_id))

    async def confirm_provider_ref(self, provider_ref: str) -> Fulfilment:
        """Complete the checkout a provider knows as ``provider_ref`` (a Stripe session id), as its
        webhook asks; 404 ``checkout_not_found`` for one of no checkout here."""
        return await self._db(lambda s: fulfil(s, checkout_by_provider_ref(s, provider_ref).id))

    async def _db(self, work: Callable[[Session], _T]) -> _T:
        return await anyio.to_thread.run_sync(partial(_in_session, self.engine, work))


def _in_session(engine: Engine, work: Callable[[Session], _T]) -> _T:
    with db.session(engine) as session:
        return work(session)


def _named_checkout(headers: Mapping[str, str], base_url: str) -> str | None:
    """The checkout a v2 payment's ``resource`` names (``…/v1/checkout/{id}/pay``), if any."""
    try:
        payment = payment_from_headers(headers)
    except PaymentRefused:
        return None  # judged when it is paid
    resource = payment.raw.get("resource") if payment is not None else None
    url = resource.get("url") if isinstance(resource, dict) else None
    prefix = f"{base_url}/v1/checkout/"
    if not isinstance(url, str) or not url.startswith(prefix) or not url.endswith("/pay"):
        return None
    return url.removeprefix(prefix).removesuffix("/pay") or None


def _accepts(payment: Payment, requirement: Mapping[str, Any]) -> bool:
    """Whether a v2 payment's ``accepted`` is ``requirement`` (the tier it buys is in ``extra``)."""
    accepted = payment.accepted or {}
    return bool(
        accepted.get("extra") == requirement["extra"] and accepted.get("amount") == requirement["amount"]
    )
