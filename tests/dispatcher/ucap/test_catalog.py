"""Search (ranked full-text: FTS5 on SQLite, tsvector on PostgreSQL), lookup by every id form,
content by URL, discovery, and bad input answered with a clear 4xx, never a 500."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from tests.dispatcher.ucap.conftest import Agent, signed
from usp_core import db
from usp_core.clock import utcnow
from usp_dispatcher.errors import UcapError
from usp_dispatcher.ucap import search as search_module
from usp_dispatcher.ucap.catalog import find_post
from usp_dispatcher.ucap.publishing import PostIn, PublicationIn, TierIn, add_post, add_publication
from usp_dispatcher.ucap.search import CANDIDATES, SearchQuery, index_document
from usp_dispatcher.ucap.search import search as search_index
from usp_dispatcher.ucap.seed import DEMO_PAID_POST, DEMO_PUBLICATION


def search(api: TestClient, agent: Agent, **body: Any) -> dict[str, Any]:
    body.setdefault("pagination", {"limit": 25})
    answer = signed(api, agent, "POST", "/v1/catalog/search", body)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def ids(result: dict[str, Any]) -> list[str]:
    return [r[r["type"]]["id"] for r in result["results"]]


@pytest.fixture
def library(api: TestClient, engine: Engine) -> None:
    """Twelve more posts in a publication of its own, some old, in two languages."""
    now = utcnow()
    with db.session(engine) as session:
        add_publication(
            session,
            PublicationIn(
                id="pub_astro",
                slug="astro",
                name="Astronomy Notes",
                description="Telescopes and the night sky.",
                categories=["science"],
                language="en",
                tiers=[
                    TierIn(id="tier_astro", name="Stargazer", price_amount=300, currency="USD"),
                    TierIn(
                        id="tier_astro_year",
                        name="Observatory",
                        price_amount=24000,
                        currency="USD",
                        interval="year",
                    ),
                ],
            ),
        )
        for n in range(12):
            add_post(
                session,
                "pub_astro",
                PostIn(
                    id=f"post_astro_{n}",
                    title=f"Night sky notes {n}" + (": the telescope mirror" if n == 7 else ""),
                    body_html=f"<p>Observing log {n}. " + ("Comets and meteors. " * (n % 3)) + "</p>",
                    categories=["observing"] if n % 2 else ["gear"],
                    language="en" if n < 10 else "de",
                    tier_ids=["tier_astro_year"] if n == 5 else ["tier_astro"] if n % 4 == 0 else [],
                    published_at=now - timedelta(days=n * 10),
                ),
            )
        session.commit()


def test_a_post_is_found_in_its_publication_by_id_or_slug_only(engine: Engine, library: None) -> None:
    with db.session(engine) as session:
        for publisher in ("pub_astro", "astro"):
            publication, post = find_post(session, publisher, "post_astro_3")
            assert (publication.id, post.id) == ("pub_astro", "post_astro_3")
        for publisher, post_id in (
            (DEMO_PUBLICATION, "post_astro_3"),  # another publication's post
            ("ai-weekly", "post_astro_3"),
            ("pub_astro", DEMO_PAID_POST),
            ("pub_astro", "post_nope"),
            ("pub_nope", "post_astro_3"),
        ):
            with pytest.raises(UcapError) as caught:
                find_post(session, publisher, post_id)
            assert caught.value.status == 404


def test_search_ranks_by_relevance_not_substring(api: TestClient, alice: Agent, library: None) -> None:
    result = search(api, alice, query="telescope mirror")
    assert ids(result)[0] == "post_astro_7"  # both words in the title
    scores = [r["relevance_score"] for r in result["results"]]
    assert scores == sorted(scores, reverse=True)
    stemmed = search(api, alice, query="comet")  # "Comets" in the body
    assert "post_astro_1" in ids(stemmed)
    assert search(api, alice, query="xylophone")["results"] == []


def test_search_filters(api: TestClient, alice: Agent, library: None) -> None:
    observing = search(api, alice, query="night sky", filters={"categories": ["Observing"]})
    assert ids(observing)
    assert all(int(i.rsplit("_", 1)[1]) % 2 == 1 for i in ids(observing))
    german = search(api, alice, query="night sky notes", filters={"language": "de"})
    assert set(ids(german)) == {"post_astro_10", "post_astro_11"}
    recent = search(api, alice, query="night sky notes", filters={"recency": "30d"})
    assert set(ids(recent)) <= {"post_astro_0", "post_astro_1", "post_astro_2", "pub_astro"}
    assert "post_astro_0" in ids(recent)
    cheap = search(api, alice, query="night sky notes", filters={"price": {"max": 100}})
    assert "post_astro_0" not in ids(cheap)  # $3/month tier only
    assert "post_astro_1" in ids(cheap)  # free
    assert "post_astro_5" not in ids(cheap)  # $240 a year is $20 a month
    yearly = search(api, alice, query="night sky notes", filters={"price": {"max": 2000}})
    assert "post_astro_5" in ids(yearly)


def test_search_pages_with_an_opaque_cursor(api: TestClient, alice: Agent, library: None) -> None:
    seen: list[str] = []
    body: dict[str, Any] = {"query": "night sky notes observing log", "pagination": {"limit": 5}}
    first = search(api, alice, **body)
    total = first["pagination"]["total"]
    page = first
    while True:
        seen += ids(page)
        cursor = page["pagination"]["cursor"]
        if cursor is None:
            break
        page = search(api, alice, **(body | {"pagination": {"limit": 5, "cursor": cursor}}))
    assert len(seen) == len(set(seen)) == total >= 12
    other = signed(
        api,
        alice,
        "POST",
        "/v1/catalog/search",
        {"query": "comet", "pagination": {"cursor": first["pagination"]["cursor"]}},
    )
    assert other.status_code == 400
    assert other.json()["reason"] == "invalid_request"


def test_lookup_by_every_id_form(api: TestClient, alice: Agent) -> None:
    forms = {
        DEMO_PUBLICATION: ("publication", DEMO_PUBLICATION),
        DEMO_PAID_POST: ("post", DEMO_PAID_POST),
        "slug:le-carnet": ("publication", "pub_le_carnet"),
        "patreon:10001": ("publication", DEMO_PUBLICATION),
        "ghost:carnet": ("publication", "pub_le_carnet"),
        "url:" + quote("https://ai-weekly.example/agents-that-pay", safe=""): ("post", DEMO_PAID_POST),
    }
    for item_id, (kind, expected) in forms.items():
        by_get = signed(api, alice, "GET", f"/v1/catalog/item/{item_id}")
        by_post = signed(
            api, alice, "POST", "/v1/catalog/lookup", {"id": item_id, "context": {"currency": "USD"}}
        )
        for answer in (by_get, by_post):
            assert answer.status_code == 200, (item_id, answer.text)
            assert answer.json()["type"] == kind
            assert answer.json()[kind]["id"] == expected
    publication = signed(api, alice, "GET", f"/v1/catalog/item/{DEMO_PUBLICATION}").json()["publication"]
    assert {t["tier_id"] for t in publication["tiers"]} == {"tier_ai_weekly_pro", "tier_ai_weekly_annual"}
    assert publication["recent_posts"]
    missing = signed(api, alice, "GET", "/v1/catalog/item/pub_nope").json()
    assert missing["type"] == "error"
    assert missing["messages"][0]["code"] == "NOT_FOUND"


def test_content_by_original_url(api: TestClient, alice: Agent) -> None:
    free = signed(
        api, alice, "GET", "/v1/content?url=" + quote("https://ai-weekly.example/roundup-208", safe="")
    )
    assert free.status_code == 200
    assert free.json()["metadata"]["id"] == "post_weekly_roundup_208"
    assert signed(api, alice, "GET", "/v1/content?url=https%3A%2F%2Fnowhere.example").status_code == 404


BAD_INPUT: list[tuple[str, str, Any, int]] = [
    ("GET", "/v1/catalog/item/isbn:123", None, 400),
    ("GET", "/v1/catalog/item/nonsense", None, 400),
    ("POST", "/v1/catalog/search", {"pagination": {"limit": 0}}, 400),
    ("POST", "/v1/catalog/search", {"pagination": {"limit": 500}}, 400),
    ("POST", "/v1/catalog/search", {"filters": {"recency": "1y"}}, 400),
    ("POST", "/v1/catalog/search", {"filters": {"price": {"max": -1}}}, 400),
    ("POST", "/v1/catalog/search", {"context": {"currency": "dollars"}}, 400),
    ("POST", "/v1/catalog/search", {"surprise": True}, 400),
    ("POST", "/v1/catalog/search", ["not", "an", "object"], 400),
    (
        "POST",
        "/v1/subscribe",
        {"publisher_id": DEMO_PUBLICATION, "tier_id": "tier_ai_weekly_pro", "payment_method": "paypal"},
        400,
    ),
    ("POST", "/v1/subscribe", {"publisher_id": DEMO_PUBLICATION, "tier_id": "tier_carnet_membre"}, 400),
    (
        "POST",
        "/v1/subscribe",
        {"publisher_id": "pub_le_carnet", "tier_id": "tier_carnet_membre", "payment_method": "usdc"},
        400,
    ),
    ("POST", "/v1/subscribe", {"publisher_id": "pub_nope", "tier_id": "tier_x"}, 404),
    ("POST", "/v1/subscribe", {"tier_id": "tier_x"}, 400),
    ("GET", f"/v1/content/{DEMO_PUBLICATION}/post_nope", None, 404),
    ("GET", f"/v1/content/pub_le_carnet/{DEMO_PAID_POST}", None, 404),
    ("DELETE", "/v1/entitlements/ent_nope", None, 404),
    ("POST", "/v1/checkout/chk_nope/pay", None, 404),
]


def test_bad_input_is_a_clear_4xx(api: TestClient, alice: Agent) -> None:
    for method, path, body, status in BAD_INPUT:
        answer = signed(api, alice, method, path, body)
        assert answer.status_code == status, (method, path, body, answer.text)
        problem = answer.json()
        assert problem["status"] == status
        assert problem["error"]["code"] == problem["reason"]
        assert problem["detail"]


def test_a_body_over_the_limit_is_refused(api: TestClient, alice: Agent) -> None:
    answer = signed(api, alice, "POST", "/v1/catalog/search", {"query": "x" * 70_000})
    assert answer.status_code == 413
    assert answer.json()["reason"] == "payload_too_large"


def test_discovery_names_the_server_and_its_tools(api: TestClient) -> None:
    document = api.get("/.well-known/ucap.json").json()
    assert document["ucap_version"] == "1.1.0-draft"
    assert {"publisher_id", "publisher_name", "ucap_server", "catalog_url", "subscribe_url"} <= set(document)
    assert document["mcp"]["tools"] == [
        "search_catalog",
        "get_catalog_item",
        "read_content",
        "subscribe",
        "list_entitlements",
    ]
    assert document["mcp"]["endpoint"].endswith("/mcp")


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_candidates_are_the_newest_matches_wherever_they_are(engine: Engine) -> None:
    """PostgreSQL ranks a query's newest CANDIDATES matches (SQLite ranks every match): a word
    common this week gives the newest, a word only five years old is found, and a word with a few
    matches this week and many last year gets those few and the newest of the rest. Equal scores
    rank newest first."""
    now = utcnow()
    docs = (
        [("common", now - timedelta(hours=n)) for n in range(CANDIDATES + 40)]
        + [("ancient", now - timedelta(days=5 * 365))]
        + [("mixed", now - timedelta(days=n)) for n in range(3)]
        + [("mixed", now - timedelta(days=400, hours=n)) for n in range(CANDIDATES)]
    )
    with db.session(engine) as session:
        for n, (word, moment) in enumerate(docs):
            index_document(
                session,
                doc_id=f"doc_{word}_{n}",
                kind="post",
                publication_id="pub_windows",
                published_at=moment,
                language="en",
                free=True,
                categories=[],
                tier_ids=[],
                title="Same title",
                summary="Same summary",
                body=f"plain text with {word}",
            )
        session.commit()

        def found(word: str, limit: int = 5) -> tuple[list[str], int]:
            page = search_index(session, SearchQuery(text=word, limit=limit))
            return [hit.doc_id for hit in page.hits], page.total

        common, total = found("common")
        assert common == [f"doc_common_{n}" for n in range(5)], "equal scores: newest first"
        assert total == CANDIDATES
        assert found("ancient")[0] == [f"doc_ancient_{CANDIDATES + 40}"]
        first = CANDIDATES + 41
        mixed, total = found("mixed", limit=4)
        assert mixed == [f"doc_mixed_{first + n}" for n in range(4)], "this week's three, then last year's"
        assert total == CANDIDATES


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_plan_follows_how_common_the_words_are(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL's statistics choose the plan: the newest matches of a word in every post are
    found by walking the dates, those of a rare word from the word's index, and a filter that
    refuses most rows moves the choice. Either plan finds the same page."""
    now = utcnow()
    with db.session(engine) as session:
        for n in range(2000):
            index_document(
                session,
                doc_id=f"doc_{n}",
                kind="post",
                publication_id="pub_plans",
                published_at=now - timedelta(minutes=n),
                language="en",
                free=n % 2 == 0,
                categories=["everyday" if n % 50 else "seldom"],
                tier_ids=[],
                title=f"Title {n}",
                summary="Summary",
                body="ubiquitous words" + (" scarce" if n % 400 == 0 else ""),
            )
        session.commit()
        session.execute(sa.text("ANALYZE ucap_search"))
        session.commit()
        chosen: list[bool] = []
        walks = search_module._walks

        def spy(*args: Any) -> bool:
            chosen.append(walks(*args))
            return chosen[-1]

        monkeypatch.setattr(search_module, "_walks", spy)
        queries = {
            "ubiquitous": (SearchQuery(text="ubiquitous"), True),
            "scarce": (SearchQuery(text="scarce"), False),
            "ubiquitous, in a seldom category": (
                SearchQuery(text="ubiquitous", categories=("seldom",)),
                False,
            ),
            "ubiquitous this hour": (SearchQuery(text="ubiquitous", since=now - timedelta(hours=1)), True),
            "scarce or ubiquitous": (SearchQuery(text="scarce ubiquitous"), False),
        }
        pages: dict[str, search_module.Page] = {}
        for name, (query, walk) in queries.items():
            chosen.clear()
            pages[name] = search_index(session, query)
            session.rollback()
            assert chosen[0] is walk, name
        for forced in (True, False):
            monkeypatch.setattr(search_module, "_walks", lambda *args, forced=forced: forced)
            for name, (query, _) in queries.items():
                assert search_index(session, query) == pages[name], (name, forced)
                session.rollback()
    assert [hit.doc_id for hit in pages["scarce"].hits] == [f"doc_{n}" for n in range(0, 2000, 400)]
    assert pages["ubiquitous, in a seldom category"].total == 40
    assert pages["ubiquitous this hour"].total == 61
