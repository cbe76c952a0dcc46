"""Ranked full-text search over publications and posts: PostgreSQL full-text search on
PostgreSQL, SQLite FTS5 on the embedded default, behind :func:`index_document` and :func:`search`.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.ucap.search``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlmodel import Session

__all__ = [
    "CANDIDATES",
    "Hit",
    "Page",
    "SearchQuery",
    "add_publication_tier",
    "index_document",
    "search",
    "touch_publication",
]

#: Matches ranked per search on PostgreSQL (the newest); also the most ``total`` reports there.
CANDIDATES: Final = 300
_WORD: Final = re.compile(r"\w+", re.UNICODE)
_MAX_WORDS: Final = 16


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


def index_document(
    session: Session,
    *,
    doc_id: str,
    kind: str,
    publication_id: str,
    published_at: datetime,
    language: str | None,
    free: bool,
    categories: list[str],
    tier_ids: list[str],
    title: str,
    summary: str,
    body: str,
) -> None:
    """Put (or replace) one publication or post in the index, in the caller's transaction. For a
    publication, ``published_at`` is its newest post's (see :func:`touch_publication`)."""
    session.execute(sa.text("DELETE FROM ucap_search WHERE doc_id = :doc_id"), {"doc_id": doc_id})
    postgres = _postgres(session)
    values = {
        "doc_id": doc_id,
        "kind": kind,
        "publication_id": publication_id,
        "published_at": _moment(published_at, postgres),
        "language": (language or "").lower() or None,
        "free": free if postgres else int(free),
        "categories": [c.lower() for c in categories],
        "tier_ids": list(tier_ids),
        "title": title,
        "summary": summary,
        "body": body,
    }
    if postgres:
        statement = (
            "INSERT INTO ucap_search (doc_id, kind, publication_id, published_at, language, free, "
            "categories, tier_ids, headline, document) VALUES (:doc_id, :kind, :publication_id, "
            ":published_at, :language, :free, :categories, :tier_ids, "
            "setweight(to_tsvector('english', :title), 'A') || "
            "setweight(to_tsvector('english', :summary), 'B'), "
            "setweight(to_tsvector('english', :title), 'A') || "
            "setweight(to_tsvector('english', :summary), 'B') || "
            "setweight(to_tsvector('english', :body), 'C'))"
        )
    else:
        statement = (
            "INSERT INTO ucap_search (doc_id, kind, publication_id, published_at, language, free, title, "
            "summary, body) VALUES (:doc_id, :kind, :publication_id, :published_at, :language, :free, "
            ":title, :summary, :body)"
        )
    if not postgres:  # FTS5 filters through ucap_categories and the tier tables
        del values["categories"], values["tier_ids"]
    session.execute(sa.text(statement), values)


def add_publication_tier(session: Session, publication_id: str, tier_id: str) -> None:
    """A tier was added to the publication (PostgreSQL's rows list a publication's tiers)."""
    if _postgres(session):
        session.execute(
            sa.text(
                "UPDATE ucap_search SET tier_ids = array_append(tier_ids, :tier_id) WHERE doc_id = :doc_id"
            ),
            {"doc_id": publication_id, "tier_id": tier_id},
        )


def touch_publication(session: Session, publication_id: str, published_at: datetime) -> None:
    """A post was published in the publication: its entry's date follows the newest post."""
    session.execute(
        sa.text(
            "UPDATE ucap_search SET published_at = :published_at "
            "WHERE doc_id = :doc_id AND published_at < :published_at"
        ),
        {"doc_id": publication_id, "published_at": _moment(published_at, _postgres(session))},
    )


def search(session: Session, query: SearchQuery) -> Page:
    """One page of hits, best first, and how many there are (on PostgreSQL, at most
    :data:`CANDIDATES`)."""
    words = tuple(dict.fromkeys(w.lower() for w in _WORD.findall(query.text or "")))[:_MAX_WORDS]
    if _postgres(session):
        return _postgres_search(session, query, words)
    if not words:
        return _sqlite_search(session, query, None)
    every = _sqlite_search(session, query, " AND ".join(f'"{w}"' for w in words))
    if every.total or len(words) == 1:
        return every
    return _sqlite_search(session, query, " OR ".join(f'"{w}"' for w in words))


def _postgres_search(session: Session, query: SearchQuery, words: tuple[str, ...]) -> Page:
    params: dict[str, Any] = {"limit": query.limit, "offset": query.offset, "cap": CANDIDATES}
    filters = "".join(f" AND {condition}" for condition in _filters(query, params, "s", postgres=True))
    if words:
        params |= {"every": " & ".join(words), "any": " | ".join(words)}
        # The newest matches of every word; only when there are none, of any word. Their ids
        # first (narrow rows, from a bitmap of the GIN index), then the candidates' rows, ranked
        # on their compact vector.
        candidates = (
            "WITH a AS (SELECT s.doc_id FROM ucap_search s WHERE s.document @@ to_tsquery('english', :every)"
            f"{filters} ORDER BY s.published_at DESC LIMIT :cap), "
            "o AS (SELECT s.doc_id FROM ucap_search s WHERE NOT EXISTS (SELECT 1 FROM a) AND "
            f"s.document @@ to_tsquery('english', :any){filters} ORDER BY s.published_at DESC LIMIT :cap), "
            "c AS (SELECT doc_id FROM a UNION ALL SELECT doc_id FROM o) "
        )
        score = "ts_rank_cd(s.headline, to_tsquery('english', :any), 32)"
        order = "score DESC, s.published_at DESC, s.doc_id"
    else:
        candidates = (
            f"WITH c AS (SELECT s.doc_id FROM ucap_search s WHERE 1 = 1{filters} "
            "ORDER BY s.published_at DESC LIMIT :cap) "
        )
        score, order = "NULL", "s.published_at DESC, s.doc_id"
    statement = sa.text(
        candidates
        + f"SELECT s.doc_id, s.kind, s.publication_id, {score} AS score, count(*) OVER () AS total "
        f"FROM c JOIN ucap_search s ON s.doc_id = c.doc_id ORDER BY {order} LIMIT :limit OFFSET :offset"
    )
    # The planner's cost model thinks a common word is cheaper to test row by row (a scan of the
    # table or of the date index) than to look up in the GIN index, but testing reads the row's
    # out-of-line text (~8 µs a row), while bitmap scans of the indexes answer without it;
    # compiling these statements (JIT) costs ~20 ms where they run in a few, and so does starting
    # parallel workers.
    session.execute(
        sa.text(
            "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_indexscan', 'off', true), "
            "set_config('jit', 'off', true), set_config('max_parallel_workers_per_gather', '0', true)"
        )
    )
    rows = session.execute(statement, params).all()
    hits = [Hit(row.kind, row.doc_id, row.publication_id, _relevance(row.score, True)) for row in rows]
    if rows or query.offset == 0:
        return Page(hits, int(rows[0].total) if rows else 0)
    counted = sa.text(candidates + "SELECT count(*) FROM c")  # a page past the end
    return Page(hits, int(session.execute(counted, params).scalar_one()))


def _sqlite_search(session: Session, query: SearchQuery, match: str | None) -> Page:
    params: dict[str, Any] = {"limit": query.limit, "offset": query.offset}
    where = _filters(query, params, "ucap_search", postgres=False)
    if match is not None:
        params["q"] = match
        where.insert(0, "ucap_search MATCH :q")
    condition = " AND ".join(where) or "1 = 1"
    score = "-bm25(ucap_search, 10.0, 4.0, 1.0)" if match is not None else "NULL"
    order = "score DESC, doc_id" if match is not None else "published_at DESC, doc_id"
    statement = sa.text(
        f"SELECT doc_id, kind, publication_id, {score} AS score FROM ucap_search "
        f"WHERE {condition} ORDER BY {order} LIMIT :limit OFFSET :offset"
    )
    counted = sa.text(f"SELECT count(*) FROM ucap_search WHERE {condition}")
    if query.categories:
        statement = statement.bindparams(sa.bindparam("categories", expanding=True))
        counted = counted.bindparams(sa.bindparam("categories", expanding=True))
    rows = session.execute(statement, params).all()
    hits = [Hit(row.kind, row.doc_id, row.publication_id, _relevance(row.score, False)) for row in rows]
    return Page(hits, int(session.execute(counted, params).scalar_one()))


def _filters(query: SearchQuery, params: dict[str, Any], t: str, postgres: bool) -> list[str]:
    """SQL conditions for the filters on table alias ``t`` (fixed fragments; values bound)."""
    where: list[str] = []
    if query.categories:
        params["categories"] = [c.lower() for c in query.categories]
        where.append(
            f"{t}.categories && CAST(:category_array AS text[])"
            if postgres
            else "EXISTS (SELECT 1 FROM ucap_categories c "
            f"WHERE c.doc_id = {t}.doc_id AND c.category IN :categories)"
        )
        if postgres:
            params["category_array"] = params.pop("categories")
    if query.language:
        params["language"] = query.language.lower()
        params["language_prefix"] = query.language.lower() + "-%"
        where.append(f"({t}.language = :language OR {t}.language LIKE :language_prefix)")
    if query.since is not None:
        params["since"] = _moment(query.since, postgres)
        where.append(f"{t}.published_at >= :since")
    if query.price_max is not None:
        params["price_max"] = query.price_max
        params["currency"] = query.currency.upper()
        monthly = (
            "(CASE t.interval WHEN 'year' THEN t.price_amount / 12 ELSE t.price_amount END) <= :price_max"
        )
        if postgres:  # the cheap tiers once (a few rows), then an array test per row
            where.append(
                f"({t}.free OR {t}.tier_ids && ARRAY(SELECT CAST(t.id AS text) FROM ucap_tiers t "
                f"WHERE t.currency = :currency AND {monthly}))"
            )
        else:
            where.append(
                f"(({t}.kind = 'post' AND ({t}.free = 1 OR EXISTS (SELECT 1 FROM ucap_post_tiers pt JOIN "
                f"ucap_tiers t ON t.id = pt.tier_id WHERE pt.post_id = {t}.doc_id AND t.currency = :currency "
                f"AND {monthly}))) OR ({t}.kind = 'publication' AND EXISTS (SELECT 1 FROM ucap_tiers t "
                f"WHERE t.publication_id = {t}.doc_id AND t.currency = :currency AND {monthly})))"
            )
    return where


def _moment(moment: datetime, postgres: bool) -> datetime | str:
    """PostgreSQL compares ``timestamptz``; FTS5 columns hold text, compared as ISO strings."""
    if postgres:
        return moment
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
