/**
 * Redis dedupe store: one key per event id, shared by every process that talks to the same Redis,
 * with the Python receiver's keys, values and scripts (`usp:dedupe:<event_id>`, `p:<token>` while
 * claimed, `d` once done), so a Node and a Python receiver can share one store. Takes an `ioredis`
 * client or a `redis` (node-redis) client; each call is one atomic Lua script.
 */
import { createHash, randomUUID } from "node:crypto";

import { type Claim, type DedupeStore, DEFAULT_LEASE_SECONDS, DEFAULT_TTL_SECONDS } from "./store.js";

// KEYS[1] = key, ARGV[1] = "p:<token>", ARGV[2] = lease in ms.
// Returns 1 if we took the key, else the value that is there ("d" or "p:<token>").
const CLAIM = `
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return 1
end
return redis.call('GET', KEYS[1])
`;
// KEYS[1] = key, ARGV[1] = "p:<token>", ARGV[2] = ttl in ms. Returns 1 if committed.
const COMMIT = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('SET', KEYS[1], 'd', 'PX', ARGV[2])
    return 1
end
return 0
`;
// KEYS[1] = key, ARGV[1] = "p:<token>". Returns 1 if released.
const RELEASE = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
`;

/** What we need of an `ioredis` client. */
interface IORedisLike {
  defineCommand: unknown;
  evalsha(sha: string, keys: number, ...args: (string | number)[]): Promise<unknown>;
  eval(script: string, keys: number, ...args: (string | number)[]): Promise<unknown>;
}
/** What we need of a `redis` (node-redis) client. */
interface NodeRedisLike {
  sendCommand(args: string[]): Promise<unknown>;
}
export type RedisClient = IORedisLike | NodeRedisLike;

export interface RedisDedupeOptions {
  prefix?: string;
  lease?: number;
  ttl?: number;
}

/**
 * Dedupe across processes and hosts through Redis. A commit after the lease ran out is a no-op
 * (Redis already dropped the key), so keep `lease` above your handler's worst-case run time.
 */
export class RedisDedupe implements DedupeStore {
  readonly prefix: string;
  private readonly leaseMs: string;
  private readonly ttlMs: string;
  private readonly run: (script: string, sha: string, args: string[]) => Promise<unknown>;

  constructor(client: RedisClient, options: RedisDedupeOptions = {}) {
    const lease = options.lease ?? DEFAULT_LEASE_SECONDS;
    const ttl = options.ttl ?? DEFAULT_TTL_SECONDS;
    if (!(lease > 0 && ttl > 0)) throw new Error("lease and ttl must be positive");
    this.prefix = options.prefix ?? "usp:dedupe:";
    this.leaseMs = String(Math.max(1, Math.round(lease * 1000)));
    this.ttlMs = String(Math.max(1, Math.round(ttl * 1000)));
    this.run = "defineCommand" in client ? ioredis(client as IORedisLike) : nodeRedis(client as NodeRedisLike);
  }

  async claim(eventId: string): Promise<Claim> {
    const token = randomUUID();
    const answer = String(await this.run(CLAIM, CLAIM_SHA, [this.prefix + eventId, `p:${token}`, this.leaseMs]));
    // Our own token back means a client resent the call after a lost reply and the first one took it.
    if (answer === "1" || answer === `p:${token}`) return { eventId, state: "new", token };
    if (answer === "d") return { eventId, state: "duplicate", token: "" };
    return { eventId, state: "in_progress", token: "" };
  }

  async commit(claim: Claim): Promise<void> {
    if (claim.state !== "new" || !claim.token) return;
    await this.run(COMMIT, COMMIT_SHA, [this.prefix + claim.eventId, `p:${claim.token}`, this.ttlMs]);
  }

  async release(claim: Claim): Promise<void> {
    if (claim.state !== "new" || !claim.token) return;
    await this.run(RELEASE, RELEASE_SHA, [this.prefix + claim.eventId, `p:${claim.token}`]);
  }
}

const sha1 = (script: string): string => createHash("sha1").update(script).digest("hex");
const CLAIM_SHA = sha1(CLAIM);
const COMMIT_SHA = sha1(COMMIT);
const RELEASE_SHA = sha1(RELEASE);

/** EVALSHA, and EVAL once when the server does not know the script (a restart, SCRIPT FLUSH). */
function ioredis(client: IORedisLike) {
  return async (script: string, sha: string, [key, ...args]: string[]): Promise<unknown> => {
    try {
      return await client.evalsha(sha, 1, key as string, ...args);
    } catch (error) {
      if (!String((error as Error).message).startsWith("NOSCRIPT")) throw error;
      return client.eval(script, 1, key as string, ...args);
    }
  };
}

function nodeRedis(client: NodeRedisLike) {
  return async (script: string, sha: string, [key, ...args]: string[]): Promise<unknown> => {
    try {
      return await client.sendCommand(["EVALSHA", sha, "1", key as string, ...args]);
    } catch (error) {
      if (!String((error as Error).message).startsWith("NOSCRIPT")) throw error;
      return client.sendCommand(["EVAL", script, "1", key as string, ...args]);
    }
  };
}
