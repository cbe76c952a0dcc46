// The cross-receiver corpus (tests/receiver/corpus.py, passed in USP_CORPUS): signed, tampered and
// mangled requests with the Python receiver's verdict on each. The TypeScript receiver must reach
// the same verdict on every one: accepted by the same signature, or refused with the same reason.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { JWKS, ReceiverError, Verifier, verifyStandard } from "../dist/index.js";

const CORPUS = process.env.USP_CORPUS ? JSON.parse(readFileSync(process.env.USP_CORPUS, "utf8")) : { cases: [] };
const POLICY_NAMES = { required_components: "requiredComponents", require_tag: "requireTag", require_created: "requireCreated" };

async function judge(c, jwks) {
  const body = Buffer.from(c.body, "base64");
  try {
    if (c.scheme === "standard") {
      verifyStandard(c.headers, body, { secrets: CORPUS.secrets, publicKeys: CORPUS.public_keys, now: CORPUS.now });
      return "ok";
    }
    const policy = Object.fromEntries(Object.entries(c.policy).map(([name, value]) => [POLICY_NAMES[name], value]));
    const verified = await new Verifier(jwks, policy).verify({ method: c.method, url: c.url, headers: c.headers, body }, CORPUS.now);
    return `ok:${verified.label}`;
  } catch (error) {
    if (error instanceof ReceiverError) return error.reason;
    return `untyped ${error?.name}: ${error?.message}`;
  }
}

test(`both receivers judge all ${CORPUS.cases.length} requests of the corpus identically`, { skip: !process.env.USP_CORPUS && "USP_CORPUS: run from tests/receiver/test_node_receiver.py" }, async () => {
  const jwks = await JWKS.fromDocument(CORPUS.jwks);
  const differ = [];
  for (const c of CORPUS.cases) {
    const verdict = await judge(c, jwks);
    if (verdict !== c.verdict) differ.push({ name: c.name, python: c.verdict, node: verdict, headers: c.headers, method: c.method, url: c.url });
  }
  assert.deepEqual(differ, []);
  assert.ok(CORPUS.cases.filter((c) => c.verdict.startsWith("ok")).length >= 20, "the corpus holds valid requests too");
});
