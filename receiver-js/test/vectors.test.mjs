// The RFC 9421 vectors the Python receiver is tested with (tests/fixtures/rfc9421.json: RFC 9421
// Appendix B, RFC 9530, the Web Bot Auth draft), judged by the TypeScript receiver.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { JWKS, PublicKey, Verifier, checkContentDigest, contentDigest, DigestMismatch } from "../dist/index.js";

const VECTORS = JSON.parse(readFileSync(new URL("../../tests/fixtures/rfc9421.json", import.meta.url), "utf8"));
const ALL = new Set(["ed25519", "ecdsa-p256-sha256", "rsa-pss-sha512", "rsa-v1_5-sha256", "hmac-sha256"]);
// The vector file names RSA keys without an alg; the RFC says which algorithm each case uses.
const RSA_ALG = { "test-key-rsa-pss": "rsa-pss-sha512", "test-key-rsa": "rsa-v1_5-sha256" };

async function keys() {
  const loaded = [];
  for (const [name, key] of Object.entries(VECTORS.keys)) {
    if (name === "test-shared-secret") {
      const secret = Buffer.from(key.shared_secret_base64, "base64").toString("base64url");
      loaded.push(await PublicKey.fromJwk({ kty: "oct", k: secret, kid: name }));
    } else {
      loaded.push(await PublicKey.fromJwk({ ...key.jwk, kid: name }, RSA_ALG[name]));
    }
  }
  return new JWKS(loaded);
}

// The RFC's messages predate our profile: no required components, no digest rule, any age.
const verifier = async (tag) =>
  new Verifier(await keys(), { requiredComponents: [], maxAge: 1e12, algorithms: ALL, requireDigest: false, tag });

const requestCases = ["b21", "b22", "b23", "b25", "b26"].map((id) => VECTORS.cases.find((c) => c.id === id));

for (const c of requestCases) {
  const message = VECTORS.messages[c.message];
  const request = (signature) => ({
    method: message.method,
    url: message.target_uri,
    headers: [...message.headers, ["Signature-Input", c.expected_signature_input], ["Signature", signature]],
    body: Buffer.from(message.body),
  });

  test(`${c.section}: ${c.title} verifies`, async () => {
    const verified = await (await verifier(c.signature_params.tag ?? null)).verify(
      request(c.expected_signature),
      c.signature_params.created,
    );
    assert.equal(verified.label, c.label);
    assert.equal(verified.kid, c.key_id);
    assert.deepEqual(verified.components, c.covered_components);
  });

  test(`${c.section}: a flipped signature bit is refused`, async () => {
    const b64 = c.expected_signature_b64;
    const flipped = `${c.label}=:${b64[0] === "A" ? "B" : "A"}${b64.slice(1)}:`;
    await assert.rejects(
      (await verifier(c.signature_params.tag ?? null)).verify(request(flipped), c.signature_params.created),
      (error) => error.reason === "bad_signature",
    );
  });
}

test("RFC 9530 examples: the reproducible digests match, the two known-bad values are refused", () => {
  let checked = 0;
  for (const example of VECTORS.rfc9530_content_digest_examples.examples) {
    const raw = example.body_utf8_or_hex;
    const body = example.name.startsWith("RFC 9530 B.4") ? Buffer.from(raw, "hex") : Buffer.from(raw);
    if (example.reproduces) {
      checkContentDigest(example.field_value, body);
      if (example.field_value.startsWith("sha-256=")) assert.equal(contentDigest(body), example.field_value);
      assert.throws(() => checkContentDigest(example.field_value, Buffer.concat([body, Buffer.from(" ")])), DigestMismatch);
      checked += 1;
    } else {
      assert.throws(() => checkContentDigest(example.field_value, body), DigestMismatch);
    }
  }
  assert.ok(checked >= 6);
});

for (const [index, vector] of VECTORS.web_bot_auth_vectors.entries()) {
  if (!vector.request) continue;
  test(`Web Bot Auth draft vector ${index} (${vector.name}) verifies`, async () => {
    const key = await PublicKey.fromJwk({ ...VECTORS.keys[vector.key].jwk, kid: vector.key_id });
    const created = Number(/created=(\d+)/.exec(vector.expected_signature_input)[1]);
    const policy = { requiredComponents: [], tag: "web-bot-auth", requireDigest: false };
    const verified = await new Verifier(new JWKS([key]), policy).verify(
      {
        method: vector.request.method,
        url: `https://${vector.request.authority}/`,
        headers: [
          ...vector.request.headers,
          ["Signature-Input", vector.expected_signature_input],
          ["Signature", vector.expected_signature],
        ],
        body: Buffer.alloc(0),
      },
      created,
    );
    assert.equal(verified.kid, vector.key_id);
  });
}
