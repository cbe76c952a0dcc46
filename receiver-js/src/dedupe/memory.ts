/**
 * In-process dedupe store: two insertion-ordered maps with fixed lease and TTL, so insertion
 * order is expiry order and eviction looks at the front only, never scans. It deduplicates within
 * one process: behind several processes or hosts, use {@link RedisDedupe}.
 */
import { type Claim, type DedupeStore, DEFAULT_LEASE_SECONDS, DEFAULT_TTL_SECONDS } from "./store.js";

export interface MemoryDedupeOptions {
  maxEntries?: number;
  lease?: number;
  ttl?: number;
  /** Monotonic seconds; injectable so tests move time without sleeping. */
  clock?: () => number;
}

/**
 * Dedupe within one process, bounded to `maxEntries` ids. When full, a new claim evicts an
 * in-progress claim whose lease ran out, else the oldest done id, else (last resort) the oldest
 * in-progress claim. Size `maxEntries` above the events you receive per `ttl`.
 */
export class MemoryDedupe implements DedupeStore {
  private readonly pending = new Map<string, [token: string, expires: number]>();
  private readonly done = new Map<string, number>();
  private readonly maxEntries: number;
  private readonly lease: number;
  private readonly ttl: number;
  private readonly clock: () => number;
  private counter = 0;

  constructor(options: MemoryDedupeOptions = {}) {
    this.maxEntries = options.maxEntries ?? 100_000;
    this.lease = options.lease ?? DEFAULT_LEASE_SECONDS;
    this.ttl = options.ttl ?? DEFAULT_TTL_SECONDS;
    this.clock = options.clock ?? (() => performance.now() / 1000);
    if (this.maxEntries < 1) throw new Error(`maxEntries must be at least 1, got ${this.maxEntries}`);
    if (!(this.lease > 0 && this.ttl > 0)) throw new Error("lease and ttl must be positive");
  }

  get size(): number {
    return this.pending.size + this.done.size;
  }

  async claim(eventId: string): Promise<Claim> {
    const now = this.clock();
    const expires = this.done.get(eventId);
    if (expires !== undefined) {
      if (expires > now) return { eventId, state: "duplicate", token: "" };
      this.done.delete(eventId);
    }
    const held = this.pending.get(eventId);
    if (held !== undefined) {
      if (held[1] > now) return { eventId, state: "in_progress", token: "" };
      this.pending.delete(eventId); // the holder's lease ran out: take the event over
    }
    if (this.size >= this.maxEntries) this.evict(now);
    const token = String(++this.counter);
    this.pending.set(eventId, [token, now + this.lease]);
    return { eventId, state: "new", token };
  }

  private evict(now: number): void {
    const oldestPending = this.pending.entries().next();
    if (!oldestPending.done && oldestPending.value[1][1] <= now) this.pending.delete(oldestPending.value[0]);
    else if (this.done.size > 0) this.done.delete(this.done.keys().next().value as string);
    else if (!oldestPending.done) this.pending.delete(oldestPending.value[0]);
  }

  async commit(claim: Claim): Promise<void> {
    const held = this.pending.get(claim.eventId);
    if (held === undefined || !claim.token || held[0] !== claim.token) return;
    this.pending.delete(claim.eventId);
    this.done.set(claim.eventId, this.clock() + this.ttl);
  }

  async release(claim: Claim): Promise<void> {
    const held = this.pending.get(claim.eventId);
    if (held !== undefined && claim.token && held[0] === claim.token) this.pending.delete(claim.eventId);
  }
}
