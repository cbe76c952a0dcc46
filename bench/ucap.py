"""The content server's costs: ``read_content`` over MCP against the same read over the signed
``/v1`` HTTP API, and catalog search latency as the catalog grows.

Run: ``uv run python bench/ucap.py [--calls 400] [--concurrency 1,4] [--sizes 10000,100000]
[--databases postgresql,sqlite] [--queries 300] [--broker redis://127.0.0.1:6379/13]``

**Reads.** The API (``usp-webhooks api``) runs in a subprocess on 127.0.0.1 with its demo content
on a fresh SQLite database; an agent's key set is served by a small HTTP server of this process.
Every request is signed as OpenBotAuth signs (a fresh nonce each, which the server records):

* **HTTP**: ``GET /v1/content/{publisher}/{post}`` with ``httpx.AsyncClient``;
* **MCP**: ``tools/call read_content`` with the official SDK client on a Streamable HTTP session,
  each HTTP request of the session signed the same way.

Both end in the same operation (:class:`usp_dispatcher.ucap.service.UcapService`); the table
shows reads/s, the API process's CPU per read (in µs and in raw Ed25519 signatures of the same run,
printed below it) and MCP/HTTP per number of callers. The post read is free, so both answer 200.
The nonces go to the SQLite database (group commits); with ``--broker redis://…`` to Redis.

**Search.** For each size, a fresh database is filled with that many synthetic posts (titles and
bodies drawn from a 20,000-word vocabulary by Zipf's law, 40 publications, categories, tiers,
a spread of dates) in bulk, then :func:`usp_dispatcher.ucap.catalog.search_catalog` (the whole
operation behind ``POST /v1/catalog/search`` and ``search_catalog``, without HTTP) runs
``--queries`` searches of one to three words, a third of them with a filter; the table shows
p50/p99 in milliseconds per database and size.
"""

# ruff: noqa: E402

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.api_process

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import httpx2
import sqlalchemy as sa
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from rich.console import Console
from rich.table import Table

from bench.api_process import ApiProcess, cpu_seconds
from bench.api_process import api_server as run_api
from bench.reference import in_signs, sign_rate
from usp_core import db
from usp_dispatcher import database as dispatcher_database
from usp_dispatcher.access.signatures import web_bot_auth_headers
from usp_dispatcher.ucap.catalog import SearchIn, search_catalog
from usp_receiver import SigningKey

_WORDS = 20_000
DEFAULT_POSTGRES = os.environ.get(
    "USP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
READ = "/v1/content/pub_ai_weekly/post_weekly_roundup_208"
Call = Callable[[], Awaitable[None]]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="counted reads per binding and level")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--sizes", default="10000,100000", help="catalog sizes (posts) for search")
    parser.add_argument("--databases", default="postgresql,sqlite")
    parser.add_argument("--queries", type=int, default=300, help="counted searches per size")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    parser.add_argument("--skip-reads", action="store_true")
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument(
        "--broker",
        default="",
        help="the reads' API broker URL (a Redis URL also keeps the nonces in Redis); default: the "
        "embedded broker, nonces in the SQLite database",
    )
    args = parser.parse_args()
    console = Console()
    if not args.skip_reads:
        levels = [int(level) for level in args.concurrency.split(",") if level.strip()]
        signs = sign_rate()
        with tempfile.TemporaryDirectory(prefix="usp-bench-ucap-") as folder:
            rows = reads(Path(folder), levels, args.calls, args.warmup, args.broker)
        signs = max(signs, sign_rate())
        nonces = "Redis" if args.broker.startswith("redis") else "SQLite"
        table = Table(
            title=f"read_content: MCP (Streamable HTTP, SDK client) vs signed HTTP, {os.cpu_count()} cores, "
            f"nonces in {nonces}"
        )
        columns = ("callers", "HTTP reads/s", "API CPU/read", "MCP reads/s", "API CPU/read", "MCP / HTTP")
        for column in columns:
            table.add_column(column, justify="right")
        for level, http, mcp in rows:
            table.add_row(
                str(level),
                *(
                    cell
                    for rate, cpu in (http, mcp)
                    for cell in (f"{rate:,.0f}", f"{cpu * 1e6:,.0f} µs = {in_signs(cpu, signs):.0f} signs")
                ),
                f"{mcp[0] / http[0]:.2f}",
            )
        console.print(table)
        console.print(
            f"raw Ed25519 sign (cryptography, one core, this run): {signs:,.0f}/s, {1e6 / signs:.1f} µs"
        )
    if not args.skip_search:
        table = Table(
            title=f"search_catalog latency (the operation, no HTTP), {args.queries} queries per size"
        )
        for column in ("database", "posts", "p50 ms", "p99 ms", "mean results"):
            table.add_column(column, justify="right")
        for name in [d.strip() for d in args.databases.split(",") if d.strip()]:
            for size in [int(s) for s in args.sizes.split(",") if s.strip()]:
                with (
                    tempfile.TemporaryDirectory(prefix="usp-bench-search-") as folder,
                    fresh(name, Path(folder), args.postgres_url) as url,
                ):
                    p50, p99, found = searches(url, size, args.queries)
                table.add_row(name, f"{size:,}", f"{p50:.1f}", f"{p99:.1f}", f"{found:.1f}")
                console.print(f"  {name} {size:,} posts: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
        console.print(table)


# ------------------------------------------------------------------------------------ reads


#: Reads per second and the API process's CPU seconds per read.
Rate = tuple[float, float]


def reads(
    folder: Path, levels: list[int], calls: int, warmup: int, broker: str
) -> list[tuple[int, Rate, Rate]]:
    key = SigningKey.generate()
    database_url = f"sqlite:///{folder / 'ucap.sqlite3'}"
    with key_directory(key) as jwks_url, api_server(database_url, folder, broker) as api:
        return [asyncio.run(_measure(api, key, jwks_url, level, calls, warmup)) for level in levels]


async def _measure(
    api: ApiProcess, key: SigningKey, jwks_url: str, callers: int, calls: int, warmup: int
) -> tuple[int, Rate, Rate]:
    per_caller = max(1, calls // callers)
    async with _callers(callers, lambda: _http_caller(api.base, key, jwks_url)) as http_calls:
        http = await _rate(api, http_calls, per_caller, warmup)
    async with _callers(callers, lambda: _mcp_caller(api.base, key, jwks_url)) as mcp_calls:
        mcp = await _rate(api, mcp_calls, per_caller, warmup)
    return callers, http, mcp


async def _rate(api: ApiProcess, calls: list[Call], per_caller: int, warmup: int) -> Rate:
    await asyncio.gather(*(_repeat(call, warmup) for call in calls))
    cpu = cpu_seconds(api.pid)
    started = time.perf_counter()
    await asyncio.gather(*(_repeat(call, per_caller) for call in calls))
    elapsed = time.perf_counter() - started
    counted = per_caller * len(calls)
    return counted / elapsed, (cpu_seconds(api.pid) - cpu) / counted


async def _repeat(call: Call, times: int) -> None:
    for _ in range(times):
        await call()


@asynccontextmanager
async def _callers(count: int, make: Callable[[], Any]) -> AsyncIterator[list[Call]]:
    from contextlib import AsyncExitStack

    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(make()) for _ in range(count)]


@asynccontextmanager
async def _http_caller(base: str, key: SigningKey, jwks_url: str) -> AsyncIterator[Call]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:

        async def call() -> None:
            url = base + READ
            response = await client.get(
                url, headers=web_bot_auth_headers("GET", url, b"", key, signature_agent=jwks_url)
            )
            if response.status_code != 200:
                raise RuntimeError(f"read answered {response.status_code}: {response.text[:200]}")

        yield call


class _Signed(httpx2.Auth):
    requires_request_body = True

    def __init__(self, key: SigningKey, jwks_url: str) -> None:
        self.key, self.jwks_url = key, jwks_url

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        request.headers.update(
            web_bot_auth_headers(
                request.method,
                str(request.url),
                request.content,
                self.key,
                signature_agent=self.jwks_url,
                content_type=request.headers.get("content-type", "application/json"),
                digest=bool(request.content),
            )
        )
        yield request


@asynccontextmanager
async def _mcp_caller(base: str, key: SigningKey, jwks_url: str) -> AsyncIterator[Call]:
    async with (
        httpx2.AsyncClient(auth=_Signed(key, jwks_url), timeout=httpx2.Timeout(30, read=60)) as http,
        Client(streamable_http_client(f"{base}/mcp", http_client=http), mode="legacy") as client,
    ):
        publisher, post = READ.rsplit("/", 2)[1:]

        async def call() -> None:
            result = await client.call_tool("read_content", {"publisher_id": publisher, "post_id": post})
            if result.structured_content is None or result.structured_content.get("status") != "ok":
                raise RuntimeError(f"read_content answered {result.structured_content}")

        yield call


@contextmanager
def key_directory(key: SigningKey) -> Iterator[str]:
    document = json.dumps({"keys": [dict(key.public.jwk)]}).encode()

    class Directory(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/http-message-signatures-directory+json")
            self.send_header("Content-Length", str(len(document)))
            self.end_headers()
            self.wfile.write(document)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Directory)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/jwks/bench-agent.json"
    finally:
        server.shutdown()


@contextmanager
def api_server(url: str, folder: Path, broker: str = "") -> Iterator[ApiProcess]:
    """``usp-webhooks api`` on ``url``'s database (:func:`bench.api_process.api_server`)."""
    env = {
        "USP_DATABASE_URL": url,
        "USP_ADMIN_TOKEN": "bench-admin-" + uuid.uuid4().hex,
        "USP_BROKER_URL": broker or f"sqla+sqlite:///{folder / 'broker.sqlite3'}",
        "USP_ALLOW_PRIVATE_TARGETS": "true",
        "USP_RATE_LIMIT_PER_MINUTE": "100000000",
    }
    with run_api(env, folder, ready="/.well-known/ucap.json") as api:
        yield api


# ------------------------------------------------------------------------------------ search


def searches(url: str, size: int, count: int) -> tuple[float, float, float]:
    engine = db.make_engine(url)
    rng = random.Random(size)
    vocabulary = _vocabulary(rng)
    try:
        started = time.perf_counter()
        fill(engine, size, vocabulary, rng)
        print(f"  filled {size:,} posts in {time.perf_counter() - started:.0f} s", flush=True)
        queries = [_query(vocabulary, rng, n) for n in range(count + 20)]
        timings: list[float] = []
        found: list[int] = []
        with db.session(engine) as session:
            for n, query in enumerate(queries):
                began = time.perf_counter()
                answer = search_catalog(session, query, base_url="http://bench.example")
                if n >= 20:  # warm-up
                    timings.append((time.perf_counter() - began) * 1000)
                    found.append(len(answer.body["results"]))
                session.rollback()
    finally:
        engine.dispose()
    timings.sort()
    return statistics.median(timings), timings[int(len(timings) * 0.99) - 1], statistics.mean(found)


def _vocabulary(rng: random.Random) -> list[str]:
    syllables = [a + b for a in "bcdfghklmnprstvz" for b in ("a", "e", "i", "o", "u", "ar", "en", "ol")]
    words: set[str] = set()
    while len(words) < _WORDS:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def _zipf(rng: random.Random, vocabulary: list[str]) -> str:
    """A word by Zipf's law over content words: rank r with probability ∝ 1/(r + 50), the 50
    standing for the stopwords a search configuration drops."""
    return vocabulary[min(int((_WORDS + 50) ** rng.random()) - 1, _WORDS - 1)]


def _text(vocabulary: list[str], rng: random.Random, length: int) -> str:
    return " ".join(_zipf(rng, vocabulary) for _ in range(length))


def _query(vocabulary: list[str], rng: random.Random, n: int) -> SearchIn:
    words = " ".join(_zipf(rng, vocabulary) for _ in range(rng.randint(1, 3)))
    body: dict[str, Any] = {"query": words}
    if n % 3 == 1:
        body["filters"] = {"recency": "30d"}
    elif n % 3 == 2:
        body["filters"] = {"price": {"max": 500}, "categories": [f"topic-{n % 12}"]}
    return SearchIn.model_validate(body)


def fill(engine: sa.Engine, size: int, vocabulary: list[str], rng: random.Random) -> None:
    """``size`` posts in 40 publications, inserted in bulk, and the search index built in one
    statement per dialect."""
    dispatcher_database.upgrade(engine)
    now = datetime.now(UTC)
    meta = sa.MetaData()
    meta.reflect(
        engine, only=["ucap_publications", "ucap_tiers", "ucap_posts", "ucap_post_tiers", "ucap_categories"]
    )
    publications, tiers, posts, links, categories = (
        meta.tables[n]
        for n in ("ucap_publications", "ucap_tiers", "ucap_posts", "ucap_post_tiers", "ucap_categories")
    )
    with engine.begin() as conn:
        conn.execute(
            sa.insert(publications),
            [
                {
                    "id": f"pub_b{p}",
                    "slug": f"bench-{p}",
                    "name": _text(vocabulary, rng, 3).title(),
                    "description": _text(vocabulary, rng, 20),
                    "categories": "[]",
                    "language": "en",
                    "created_at": now,
                    "updated_at": now,
                }
                for p in range(40)
            ],
        )
        conn.execute(
            sa.insert(tiers),
            [
                {
                    "id": f"tier_b{p}",
                    "publication_id": f"pub_b{p}",
                    "name": "Member",
                    "price_amount": 300 + 50 * p,
                    "currency": "USD",
                    "interval": "month",
                    "features": "[]",
                    "position": 0,
                    "created_at": now,
                }
                for p in range(40)
            ],
        )
    batch = 5000
    for start in range(0, size, batch):
        rows, link_rows, category_rows = [], [], []
        for n in range(start, min(size, start + batch)):
            body = _text(vocabulary, rng, rng.randint(150, 400))
            post_id = f"post_b{n}"
            rows.append(
                {
                    "id": post_id,
                    "publication_id": f"pub_b{n % 40}",
                    "title": _text(vocabulary, rng, 7).capitalize(),
                    "excerpt": _text(vocabulary, rng, 25),
                    "body_html": f"<p>{body}</p>",
                    "body_text": body,
                    "categories": "[]",
                    "language": "en",
                    "word_count": len(body.split()),
                    "free": n % 3 == 0,
                    "published_at": now - timedelta(minutes=n * 7),
                    "updated_at": now,
                }
            )
            if n % 3:
                link_rows.append({"post_id": post_id, "tier_id": f"tier_b{n % 40}"})
            category_rows.append({"doc_id": post_id, "category": f"topic-{n % 12}"})
        with engine.begin() as conn:
            conn.execute(sa.insert(posts), rows)
            conn.execute(sa.insert(links), link_rows)
            conn.execute(sa.insert(categories), category_rows)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(
                sa.text(
                    "INSERT INTO ucap_search (doc_id, kind, publication_id, published_at, language, free, "
                    "categories, tier_ids, headline, document) "
                    "SELECT p.id, 'post', publication_id, published_at, language, free, "
                    "ARRAY(SELECT category FROM ucap_categories c WHERE c.doc_id = p.id), "
                    "ARRAY(SELECT tier_id FROM ucap_post_tiers pt WHERE pt.post_id = p.id), "
                    "setweight(to_tsvector('english', title), 'A') || "
                    "setweight(to_tsvector('english', coalesce(excerpt, '')), 'B'), "
                    "setweight(to_tsvector('english', title), 'A') || "
                    "setweight(to_tsvector('english', coalesce(excerpt, '')), 'B') || "
                    "setweight(to_tsvector('english', body_text), 'C') FROM ucap_posts p"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO ucap_search (doc_id, kind, publication_id, published_at, language, free, "
                    "categories, tier_ids, headline, document) "
                    "SELECT u.id, 'publication', u.id, updated_at, language, false, '{}', "
                    "ARRAY(SELECT t.id FROM ucap_tiers t WHERE t.publication_id = u.id), "
                    "setweight(to_tsvector('english', name), 'A') || "
                    "setweight(to_tsvector('english', coalesce(description, '')), 'B'), "
                    "setweight(to_tsvector('english', name), 'A') || "
                    "setweight(to_tsvector('english', coalesce(description, '')), 'B') "
                    "FROM ucap_publications u"
                )
            )
        else:
            conn.execute(
                sa.text(
                    "INSERT INTO ucap_search (doc_id, kind, publication_id, published_at, language, free, "
                    "title, summary, body) SELECT id, 'post', publication_id, "
                    "strftime('%Y-%m-%dT%H:%M:%fZ', published_at), language, free, title, "
                    "coalesce(excerpt, ''), body_text FROM ucap_posts"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO ucap_search (doc_id, kind, publication_id, published_at, language, free, "
                    "title, summary, body) SELECT id, 'publication', id, "
                    "strftime('%Y-%m-%dT%H:%M:%fZ', updated_at), language, 0, name, "
                    "coalesce(description, ''), '' FROM ucap_publications"
                )
            )
        conn.execute(sa.text("ANALYZE"))


@contextmanager
def fresh(name: str, folder: Path, postgres_url: str) -> Iterator[str]:
    if name == "sqlite":
        yield f"sqlite:///{folder / 'search.sqlite3'}"
        return
    schema = f"usp_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(postgres_url)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        yield (
            sa.make_url(postgres_url)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


if __name__ == "__main__":
    main()
