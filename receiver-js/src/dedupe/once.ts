/** Run a piece of work at most once per `event_id` (once per success), over any dedupe store. */
import type { DedupeStore } from "./store.js";

/**
 * What {@link processOnce} did: `accepted` (ran and succeeded), `duplicate` (already processed,
 * not run), `in_progress` (held elsewhere right now, not run), `failed` (the work threw: the
 * claim was released so a redelivery runs it again), `unavailable` (the store could not be asked).
 */
export type Processed = "accepted" | "duplicate" | "in_progress" | "failed" | "unavailable";

export type Log = (message: string, error?: unknown) => void;

/**
 * Claim `eventId`; when it is new, await `run()` and commit, or release the claim if `run` throws.
 * Never throws: store failures and the work's own failure go to `log` (local eyes only, never
 * echoed to a sender: a handler's text may hold PII or secrets).
 */
export async function processOnce(
  dedupe: DedupeStore,
  eventId: string,
  run: () => Promise<void>,
  log: Log = (message, error) => console.error(message, error ?? ""),
): Promise<Processed> {
  let claim;
  try {
    claim = await dedupe.claim(eventId);
  } catch (error) {
    log(`dedupe store unavailable: could not claim event ${short(eventId)}`, error);
    return "unavailable";
  }
  if (claim.state === "duplicate") return "duplicate";
  if (claim.state === "in_progress") return "in_progress";
  try {
    await run();
  } catch (error) {
    log(`handler failed for event ${short(eventId)}; claim released for a retry`, error);
    try {
      await dedupe.release(claim);
    } catch (releaseError) {
      log(`dedupe store failed to release event ${short(eventId)}; the claim will expire with its lease`, releaseError);
    }
    return "failed";
  }
  try {
    await dedupe.commit(claim);
  } catch (error) {
    // The work is done: reporting a failure would make the sender run it twice.
    log(`could not record event ${short(eventId)} as processed; its claim will expire`, error);
  }
  return "accepted";
}

function short(eventId: string): string {
  return JSON.stringify(eventId.length > 64 ? `${eventId.slice(0, 64)}…` : eventId);
}
