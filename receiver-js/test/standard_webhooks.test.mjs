// Our Standard Webhooks verifier against the `standardwebhooks` package (the spec's own library):
// what it signs, ours verifies, and what ours refuses (a changed body, a stale or early timestamp,
// another secret) it refuses too; v1a under an Ed25519 public key; a rotation's two secrets; and
// StandardWebhooksVerifier falling back to RFC 9421.
import { test } from "node:test";
import assert from "node:assert/strict";
import { generateKeyPairSync, randomBytes, sign } from "node:crypto";

import { Webhook } from "standardwebhooks";

import { JWKS, StandardWebhooksVerifier, Verifier, verifyStandard } from "../dist/index.js";

const secret = () => `whsec_${randomBytes(32).toString("base64")}`;
const BODY = JSON.stringify({ event: "booking.confirmed", event_id: "evt_sw_1" });
const now = Math.floor(Date.now() / 1000);

function headers(key, { id = "evt_sw_1", at = now, body = BODY } = {}) {
  return {
    "webhook-id": id,
    "webhook-timestamp": String(at),
    "webhook-signature": new Webhook(key).sign(id, new Date(at * 1000), body),
  };
}

test("what the standardwebhooks package signs, ours verifies; both refuse the same wrong requests", () => {
  const key = secret();
  const good = headers(key);
  assert.deepEqual(verifyStandard(good, Buffer.from(BODY), { secrets: [key] }), {
    scheme: "v1",
    webhookId: "evt_sw_1",
    kid: "standard-webhooks v1",
  });
  assert.deepEqual(new Webhook(key).verify(BODY, good), JSON.parse(BODY));
  const wrong = [
    ["a changed body", good, `${BODY} `, "bad_signature"],
    // 30 s past the five-minute tolerance either way: `now` was read when the module loaded, and a
    // second boundary crossed since then made a 301 s margin a 300 s one (accepted) in CI.
    ["stale", headers(key, { at: now - 330 }), BODY, "stale"],
    ["early", headers(key, { at: now + 330 }), BODY, "future"],
    ["another secret", headers(secret()), BODY, "bad_signature"],
  ];
  for (const [what, sent, body, reason] of wrong) {
    assert.throws(() => verifyStandard(sent, Buffer.from(body), { secrets: [key] }), (e) => e.reason === reason, what);
    assert.throws(() => new Webhook(key).verify(body, sent), what);
  }
});

test("during a rotation either secret verifies", () => {
  const [old, fresh] = [secret(), secret()];
  const both = headers(fresh);
  both["webhook-signature"] = `${headers(old)["webhook-signature"]} ${both["webhook-signature"]}`;
  for (const key of [old, fresh]) assert.equal(verifyStandard(both, Buffer.from(BODY), { secrets: [key] }).scheme, "v1");
  assert.throws(() => verifyStandard(both, Buffer.from(BODY), { secrets: [secret()] }), (e) => e.reason === "bad_signature");
});

test("v1a: Ed25519 under a whpk_ public key", () => {
  const { privateKey, publicKey } = generateKeyPairSync("ed25519");
  const whpk = `whpk_${publicKey.export({ format: "der", type: "spki" }).subarray(-32).toString("base64")}`;
  const signature = sign(null, Buffer.from(`evt_sw_1.${now}.${BODY}`), privateKey).toString("base64");
  const sent = { "webhook-id": "evt_sw_1", "webhook-timestamp": String(now), "webhook-signature": `v1a,${signature}` };
  assert.equal(verifyStandard(sent, Buffer.from(BODY), { publicKeys: [whpk] }).scheme, "v1a");
  assert.throws(() => verifyStandard(sent, Buffer.from(`${BODY} `), { publicKeys: [whpk] }), (e) => e.reason === "bad_signature");
  assert.throws(() => verifyStandard(sent, Buffer.from(BODY), { secrets: [secret()] }), (e) => e.reason === "bad_signature");
});

test("StandardWebhooksVerifier: Standard Webhooks first, RFC 9421 for a request without them", async () => {
  const key = secret();
  const verifier = new StandardWebhooksVerifier({ secrets: [key], rfc9421: new Verifier(new JWKS()) });
  const request = { method: "POST", url: "https://platform.example/hooks", headers: headers(key), body: Buffer.from(BODY) };
  assert.equal((await verifier.verify(request)).scheme, "v1");
  await assert.rejects(verifier.verify({ ...request, headers: { "content-type": "application/json" } }), (e) => e.reason === "missing_signature");
  const alone = new StandardWebhooksVerifier({ secrets: [key] });
  await assert.rejects(alone.verify({ ...request, body: Buffer.from(`${BODY} `) }), (e) => e.reason === "bad_signature");
  assert.throws(() => new StandardWebhooksVerifier({}), /whsec_/);
});
