/** The contract every dedupe store keeps (memory, Redis), as the Python receiver's stores do. */

/**
 * How long an in-progress claim lives without commit or release (60 s): longer than any handler
 * should run (the sender gives up on a request after 15 s), short enough that a crashed
 * receiver's claim frees itself before the sender's second retry.
 */
export const DEFAULT_LEASE_SECONDS = 60;
/** How long a processed id is remembered: 31 days, a day longer than the service keeps events. */
export const DEFAULT_TTL_SECONDS = 31 * 24 * 3600;

export type ClaimState = "new" | "duplicate" | "in_progress";

/** The answer to `claim`; pass it back to `commit`/`release`. `token` is set only for `new`. */
export interface Claim {
  eventId: string;
  state: ClaimState;
  token: string;
}

/**
 * Claim / commit / release. Of two simultaneous claims of one id, exactly one is `new`; a commit
 * or release only acts on the claim that holds the id (its token), so a stale claim can neither
 * record nor free someone else's.
 */
export interface DedupeStore {
  claim(eventId: string): Promise<Claim>;
  commit(claim: Claim): Promise<void>;
  release(claim: Claim): Promise<void>;
}
