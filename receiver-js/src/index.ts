/**
 * Verify and deduplicate USP webhooks in Node.js. The whole surface is here; framework
 * integrations are imported explicitly so the base install needs none of them:
 * `@usp-webhooks/receiver/express`, `@usp-webhooks/receiver/hono`, `@usp-webhooks/receiver/redis`.
 */
export { contentDigest, checkContentDigest } from "./digest.js";
export { MemoryDedupe, type MemoryDedupeOptions } from "./dedupe/memory.js";
export { processOnce, type Processed } from "./dedupe/once.js";
export { type Claim, type ClaimState, type DedupeStore, DEFAULT_LEASE_SECONDS, DEFAULT_TTL_SECONDS } from "./dedupe/store.js";
export {
  BadSignature,
  DigestMismatch,
  ExpiredSignature,
  FutureSignature,
  InvalidEvent,
  KeyFetchError,
  MalformedSignature,
  MissingComponent,
  MissingSignature,
  ReceiverError,
  StaleSignature,
  TagMismatch,
  UnknownKey,
  VerificationError,
} from "./errors.js";
export { parseEvent, parseProbe } from "./event.js";
export type * from "./generated/events.js";
export type { ProbeEvent, ProbeData } from "./generated/probe.js";
export { DEFAULT_MAX_BODY_BYTES, fetchHandler, nodeHandler, type HttpOptions } from "./http.js";
export { JWKS, KeyRing, RemoteJWKS, type RemoteJWKSOptions } from "./jwks.js";
export { DEFAULT_ALGORITHMS, PublicKey, type Algorithm, type Jwk, type KeyResolver } from "./keys.js";
export type { HeadersInput } from "./message.js";
export {
  PROBLEM_TYPE_BASE,
  WebhookReceiver,
  problem,
  type Handler,
  type Outcome,
  type ReceivedWebhook,
  type WebhookReceiverOptions,
} from "./receive.js";
export {
  PUBLIC_KEY_PREFIX,
  SECRET_PREFIX,
  StandardWebhooksVerifier,
  type StandardVerified,
  verifyStandard,
} from "./standardWebhooks.js";
export {
  DEFAULT_POLICY,
  PROFILE_COMPONENTS,
  USP_TAG,
  Verifier,
  type SignedRequest,
  type VerificationPolicy,
  type Verified,
} from "./verify.js";
