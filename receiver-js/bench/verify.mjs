// The Node.js rows of bench/verify.py: it passes one signed delivery (USP_BENCH_INPUT, a JSON
// file: url, headers, body, the public JWK, a Standard Webhooks secret and its v1 headers) and
// reads back one JSON object of operations per second, each row's best of `rounds`. Run it through
// bench/verify.py, which pins both processes to one core.
import { readFileSync } from "node:fs";
import { generateKeyPairSync, sign, verify } from "node:crypto";

import { JWKS, MemoryDedupe, PublicKey, Verifier, WebhookReceiver, verifyStandard } from "../dist/index.js";

const input = JSON.parse(readFileSync(process.env.USP_BENCH_INPUT, "utf8"));
const body = Buffer.from(input.body, "base64");
const { headers, url, seconds, rounds } = input;
const verifier = new Verifier(new JWKS([await PublicKey.fromJwk(input.jwk)]));
const now = input.now;

const { privateKey, publicKey } = generateKeyPairSync("ed25519");
const data = Buffer.alloc(300, "x");
const rawSignature = sign(null, data, privateKey);

let counter = 0;
const withDedupe = () => {
  const store = new MemoryDedupe();
  return async () => {
    const verified = await verifier.verify({ method: "POST", url, headers, body }, now);
    const claim = await store.claim(`${JSON.parse(body).event_id}-${counter++}`);
    await store.commit(claim);
    return verified;
  };
};
// The whole receiver: verify, validate the event against the schema, dedupe, run the handler. A
// fresh event_id each time would need a fresh signature; the body's id is reused, so every
// delivery after the first is a duplicate: measured as the receiver answers it (still verified).
const receiver = new WebhookReceiver({ verifier: { verify: (request) => verifier.verify(request, now) }, handler: () => {} });

const rows = {
  "raw Ed25519 verify (node:crypto), Node's floor": () => verify(null, data, publicKey, rawSignature),
  "raw Ed25519 sign (node:crypto)": () => sign(null, data, privateKey),
  "@usp-webhooks/receiver: digest + signature + policy": () => verifier.verify({ method: "POST", url, headers, body }, now),
  "@usp-webhooks/receiver + memory dedupe (claim+commit)": withDedupe(),
  "@usp-webhooks/receiver: WebhookReceiver.receive (+ schema validation)": () => receiver.receive("POST", url, headers, body),
  "@usp-webhooks/receiver: Standard Webhooks v1 verify": () =>
    verifyStandard(input.standard_headers, body, { secrets: [input.secret], now }),
};

async function rate(operation) {
  const first = operation();
  if (first instanceof Promise) await first;
  const deadline = performance.now() + seconds * 1000;
  let count = 0;
  while (performance.now() < deadline) {
    for (let i = 0; i < 64; i++) {
      const result = operation();
      if (result instanceof Promise) await result;
    }
    count += 64;
  }
  return count / seconds;
}

const best = {};
for (let round = 0; round < rounds; round++) {
  for (const [name, operation] of Object.entries(rows)) best[name] = Math.max(best[name] ?? 0, await rate(operation));
}
console.log(JSON.stringify(best));
