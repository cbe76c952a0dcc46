// Agents written with other people's npm packages, in their default configuration, against the
// content API started by tests/dispatcher/ucap/test_node_clients.py (which passes the addresses in
// the environment): Cloudflare's `web-bot-auth` signs every request, `@x402/fetch` with
// `@x402/evm` pays in x402 version 2.
import { test } from "node:test";
import assert from "node:assert/strict";
import { signatureHeaders } from "web-bot-auth";
import { signerFromJWK } from "web-bot-auth/crypto";
import { wrapFetchWithPaymentFromConfig, decodePaymentResponseHeader } from "@x402/fetch";
import { ExactEvmScheme } from "@x402/evm";
import { privateKeyToAccount, generatePrivateKey } from "viem/accounts";

const API = process.env.USP_API_URL;
const AGENT = process.env.USP_AGENT_JWKS_URL;
const KEY = JSON.parse(process.env.USP_AGENT_JWK);
const READ = `${API}/v1/content/${process.env.USP_PUBLICATION}/${process.env.USP_PAID_POST}`;

// fetch, each request signed by web-bot-auth with its defaults (it covers "@authority" and
// "signature-agent"; created, expires, a nonce, keyid the key's thumbprint, tag web-bot-auth).
async function signedFetch(input, init) {
  const request = new Request(input, init);
  const body = request.body === null ? undefined : await request.arrayBuffer();
  const headers = new Headers(request.headers);
  headers.set("Signature-Agent", `"${AGENT}"`);
  const unsigned = new Request(request.url, { method: request.method, headers });
  const now = new Date();
  const fields = await signatureHeaders(unsigned, await signerFromJWK(KEY), {
    created: now,
    expires: new Date(now.getTime() + 300_000),
  });
  headers.set("Signature", fields["Signature"]);
  headers.set("Signature-Input", fields["Signature-Input"]);
  return fetch(request.url, { method: request.method, headers, body });
}

function post(url, body) {
  return signedFetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
}

test("web-bot-auth's default signature verifies on GET content", async () => {
  const wall = await signedFetch(READ);
  assert.equal(wall.status, 402, await wall.clone().text());
  assert.equal((await wall.json()).error.code, "payment_required");
  assert.ok(wall.headers.get("PAYMENT-REQUIRED"));
});

test("web-bot-auth's default signature verifies on POST search", async () => {
  const found = await post(`${API}/v1/catalog/search`, { query: "agents that pay" });
  assert.equal(found.status, 200, await found.clone().text());
  assert.ok((await found.json()).results.length > 0);
});

test("web-bot-auth's default signature verifies on POST subscribe", async () => {
  const started = await post(`${API}/v1/subscribe`, {
    publisher_id: process.env.USP_PUBLICATION,
    tier_id: "tier_ai_weekly_pro",
    payment_method: "stripe",
  });
  assert.equal(started.status, 200, await started.clone().text());
  assert.equal((await started.json()).status, "pending_payment");
});

test("an unsigned request is refused", async () => {
  const refused = await fetch(READ);
  assert.equal(refused.status, 403);
});

test("@x402/fetch pays in version 2 and reads the post in one exchange", async () => {
  const account = privateKeyToAccount(generatePrivateKey());
  const paying = wrapFetchWithPaymentFromConfig(signedFetch, {
    schemes: [{ network: "eip155:*", client: new ExactEvmScheme(account) }],
    // The SDK refuses payments over $1 unless told (the README's agent section says so): the
    // demo's tier is $8.
    spendControls: { maxAmountPerPayment: "$20" },
  });
  const read = await paying(READ);
  assert.equal(read.status, 200, await read.clone().text());
  assert.match((await read.json()).content.html, /Agents that pay/);
  const settled = decodePaymentResponseHeader(read.headers.get("PAYMENT-RESPONSE"));
  assert.equal(settled.success, true);
  assert.equal(settled.network, "eip155:84532");
  assert.equal(settled.payer.toLowerCase(), account.address.toLowerCase());
  const again = await signedFetch(READ);
  assert.equal(again.status, 200, "the entitlement stays");
});

test("web-bot-auth's verifier accepts what our agent signer signs", async () => {
  const ours = JSON.parse(process.env.USP_OUR_SIGNED);
  const request = new Request(ours.url, { method: ours.method, headers: ours.headers, body: ours.body });
  const { verifierFromJWK } = await import("web-bot-auth/crypto");
  const { verify } = await import("web-bot-auth");
  await verify(request, await verifierFromJWK(ours.jwk));
  const forged = new Request(ours.url.replace("/v1/", "/v2/"), { method: ours.method, headers: ours.headers, body: ours.body });
  await assert.rejects(verify(forged, await verifierFromJWK(ours.jwk)));
});
