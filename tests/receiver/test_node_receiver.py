"""The TypeScript receiver (``receiver-js/``, ``@usp-webhooks/receiver``) under Node's test
runner: the RFC 9421 vectors, the cross-receiver corpus judged exactly as the Python receiver judges
it, the dedupe stores on a real Redis (shared with the Python store), ``RemoteJWKS`` against a real
server, the Express and Hono skins, and the package ``npm pack`` makes."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

from redis import Redis

from tests.nodejs import RECEIVER_JS, build_receiver_js, receiver_js_test
from tests.receiver.corpus import corpus
from usp_receiver.dedupe import ClaimState
from usp_receiver.dedupe.redis import RedisDedupe

REDIS_URL = "redis://127.0.0.1:6379/0"


def test_the_rfc9421_vectors_verify() -> None:
    report = receiver_js_test("vectors.test.mjs")
    assert "# pass 13" in report, report


def test_both_receivers_judge_the_corpus_identically(tmp_path: Path) -> None:
    path = tmp_path / "corpus.json"
    data = corpus()
    path.write_text(json.dumps(data))
    verdicts = {case["verdict"] for case in data["cases"]}
    assert {"ok:sig1", "ok:sig2", "bad_signature", "digest_mismatch", "stale", "unknown_key"} <= verdicts
    receiver_js_test("corpus.test.mjs", {"USP_CORPUS": str(path)})


def test_dedupe_on_memory_and_redis_shared_with_the_python_store() -> None:
    prefix = f"usp:test:{uuid.uuid4()}:"
    event_id = f"evt_{uuid.uuid4().hex}"
    client = Redis.from_url(REDIS_URL)
    try:
        python = RedisDedupe(client, prefix=prefix)
        claim = python.claim(event_id)
        assert claim.state is ClaimState.NEW
        python.commit(claim)
        python.close()
        report = receiver_js_test(
            "dedupe.test.mjs",
            {"USP_REDIS_URL": REDIS_URL, "USP_PYTHON_DONE_ID": event_id, "USP_PYTHON_PREFIX": prefix},
        )
        assert "# skipped 0" in report, report
        assert client.get(prefix + event_id + "_other") is not None, "Node claimed it in the same store"
    finally:
        for key in client.scan_iter(prefix + "*"):
            client.delete(key)
        client.close()


def test_remote_jwks_caching_and_refetch_rules() -> None:
    receiver_js_test("jwks.test.mjs")


def test_the_express_and_hono_skins() -> None:
    receiver_js_test("express.test.mjs")


def test_npm_pack_makes_a_package_a_platform_installs_and_imports(tmp_path: Path) -> None:
    """What ``npm pack`` writes is what a platform gets from ``npm install``: the built code, its
    types and the README, no sources or tests; installed into an empty project, every entry
    point of ``exports`` imports and the front door has the whole surface."""
    build_receiver_js()
    npm = shutil.which("npm")
    assert npm is not None
    packed = subprocess.run(
        [npm, "pack", "--json", "--pack-destination", str(tmp_path)],
        cwd=RECEIVER_JS,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    (manifest,) = json.loads(packed.stdout)
    files = {entry["path"] for entry in manifest["files"]}
    assert {"package.json", "README.md", "dist/index.js", "dist/index.d.ts", "dist/express.js"} <= files
    assert not [name for name in files if name.startswith(("src/", "test/", "scripts/", "node_modules/"))]
    project = tmp_path / "platform"
    project.mkdir()
    (project / "package.json").write_text('{"name": "platform", "private": true, "type": "module"}')
    subprocess.run(
        [npm, "install", "--prefer-offline", "--no-audit", "--no-fund", str(tmp_path / manifest["filename"])],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    script = (
        'import * as receiver from "@usp-webhooks/receiver";'
        'import { uspWebhook } from "@usp-webhooks/receiver/express";'
        'import { RedisDedupe } from "@usp-webhooks/receiver/redis";'
        'import { uspWebhook as hono } from "@usp-webhooks/receiver/hono";'
        "console.log(JSON.stringify(Object.keys(receiver)),"
        " typeof uspWebhook, typeof RedisDedupe, typeof hono);"
    )
    node = shutil.which("node")
    assert node is not None
    done = subprocess.run(
        [node, "--input-type=module", "-e", script], cwd=project, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    names, *kinds = done.stdout.split()
    assert kinds == ["function", "function", "function"]
    assert {"Verifier", "RemoteJWKS", "WebhookReceiver", "StandardWebhooksVerifier", "MemoryDedupe"} <= set(
        json.loads(names)
    )


def test_standard_webhooks_against_the_spec_library() -> None:
    receiver_js_test("standard_webhooks.test.mjs")


def test_the_event_types_and_schemas_are_generated_from_the_contract(tmp_path: Path) -> None:
    """``receiver-js/src/generated`` is what ``npm run generate`` makes of ``schemas/json`` now;
    and the check notices a contract that moved on (a copy of the package whose contract differs)."""
    build_receiver_js()
    node = shutil.which("node")
    assert node is not None
    script = ["scripts/generate-events.mjs", "--check"]
    done = subprocess.run([node, *script], cwd=RECEIVER_JS, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{done.stderr}: run `npm run generate` in receiver-js/ and commit"

    copy = tmp_path / "repo"
    shutil.copytree(RECEIVER_JS.parent / "schemas" / "json", copy / "schemas" / "json")
    (copy / "receiver-js").mkdir()
    for name in ("scripts", "src"):
        shutil.copytree(RECEIVER_JS / name, copy / "receiver-js" / name)
    (copy / "receiver-js" / "node_modules").symlink_to(RECEIVER_JS / "node_modules")
    probe = json.loads((copy / "schemas" / "json" / "probe_event.json").read_text())
    probe["properties"]["event_id"]["description"] = "a contract that moved on"
    (copy / "schemas" / "json" / "probe_event.json").write_text(json.dumps(probe))
    stale = subprocess.run(
        [node, *script], cwd=copy / "receiver-js", capture_output=True, text=True, timeout=120
    )
    assert stale.returncode == 1
    assert "out of date" in stale.stderr
    assert "probe" in stale.stderr
