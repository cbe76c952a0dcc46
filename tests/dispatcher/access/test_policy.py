"""The AuthorizationPolicy as configured and as published in /.well-known/usp."""

from __future__ import annotations

from tests.dispatcher.conftest import MakeSettings
from usp_dispatcher.access import AuthorizationPolicy, policy_document
from usp_dispatcher.cli.config import Settings


def test_defaults_offer_everything_and_require_authentication(settings: Settings) -> None:
    policy = AuthorizationPolicy.from_settings(settings)
    assert policy.mechanisms == ("bearer", "http_message_signatures", "booking_scoped_credential")
    assert policy.require_authentication
    document = policy_document(settings)
    assert document["mechanisms"] == list(policy.mechanisms)
    assert document["require_authentication"] is True
    assert (
        document["booking_scoped_credential"]["jwks_uri"] == "http://127.0.0.1:8000/.well-known/usp/jwks.json"
    )
    assert document["booking_scoped_credential"]["ttl_seconds"] == 2_592_000
    assert "usp_bookings_confirm" not in document["booking_scoped_credential"]["scope"]
    assert "signature-agent" in document["http_message_signatures"]["covered_components"]


def test_settings_choose_the_mechanisms(make_settings: MakeSettings) -> None:
    settings = make_settings(
        auth_mechanisms="booking_scoped_credential,bearer",
        require_authentication=False,
        booking_credential_ttl_seconds=3600,
    )
    document = policy_document(settings)
    assert document["mechanisms"] == ["bearer", "booking_scoped_credential"]  # our order, not the list's
    assert document["require_authentication"] is False
    assert "http_message_signatures" not in document
    assert document["booking_scoped_credential"]["ttl_seconds"] == 3600


def test_policy_document_holds_no_secret(settings: Settings) -> None:
    assert "test-admin-token" not in repr(policy_document(settings))
