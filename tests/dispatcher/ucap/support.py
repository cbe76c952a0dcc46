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
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount
from fastapi.testclient import TestClient

from tests.dispatcher.ucap.conftest import Agent, signed
from usp_dispatcher.ucap.seed import DEMO_PUBLICATION

PRO = "tier_ai_weekly_pro"
#: The chains the tests pay on, by both versions' names.
CHAIN_IDS = {"base-sepolia": 84532, "eip155:84532": 84532, "base": 8453, "eip155:8453": 8453}


def x402_payment(
    requirements: dict[str, Any],
    *,
    payer: LocalAccount | None = None,
    signer: LocalAccount | None = None,
    signature: str | None = None,
    changes: dict[str, str] | None = None,
) -> str:
    """An ``X-PAYMENT`` header as an x402 v1 client builds it: an EIP-3009 authorization from
    ``payer`` (a fresh key by default) with ``changes`` applied, signed under EIP-712 by ``signer``
    (the payer by default) unless ``signature`` is given."""
    payer = payer or Account.create()
    now = int(time.time())
    authorization: dict[str, Any] = {
        "from": payer.address,
        "to": requirements["payTo"],
        "value": requirements["maxAmountRequired"],
        "validAfter": str(now - 60),
        "validBefore": str(now + 300),
        "nonce": "0x" + secrets.token_hex(32),
    } | (changes or {})
    if signature is None:
        signature = sign_authorization(signer or payer, authorization, requirements)
    payload = {
        "x402Version": 1,
        "scheme": "exact",
        "network": requirements["network"],
        "payload": {"signature": signature, "authorization": authorization},
    }
    return base64.b64encode(json.dumps(payload).encode()).decode()


def sign_authorization(
    account: LocalAccount, authorization: dict[str, Any], requirements: dict[str, Any]
) -> str:
    """The EIP-712 signature of a ``TransferWithAuthorization`` (EIP-3009) under the token's domain,
    as x402's clients make it; written here from the EIP texts, with eth-account."""
    typed = {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            "TransferWithAuthorization": [
                {"name": n, "type": t}
                for n, t in [
                    ("from", "address"),
                    ("to", "address"),
                    ("value", "uint256"),
                    ("validAfter", "uint256"),
                    ("validBefore", "uint256"),
                    ("nonce", "bytes32"),
                ]
            ],
        },
        "primaryType": "TransferWithAuthorization",
        "domain": {
            "name": requirements["extra"]["name"],
            "version": requirements["extra"]["version"],
            "chainId": CHAIN_IDS[requirements["network"]],
            "verifyingContract": requirements["asset"],
        },
        "message": {
            "from": authorization["from"],
            "to": authorization["to"],
            "value": int(authorization["value"]),
            "validAfter": int(authorization["validAfter"]),
            "validBefore": int(authorization["validBefore"]),
            "nonce": bytes.fromhex(str(authorization["nonce"])[2:]),
        },
    }
    signed = account.sign_message(encode_typed_data(full_message=typed))
    return "0x" + bytes(signed.signature).hex()


def subscribe_usdc(api: TestClient, agent: Agent, tier_id: str = PRO) -> dict[str, Any]:
    """Subscribe ``agent`` to ``tier_id`` with USDC; the answer's body (a 402: x402 asks)."""
    answer = signed(
        api,
        agent,
        "POST",
        "/v1/subscribe",
        {"publisher_id": DEMO_PUBLICATION, "tier_id": tier_id, "payment_method": "usdc"},
    )
    assert answer.status_code == 402, answer.text
    body: dict[str, Any] = answer.json()
    return body


def start_usdc(api: TestClient, agent: Agent, tier_id: str = PRO) -> dict[str, Any]:
    """Subscribe ``agent`` to ``tier_id`` with USDC; the x402 (v1) requirements to pay."""
    requirements: dict[str, Any] = subscribe_usdc(api, agent, tier_id)["accepts"][0]
    return requirements


def pay(
    api: TestClient, agent: Agent, requirements: dict[str, Any], payment: str | None = None
) -> httpx2.Response:
    """Send ``payment`` (default: a valid one) to the requirements' resource, signed by ``agent``."""
    header = payment if payment is not None else x402_payment(requirements)
    return signed(
        api, agent, "POST", urlsplit(str(requirements["resource"])).path, headers={"X-PAYMENT": header}
    )
