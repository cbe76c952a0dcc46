/**
 * Standard Webhooks 1.0 signatures (`webhook-id`, `webhook-timestamp`, `webhook-signature`), which
 * a subscription may ask for beside the RFC 9421 ones: `v1` is HMAC-SHA256 under a `whsec_`
 * secret, `v1a` Ed25519 under a `whpk_` public key, over `{webhook-id}.{webhook-timestamp}.{body}`.
 * Written here rather than taken from the `standardwebhooks` package, which has no `v1a` and no
 * reason codes; our tests check each against it. Which scheme to choose: docs/protocol.md.
 */
import { type KeyObject, createHmac, createPublicKey, timingSafeEqual, verify as cryptoVerify } from "node:crypto";

import {
  BadSignature,
  FutureSignature,
  MalformedSignature,
  MissingSignature,
  VerificationError,
  StaleSignature,
} from "./errors.js";
import { type HeadersInput, fieldValue, normalizeFields } from "./message.js";
import type { SignedRequest, Verified, Verifier } from "./verify.js";

export const SECRET_PREFIX = "whsec_";
export const PUBLIC_KEY_PREFIX = "whpk_";
/** Seconds a `webhook-timestamp` may be off, either way: the spec's libraries use five minutes. */
export const TOLERANCE = 300;
/** Signatures one header may carry before it is refused unread (a rotation sends two per scheme). */
export const MAX_SIGNATURES = 8;
/** The DER prefix of an Ed25519 SubjectPublicKeyInfo, before the 32 raw key bytes. */
const ED25519_SPKI = Buffer.from("302a300506032b6570032100", "hex");

/** A request whose Standard Webhooks signature held: `v1` or `v1a`. */
export interface StandardVerified {
  scheme: "v1" | "v1a";
  webhookId: string;
  /** What signed, as handlers print it for an RFC 9421 key: the scheme. */
  kid: string;
}

export interface StandardOptions {
  secrets?: readonly string[];
  publicKeys?: readonly string[];
  tolerance?: number;
  /** Unix seconds. */
  now?: number;
}

/**
 * The `webhook-id` and scheme of a request one of whose signatures holds under `secrets` (`v1`)
 * or `publicKeys` (`v1a`); else throw {@link MissingSignature}, {@link MalformedSignature},
 * {@link StaleSignature}, {@link FutureSignature} or {@link BadSignature}.
 */
export function verifyStandard(headers: HeadersInput, body: Uint8Array, options: StandardOptions): StandardVerified {
  const fields = normalizeFields(headers);
  const [id, stamp, header] = ["id", "timestamp", "signature"].map((name) => fieldValue(fields, `webhook-${name}`));
  if (id === undefined || stamp === undefined || header === undefined) {
    throw new MissingSignature("webhook-id, webhook-timestamp and webhook-signature must all be present");
  }
  if (!/^[0-9]{1,12}$/.test(stamp)) {
    throw new MalformedSignature(`webhook-timestamp is not Unix seconds: ${JSON.stringify(stamp.slice(0, 40))}`);
  }
  const now = options.now ?? Date.now() / 1000;
  const tolerance = options.tolerance ?? TOLERANCE;
  const sent = Number(stamp);
  if (sent < now - tolerance) throw new StaleSignature(`webhook-timestamp is ${Math.round(now - sent)} s old`);
  if (sent > now + tolerance) throw new FutureSignature(`webhook-timestamp is ${Math.round(sent - now)} s in the future`);
  const entries = header.split(/\s+/).filter(Boolean);
  if (entries.length > MAX_SIGNATURES) {
    throw new MalformedSignature(`webhook-signature carries ${entries.length} signatures, more than ${MAX_SIGNATURES}`);
  }
  const content = Buffer.concat([Buffer.from(`${id}.${stamp}.`), body]);
  const macs = (options.secrets ?? []).map((secret) =>
    createHmac("sha256", Buffer.from(secret.replace(/^whsec_/, ""), "base64")).update(content).digest(),
  );
  const keys = (options.publicKeys ?? []).map(publicKey);
  for (const entry of entries) {
    const comma = entry.indexOf(",");
    const version = comma < 0 ? entry : entry.slice(0, comma);
    const value = comma < 0 ? "" : entry.slice(comma + 1);
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(value) || value.length % 4 !== 0) continue;
    const signature = Buffer.from(value, "base64");
    if (version === "v1" && macs.some((mac) => mac.length === signature.length && timingSafeEqual(mac, signature))) {
      return { scheme: "v1", webhookId: id, kid: "standard-webhooks v1" };
    }
    if (version === "v1a" && keys.some((key) => holds(key, signature, content))) {
      return { scheme: "v1a", webhookId: id, kid: "standard-webhooks v1a" };
    }
  }
  throw new BadSignature("no webhook-signature entry holds under the secrets and keys given");
}

const PUBLIC_KEYS = new Map<string, KeyObject>();

/** A `whpk_` key, loaded once: loading costs about as much as a verification. */
function publicKey(text: string): KeyObject {
  let key = PUBLIC_KEYS.get(text);
  if (key === undefined) {
    const raw = Buffer.from(text.replace(/^whpk_/, ""), "base64");
    key = createPublicKey({ key: Buffer.concat([ED25519_SPKI, raw]), format: "der", type: "spki" });
    if (PUBLIC_KEYS.size >= 256) PUBLIC_KEYS.clear();
    PUBLIC_KEYS.set(text, key);
  }
  return key;
}

function holds(key: KeyObject, signature: Buffer, content: Buffer): boolean {
  try {
    return cryptoVerify(null, content, key, signature);
  } catch {
    return false;
  }
}

/**
 * The verifier a {@link WebhookReceiver} takes for Standard Webhooks. With `rfc9421`, a request
 * this scheme does not vouch for (no such headers, or none that holds) is judged by RFC 9421
 * instead, so a platform moving between the two loses no delivery.
 */
export class StandardWebhooksVerifier {
  readonly secrets: readonly string[];
  readonly publicKeys: readonly string[];
  readonly tolerance: number;
  readonly rfc9421: Verifier | undefined;

  constructor(options: { secrets?: readonly string[]; publicKeys?: readonly string[]; tolerance?: number; rfc9421?: Verifier }) {
    this.secrets = options.secrets ?? [];
    this.publicKeys = options.publicKeys ?? [];
    this.tolerance = options.tolerance ?? TOLERANCE;
    this.rfc9421 = options.rfc9421;
    if (this.secrets.length === 0 && this.publicKeys.length === 0 && this.rfc9421 === undefined) {
      throw new Error("give the whsec_ secrets, the whpk_ public keys, or both");
    }
  }

  async verify(request: SignedRequest, now?: number): Promise<StandardVerified | Verified> {
    try {
      if (this.secrets.length === 0 && this.publicKeys.length === 0) {
        throw new MissingSignature("no Standard Webhooks secret or key is configured");
      }
      return verifyStandard(request.headers, request.body, {
        secrets: this.secrets,
        publicKeys: this.publicKeys,
        tolerance: this.tolerance,
        ...(now === undefined ? {} : { now }),
      });
    } catch (error) {
      if (!(error instanceof VerificationError) || this.rfc9421 === undefined) throw error;
    }
    return this.rfc9421.verify(request, now);
  }
}
