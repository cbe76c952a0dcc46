// A platform's Express app built on @usp-webhooks/receiver, run by the Python end-to-end tests
// (tests/dispatcher/admin/test_node_receiver.py) against the real service: it trusts the business's
// JWKS (USP_JWKS_URL), prints `listening <port>` once up, then one JSON line per event its handlers
// ran. Routes:
//   /hooks        the receiver as a platform runs it: the USP policy, memory dedupe
//   /hooks-redis  the same with the Redis store (USP_REDIS_URL), through ioredis
//   /hooks-short  a 2 s replay window, so a test can replay a delivery past it without waiting;
//                 with USP_RECORD set, each request is printed as it arrived (so is /hooks-redis's)
//   /hooks-flaky  a handler that fails the first time it sees each event (the sender must retry)
import express from "express";
import { Redis } from "ioredis";

import { RemoteJWKS, Verifier, WebhookReceiver } from "../dist/index.js";
import { uspWebhook } from "../dist/express.js";
import { RedisDedupe } from "../dist/dedupe/redis.js";

const keys = new RemoteJWKS(process.env.USP_JWKS_URL, { allowInsecureHttp: true, minRefreshInterval: 1 });
const report = (route) => (hook) => {
  const { event, verified } = hook;
  console.log(JSON.stringify({ route, event_id: event.event_id, event: event.event, kid: verified.kid, label: verified.label }));
};

const failedOnce = new Set();
const flaky = (hook) => {
  if (!failedOnce.has(hook.event.event_id)) {
    failedOnce.add(hook.event.event_id);
    throw new Error("the platform's database is down (on purpose)");
  }
  report("/hooks-flaky")(hook);
};

const quiet = () => {}; // the refusals the tests provoke are not news
const app = express();
app.post("/hooks", uspWebhook(new WebhookReceiver({ verifier: new Verifier(keys), handler: report("/hooks"), log: quiet })));
// USP_RECORD: /hooks-short and /hooks-redis print each request as it arrived (after express.raw(), which the
// middleware accepts), so a test can replay or tamper with a real delivery.
const record = (request, response, next) => {
  if (process.env.USP_RECORD) {
    console.log(JSON.stringify({ recorded: request.path, headers: request.rawHeaders, body: request.body.toString("base64") }));
  }
  next();
};
app.post("/hooks-short", express.raw({ type: () => true }), record, uspWebhook(new WebhookReceiver({ verifier: new Verifier(keys, { maxAge: 2 }), handler: report("/hooks-short"), log: quiet })));
app.post("/hooks-flaky", uspWebhook(new WebhookReceiver({ verifier: new Verifier(keys), handler: flaky, log: quiet })));
let redis;
if (process.env.USP_REDIS_URL) {
  redis = new Redis(process.env.USP_REDIS_URL);
  const dedupe = new RedisDedupe(redis, { prefix: process.env.USP_REDIS_PREFIX ?? "usp:dedupe:" });
  app.post("/hooks-redis", express.raw({ type: () => true }), record, uspWebhook(new WebhookReceiver({ verifier: new Verifier(keys), handler: report("/hooks-redis"), dedupe, log: quiet })));
}

const server = app.listen(Number(process.env.PORT ?? 0), "127.0.0.1", () => {
  console.log(`listening ${server.address().port}`);
});
const stop = () => server.close(() => redis?.disconnect());
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
