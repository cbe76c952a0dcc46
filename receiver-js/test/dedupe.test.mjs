// The safe dedupe: claim / commit / release on the memory store and on a real Redis (USP_REDIS_URL)
// through both Redis clients, and processOnce over them: an event is handled once per success,
// never dropped when its handling failed, and a crashed holder's claim frees itself.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import { Redis } from "ioredis";
import { createClient } from "redis";

import { MemoryDedupe, processOnce } from "../dist/index.js";
import { RedisDedupe } from "../dist/dedupe/redis.js";

const REDIS_URL = process.env.USP_REDIS_URL ?? "redis://127.0.0.1:6379/0";
const prefix = `usp:test:${randomUUID()}:`;
const ioredis = new Redis(REDIS_URL);
const nodeRedis = await createClient({ url: REDIS_URL }).connect();
after(async () => {
  const keys = await ioredis.keys(`${prefix}*`);
  if (keys.length) await ioredis.del(...keys);
  ioredis.disconnect();
  await nodeRedis.quit();
});

let now = 0;
const stores = {
  memory: () => new MemoryDedupe({ lease: 1, ttl: 100, clock: () => now }),
  ioredis: () => new RedisDedupe(ioredis, { prefix, lease: 0.3 }),
  "node-redis": () => new RedisDedupe(nodeRedis, { prefix, lease: 0.3 }),
};
const leaseRunsOut = async (name) => {
  if (name === "memory") now += 2;
  else await new Promise((resolve) => setTimeout(resolve, 450));
};

for (const [name, make] of Object.entries(stores)) {
  test(`${name}: of two simultaneous claims exactly one is new; commit makes it a duplicate`, async () => {
    const store = make();
    const id = `evt_${randomUUID()}`;
    const claims = await Promise.all([store.claim(id), store.claim(id)]);
    assert.deepEqual(claims.map((c) => c.state).sort(), ["in_progress", "new"]);
    const mine = claims.find((c) => c.state === "new");
    await store.commit(mine);
    assert.equal((await store.claim(id)).state, "duplicate");
  });

  test(`${name}: a release lets the redelivery run; a stale claim frees nobody else's`, async () => {
    const store = make();
    const id = `evt_${randomUUID()}`;
    const first = await store.claim(id);
    await store.release(first);
    const second = await store.claim(id);
    assert.equal(second.state, "new");
    await store.release(first); // first's token no longer holds the id
    assert.equal((await store.claim(id)).state, "in_progress");
    await store.commit(second);
    await store.release(second); // a committed id stays done
    assert.equal((await store.claim(id)).state, "duplicate");
  });

  test(`${name}: a crashed holder's claim expires with its lease, and its late commit changes nothing`, async () => {
    const store = make();
    const id = `evt_${randomUUID()}`;
    const crashed = await store.claim(id);
    await leaseRunsOut(name);
    const takeover = await store.claim(id);
    assert.equal(takeover.state, "new");
    await store.commit(crashed);
    assert.equal((await store.claim(id)).state, "in_progress", "the takeover still holds it");
    await store.commit(takeover);
    assert.equal((await store.claim(id)).state, "duplicate");
  });

  test(`${name}: processOnce runs the work once per success and never drops a failed one`, async () => {
    const store = make();
    const id = `evt_${randomUUID()}`;
    const ran = [];
    const failing = async () => {
      ran.push("failed");
      throw new Error("down");
    };
    const working = async () => void ran.push("ran");
    assert.equal(await processOnce(store, id, failing, () => {}), "failed");
    assert.equal(await processOnce(store, id, working, () => {}), "accepted");
    assert.equal(await processOnce(store, id, working, () => {}), "duplicate");
    assert.deepEqual(ran, ["failed", "ran"]);
  });
}

test("processOnce: a store that cannot be asked is `unavailable`, and the work does not run", async () => {
  const broken = { claim: async () => Promise.reject(new Error("connection refused")) };
  let ran = false;
  assert.equal(await processOnce(broken, "evt_1", async () => void (ran = true), () => {}), "unavailable");
  assert.equal(ran, false);
});

test("memory: a full store evicts an expired claim first, then the oldest done id", async () => {
  now = 1000;
  const store = new MemoryDedupe({ maxEntries: 2, lease: 1, ttl: 100, clock: () => now });
  const done = await store.claim("evt_done");
  await store.commit(done);
  await store.claim("evt_crashed");
  now += 2; // evt_crashed's lease runs out
  assert.equal((await store.claim("evt_new")).state, "new");
  assert.equal((await store.claim("evt_done")).state, "duplicate", "the done id was kept");
  assert.equal(store.size, 2);
});

test("Redis: a Node receiver and a Python receiver share one store (same keys, same values)", async () => {
  const store = new RedisDedupe(ioredis, { prefix });
  const id = `evt_${randomUUID()}`;
  const claim = await store.claim(id);
  assert.match(await ioredis.get(prefix + id), /^p:/);
  await store.commit(claim);
  assert.equal(await ioredis.get(prefix + id), "d");
  const ttl = await ioredis.pttl(prefix + id);
  assert.ok(ttl > 30 * 24 * 3600 * 1000, `remembered for 31 days, not ${ttl} ms`);
});

// tests/receiver/test_node_receiver.py commits an id with the Python RedisDedupe first.
const fromPython = process.env.USP_PYTHON_DONE_ID;
test("Redis: an id the Python receiver committed is a duplicate here", { skip: !fromPython && "run from pytest" }, async () => {
  const store = new RedisDedupe(ioredis, { prefix: process.env.USP_PYTHON_PREFIX });
  assert.equal((await store.claim(fromPython)).state, "duplicate");
  assert.equal((await store.claim(`${fromPython}_other`)).state, "new");
});
