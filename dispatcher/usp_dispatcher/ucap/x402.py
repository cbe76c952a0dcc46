"""x402's wire format in versions 1 and 2, and what a facilitator checks of an ``exact`` EVM
payment before it settles: the EIP-3009 ``TransferWithAuthorization`` whose EIP-712 signature
recovers to its ``from`` (through ``eth-account``), paying ``payTo`` at least the price, on time.

Version 2 travels in headers (``PAYMENT-REQUIRED``, ``PAYMENT-SIGNATURE``, ``PAYMENT-RESPONSE``:
base64 of JSON) and names networks by CAIP-2 id; version 1 puts the requirements in the 402 body
and the payment in ``X-PAYMENT`` (answered by ``X-PAYMENT-RESPONSE``), with network names. A
client is answered in the version it pays in.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from usp_dispatcher.errors import PaymentRefused

__all__ = [
    "NETWORK_NAMES",
    "PAYMENT_REQUIRED",
    "PAYMENT_RESPONSE",
    "PAYMENT_SIGNATURE",
    "V1_PAYMENT",
    "V1_PAYMENT_RESPONSE",
    "Payment",
    "as_v1",
    "caip2",
    "carries_payment",
    "check_exact",
    "encode",
    "payment_from_headers",
    "payment_required",
    "read_payment",
    "requirement_from",
]

PAYMENT_REQUIRED: Final = "PAYMENT-REQUIRED"
PAYMENT_SIGNATURE: Final = "PAYMENT-SIGNATURE"
PAYMENT_RESPONSE: Final = "PAYMENT-RESPONSE"
V1_PAYMENT: Final = "X-PAYMENT"
V1_PAYMENT_RESPONSE: Final = "X-PAYMENT-RESPONSE"

#: Version 1's network names and their CAIP-2 ids (the EVM networks x402's SDKs name in v1).
NETWORK_NAMES: Final[Mapping[str, str]] = {
    "base": "eip155:8453",
    "base-sepolia": "eip155:84532",
    "ethereum": "eip155:1",
    "sepolia": "eip155:11155111",
    "polygon": "eip155:137",
    "polygon-amoy": "eip155:80002",
    "avalanche": "eip155:43114",
    "avalanche-fuji": "eip155:43113",
    "optimism": "eip155:10",
    "arbitrum": "eip155:42161",
}
_V1_NAMES: Final = {v: k for k, v in NETWORK_NAMES.items()}
_EIP155: Final = re.compile(r"eip155:([1-9][0-9]{0,18})")
_ADDRESS: Final = re.compile(r"0x[0-9a-fA-F]{40}")
_NONCE: Final = re.compile(r"0x[0-9a-fA-F]{64}")
_SIGNATURE: Final = re.compile(r"0x[0-9a-fA-F]{130}")
_AUTHORIZATION_FIELDS: Final = ("from", "to", "value", "validAfter", "validBefore", "nonce")
_TYPES: Final = {
    "EIP712Domain": [
        {"name": "name", "type": "string"},
        {"name": "version", "type": "string"},
        {"name": "chainId", "type": "uint256"},
        {"name": "verifyingContract", "type": "address"},
    ],
    "TransferWithAuthorization": [
        {"name": "from", "type": "address"},
        {"name": "to", "type": "address"},
        {"name": "value", "type": "uint256"},
        {"name": "validAfter", "type": "uint256"},
        {"name": "validBefore", "type": "uint256"},
        {"name": "nonce", "type": "bytes32"},
    ],
}


def caip2(network: str) -> str:
    """``network`` as a CAIP-2 id: a v1 name is translated (``base-sepolia`` → ``eip155:84532``).

    >>> caip2("base-sepolia"), caip2("eip155:8453")
    ('eip155:84532', 'eip155:8453')
    """
    named = NETWORK_NAMES.get(network, network)
    if _EIP155.fullmatch(named) is None:
        raise ValueError(f"{network!r} is neither an eip155 CAIP-2 id nor an x402 v1 network name")
    return named


def _chain_id(network: str) -> int:
    return int(caip2(network).partition(":")[2])


def encode(document: Mapping[str, Any]) -> str:
    """A header value: base64 of compact JSON."""
    return base64.b64encode(json.dumps(document, separators=(",", ":")).encode()).decode()


def payment_required(
    resource: Mapping[str, Any], accepts: list[dict[str, Any]], error: str | None = None
) -> dict[str, Any]:
    """A v2 ``PaymentRequired`` (what ``PAYMENT-REQUIRED`` carries, base64-encoded)."""
    document: dict[str, Any] = {"x402Version": 2, "resource": dict(resource), "accepts": accepts}
    if error is not None:
        document["error"] = error
    return document


def as_v1(requirement: Mapping[str, Any], resource: Mapping[str, Any]) -> dict[str, Any]:
    """The v1 ``PaymentRequirements`` for a v2 requirement and its resource."""
    network = str(requirement["network"])
    return {
        "scheme": requirement["scheme"],
        "network": _V1_NAMES.get(network, network),
        "maxAmountRequired": requirement["amount"],
        "resource": resource["url"],
        "description": resource.get("description", ""),
        "mimeType": resource.get("mimeType", "application/json"),
        "payTo": requirement["payTo"],
        "maxTimeoutSeconds": requirement["maxTimeoutSeconds"],
        "asset": requirement["asset"],
        "extra": requirement.get("extra") or {},
    }


def requirement_from(document: Mapping[str, Any]) -> dict[str, Any]:
    """A requirement in v2's shape, from either version's (a facilitator may be sent either)."""
    try:
        amount = document["amount"] if "amount" in document else document["maxAmountRequired"]
        return {
            "scheme": str(document["scheme"]),
            "network": caip2(str(document["network"])),
            "amount": str(amount),
            "asset": str(document["asset"]),
            "payTo": str(document["payTo"]),
            "maxTimeoutSeconds": int(document["maxTimeoutSeconds"]),
            "extra": dict(document.get("extra") or {}),
        }
    except (KeyError, TypeError, ValueError):
        raise PaymentRefused(
            "invalid_payment_requirements", "the payment requirements are incomplete"
        ) from None


@dataclass(frozen=True, slots=True)
class Payment:
    """A client's payment, of either version: ``raw`` as sent (what a facilitator is given),
    ``accepted`` the requirement a v2 client says it pays (None in v1)."""

    version: int
    scheme: str
    network: str
    authorization: Mapping[str, str]
    signature: str
    accepted: Mapping[str, Any] | None
    raw: Mapping[str, Any]

    @property
    def nonce(self) -> str:
        return self.authorization["nonce"].lower()

    @property
    def payer(self) -> str:
        return self.authorization["from"]


def carries_payment(headers: Mapping[str, str]) -> bool:
    """Whether a request carries an x402 payment of either version (well-formed or not)."""
    names = {name.lower() for name in headers}
    return PAYMENT_SIGNATURE.lower() in names or V1_PAYMENT.lower() in names


def payment_from_headers(headers: Mapping[str, str]) -> Payment | None:
    """The payment a request carries (``PAYMENT-SIGNATURE``, else ``X-PAYMENT``), or None."""
    lowered = {k.lower(): v for k, v in headers.items()}
    if (value := lowered.get(PAYMENT_SIGNATURE.lower())) is not None:
        return read_payment(_decoded(value, PAYMENT_SIGNATURE), expect=2)
    if (value := lowered.get(V1_PAYMENT.lower())) is not None:
        return read_payment(_decoded(value, V1_PAYMENT), expect=1)
    return None


def _decoded(value: str, header: str) -> dict[str, Any]:
    try:
        document = json.loads(base64.b64decode(value, validate=True))
    except (ValueError, binascii.Error):
        raise PaymentRefused("invalid_payload", f"{header} is not base64 of a JSON payment payload") from None
    if not isinstance(document, dict):
        raise PaymentRefused("invalid_payload", f"{header} must hold a JSON object")
    return document


def read_payment(document: Mapping[str, Any], *, expect: int | None = None) -> Payment:
    """A ``PaymentPayload`` of either version, its shape checked (not yet its signature)."""
    version = document.get("x402Version")
    if version not in (1, 2) or (expect is not None and version != expect):
        raise PaymentRefused("invalid_x402_version", f"x402Version must be {expect or '1 or 2'}")
    accepted = document.get("accepted") if version == 2 else None
    if version == 2 and not isinstance(accepted, dict):
        raise PaymentRefused("invalid_payload", "a version 2 payment names the requirement it accepted")
    scheme = accepted.get("scheme") if accepted is not None else document.get("scheme")
    network = accepted.get("network") if accepted is not None else document.get("network")
    inner = document.get("payload")
    authorization = inner.get("authorization") if isinstance(inner, dict) else None
    signature = inner.get("signature") if isinstance(inner, dict) else None
    if not isinstance(authorization, dict) or not all(
        isinstance(authorization.get(f), str) for f in _AUTHORIZATION_FIELDS
    ):
        raise PaymentRefused("invalid_payload", "the payment has no complete EIP-3009 authorization")
    if not isinstance(scheme, str) or not isinstance(network, str):
        raise PaymentRefused("invalid_payload", "the payment names no scheme or network")
    return Payment(
        version=int(version),
        scheme=scheme,
        network=network,
        authorization={f: authorization[f] for f in _AUTHORIZATION_FIELDS},
        signature=signature if isinstance(signature, str) else "",
        accepted=accepted,
        raw=document,
    )


def check_exact(payment: Payment, requirement: Mapping[str, Any], now: float) -> str:
    """The payer, when ``payment`` is an ``exact`` EVM payment meeting ``requirement`` (v2 shape)
    and its signature recovers to its ``from``; :class:`PaymentRefused` with x402's reason
    otherwise. Whether the nonce was used before is the facilitator's to know."""
    if payment.scheme != "exact" or requirement.get("scheme") != "exact":
        raise PaymentRefused("unsupported_scheme", "only the exact scheme is accepted")
    try:
        network = caip2(payment.network)
    except ValueError:
        raise PaymentRefused("network_mismatch", "the payment names an unknown network") from None
    if network != requirement.get("network"):
        raise PaymentRefused("network_mismatch", "the payment is for another network")
    if payment.accepted is not None and not _same_requirement(payment.accepted, requirement):
        raise PaymentRefused("invalid_payment_requirements", "the payment accepted other requirements")
    auth = payment.authorization
    if not all(_ADDRESS.fullmatch(auth[k]) for k in ("from", "to")) or not _NONCE.fullmatch(auth["nonce"]):
        raise PaymentRefused("invalid_payload", "from/to must be addresses and the nonce 32 bytes of hex")
    if auth["to"].lower() != str(requirement.get("payTo", "")).lower():
        raise PaymentRefused(
            "invalid_exact_evm_payload_recipient_mismatch", "the payment goes to someone else"
        )
    try:
        value, after, before = (int(auth[k]) for k in ("value", "validAfter", "validBefore"))
    except ValueError:
        raise PaymentRefused("invalid_payload", "value and validity must be integers") from None
    if value < int(requirement["amount"]):
        raise PaymentRefused(
            "invalid_exact_evm_payload_authorization_value_mismatch", "the payment is less than the price"
        )
    if now < after:
        raise PaymentRefused(
            "invalid_exact_evm_payload_authorization_valid_after", "the payment is not valid yet"
        )
    if now >= before:
        raise PaymentRefused(
            "invalid_exact_evm_payload_authorization_valid_before", "the payment authorization expired"
        )
    if _signer(auth, payment.signature, requirement) != auth["from"].lower():
        raise PaymentRefused(
            "invalid_exact_evm_payload_signature", "the authorization is not signed by its from address"
        )
    return payment.payer


def _same_requirement(accepted: Mapping[str, Any], requirement: Mapping[str, Any]) -> bool:
    try:
        theirs = requirement_from(accepted)
    except PaymentRefused:
        return False
    fold = ("asset", "payTo")
    return all(
        (str(theirs[k]).lower() == str(requirement[k]).lower()) if k in fold else theirs[k] == requirement[k]
        for k in ("scheme", "network", "amount", "asset", "payTo", "maxTimeoutSeconds", "extra")
    )


def _signer(authorization: Mapping[str, str], signature: str, requirement: Mapping[str, Any]) -> str:
    """The address whose key made ``signature`` over the EIP-712 ``TransferWithAuthorization``,
    lower-cased; ``""`` when the signature is no 65-byte ECDSA signature (an undeployed smart
    wallet's ERC-6492 or ERC-1271 signature needs the chain, which a sandbox does not have)."""
    extra = requirement.get("extra") or {}
    if not _SIGNATURE.fullmatch(signature) or not extra.get("name") or not extra.get("version"):
        return ""
    typed = {
        "types": _TYPES,
        "primaryType": "TransferWithAuthorization",
        "domain": {
            "name": str(extra["name"]),
            "version": str(extra["version"]),
            "chainId": _chain_id(str(requirement["network"])),
            "verifyingContract": str(requirement["asset"]),
        },
        "message": {
            "from": authorization["from"],
            "to": authorization["to"],
            "value": int(authorization["value"]),
            "validAfter": int(authorization["validAfter"]),
            "validBefore": int(authorization["validBefore"]),
            "nonce": bytes.fromhex(authorization["nonce"][2:]),
        },
    }
    # Imported here, on the first payment: eth-account pulls in py_ecc, whose BLS tables take
    # about a second to build, and every API process and CLI command would pay it at start-up.
    from eth_account import Account
    from eth_account.messages import encode_typed_data
    from eth_utils.exceptions import ValidationError as EthValidationError

    try:
        recovered = Account.recover_message(encode_typed_data(full_message=typed), signature=signature)
    except (EthValidationError, ValueError, TypeError):
        return ""
    return str(recovered).lower()
