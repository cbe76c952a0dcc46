"""Ranked full-text search over publications and posts: PostgreSQL full-text search on
PostgreSQL, SQLite FTS5 on the embedded default, behind :func:`index_document` and :func:`search`.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.ucap.search``.
"""

from __future__ import annotations

import math
import re
import time
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
    :data:`CANDIDATES`). Documents with every word; when there are none, with any."""
    words = tuple(dict.fromkeys(w.lower() for w in _WORD.findall(query.text or "")))[:_MAX_WORDS]
    find = _postgres_search if _postgres(session) else _sqlite_search
    every = find(session, query, words, True)
    if every.total or len(words) < 2:
        return every
    return find(session, query, words, False)


def _postgres_search(session: Session, query: SearchQuery, words: tuple[str, ...], every: bool) -> Page:
    params: dict[str, Any] = {"limit": query.limit, "offset": query.offset, "cap": CANDIDATES}
    # The filters are written before the word test: PostgreSQL keeps the written order among
    # conditions it costs alike, and the in-row tests spare reading the out-of-line tsvector.
    filters = "".join(f"{condition} AND " for condition in _filters(query, params, "s", postgres=True))
    if words:
        params |= {"match": (" & " if every else " | ").join(words), "any": " | ".join(words)}
        # The newest matches' ids first (narrow rows), then their rows, ranked on their compact
        # vector.
        candidates = (
            f"WITH c AS (SELECT s.doc_id FROM ucap_search s WHERE {filters}"
            "s.document @@ to_tsquery('english', :match) ORDER BY s.published_at DESC LIMIT :cap) "
        )
        score = "ts_rank_cd(s.headline, to_tsquery('english', :any), 32)"
        order = "score DESC, s.published_at DESC, s.doc_id"
    else:
        candidates = (
            f"WITH c AS (SELECT s.doc_id FROM ucap_search s WHERE {filters}TRUE "
            "ORDER BY s.published_at DESC LIMIT :cap) "
        )
        score, order = "NULL", "s.published_at DESC, s.doc_id"
    statement = sa.text(
        candidates
        + f"SELECT s.doc_id, s.kind, s.publication_id, {score} AS score, count(*) OVER () AS total "
        f"FROM c JOIN ucap_search s ON s.doc_id = c.doc_id ORDER BY {order} LIMIT :limit OFFSET :offset"
    )
    # The plan is ours to choose (see _walks): PostgreSQL's cost model does not know that testing
    # a word reads the row's out-of-line text. Compiling these statements (JIT) costs ~20 ms where
    # they run in a few, and so does starting parallel workers.
    walk = _walks(session, query, words, every)
    session.execute(
        sa.text(
            "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_indexscan', :walk, true), "
            "set_config('enable_bitmapscan', :bitmap, true), set_config('jit', 'off', true), "
            "set_config('max_parallel_workers_per_gather', '0', true)"
        ),
        {"walk": "on" if walk else "off", "bitmap": "off" if walk else "on"},
    )
    rows = session.execute(statement, params).all()
    hits = [Hit(row.kind, row.doc_id, row.publication_id, _relevance(row.score, True)) for row in rows]
    if rows or query.offset == 0:
        return Page(hits, int(rows[0].total) if rows else 0)
    counted = sa.text(candidates + "SELECT count(*) FROM c")  # a page past the end
    return Page(hits, int(session.execute(counted, params).scalar_one()))


# What each plan costs, in µs, measured with bench/ucap.py's catalog at 100,000 and 1,000,000
# posts: walking the date index tests a row's filters (~1 µs) and, where they pass, its words
# (~3.5 µs, reading the out-of-line tsvector); a bitmap of the GIN indexes costs ~1 ms and
# ~0.5 µs a row it reads (less for the densest).
_ROW_US: Final = 1.0
_WORDS_US: Final = 3.5
_BITMAP_US: Final = 1000.0
_MATCH_US: Final = 0.5
_PRICE_SHARE: Final = 0.5  # the share of rows a price ceiling keeps, which no statistic tells
_STATISTICS_TTL: Final = 600.0
_LEXEMES_KEPT: Final = 10_000


@dataclass(frozen=True, slots=True)
class _Statistics:
    """What ANALYZE found in ``ucap_search``: its rows, the share of rows holding each common
    lexeme and category, and the quantiles of ``published_at``."""

    rows: float
    lexemes: dict[str, float]
    categories: dict[str, float]
    dates: tuple[datetime, ...]
    read_at: float


def _shares(values: list[str] | None, shares: list[float] | None) -> dict[str, float]:
    """ANALYZE's most common elements and the share of rows holding each; ``""`` holds the share
    assumed for any other (half the least common one's, as PostgreSQL assumes)."""
    common = dict(zip(values or (), shares or (), strict=False))
    common[""] = min(common.values(), default=0.02) / 2
    return common


def _share(common: dict[str, float], key: str) -> float:
    return common.get(key) or common[""]


def _walks(session: Session, query: SearchQuery, words: tuple[str, ...], every: bool) -> bool:
    """Whether walking the date index newest first (and testing each row) finds the newest
    :data:`CANDIDATES` matches sooner than a bitmap of every match: yes for a word in a tenth of
    the posts at a million of them, no for a rare one, which the walk would test for in every row."""
    statistics = _statistics(session)
    if statistics.rows < 1:
        return True
    shares = [_share(statistics.lexemes, lexeme) for lexeme in _lexemes(session, words)]
    words_share = math.prod(shares) if every else 1 - math.prod(1 - share for share in shares)
    categories_share = (
        min(1.0, sum(_share(statistics.categories, c.lower()) for c in query.categories))
        if query.categories
        else 1.0
    )
    filters_share = categories_share * (_PRICE_SHARE if query.price_max is not None else 1.0)
    window = statistics.rows * _newer_share(statistics.dates, query.since)
    examined = min(window, CANDIDATES / max(words_share * filters_share, 1e-9))
    walk = examined * (_ROW_US + filters_share * _WORDS_US)
    read = statistics.rows * words_share * categories_share
    # Past a date, PostgreSQL reads the rows since then rather than more matches than that.
    bitmap = window * (_ROW_US + _WORDS_US) if read > window else _BITMAP_US + read * _MATCH_US
    return walk <= bitmap


def _newer_share(dates: tuple[datetime, ...], since: datetime | None) -> float:
    """The share of rows published at or after ``since``, from ANALYZE's equal-count quantiles."""
    if since is None or len(dates) < 2:
        return 1.0
    newer = sum(1 for d in dates if d >= since)
    return max(newer, 1) / len(dates)


def _statistics(session: Session) -> _Statistics:
    """Kept with the database connection (its schema's statistics) for ten minutes."""
    info = session.connection().info
    kept: _Statistics | None = info.get("ucap_search_statistics")
    if kept is not None and time.monotonic() - kept.read_at < _STATISTICS_TTL:
        return kept
    rows = session.execute(
        sa.text(
            "SELECT greatest(c.reltuples, 0) AS rows, d.most_common_elems::text::text[] AS lexemes, "
            "d.most_common_elem_freqs AS lexeme_shares, g.most_common_elems::text::text[] AS categories, "
            "g.most_common_elem_freqs AS category_shares, "
            "h.histogram_bounds::text::timestamptz[] AS dates FROM pg_class c "
            "LEFT JOIN pg_stats d ON d.schemaname = current_schema() AND d.tablename = 'ucap_search' "
            "AND d.attname = 'document' "
            "LEFT JOIN pg_stats g ON g.schemaname = current_schema() AND g.tablename = 'ucap_search' "
            "AND g.attname = 'categories' "
            "LEFT JOIN pg_stats h ON h.schemaname = current_schema() AND h.tablename = 'ucap_search' "
            "AND h.attname = 'published_at' "
            "WHERE c.oid = to_regclass('ucap_search')"
        )
    ).one()
    kept = _Statistics(
        rows=float(rows.rows),
        lexemes=_shares(rows.lexemes, rows.lexeme_shares),
        categories=_shares(rows.categories, rows.category_shares),
        dates=tuple(rows.dates or ()),
        read_at=time.monotonic(),
    )
    info["ucap_search_statistics"] = kept
    return kept


def _lexemes(session: Session, words: tuple[str, ...]) -> list[str]:
    """The query's words as the index holds them (stemmed; stopwords gone), remembered with the
    connection so a word is stemmed by the database once."""
    known: dict[str, tuple[str, ...]] = session.connection().info.setdefault("ucap_search_lexemes", {})
    missing = [w for w in words if w not in known]
    if missing:
        if len(known) > _LEXEMES_KEPT:
            known.clear()
        stemmed = session.execute(
            sa.text(
                "SELECT w, tsvector_to_array(to_tsvector('english', w)) AS lexemes "
                "FROM unnest(CAST(:words AS text[])) AS w"
            ),
            {"words": missing},
        )
        known.update((row.w, tuple(row.lexemes)) for row in stemmed)
    return [lexeme for w in words for lexeme in known.get(w, ())]


def _sqlite_search(session: Session, query: SearchQuery, words: tuple[str, ...], every: bool) -> Page:
    params: dict[str, Any] = {"limit": query.limit, "offset": query.offset}
    where = _filters(query, params, "ucap_search", postgres=False)
    match = (" AND " if every else " OR ").join(f'"{w}"' for w in words) if words else None
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
