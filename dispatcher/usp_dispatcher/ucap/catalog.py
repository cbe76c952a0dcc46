"""Reading the catalog: search, lookup by any of UCAP's id forms, and content access (200 with the
post, or 402 with offers).

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.ucap.catalog``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, Literal
from urllib.parse import unquote

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlmodel import Session, col, select

from usp_core.clock import utcnow
from usp_dispatcher.ucap.agents import Agent
from usp_dispatcher.ucap.answers import Answer, invalid, not_found
from usp_dispatcher.ucap.search import SearchQuery, search
from usp_dispatcher.ucap.tables import AliasRow, EntitlementRow, PostRow, PostTierRow, PublicationRow, TierRow

__all__ = [
    "LookupIn",
    "SearchIn",
    "find_post",
    "lookup",
    "publication_view",
    "read_content",
    "search_catalog",
    "tier_view",
    "tiers_of",
]

MAX_LIMIT: Final = 25
DEFAULT_LIMIT: Final = 10
_RECENCY: Final = {
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "90d": timedelta(days=90),
}
_TEASER_WORDS: Final = 60
_WORDS_PER_MINUTE: Final = 230
#: Builds an offer's checkout link for an agent: (agent, publication id, tier id) -> URL.
OfferLink = Callable[[Agent, str, str], str]


# ------------------------------------------------------------------------------------ inputs


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class PriceFilter(_Open):
    max: int | None = Field(default=None, ge=0, le=100_000_000, description="cents per month")
    min: int | None = Field(default=None, ge=0)
    currency: str | None = Field(default=None, pattern=r"^[A-Za-z]{3}$")


class Filters(_Open):
    categories: list[str] = Field(default_factory=list, max_length=20)
    price: PriceFilter | None = None
    language: str | None = Field(default=None, max_length=35, pattern=r"^[A-Za-z]{1,8}(-[A-Za-z0-9]{1,8})*$")
    recency: Literal["24h", "7d", "30d", "90d"] | None = None


class Context(_Open):
    language: str | None = Field(default=None, max_length=35)
    currency: str | None = Field(default=None, pattern=r"^[A-Za-z]{3}$")
    intent: str | None = Field(default=None, max_length=1000)


class Pagination(_Open):
    limit: int = Field(default=DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)
    cursor: str | None = Field(default=None, max_length=200)


class SearchIn(_Strict):
    """``search_catalog``'s arguments, the body of ``POST /v1/catalog/search``."""

    query: str | None = Field(default=None, max_length=500)
    filters: Filters = Field(default_factory=Filters)
    context: Context = Field(default_factory=Context)
    pagination: Pagination = Field(default_factory=Pagination)


class LookupIn(_Strict):
    """``get_catalog_item``'s arguments, the body of ``POST /v1/catalog/lookup``."""

    id: str = Field(min_length=1, max_length=2100)
    context: Context = Field(default_factory=Context)


def parsed(model: type[BaseModel], data: Any) -> Any:
    """``data`` as ``model``, or a 400 ``invalid_request`` naming what is wrong (never the input)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        text = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in errors[:5])
        raise invalid(text) from None


# ------------------------------------------------------------------------------------ search


def search_catalog(session: Session, args: SearchIn, *, base_url: str) -> Answer:
    """Ranked results, publications and posts mixed, with an opaque cursor to the next page."""
    offset = _offset(args.pagination.cursor, args)
    price = args.filters.price
    currency = (price.currency if price and price.currency else args.context.currency) or "USD"
    since = utcnow() - _RECENCY[args.filters.recency] if args.filters.recency else None
    page = search(
        session,
        SearchQuery(
            text=args.query,
            categories=tuple(args.filters.categories),
            price_max=price.max if price else None,
            currency=currency,
            language=args.filters.language,
            since=since,
            limit=args.pagination.limit,
            offset=offset,
        ),
    )
    publications = _publications(session, {hit.publication_id for hit in page.hits})
    posts = _posts(session, [hit.doc_id for hit in page.hits if hit.kind == "post"])
    tiers = _tiers(session, set(publications))
    results: list[dict[str, Any]] = []
    for hit in page.hits:
        publication = publications[hit.publication_id]
        if hit.kind == "publication":
            entry: dict[str, Any] = {
                "type": "publication",
                "publication": publication_view(publication, tiers),
            }
        else:
            post, unlocking = posts[hit.doc_id]
            entry = {
                "type": "post",
                "post": post_view(post, publication, [tiers[t] for t in unlocking if t in tiers], base_url),
                "publication": _publication_summary(publication),
            }
        if hit.score is not None:
            entry["relevance_score"] = hit.score
        results.append(entry)
    following = offset + len(page.hits)
    cursor = _cursor(following, args) if following < page.total else None
    return Answer(
        {
            "results": results,
            "pagination": {"total": page.total, "limit": args.pagination.limit, "cursor": cursor},
            "messages": [],
        }
    )


def _cursor(offset: int, args: SearchIn) -> str:
    """Opaque: the offset, and a fingerprint of the search it belongs to (a cursor is refused for
    another search rather than paging it wrongly)."""
    raw = json.dumps({"o": offset, "q": _fingerprint(args)}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _offset(cursor: str | None, args: SearchIn) -> int:
    if not cursor:
        return 0
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        offset = int(data["o"])
        fingerprint = data["q"]
    except (ValueError, KeyError, TypeError):
        raise invalid("pagination.cursor is not a cursor this server gave") from None
    if fingerprint != _fingerprint(args) or not 0 <= offset <= 10_000:
        raise invalid("pagination.cursor belongs to another search")
    return offset


def _fingerprint(args: SearchIn) -> str:
    basis = args.model_dump(mode="json", exclude={"pagination"})
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------ lookup


def lookup(session: Session, item_id: str, *, base_url: str) -> Answer:
    """A publication or post by ``pub_…``, ``post_…``, ``slug:…``, ``patreon:…``, ``ghost:…`` or
    ``url:<encoded url>``; an unknown form is a 400, an unknown id a ``NOT_FOUND`` message."""
    kind, target = _resolve(session, item_id)
    if target is None:
        return Answer(
            {
                "type": "error",
                "publication": None,
                "post": None,
                "messages": [
                    {
                        "type": "error",
                        "code": "NOT_FOUND",
                        "message": f"Nothing has the id {kind}",
                        "severity": "recoverable",
                    }
                ],
            }
        )
    if isinstance(target, PublicationRow):
        tiers = _tiers(session, {target.id})
        view = publication_view(target, tiers)
        recent = session.exec(
            select(PostRow)
            .where(PostRow.publication_id == target.id)
            .order_by(col(PostRow.published_at).desc())
            .limit(5)
        ).all()
        unlocking = _unlocking(session, [p.id for p in recent])
        view["recent_posts"] = [
            post_view(p, target, [tiers[t] for t in unlocking.get(p.id, []) if t in tiers], base_url)
            for p in recent
        ]
        return Answer({"type": "publication", "publication": view, "messages": []})
    publication = session.get(PublicationRow, target.publication_id)
    assert publication is not None  # foreign key
    tiers = _tiers(session, {publication.id})
    post_tiers = _unlocking(session, [target.id]).get(target.id, [])
    return Answer(
        {
            "type": "post",
            "publication": _publication_summary(publication),
            "post": post_view(target, publication, [tiers[t] for t in post_tiers if t in tiers], base_url),
            "messages": [],
        }
    )


def _resolve(session: Session, item_id: str) -> tuple[str, PublicationRow | PostRow | None]:
    """The row an id names (``None`` when none does); a 400 for a form this server does not know."""
    text = item_id.strip()
    if text.startswith("pub_"):
        return text, session.get(PublicationRow, text)
    if text.startswith("post_"):
        return text, session.get(PostRow, text)
    form, sep, value = text.partition(":")
    if not sep or not value:
        raise invalid(
            "id must be pub_{id}, post_{id}, slug:{slug}, patreon:{id}, ghost:{id} or url:{encoded_url}"
        )
    if form == "slug":
        return text, session.exec(select(PublicationRow).where(PublicationRow.slug == value)).first()
    if form in ("patreon", "ghost", "url"):
        alias = f"url:{unquote(value)}" if form == "url" else f"{form}:{value}"
        row = session.get(AliasRow, alias)
        if row is None:
            return text, None
        if row.post_id is not None:
            return text, session.get(PostRow, row.post_id)
        return text, session.get(PublicationRow, row.publication_id)
    raise invalid(f"unknown id form {form[:20]!r}: use pub_, post_, slug:, patreon:, ghost: or url:")


# ------------------------------------------------------------------------------------ content


def find_post(session: Session, publisher_id: str, post_id: str) -> tuple[PublicationRow, PostRow]:
    """The post, within its publication (by id or slug); 404 ``content_not_found`` otherwise.

    One statement, as every read begins here. An id (``pub_…``) never reads as a slug, which has
    no ``_``, so the two never name different publications."""
    named = sa.or_(col(PublicationRow.id) == publisher_id, col(PublicationRow.slug) == publisher_id)
    found = session.exec(
        select(PublicationRow, PostRow)
        .join(PostRow, col(PostRow.publication_id) == col(PublicationRow.id))
        .where(col(PostRow.id) == post_id, named)
    ).first()
    if found is None:
        raise not_found("No such post in that publication.")
    return found[0], found[1]


def post_by_url(session: Session, url: str) -> tuple[PublicationRow, PostRow]:
    alias = session.get(AliasRow, f"url:{url}")
    post = session.get(PostRow, alias.post_id) if alias is not None and alias.post_id else None
    if post is None:
        raise not_found("No post has that URL.")
    publication = session.get(PublicationRow, post.publication_id)
    assert publication is not None
    return publication, post


def read_content(
    session: Session,
    agent: Agent,
    publication: PublicationRow,
    post: PostRow,
    *,
    base_url: str,
    offer_link: OfferLink,
) -> Answer:
    """The post when it is free or ``agent`` holds an active entitlement to a tier unlocking it;
    otherwise 402 with a teaser and one offer per such tier."""
    unlocking = _unlocking(session, [post.id]).get(post.id, [])
    if post.free or _entitled(session, agent, unlocking):
        return Answer(
            {
                "content": {"html": post.body_html, "text": post.body_text, "format": "html"},
                "metadata": _metadata(post, unlocking),
                "publisher": {"id": publication.id, "name": publication.name, "url": publication.url},
                "attribution": {
                    "required": True,
                    "format": f"Source: [{publication.name}]({post.url or publication.url or base_url})",
                },
            }
        )
    tiers = _tiers(session, {publication.id})
    offers = [
        tier_view(tiers[t]) | {"checkout_url": offer_link(agent, publication.id, t)}
        for t in unlocking
        if t in tiers
    ]
    return Answer(
        {
            "error": {"code": "payment_required", "message": "This content requires a subscription"},
            "teaser": {
                "title": post.title,
                "excerpt": post.excerpt,
                **_teaser(post),
                "author": post.author,
                "published_at": _time(post.published_at),
            },
            "offers": offers,
            "publisher": {"id": publication.id, "name": publication.name},
        },
        status=402,
    )


def _entitled(session: Session, agent: Agent, tier_ids: Sequence[str]) -> bool:
    if not tier_ids:
        return False
    found = session.exec(
        select(EntitlementRow.id)
        .where(EntitlementRow.agent_id == agent.id)
        .where(EntitlementRow.status == "active")
        .where(col(EntitlementRow.tier_id).in_(tier_ids))
        .where(sa.or_(col(EntitlementRow.renews_at).is_(None), col(EntitlementRow.renews_at) > utcnow()))
        .limit(1)
    ).first()
    return found is not None


# ------------------------------------------------------------------------------------ views


def publication_view(publication: PublicationRow, tiers: dict[str, TierRow]) -> dict[str, Any]:
    own = sorted((t for t in tiers.values() if t.publication_id == publication.id), key=lambda t: t.position)
    categories: list[str] = json.loads(publication.categories)
    view: dict[str, Any] = {
        "id": publication.id,
        "slug": publication.slug,
        "title": publication.name,
        "name": publication.name,
        "description": publication.description,
        "url": publication.url,
        "category": categories[0] if categories else None,
        "categories": categories,
        "language": publication.language,
        "tiers": [tier_view(t) for t in own],
    }
    if own:
        amounts = [t.price_amount for t in own]
        view["price"] = {
            "min": min(amounts),
            "max": max(amounts),
            "currency": own[0].currency,
            "interval": own[0].interval,
        }
    return {k: v for k, v in view.items() if v is not None}


def tier_view(tier: TierRow) -> dict[str, Any]:
    """A tier as UCAP's offers and tiers show it (``tier_id``/``tier_name``, and ``id``/``name``)."""
    return {
        "tier_id": tier.id,
        "tier_name": tier.name,
        "id": tier.id,
        "name": tier.name,
        "price": {"amount": tier.price_amount, "currency": tier.currency, "interval": tier.interval},
        "features": json.loads(tier.features),
    }


def post_view(
    post: PostRow, publication: PublicationRow, unlocking: Sequence[TierRow], base_url: str
) -> dict[str, Any]:
    cheapest = min(unlocking, key=lambda t: t.price_amount, default=None)
    view: dict[str, Any] = {
        "id": post.id,
        "publisher_id": publication.id,
        "title": post.title,
        "author": post.author,
        "excerpt": post.excerpt,
        "teaser": _teaser(post),
        "category": json.loads(post.categories),
        "language": post.language,
        "published_at": _time(post.published_at),
        "updated_at": _time(post.updated_at),
        "word_count": post.word_count,
        "reading_time_minutes": max(1, math.ceil(post.word_count / _WORDS_PER_MINUTE)),
        "access": "free" if post.free else "paid",
        "tier_ids": [t.id for t in unlocking],
        "content_url": f"{base_url.rstrip('/')}/v1/content/{publication.id}/{post.id}",
        "url": post.url,
    }
    if cheapest is not None:
        view["min_tier"] = {"id": cheapest.id, "name": cheapest.name, "price": tier_view(cheapest)["price"]}
    return {k: v for k, v in view.items() if v is not None}


def _publication_summary(publication: PublicationRow) -> dict[str, Any]:
    return {
        "id": publication.id,
        "slug": publication.slug,
        "title": publication.name,
        "name": publication.name,
    }


def _teaser(post: PostRow) -> dict[str, Any]:
    text = post.teaser or " ".join(post.body_text.split()[:_TEASER_WORDS])
    return {"text": text, "word_count": len(text.split()), "format": "text"}


def _metadata(post: PostRow, unlocking: Sequence[str]) -> dict[str, Any]:
    return {
        "id": post.id,
        "title": post.title,
        "author": post.author,
        "published_at": _time(post.published_at),
        "updated_at": _time(post.updated_at),
        "tier": unlocking[0] if unlocking else "free",
        "word_count": post.word_count,
        "reading_time_minutes": max(1, math.ceil(post.word_count / _WORDS_PER_MINUTE)),
    }


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------ loading


def tiers_of(session: Session, publication_id: str) -> dict[str, TierRow]:
    return _tiers(session, {publication_id})


def _publications(session: Session, ids: set[str]) -> dict[str, PublicationRow]:
    if not ids:
        return {}
    return {
        p.id: p for p in session.exec(select(PublicationRow).where(col(PublicationRow.id).in_(ids))).all()
    }


def _tiers(session: Session, publication_ids: set[str]) -> dict[str, TierRow]:
    if not publication_ids:
        return {}
    rows = session.exec(select(TierRow).where(col(TierRow.publication_id).in_(publication_ids))).all()
    return {t.id: t for t in rows}


def _posts(session: Session, ids: list[str]) -> dict[str, tuple[PostRow, list[str]]]:
    if not ids:
        return {}
    unlocking = _unlocking(session, ids)
    rows = session.exec(select(PostRow).where(col(PostRow.id).in_(ids))).all()
    return {p.id: (p, unlocking.get(p.id, [])) for p in rows}


def _unlocking(session: Session, post_ids: list[str]) -> dict[str, list[str]]:
    if not post_ids:
        return {}
    found: dict[str, list[str]] = {}
    rows = session.connection().execute(  # Core: two strings a row, no objects to build
        sa.select(col(PostTierRow.post_id), col(PostTierRow.tier_id))
        .where(col(PostTierRow.post_id).in_(post_ids))
        .order_by(col(PostTierRow.tier_id))
    )
    for post_id, tier_id in rows:
        found.setdefault(post_id, []).append(tier_id)
    return found
