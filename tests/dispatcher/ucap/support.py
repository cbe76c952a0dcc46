"""Helpers the UCAP tests share: an x402 payment as a client builds it, and a USDC subscription
started and paid over the signed ``/v1`` API."""

from __future__ import annotations

import base64
import json
import secrets
import time
from typing import Any
from urllib.parse import urlsplit

import httpx2
from fastapi.testclient import TestClient

from tests.dispatcher.ucap.conftest import Agent, signed
from usp_dispatcher.ucap.seed import DEMO_PUBLICATION

PRO = "tier_ai_weekly_pro"


def x402_payment(requirements: dict[str, object], **changes: object) -> str:
    """An ``X-PAYMENT`` header as an x402 client builds it (EIP-3009 authorization)."""
    now = int(time.time())
    authorization = {
        "from": "0x857b06519E91e3A54538791bDbb0E22373e36b66",
        "to": requirements["payTo"],
        "value": requirements["maxAmountRequired"],
        "validAfter": str(now - 60),
        "validBefore": str(now + 300),
        "nonce": "0x" + secrets.token_hex(32),
    } | changes
    payload = {
        "x402Version": 1,
        "scheme": "exact",
        "network": requirements["network"],
        "payload": {"signature": "0x" + "ab" * 65, "authorization": authorization},
    }
    return base64.b64encode(json.dumps(payload).encode()).decode()


def start_usdc(api: TestClient, agent: Agent, tier_id: str = PRO) -> dict[str, Any]:
    """Subscribe ``agent`` to ``tier_id`` with USDC; the x402 requirements to pay."""
    answer = signed(
        api,
        agent,
        "POST",
        "/v1/subscribe",
        {"publisher_id": DEMO_PUBLICATION, "tier_id": tier_id, "payment_method": "usdc"},
    )
    assert answer.status_code == 200, answer.text
    requirements: dict[str, Any] = answer.json()["accepts"][0]
    return requirements


def pay(
    api: TestClient, agent: Agent, requirements: dict[str, Any], payment: str | None = None
) -> httpx2.Response:
    """Send ``payment`` (default: a valid one) to the requirements' resource, signed by ``agent``."""
    header = payment if payment is not None else x402_payment(requirements)
    return signed(
        api, agent, "POST", urlsplit(str(requirements["resource"])).path, headers={"X-PAYMENT": header}
    )
