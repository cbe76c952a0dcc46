// The Express and Hono skins in process, with a key of our own: what they answer for each kind of
// request (a signed event, a duplicate, a failing handler, a probe, a refusal, a wrong method, a
// body too large) and that they hand the handler the exact bytes received.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { generateKeyPairSync, sign } from "node:crypto";

import express from "express";
import { Hono } from "hono";

import { JWKS, PublicKey, Verifier, WebhookReceiver, contentDigest } from "../dist/index.js";
import { uspWebhook } from "../dist/express.js";
import { uspWebhook as honoWebhook } from "../dist/hono.js";

const { privateKey, publicKey } = generateKeyPairSync("ed25519");
let verifier;

/** Sign as the worker does: the USP profile, created now, tagged. */
function signed(url, body, { created = Math.floor(Date.now() / 1000) } = {}) {
  const { host, pathname } = new URL(url);
  const headers = { "Content-Type": "application/json", "Content-Digest": contentDigest(Buffer.from(body)) };
  const params = `("@method" "@authority" "@path" "content-digest" "content-type");created=${created};keyid="test-key";alg="ed25519";tag="usp-webhook"`;
  const base = [
    `"@method": POST`,
    `"@authority": ${host}`,
    `"@path": ${pathname}`,
    `"content-digest": ${headers["Content-Digest"]}`,
    `"content-type": application/json`,
    `"@signature-params": ${params}`,
  ].join("\n");
  const signature = sign(null, Buffer.from(base), privateKey).toString("base64");
  return { ...headers, "Signature-Input": `sig1=${params}`, Signature: `sig1=:${signature}:` };
}

// The USP binding's booking.confirmed example, with the event id each test needs.
const event = (id) =>
  JSON.stringify({
    event: "booking.confirmed",
    event_id: id,
    booking_id: "bkg_456def",
    timestamp: "2026-03-14T22:06:00Z",
    version: "2026-08-20",
    data: {
      id: "bkg_456def",
      service_id: "svc_haircut_001",
      slot_id: "slot_20260315_0900",
      state: "confirmed",
      buyer: { first_name: "Ada", email: "ada@example.com" },
      start: "2026-03-15T09:00:00-04:00",
      end: "2026-03-15T10:00:00-04:00",
      created_at: "2026-03-14T22:05:12Z",
      updated_at: "2026-03-14T22:06:00Z",
    },
  });

function servers() {
  const seen = [];
  let fail = false;
  const handler = (hook) => {
    if (fail) throw new Error("down");
    seen.push([hook.event.event_id, Buffer.from(hook.body).toString()]);
  };
  const receiver = new WebhookReceiver({ verifier, handler, log: () => {} });
  const app = express();
  app.post("/hooks", uspWebhook(receiver, { maxBodyBytes: 4096 }));
  app.post("/raw", express.raw({ type: "*/*" }), uspWebhook(receiver));
  app.post("/parsed", express.json(), uspWebhook(receiver));
  app.use((error, request, response, next) => response.status(500).json({ error: error.message }));
  const hono = new Hono();
  hono.post("/hooks", honoWebhook(new WebhookReceiver({ verifier, handler, log: () => {} })));
  return { app, hono, seen, failing: (value) => (fail = value) };
}

let server;
let base;
let state;
before(async () => {
  const jwk = { ...publicKey.export({ format: "jwk" }), kid: "test-key" };
  verifier = new Verifier(new JWKS([await PublicKey.fromJwk(jwk)]));
  state = servers();
  server = state.app.listen(0, "127.0.0.1");
  await new Promise((resolve) => server.once("listening", resolve));
  base = `http://127.0.0.1:${server.address().port}`;
});
after(() => server.close());

async function post(path, body, headers) {
  const response = await fetch(base + path, { method: "POST", body, headers });
  return { status: response.status, body: await response.json(), headers: response.headers };
}

test("Express: a signed event is handled once, with its exact bytes; again it is a duplicate", async () => {
  const body = event("evt_express_1");
  const first = await post("/hooks", body, signed(base + "/hooks", body));
  assert.deepEqual([first.status, first.body], [200, { status: "accepted", event_id: "evt_express_1" }]);
  const again = await post("/hooks", body, signed(base + "/hooks", body));
  assert.deepEqual([again.status, again.body.status], [200, "duplicate"]);
  assert.deepEqual(state.seen.filter(([id]) => id === "evt_express_1"), [["evt_express_1", body]]);
});

test("Express: a handler that fails answers 500, and the retry is processed, not a duplicate", async () => {
  const body = event("evt_express_2");
  state.failing(true);
  const failed = await post("/hooks", body, signed(base + "/hooks", body));
  assert.deepEqual([failed.status, failed.body.reason], [500, "handler_failed"]);
  assert.equal(failed.headers.get("content-type"), "application/problem+json");
  assert.ok(!JSON.stringify(failed.body).includes("down"), "the handler's text is never sent back");
  state.failing(false);
  const retried = await post("/hooks", body, signed(base + "/hooks", body));
  assert.deepEqual([retried.status, retried.body.status], [200, "accepted"]);
});

test("Express: refusals carry the reason code", async () => {
  const body = event("evt_express_3");
  const tampered = await post("/hooks", body.replace("Ada", "Eve"), signed(base + "/hooks", body));
  assert.deepEqual([tampered.status, tampered.body.reason], [401, "digest_mismatch"]);
  assert.equal(tampered.headers.get("www-authenticate"), 'Signature realm="usp-webhooks"');
  const stale = await post("/hooks", body, signed(base + "/hooks", body, { created: Math.floor(Date.now() / 1000) - 600 }));
  assert.deepEqual([stale.status, stale.body.reason], [401, "stale"]);
  const unsigned = await post("/hooks", body, { "Content-Type": "application/json" });
  assert.deepEqual([unsigned.status, unsigned.body.reason], [401, "missing_signature"]);
  const notAnEvent = JSON.stringify({ hello: "world" });
  const invalid = await post("/hooks", notAnEvent, signed(base + "/hooks", notAnEvent));
  assert.deepEqual([invalid.status, invalid.body.reason], [400, "invalid_event"]);
  const big = "x".repeat(5000);
  const tooLarge = await post("/hooks", big, signed(base + "/hooks", big));
  assert.deepEqual([tooLarge.status, tooLarge.body.reason], [413, "payload_too_large"]);
  const get = await fetch(base + "/hooks");
  assert.equal(get.status, 404); // Express routes only POST here; nodeHandler answers 405 itself
});

test("Express: a probe is verified and acknowledged, and acted on by nobody", async () => {
  const body = JSON.stringify({ event: "probe.test", event_id: "evt_probe_1", timestamp: "2026-12-07T10:00:00Z", data: { probe: true, case: "valid" } });
  const answer = await post("/hooks", body, signed(base + "/hooks", body));
  assert.deepEqual([answer.status, answer.body], [200, { status: "probe", event_id: "evt_probe_1" }]);
  assert.ok(!state.seen.some(([id]) => id === "evt_probe_1"));
});

test("Express: after express.raw() it verifies the same bytes; after express.json() it says what is wrong", async () => {
  const body = event("evt_express_4");
  const raw = await post("/raw", body, signed(base + "/raw", body));
  assert.deepEqual([raw.status, raw.body.status], [200, "accepted"]);
  const parsed = await post("/parsed", body, signed(base + "/parsed", body));
  assert.equal(parsed.status, 500);
  assert.match(parsed.body.error, /mount uspWebhook first, or use express.raw\(\)/);
});

test("Hono: the same receiver answers through the fetch API", async () => {
  const url = "http://hono.test/hooks";
  const body = event("evt_hono_1");
  const first = await state.hono.request(url, { method: "POST", body, headers: signed(url, body) });
  assert.deepEqual([first.status, (await first.json()).status], [200, "accepted"]);
  const again = await state.hono.request(url, { method: "POST", body, headers: signed(url, body) });
  assert.equal((await again.json()).status, "duplicate");
  const tampered = await state.hono.request(url, { method: "POST", body: body + " ", headers: signed(url, body) });
  assert.deepEqual([tampered.status, (await tampered.json()).reason], [401, "digest_mismatch"]);
});
