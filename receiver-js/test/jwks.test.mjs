// RemoteJWKS against a real HTTP server on 127.0.0.1: the Python receiver's caching and refetch
// rules (max-age and Age, conditional refresh, one refetch per interval on an unknown kid shared by
// concurrent misses, cached keys kept through a failure, no redirects, a size cap), and which keys
// a JWKS document may contribute.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { generateKeyPairSync } from "node:crypto";

import { JWKS, KeyFetchError, KeyRing, PublicKey, RemoteJWKS } from "../dist/index.js";

const jwk = (kid) => ({ ...generateKeyPairSync("ed25519").publicKey.export({ format: "jwk" }), kid });
const server = { document: { keys: [jwk("k1")] }, status: 200, headers: {}, requests: [], delay: 0 };
let base;
let http;
before(async () => {
  http = createServer(async (request, response) => {
    server.requests.push({ url: request.url, headers: request.headers });
    if (server.delay) await new Promise((resolve) => setTimeout(resolve, server.delay));
    const body = typeof server.document === "string" ? server.document : JSON.stringify(server.document);
    if (request.headers["if-none-match"] === '"v1"' && server.status === 200 && server.headers.ETag === '"v1"') {
      response.writeHead(304, server.headers).end();
      return;
    }
    response.writeHead(server.status, { "Content-Type": "application/jwk-set+json", ...server.headers }).end(body);
  });
  await new Promise((resolve) => http.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${http.address().port}`;
});
after(() => http.close());

function reset(document) {
  Object.assign(server, { document, status: 200, headers: {}, requests: [], delay: 0 });
}

test("only https, unless allowInsecureHttp", () => {
  assert.throws(() => new RemoteJWKS("http://127.0.0.1/jwks.json"), /must be https/);
  assert.ok(new RemoteJWKS("https://business.example/.well-known/usp/jwks.json"));
});

test("fresh for max-age minus Age, then refreshed conditionally; a 304 renews the cached keys", async () => {
  reset({ keys: [jwk("k1")] });
  server.headers = { "Cache-Control": "max-age=100", Age: "40", ETag: '"v1"' };
  let now = 0;
  const keys = new RemoteJWKS(`${base}/jwks.json`, { allowInsecureHttp: true, clock: () => now });
  assert.ok(await keys.resolve("k1"));
  now = 59;
  assert.ok(await keys.resolve("k1"));
  assert.equal(server.requests.length, 1, "fresh for 100 - 40 = 60 s");
  now = 61;
  assert.ok(await keys.resolve("k1"));
  assert.equal(server.requests.length, 2);
  assert.equal(server.requests[1].headers["if-none-match"], '"v1"');
  now = 100;
  assert.ok(await keys.resolve("k1"), "the 304 renewed them");
  assert.equal(server.requests.length, 2);
});

test("an unknown kid refetches at most once per interval, and concurrent misses share the fetch", async () => {
  reset({ keys: [jwk("k1")] });
  let now = 0;
  const keys = new RemoteJWKS(`${base}/jwks.json`, { allowInsecureHttp: true, clock: () => now, minRefreshInterval: 30 });
  await keys.resolve("k1");
  now = 31;
  server.document = { keys: [jwk("k1"), jwk("k2")] };
  server.delay = 50;
  const found = await Promise.all([keys.resolve("k2"), keys.resolve("k2"), keys.resolve("k2")]);
  assert.ok(found.every((key) => key?.kid === "k2"), "the rotated-in key is found");
  assert.equal(server.requests.length, 2, "one refetch for three concurrent misses");
  assert.equal(await keys.resolve("k3"), undefined);
  assert.equal(server.requests.length, 2, "and no other within the interval");
  now = 62;
  assert.equal(await keys.resolve("k3"), undefined);
  assert.equal(server.requests.length, 3);
});

test("a failed refresh keeps the cached keys; with nothing cached it is a KeyFetchError", async () => {
  reset({ keys: [jwk("k1")] });
  server.headers = { "Cache-Control": "max-age=60" };
  let now = 0;
  const warnings = [];
  const keys = new RemoteJWKS(`${base}/jwks.json`, { allowInsecureHttp: true, clock: () => now, warn: (m) => warnings.push(m) });
  await keys.resolve("k1");
  server.status = 503;
  now = 61;
  assert.ok(await keys.resolve("k1"), "served from the cache");
  assert.match(warnings[0], /HTTP 503.*serving cached keys/);

  const cold = new RemoteJWKS(`${base}/jwks.json`, { allowInsecureHttp: true });
  await assert.rejects(cold.resolve("k1"), KeyFetchError);
  server.status = 302;
  server.headers = { Location: "https://elsewhere.example/jwks.json" };
  await assert.rejects(new RemoteJWKS(`${base}/x`, { allowInsecureHttp: true }).resolve("k1"), /redirect to https:\/\/elsewhere.example\/jwks.json not followed/);
});

test("an oversized or invalid document is refused", async () => {
  reset({ keys: [jwk("k1")], padding: "x".repeat(2000) });
  await assert.rejects(new RemoteJWKS(`${base}/jwks.json`, { allowInsecureHttp: true, maxBytes: 1000 }).resolve("k1"), /exceeds 1000/);
  reset("not json");
  await assert.rejects(new RemoteJWKS(`${base}/jwks.json`, { allowInsecureHttp: true }).resolve("k1"), /invalid JWKS document/);
});

test("a JWKS document contributes only keys we may verify with", async () => {
  const rsa = { ...generateKeyPairSync("rsa", { modulusLength: 2048 }).publicKey.export({ format: "jwk" }), kid: "rsa-no-alg" };
  const jwks = await JWKS.fromDocument({
    keys: [
      jwk("good"),
      { ...jwk("encryption"), use: "enc" },
      { ...jwk("no-verify"), key_ops: ["sign"] },
      { kty: "oct", k: "c2VjcmV0", kid: "secret" },
      rsa,
      { kty: "EC", crv: "P-384", x: "AA", y: "AA", kid: "p384" },
    ],
  });
  assert.deepEqual([...jwks].map((key) => key.kid), ["good"]);
  await assert.rejects(JWKS.fromDocument({ nokeys: [] }), /"keys" array/);
  const key = await PublicKey.fromJwk(jwk(undefined));
  assert.match(key.kid, /^[A-Za-z0-9_-]{43}$/, "a JWK without kid is named by its RFC 7638 thumbprint");
  assert.throws(() => new JWKS([key, { ...key, jwk: { x: "other" } }]), /names two different keys/);
  const ring = new KeyRing(new JWKS(), new JWKS([key]));
  assert.equal((await ring.resolve(key.kid))?.kid, key.kid);
});

test("the RFC 7638 thumbprint of the RFC 8037 example key", async () => {
  const key = await PublicKey.fromJwk({ kty: "OKP", crv: "Ed25519", x: "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs" });
  assert.equal(key.kid, "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U");
  assert.equal(key.alg, "ed25519");
});
