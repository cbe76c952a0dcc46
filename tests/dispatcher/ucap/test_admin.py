"""The publisher's side: publications, tiers and posts through the admin API (and the CLI on top
of it), agents' subscriptions listed, a checkout confirmed by hand; all refused without the token."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.dispatcher.conftest import ADMIN, ADMIN_TOKEN, MakeSettings, Serve
from tests.dispatcher.ucap.conftest import Agent, signed
from tests.dispatcher.ucap.support import start_usdc
from usp_dispatcher import cli
from usp_dispatcher.api.app import create_app


def test_publish_and_find(api: TestClient, alice: Agent) -> None:
    publication = {
        "slug": "field-notes",
        "name": "Field Notes",
        "description": "Birds and the people who count them.",
        "categories": ["nature"],
        "language": "en",
        "external_ids": ["patreon:777"],
        "tiers": [{"name": "Birder", "price_amount": 400, "currency": "EUR"}],
    }
    made = api.post("/admin/ucap/publications", json=publication, headers=ADMIN)
    assert made.status_code == 201, made.text
    pub_id = made.json()["id"]
    tier = api.post(
        f"/admin/ucap/publications/{pub_id}/tiers",
        json={"name": "Ornithologist", "price_amount": 4000, "currency": "EUR", "interval": "year"},
        headers=ADMIN,
    )
    assert tier.status_code == 201, tier.text
    post = api.post(
        f"/admin/ucap/publications/{pub_id}/posts",
        json={
            "title": "Counting curlews at dawn",
            "body_html": "<p>Curlews, 42 of them.</p>",
            "tier_ids": [tier.json()["id"]],
        },
        headers=ADMIN,
    )
    assert post.status_code == 201, post.text
    assert post.json()["free"] is False
    found = signed(api, alice, "POST", "/v1/catalog/search", {"query": "curlews"}).json()
    assert [r["post"]["id"] for r in found["results"] if r["type"] == "post"] == [post.json()["id"]]
    assert signed(api, alice, "GET", "/v1/catalog/item/patreon:777").json()["publication"]["id"] == pub_id

    replaced = api.put(
        f"/admin/ucap/posts/{post.json()['id']}",
        json={"title": "Counting godwits at dusk", "body_html": "<p>Godwits.</p>"},
        headers=ADMIN,
    )
    assert replaced.json()["free"] is True
    assert signed(api, alice, "POST", "/v1/catalog/search", {"query": "curlews"}).json()["results"] == []
    assert signed(api, alice, "POST", "/v1/catalog/search", {"query": "godwit"}).json()["results"]

    again = api.post("/admin/ucap/publications", json=publication, headers=ADMIN)
    assert again.status_code == 409
    foreign = api.post(
        f"/admin/ucap/publications/{pub_id}/posts",
        json={"title": "x", "body_html": "<p>x</p>", "tier_ids": ["tier_ai_weekly_pro"]},
        headers=ADMIN,
    )
    assert foreign.status_code == 422
    assert foreign.json()["reason"] == "tier_not_found"


def test_subscriptions_and_a_confirmation_by_hand(api: TestClient, alice: Agent) -> None:
    start_usdc(api, alice)
    listed = api.get("/admin/ucap/subscriptions", headers=ADMIN).json()["subscriptions"]
    assert [(s["status"], s["payment_method"]) for s in listed] == [("pending_payment", "usdc")]
    assert listed[0]["agent"]["key_directory"] == alice.jwks_url
    assert api.get("/v1/entitlements").status_code == 403  # unsigned
    checkout = signed(
        api,
        alice,
        "POST",
        "/v1/subscribe",
        {"publisher_id": "pub_ai_weekly", "tier_id": "tier_ai_weekly_pro", "payment_method": "usdc"},
    ).json()["checkout"]["session_id"]
    confirmed = api.post(f"/admin/ucap/checkouts/{checkout}/confirm", headers=ADMIN)
    assert confirmed.json()["granted"] is True
    assert api.post(f"/admin/ucap/checkouts/{checkout}/confirm", headers=ADMIN).json()["granted"] is False
    active = api.get("/admin/ucap/subscriptions", params={"status": "active"}, headers=ADMIN).json()
    assert len(active["subscriptions"]) == 1


def test_the_admin_routes_need_the_token(api: TestClient) -> None:
    for method, path in [
        ("POST", "/admin/ucap/publications"),
        ("GET", "/admin/ucap/subscriptions"),
        ("POST", "/admin/ucap/checkouts/chk_x/confirm"),
    ]:
        assert api.request(method, path, json={}).status_code == 401


def test_the_content_commands(
    make_settings: MakeSettings, serve: Serve, tmp_path: Path, database_url: str
) -> None:
    base = serve(create_app(make_settings()))
    env = {"USP_ADMIN_URL": base, "USP_ADMIN_TOKEN": ADMIN_TOKEN, "USP_DATABASE_URL": database_url}
    runner = CliRunner()
    (tmp_path / "pub.json").write_text(
        json.dumps(
            {
                "slug": "cli-pub",
                "name": "CLI Pub",
                "tiers": [{"id": "tier_cli", "name": "Reader", "price_amount": 100, "currency": "USD"}],
            }
        )
    )
    made = runner.invoke(cli.app, ["content", "add-publication", str(tmp_path / "pub.json")], env=env)
    assert made.exit_code == 0, made.output
    pub_id = made.output.split()[1]
    (tmp_path / "post.json").write_text(
        json.dumps({"title": "Hello", "body_html": "<p>Hi</p>", "tier_ids": ["tier_cli"]})
    )
    posted = runner.invoke(cli.app, ["content", "add-post", pub_id, str(tmp_path / "post.json")], env=env)
    assert posted.exit_code == 0, posted.output
    assert posted.output.startswith("paid post post_")
    (tmp_path / "bad.json").write_text("{not json")
    assert (
        runner.invoke(cli.app, ["content", "add-post", pub_id, str(tmp_path / "bad.json")], env=env).exit_code
        == 2
    )
    listed = runner.invoke(cli.app, ["content", "subscriptions"], env=env)
    assert listed.exit_code == 0, listed.output
    missing = runner.invoke(cli.app, ["payments", "confirm", "chk_nope"], env=env)
    assert missing.exit_code == 1
    assert "content_not_found" in missing.output
