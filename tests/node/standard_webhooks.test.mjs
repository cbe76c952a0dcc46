// Deliveries our worker signed with Standard Webhooks, judged by other people's npm packages in
// their default configuration: `standardwebhooks` (the spec's own library) and `svix`'s
// Webhook.verify. tests/dispatcher/api/test_standard_webhooks.py captures the deliveries (body and
// headers as they arrived) and passes them in USP_SW_CASES, a JSON file: each case names the
// secrets that must verify it and whether it must be refused (a tampered body, a stale timestamp).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Webhook as StandardWebhook } from "standardwebhooks";
import { Webhook as SvixWebhook } from "svix";

const CASES = JSON.parse(readFileSync(process.env.USP_SW_CASES, "utf8"));

const LIBRARIES = {
  standardwebhooks: (secret) => new StandardWebhook(secret),
  svix: (secret) => new SvixWebhook(secret),
};

for (const [library, make] of Object.entries(LIBRARIES)) {
  for (const c of CASES) {
    test(`${library}: ${c.name}`, () => {
      for (const secret of c.secrets) {
        const verify = () => make(secret).verify(c.body, c.headers);
        if (c.refused) {
          assert.throws(verify, `${c.name} must be refused`);
        } else {
          // standardwebhooks answers the parsed payload; svix 2 answers nothing (it throws if not).
          const payload = verify() ?? JSON.parse(c.body);
          assert.equal(payload.event_id ?? payload.params?.event_id, c.event_id);
        }
      }
    });
  }
}
