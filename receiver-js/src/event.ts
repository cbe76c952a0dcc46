/**
 * The signed body as a USP event: validated against the JSON Schemas generated from the wire
 * contract (`schemas/json/`, copied into `generated/` by `npm run generate`), so the types and the
 * check cannot drift from what the business sends.
 */
import { Ajv2020 } from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

import type { WebhookEvent } from "./generated/events.js";
import type { ProbeEvent } from "./generated/probe.js";
import { probeEventSchema, webhookEventSchema } from "./generated/schemas.js";
import { InvalidEvent } from "./errors.js";

// strict: false lets the schemas' `discriminator` (an OpenAPI keyword Ajv knows only without a
// `mapping`) through as an annotation; `oneOf` over the `event` constants decides alone.
const ajv = new Ajv2020({ strict: false, allErrors: false });
(addFormats as unknown as (ajv: Ajv2020) => void)(ajv);
const validEvent = ajv.compile<WebhookEvent>(webhookEventSchema);
const validProbe = ajv.compile<ProbeEvent>(probeEventSchema);
/** Each event type's own schema: what a failed `oneOf` is explained by (its own errors say little). */
const byType = new Map(
  Object.entries(webhookEventSchema.discriminator.mapping).map(([type, ref]) => [
    type,
    ajv.compile({ $ref: ref, $defs: webhookEventSchema.$defs }),
  ]),
);

/** `body` as a USP event, or throw {@link InvalidEvent} saying why not (never the body itself). */
export function parseEvent(body: Uint8Array | string): WebhookEvent {
  const document = decode(body);
  if (validEvent(document)) return document;
  const type = (document as { event?: unknown } | null)?.event;
  const own = typeof type === "string" ? byType.get(type) : undefined;
  if (own === undefined) {
    throw new InvalidEvent(`invalid USP event: event ${JSON.stringify(type)} is not one of ${[...byType.keys()].join(", ")}`);
  }
  own(document);
  const problems = (own.errors ?? validEvent.errors ?? [])
    .slice(0, 5)
    .map((e) => `${e.instancePath || "<root>"}: ${e.message ?? "invalid"}`)
    .join("; ");
  throw new InvalidEvent(`invalid USP event (${type}): ${problems}`);
}

/** `body` as the probe event `usp-webhooks probe` sends, else `undefined`. */
export function parseProbe(body: Uint8Array | string): ProbeEvent | undefined {
  try {
    const document = decode(body);
    return validProbe(document) ? document : undefined;
  } catch {
    return undefined;
  }
}

function decode(body: Uint8Array | string): unknown {
  try {
    const text = typeof body === "string" ? body : new TextDecoder("utf-8", { fatal: true }).decode(body);
    return JSON.parse(text);
  } catch (error) {
    throw new InvalidEvent(`invalid USP event: the body is not UTF-8 JSON (${(error as Error).message})`);
  }
}
