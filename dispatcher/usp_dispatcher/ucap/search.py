"""Ranked full-text search over publications and posts: PostgreSQL full-text search on
PostgreSQL, SQLite FTS5 on the embedded default, behind :func:`index_document` and :func:`search`.

Both index the same three fields, weighted title > summary (description, excerpt, teaser) > body,
with English stemming (``english`` configuration; FTS5's ``porter`` tokenizer). A query's words are
OR-ed: documents matching more (and rarer) words rank first (``ts_rank_cd``; FTS5's ``bm25``),
so a natural-language query still finds something. Without words, results come newest first.
Filters are applied in the same statement, through the ``ucap_*`` tables.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlmodel import Session

__all__ = ["Hit", "SearchQuery", "index_document", "search", "unindex_document"]

_WORD: Final = re.compile(r"\w+", re.UNICODE)
_MAX_WORDS: Final = 16
#: Free posts, and posts and publications with a tier in ``:currency`` at most ``:price_max`` a
#: month (a yearly tier counts a twelfth of its price).
_PRICE_AT_MOST: Final = (
    "((s.kind = 'post' AND (p.free OR EXISTS (SELECT 1 FROM ucap_post_tiers pt JOIN ucap_tiers t "
    "ON t.id = pt.tier_id WHERE pt.post_id = s.doc_id AND t.currency = :currency AND "
    "(CASE t.interval WHEN 'year' THEN t.price_amount / 12 ELSE t.price_amount END) <= :price_max))) "
    "OR (s.kind = 'publication' AND EXISTS (SELECT 1 FROM ucap_tiers t WHERE t.publication_id = s.doc_id "
    "AND t.currency = :currency AND "
    "(CASE t.interval WHEN 'year' THEN t.price_amount / 12 ELSE t.price_amount END) <= :price_max)))"
)


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """What to find. ``categories`` match any (lower-cased); ``price_max`` is cents per month in
    ``currency`` (yearly tiers count a twelfth); ``since`` keeps posts published after it (and
    publications with such a post)."""

    text: str | None = None
    categories: tuple[str, ...] = ()
    price_max: int | None = None
    currency: str = "USD"
    language: str | None = None
    since: datetime | None = None
    limit: int = 10
    offset: int = 0


@dataclass(frozen=True, slots=True)
class Hit:
    kind: str
    doc_id: str
    publication_id: str
    score: float | None


@dataclass(frozen=True, slots=True)
class Page:
    hits: list[Hit]
    total: int
    words: tuple[str, ...] = field(default=())


def index_document(
    session: Session, *, doc_id: str, kind: str, publication_id: str, title: str, summary: str, body: str
) -> None:
    """Put (or replace) one publication or post in the index, in the caller's transaction."""
    unindex_document(session, doc_id)
    values = {
        "doc_id": doc_id,
        "kind": kind,
        "publication_id": publication_id,
        "title": title,
        "summary": summary,
        "body": body,
    }
    if _postgres(session):
        session.execute(
            sa.text(
                "INSERT INTO ucap_search (doc_id, kind, publication_id, document) VALUES (:doc_id, :kind, "
                ":publication_id, setweight(to_tsvector('english', :title), 'A') || "
                "setweight(to_tsvector('english', :summary), 'B') || "
                "setweight(to_tsvector('english', :body), 'C'))"
            ),
            values,
        )
    else:
        session.execute(
            sa.text(
                "INSERT INTO ucap_search (doc_id, kind, publication_id, title, summary, body) "
                "VALUES (:doc_id, :kind, :publication_id, :title, :summary, :body)"
            ),
            values,
        )


def unindex_document(session: Session, doc_id: str) -> None:
    session.execute(sa.text("DELETE FROM ucap_search WHERE doc_id = :doc_id"), {"doc_id": doc_id})


def search(session: Session, query: SearchQuery) -> Page:
    """One page of hits, best first, and how many there are in all."""
    words = tuple(dict.fromkeys(w.lower() for w in _WORD.findall(query.text or "")))[:_MAX_WORDS]
    postgres = _postgres(session)
    params: dict[str, Any] = {"limit": query.limit, "offset": query.offset}
    # The full-text part first, on its own (FTS5 allows bm25() only in the MATCH query itself),
    # then the filters and the page over its hits.
    if not words:
        matching = "SELECT doc_id, kind, publication_id, NULL AS score FROM ucap_search"
    elif postgres:
        params["q"] = " | ".join(words)
        matching = (
            "SELECT doc_id, kind, publication_id, ts_rank_cd(document, to_tsquery('english', :q), 32) "
            "AS score FROM ucap_search WHERE document @@ to_tsquery('english', :q)"
        )
    else:
        params["q"] = " OR ".join(f'"{w}"' for w in words)
        matching = (
            "SELECT doc_id, kind, publication_id, -bm25(ucap_search, 10.0, 4.0, 1.0) AS score "
            "FROM ucap_search WHERE ucap_search MATCH :q"
        )
    where = _filters(query, params)
    order = "s.score DESC, s.doc_id" if words else "COALESCE(p.published_at, pub.updated_at) DESC, s.doc_id"
    statement = sa.text(
        f"WITH s AS ({matching}) SELECT s.doc_id, s.kind, s.publication_id, s.score, "  # noqa: S608
        "count(*) OVER () AS total FROM s LEFT JOIN ucap_posts p ON p.id = s.doc_id "
        "JOIN ucap_publications pub ON pub.id = s.publication_id "
        f"WHERE {' AND '.join(where) or '1 = 1'} ORDER BY {order} LIMIT :limit OFFSET :offset"
    )
    if query.categories:
        statement = statement.bindparams(sa.bindparam("categories", expanding=True))
    rows = session.execute(statement, params).all()
    hits = [Hit(row.kind, row.doc_id, row.publication_id, _relevance(row.score, postgres)) for row in rows]
    total = int(rows[0].total) if rows else _count(session, matching, where, params, query)
    return Page(hits, total, words)


def _filters(query: SearchQuery, params: dict[str, Any]) -> list[str]:
    """SQL conditions for the filters (fixed fragments; every value is a bound parameter)."""
    where: list[str] = []
    if query.categories:
        params["categories"] = [c.lower() for c in query.categories]
        where.append(
            "EXISTS (SELECT 1 FROM ucap_categories c WHERE c.doc_id = s.doc_id AND c.category IN :categories)"
        )
    if query.language:
        params["language"] = query.language.lower()
        params["language_prefix"] = query.language.lower() + "-%"
        where.append(
            "(LOWER(COALESCE(p.language, pub.language, '')) = :language "
            "OR LOWER(COALESCE(p.language, pub.language, '')) LIKE :language_prefix)"
        )
    if query.since is not None:
        params["since"] = query.since
        where.append(
            "((s.kind = 'post' AND p.published_at >= :since) OR (s.kind = 'publication' AND EXISTS "
            "(SELECT 1 FROM ucap_posts rp WHERE rp.publication_id = s.doc_id AND rp.published_at >= :since)))"
        )
    if query.price_max is not None:
        params["price_max"] = query.price_max
        params["currency"] = query.currency.upper()
        where.append(_PRICE_AT_MOST)
    return where


def _count(
    session: Session, matching: str, where: Sequence[str], params: dict[str, Any], query: SearchQuery
) -> int:
    """The total when the page came back empty (an offset past the end): count without it."""
    if query.offset == 0:
        return 0
    condition = " AND ".join(where) or "1 = 1"
    statement = sa.text(
        f"WITH s AS ({matching}) SELECT count(*) FROM s LEFT JOIN ucap_posts p ON p.id = s.doc_id "  # noqa: S608
        "JOIN ucap_publications pub ON pub.id = s.publication_id WHERE " + condition
    )
    if query.categories:
        statement = statement.bindparams(sa.bindparam("categories", expanding=True))
    return int(session.execute(statement, params).scalar_one())


def _relevance(raw: float | None, postgres: bool) -> float | None:
    """A score in 0..1: ``ts_rank_cd`` normalised with 32 already is; FTS5's ``bm25`` (negated
    here, so higher is better on both) is unbounded."""
    if raw is None:
        return None
    if postgres:
        return round(float(raw), 4)
    magnitude = float(raw)
    return round(magnitude / (1.0 + magnitude), 4) if magnitude > 0 else 0.0


def _postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"
