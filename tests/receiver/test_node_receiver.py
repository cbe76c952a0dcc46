"""The TypeScript receiver (``receiver-js/``, ``@usp-webhooks/receiver``) under Node's test
runner: the RFC 9421 vectors, the cross-receiver corpus judged exactly as the Python receiver judges
it, the dedupe stores on a real Redis (shared with the Python store), ``RemoteJWKS`` against a real
server, and the Express and Hono skins."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from redis import Redis

from tests.nodejs import receiver_js_test
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
