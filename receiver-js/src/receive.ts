/**
 * Receiving one webhook, independent of the web framework: verify, parse, dedupe, handle, and
 * say what to answer, with the Python receiver's statuses and RFC 9457 problem bodies.
 */
import { processOnce, type Log } from "./dedupe/once.js";
import { MemoryDedupe } from "./dedupe/memory.js";
import type { DedupeStore } from "./dedupe/store.js";
import { InvalidEvent, KeyFetchError, type ReceiverError, VerificationError } from "./errors.js";
import { parseEvent, parseProbe } from "./event.js";
import type { WebhookEvent } from "./generated/events.js";
import type { HeadersInput } from "./message.js";
import type { StandardVerified, StandardWebhooksVerifier } from "./standardWebhooks.js";
import type { Verified, Verifier } from "./verify.js";

/** Problem `type` URIs are this prefix plus the reason code (RFC 9457 §3.1.1). */
export const PROBLEM_TYPE_BASE = "urn:usp-webhooks:problem:";
const RETRY_IN_PROGRESS_SECONDS = 5;

/** What a handler gets: the validated event, who signed it, the exact bytes received. */
export interface ReceivedWebhook {
  event: WebhookEvent;
  verified: Verified | StandardVerified;
  body: Uint8Array;
}

export type Handler = (hook: ReceivedWebhook) => unknown;

/** The answer to send: `status`, a JSON `body` and extra `headers`. */
export interface Outcome {
  status: number;
  body: Record<string, unknown>;
  headers: Record<string, string>;
  reason: string | undefined;
  eventId: string | undefined;
  /** `application/problem+json` for a refusal, else `application/json`. */
  mediaType: string;
}

export interface WebhookReceiverOptions {
  verifier: Verifier | StandardWebhooksVerifier;
  handler: Handler;
  /** Where processed event ids are remembered: in this process by default; Redis across several. */
  dedupe?: DedupeStore;
  /** Where refusals and failures are logged for local eyes (console.error). */
  log?: Log;
}

/**
 * Verify, deduplicate and hand USP webhooks to `handler`. Throw (or reject) from the handler to
 * refuse the event: the sender gets a 500 and retries, and the retry is processed, never
 * swallowed as a duplicate.
 */
export class WebhookReceiver {
  readonly verifier: Verifier | StandardWebhooksVerifier;
  readonly handler: Handler;
  readonly dedupe: DedupeStore;
  private readonly log: Log;

  constructor(options: WebhookReceiverOptions) {
    this.verifier = options.verifier;
    this.handler = options.handler;
    this.dedupe = options.dedupe ?? new MemoryDedupe();
    this.log = options.log ?? ((message, error) => console.error(message, error ?? ""));
  }

  /** Process one delivery and say what to answer. Never throws for bad input. */
  async receive(method: string, url: string, headers: HeadersInput, body: Uint8Array): Promise<Outcome> {
    let verified;
    try {
      verified = await this.verifier.verify({ method, url, headers, body });
    } catch (error) {
      if (error instanceof VerificationError) return refusal(401, error, "Signature verification failed");
      if (error instanceof KeyFetchError) {
        this.log(`webhook deferred: signing keys unavailable (${error.detail})`);
        return refusal(503, error, "Signing keys unavailable", 30);
      }
      throw error;
    }
    let event: WebhookEvent;
    try {
      event = parseEvent(body);
    } catch (error) {
      if (!(error instanceof InvalidEvent)) throw error;
      const probe = parseProbe(body);
      if (probe !== undefined) {
        // Verified, and acted on by nobody: `usp-webhooks probe` asks.
        return outcome(200, { status: "probe", event_id: probe.event_id }, {}, undefined, probe.event_id);
      }
      return problem(400, "invalid_event", "Not a valid USP event", error.detail);
    }
    return this.deliver({ event, verified, body });
  }

  private async deliver(hook: ReceivedWebhook): Promise<Outcome> {
    const eventId = hook.event.event_id;
    const processed = await processOnce(this.dedupe, eventId, async () => {
      await this.handler(hook);
    }, this.log);
    switch (processed) {
      case "accepted":
        return outcome(200, { status: "accepted", event_id: eventId }, {}, undefined, eventId);
      case "duplicate":
        return outcome(200, { status: "duplicate", event_id: eventId }, {}, "duplicate", eventId);
      case "in_progress":
        return problem(409, "in_progress", "Event is being processed", "retry later", {
          "Retry-After": String(RETRY_IN_PROGRESS_SECONDS),
        }, eventId);
      case "failed":
        // The handler's own text may hold PII or secrets: it is logged, never sent back.
        return problem(500, "handler_failed", "Webhook handler failed", "", {}, eventId);
      case "unavailable":
        return problem(503, "dedupe_unavailable", "Deduplication store unavailable", "", { "Retry-After": "30" }, eventId);
    }
  }
}

function outcome(
  status: number,
  body: Record<string, unknown>,
  headers: Record<string, string>,
  reason: string | undefined,
  eventId: string | undefined,
): Outcome {
  const mediaType = status >= 400 ? "application/problem+json" : "application/json";
  return { status, body, headers, reason, eventId, mediaType };
}

/** An RFC 9457 problem answer; `reason` is repeated as a member (the stable code senders switch on). */
export function problem(
  status: number,
  reason: string,
  title: string,
  detail = "",
  headers: Record<string, string> = {},
  eventId?: string,
): Outcome {
  const body: Record<string, unknown> = { type: PROBLEM_TYPE_BASE + reason, title, status, reason };
  if (detail) body.detail = detail;
  return outcome(status, body, { ...headers }, reason, eventId);
}

function refusal(status: number, error: ReceiverError, title: string, retryAfter?: number): Outcome {
  const headers: Record<string, string> = retryAfter ? { "Retry-After": String(retryAfter) } : {};
  if (status === 401) headers["WWW-Authenticate"] = 'Signature realm="usp-webhooks"';
  return problem(status, error.reason, title, error.detail, headers);
}
