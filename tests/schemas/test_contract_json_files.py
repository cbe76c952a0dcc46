"""The generated JSON Schemas: committed files match the models, and say what the models say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.schemas.samples import ALL_EVENT_TYPES
from usp_schemas import EVENT_TYPES, OPERATIONAL_EVENT_TYPES, USP_VERSION, generate
from usp_schemas.generate import DEFAULT_OUTPUT_DIR, main, render_schemas, stale_files

REPO_JSON_DIR = Path(__file__).resolve().parents[2] / "schemas" / "json"
EXPECTED_FILES = {
    "webhook_event.json",
    "booking.json",
    "service.json",
    "slot.json",
    "waitlist_entry.json",
    "message.json",
    "jsonrpc_notification.json",
    "mcp_tool_result.json",
    "publication.json",
    "post.json",
    "content_subscription.json",
    "entitlement.json",
    "probe_event.json",
    "operational_event.json",
}


def load(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(render_schemas()[name])
    return schema


def test_committed_schemas_match_the_models() -> None:
    stale = stale_files(REPO_JSON_DIR, render_schemas())

    assert not stale, (
        f"schemas/json is out of date for {stale}: run `uv run python -m usp_schemas.generate` and commit"
    )


def test_output_folder_is_found_from_the_package_not_cwd() -> None:
    assert DEFAULT_OUTPUT_DIR == REPO_JSON_DIR


def test_every_documented_file_is_rendered() -> None:
    assert set(render_schemas()) == EXPECTED_FILES


def test_rendering_is_deterministic_and_canonically_formatted() -> None:
    first, second = render_schemas(), render_schemas()

    assert first == second
    for name, text in first.items():
        assert text.endswith("}\n"), name
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n", name


def test_union_maps_every_event_type_to_its_definition() -> None:
    schema = load("webhook_event.json")
    defs = schema["$defs"]

    mapping = schema["discriminator"]["mapping"]
    assert schema["discriminator"]["propertyName"] == "event"
    assert set(mapping) == set(ALL_EVENT_TYPES) | set(OPERATIONAL_EVENT_TYPES)
    assert set(ALL_EVENT_TYPES) == set(EVENT_TYPES)
    operational = load("operational_event.json")["discriminator"]["mapping"]
    assert set(operational) == set(OPERATIONAL_EVENT_TYPES)
    assert sorted(ref["$ref"] for ref in schema["oneOf"]) == sorted(mapping.values())
    for event_type, ref in mapping.items():
        definition = defs[ref.removeprefix("#/$defs/")]
        assert definition["properties"]["event"]["const"] == event_type
        assert definition["required"][:3] == ["event", "event_id", "timestamp"], event_type
        assert definition["properties"]["version"]["const"] == USP_VERSION


@pytest.mark.parametrize(
    ("prefix", "subject", "data"),
    [
        ("booking.", "booking_id", "Booking"),
        ("catalog.service.", "service_id", "Service"),
        ("catalog.availability.", "service_id", "AvailabilityChange"),
        ("waitlist.", "waitlist_entry_id", "WaitlistEntry"),
    ],
)
def test_each_event_requires_its_subject_id_and_types_its_data(prefix: str, subject: str, data: str) -> None:
    schema = load("webhook_event.json")

    matched = [t for t in schema["discriminator"]["mapping"] if t.startswith(prefix)]
    assert matched
    for event_type in matched:
        definition = schema["$defs"][schema["discriminator"]["mapping"][event_type].removeprefix("#/$defs/")]
        assert subject in definition["required"], event_type
        assert definition["properties"]["data"] == {"$ref": f"#/$defs/{data}"}, event_type


def test_envelope_and_payloads_accept_extra_fields() -> None:
    schema = load("webhook_event.json")

    for name in ("BookingConfirmed", "Booking", "Buyer", "Service", "Slot", "WaitlistEntry"):
        assert schema["$defs"][name]["additionalProperties"] is True, name


def test_notification_schema_has_no_id_and_types_params_as_the_event() -> None:
    schema = load("jsonrpc_notification.json")

    assert "id" not in schema["properties"]
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["jsonrpc", "method", "params"]
    assert schema["properties"]["method"]["const"] == "usp_webhook"
    mapping = schema["properties"]["params"]["discriminator"]["mapping"]
    assert set(mapping) == set(ALL_EVENT_TYPES) | set(OPERATIONAL_EVENT_TYPES)
    assert all(
        ref["$ref"].removeprefix("#/$defs/") in schema["$defs"]
        for ref in schema["properties"]["params"]["oneOf"]
    )


def test_descriptions_carry_no_python_examples() -> None:
    for name, text in render_schemas().items():
        assert ">>>" not in text, name
        assert "``" not in text, name


def test_payload_files_describe_their_model() -> None:
    titles = {
        name: load(name)["title"]
        for name in EXPECTED_FILES - {"webhook_event.json", "operational_event.json"}
    }

    assert titles == {
        "booking.json": "Booking",
        "service.json": "Service",
        "slot.json": "Slot",
        "waitlist_entry.json": "WaitlistEntry",
        "message.json": "Message",
        "jsonrpc_notification.json": "WebhookNotification",
        "mcp_tool_result.json": "ToolResult",
        "publication.json": "Publication",
        "post.json": "Post",
        "content_subscription.json": "ContentSubscription",
        "entitlement.json": "Entitlement",
        "probe_event.json": "ProbeEvent",
    }
    assert load("slot.json")["properties"]["duration"]["pattern"].startswith("^P")


def test_generate_writes_checks_and_prunes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "obsolete.json").write_text("{}\n", encoding="utf-8")
    assert main(["--out", str(tmp_path), "--check"]) == 1
    assert "run: uv run python -m usp_schemas.generate" in capsys.readouterr().err

    assert main(["--out", str(tmp_path)]) == 0

    assert {p.name for p in tmp_path.iterdir()} == EXPECTED_FILES
    assert main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "slot.json").write_text("{}\n", encoding="utf-8")
    assert main(["--out", str(tmp_path), "--check"]) == 1
    assert "slot.json" in capsys.readouterr().err


def test_generate_needs_a_checkout_or_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Installed from a wheel, the package's parent is site-packages: no "json" folder may land there.
    monkeypatch.setattr(generate, "DEFAULT_OUTPUT_DIR", tmp_path / "site-packages" / "json")

    with pytest.raises(SystemExit) as exited:
        main([])

    assert exited.value.code == 2
    assert not (tmp_path / "site-packages").exists()
