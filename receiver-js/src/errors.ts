/**
 * One typed error hierarchy with stable, machine-readable reason codes, the same codes as the
 * Python `usp-receiver`: receivers map `reason` to HTTP answers and metrics; the message may
 * change between releases, the `reason` never does.
 */

export class ReceiverError extends Error {
  static readonly reason: string = "receiver_error";
  readonly detail: string;

  constructor(detail = "") {
    super(detail);
    this.name = new.target.name;
    this.detail = detail || (new.target as typeof ReceiverError).reason;
    this.message = this.detail;
  }

  /** A stable snake_case code, e.g. `"bad_signature"`. */
  get reason(): string {
    return (this.constructor as typeof ReceiverError).reason;
  }
}

/** The message is not provably from a trusted key, or breaks the replay policy (HTTP 401). */
export class VerificationError extends ReceiverError {
  static override readonly reason: string = "verification_failed";
}

/** No `Signature`/`Signature-Input` (or no Standard Webhooks headers) was presented. */
export class MissingSignature extends VerificationError {
  static override readonly reason: string = "missing_signature";
}

/** A signature field is present but cannot be parsed or has the wrong types. */
export class MalformedSignature extends VerificationError {
  static override readonly reason: string = "malformed_signature";
}

/** No trusted key has the signature's `keyid`, even after refreshing the JWKS. */
export class UnknownKey extends VerificationError {
  static override readonly reason: string = "unknown_key";
}

/** The cryptographic check failed, or the algorithm does not match the key. */
export class BadSignature extends VerificationError {
  static override readonly reason: string = "bad_signature";
}

/** `Content-Digest` is absent, malformed or does not match the body bytes. */
export class DigestMismatch extends VerificationError {
  static override readonly reason: string = "digest_mismatch";
}

/** The signature does not cover a component or parameter the policy requires. */
export class MissingComponent extends VerificationError {
  static override readonly reason: string = "missing_component";
}

/** `created` is older than the replay window allows. */
export class StaleSignature extends VerificationError {
  static override readonly reason: string = "stale";
}

/** `expires` is in the past. */
export class ExpiredSignature extends VerificationError {
  static override readonly reason: string = "expired";
}

/** `created` is further ahead than the allowed clock skew. */
export class FutureSignature extends VerificationError {
  static override readonly reason: string = "future";
}

/** The signature's `tag` is not the application tag the policy expects. */
export class TagMismatch extends VerificationError {
  static override readonly reason: string = "tag_mismatch";
}

/** The signed body is not a valid USP event envelope (HTTP 400). */
export class InvalidEvent extends ReceiverError {
  static override readonly reason: string = "invalid_event";
}

/** The remote JWKS could not be fetched or parsed and no cached copy is usable (HTTP 503). */
export class KeyFetchError extends ReceiverError {
  static override readonly reason: string = "key_fetch_failed";
}
