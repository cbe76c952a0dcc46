"""The publisher's side: add publications, tiers and posts (admin API, CLI, demo seed), each with
its search entry and its event in the same transaction.
"""

from __future__ import annotations

import html
import json
import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import Session, select

from usp_core.clock import utcnow
from usp_dispatcher.errors import Conflict, NotFound, Refused
from usp_dispatcher.ucap.events import emit_post_event, emit_publication_updated
from usp_dispatcher.ucap.search import add_publication_tier, index_document, touch_publication
from usp_dispatcher.ucap.tables import AliasRow, CategoryRow, PostRow, PostTierRow, PublicationRow, TierRow
from usp_schemas import PostPublished, PostUpdated

__all__ = ["PostIn", "PublicationIn", "TierIn", "add_post", "add_publication", "add_tier", "update_post"]

_TAGS = re.compile(r"<[^>]+>")
_SLUG = r"^[a-z0-9][a-z0-9-]{0,119}$"
_ALIAS = r"^(patreon|ghost):[\x21-\x7e]{1,200}$"


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TierIn(_In):
    id: str | None = Field(default=None, pattern=r"^tier_[0-9A-Za-z_-]{1,120}$")
    name: str = Field(min_length=1, max_length=200)
    price_amount: int = Field(ge=0, le=100_000_000, description="minor units (cents)")
    currency: str = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217")
    interval: Literal["month", "year", "once"] = "month"
    features: list[str] = Field(default_factory=list, max_length=20)
    stripe_price_id: str | None = Field(default=None, max_length=255)


class PublicationIn(_In):
    id: str | None = Field(default=None, pattern=r"^pub_[0-9A-Za-z_-]{1,120}$")
    slug: str = Field(pattern=_SLUG)
    name: str = Field(min_length=1, max_length=200)
    description: str | None = Field(default=None, max_length=5000)
    categories: list[str] = Field(default_factory=list, max_length=20)
    language: str | None = Field(default=None, pattern=r"^[A-Za-z]{1,8}(-[A-Za-z0-9]{1,8})*$")
    url: str | None = Field(default=None, max_length=2000, pattern=r"^https?://")
    external_ids: list[str] = Field(default_factory=list, max_length=10, description="patreon:…, ghost:…")
    tiers: list[TierIn] = Field(default_factory=list, max_length=20)


class PostIn(_In):
    id: str | None = Field(default=None, pattern=r"^post_[0-9A-Za-z_-]{1,120}$")
    title: str = Field(min_length=1, max_length=500)
    author: str | None = Field(default=None, max_length=200)
    excerpt: str | None = Field(default=None, max_length=2000)
    teaser: str | None = Field(default=None, max_length=5000)
    body_html: str = Field(min_length=1, max_length=2_000_000)
    body_text: str | None = Field(default=None, max_length=2_000_000, description="default: the HTML's text")
    categories: list[str] = Field(default_factory=list, max_length=20)
    language: str | None = Field(default=None, pattern=r"^[A-Za-z]{1,8}(-[A-Za-z0-9]{1,8})*$")
    url: str | None = Field(default=None, max_length=2000, pattern=r"^https?://")
    external_ids: list[str] = Field(default_factory=list, max_length=10)
    tier_ids: list[str] = Field(default_factory=list, max_length=20, description="empty: a free post")
    published_at: datetime | None = None


def add_publication(
    session: Session, data: PublicationIn, *, now: datetime | None = None, announce: bool = True
) -> PublicationRow:
    """A new publication with its tiers; emits ``content.publication.updated`` (unless not
    ``announce``: the demo seed). The caller commits."""
    moment = now or utcnow()
    if session.exec(select(PublicationRow).where(PublicationRow.slug == data.slug)).first() is not None:
        raise Conflict("slug_taken", f"A publication already has the slug {data.slug!r}.")
    row = PublicationRow(
        slug=data.slug,
        name=data.name,
        description=data.description,
        categories=json.dumps(data.categories),
        language=data.language,
        url=data.url,
        created_at=moment,
        updated_at=moment,
    )
    if data.id:
        row.id = data.id
    if session.get(PublicationRow, row.id) is not None:
        raise Conflict("publication_exists", f"The publication {row.id} exists already.")
    session.add(row)
    session.flush()
    _aliases(session, data.external_ids, data.url, publication_id=row.id, post_id=None)
    _categories(session, row.id, data.categories)
    tiers = [_tier(session, row.id, tier, position) for position, tier in enumerate(data.tiers)]
    _index_publication(session, row, [tier.id for tier in tiers])
    session.flush()
    if announce:
        emit_publication_updated(session, row, now=moment)
    return row


def add_tier(session: Session, publication_id: str, data: TierIn, *, now: datetime | None = None) -> TierRow:
    """Another tier of a publication; emits ``content.publication.updated``."""
    publication = _publication(session, publication_id)
    count = len(session.exec(select(TierRow.id).where(TierRow.publication_id == publication.id)).all())
    tier = _tier(session, publication.id, data, count)
    add_publication_tier(session, publication.id, tier.id)
    publication.updated_at = now or utcnow()
    session.add(publication)
    session.flush()
    emit_publication_updated(session, publication, now=publication.updated_at)
    return tier


def add_post(
    session: Session, publication_id: str, data: PostIn, *, now: datetime | None = None, announce: bool = True
) -> PostRow:
    """Publish a post; emits ``content.post.published`` (unless not ``announce``). Its tiers must
    be the publication's."""
    moment = now or utcnow()
    publication = _publication(session, publication_id)
    _check_tiers(session, publication.id, data.tier_ids)
    text = data.body_text if data.body_text is not None else _text_of(data.body_html)
    row = PostRow(
        publication_id=publication.id,
        title=data.title,
        author=data.author,
        excerpt=data.excerpt,
        teaser=data.teaser,
        body_html=data.body_html,
        body_text=text,
        categories=json.dumps(data.categories),
        language=data.language or publication.language,
        url=data.url,
        word_count=len(text.split()),
        free=not data.tier_ids,
        published_at=data.published_at or moment,
        updated_at=moment,
    )
    if data.id:
        if session.get(PostRow, data.id) is not None:
            raise Conflict("post_exists", f"The post {data.id} exists already.")
        row.id = data.id
    session.add(row)
    session.flush()
    for tier_id in dict.fromkeys(data.tier_ids):
        session.add(PostTierRow(post_id=row.id, tier_id=tier_id))
    _aliases(session, data.external_ids, data.url, publication_id=publication.id, post_id=row.id)
    _categories(session, row.id, data.categories)
    _index_post(session, row, list(dict.fromkeys(data.tier_ids)))
    session.flush()
    if announce:
        emit_post_event(session, PostPublished, row, now=moment)
    return row


def update_post(session: Session, post_id: str, data: PostIn, *, now: datetime | None = None) -> PostRow:
    """Replace a post's content and metadata (not its id or publication); emits
    ``content.post.updated``."""
    moment = now or utcnow()
    row = session.get(PostRow, post_id)
    if row is None:
        raise NotFound("post_not_found", f"There is no post {post_id}.")
    _check_tiers(session, row.publication_id, data.tier_ids)
    text = data.body_text if data.body_text is not None else _text_of(data.body_html)
    row.title, row.author, row.excerpt, row.teaser = data.title, data.author, data.excerpt, data.teaser
    row.body_html, row.body_text, row.word_count = data.body_html, text, len(text.split())
    row.categories, row.url, row.free = json.dumps(data.categories), data.url, not data.tier_ids
    row.language = data.language or row.language
    row.updated_at = moment
    session.add(row)
    for link in session.exec(select(PostTierRow).where(PostTierRow.post_id == row.id)).all():
        session.delete(link)
    for category in session.exec(select(CategoryRow).where(CategoryRow.doc_id == row.id)).all():
        session.delete(category)
    session.flush()
    for tier_id in dict.fromkeys(data.tier_ids):
        session.add(PostTierRow(post_id=row.id, tier_id=tier_id))
    _categories(session, row.id, data.categories)
    _index_post(session, row, list(dict.fromkeys(data.tier_ids)))
    session.flush()
    emit_post_event(session, PostUpdated, row, now=moment)
    return row


def _publication(session: Session, publication_id: str) -> PublicationRow:
    row = session.get(PublicationRow, publication_id)
    if row is None:
        raise NotFound("publication_not_found", f"There is no publication {publication_id}.")
    return row


def _tier(session: Session, publication_id: str, data: TierIn, position: int) -> TierRow:
    tier = TierRow(
        publication_id=publication_id,
        name=data.name,
        price_amount=data.price_amount,
        currency=data.currency,
        interval=data.interval,
        features=json.dumps(data.features),
        stripe_price_id=data.stripe_price_id,
        position=position,
    )
    if data.id:
        if session.get(TierRow, data.id) is not None:
            raise Conflict("tier_exists", f"The tier {data.id} exists already.")
        tier.id = data.id
    session.add(tier)
    return tier


def _check_tiers(session: Session, publication_id: str, tier_ids: list[str]) -> None:
    for tier_id in tier_ids:
        tier = session.get(TierRow, tier_id)
        if tier is None or tier.publication_id != publication_id:
            raise Refused("tier_not_found", f"The publication has no tier {tier_id}.")


def _aliases(
    session: Session, external_ids: list[str], url: str | None, *, publication_id: str, post_id: str | None
) -> None:
    names = list(external_ids) + ([f"url:{url}"] if url else [])
    for name in dict.fromkeys(names):
        if not name.startswith("url:") and not re.match(_ALIAS, name):
            raise Refused("invalid_external_id", "External ids look like patreon:{id} or ghost:{id}.")
        if session.get(AliasRow, name) is not None:
            raise Conflict("external_id_taken", f"Something else already has the id {name[:120]}.")
        session.add(AliasRow(alias=name, publication_id=publication_id, post_id=post_id))


def _categories(session: Session, doc_id: str, categories: list[str]) -> None:
    for category in dict.fromkeys(c.strip().lower()[:100] for c in categories if c.strip()):
        session.add(CategoryRow(doc_id=doc_id, category=category))


def _index_publication(session: Session, row: PublicationRow, tier_ids: list[str]) -> None:
    index_document(
        session,
        doc_id=row.id,
        kind="publication",
        publication_id=row.id,
        published_at=row.created_at,
        language=row.language,
        free=False,
        categories=json.loads(row.categories),
        tier_ids=tier_ids,
        title=row.name,
        summary=" ".join([row.description or "", *json.loads(row.categories)]),
        body="",
    )


def _index_post(session: Session, row: PostRow, tier_ids: list[str]) -> None:
    index_document(
        session,
        doc_id=row.id,
        kind="post",
        publication_id=row.publication_id,
        published_at=row.published_at,
        language=row.language,
        free=row.free,
        categories=json.loads(row.categories),
        tier_ids=tier_ids,
        title=row.title,
        summary=" ".join(
            [row.excerpt or "", row.teaser or "", row.author or "", *json.loads(row.categories)]
        ),
        body=row.body_text,
    )
    touch_publication(session, row.publication_id, row.published_at)


def _text_of(markup: str) -> str:
    return " ".join(html.unescape(_TAGS.sub(" ", markup)).split())
