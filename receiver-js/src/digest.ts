/**
 * RFC 9530 `Content-Digest`: always computed over the exact bytes received, always checked. The
 * common case (one `sha-256` member, as our signer writes it) is a string comparison; every other
 * form goes through the `structured-headers` parser.
 */
import { createHash, timingSafeEqual } from "node:crypto";

import { DigestMismatch } from "./errors.js";
import { parseDictionaryStrict } from "./sf.js";

const HASHES: Record<string, string> = { "sha-256": "sha256", "sha-512": "sha512" };

/** The `Content-Digest` field value for `body`. */
export function contentDigest(body: Uint8Array): string {
  return `sha-256=:${createHash("sha256").update(body).digest("base64")}:`;
}

/**
 * Throw {@link DigestMismatch} unless `value` is a valid digest of `body`. Every member must
 * match, and unknown algorithms are refused rather than ignored: accepting a message where one
 * algorithm disagrees would let an attacker pair a good digest with a forged body under another.
 */
export function checkContentDigest(value: string | undefined, body: Uint8Array): void {
  if (value === undefined) throw new DigestMismatch("Content-Digest is missing");
  if (value === contentDigest(body)) return;
  let members;
  try {
    members = parseDictionaryStrict(value);
  } catch (error) {
    throw new DigestMismatch(`Content-Digest is malformed: ${(error as Error).message}`);
  }
  if (members.size === 0) throw new DigestMismatch("Content-Digest has no members");
  for (const [name, member] of members) {
    const hash = HASHES[name];
    if (hash === undefined) throw new DigestMismatch(`Content-Digest algorithm ${name} is not supported`);
    const [digest] = member;
    if (!(digest instanceof ArrayBuffer)) throw new DigestMismatch(`Content-Digest ${name} is not a byte sequence`);
    const expected = createHash(hash).update(body).digest();
    const given = Buffer.from(digest);
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
      throw new DigestMismatch(`Content-Digest ${name} does not match the message body`);
    }
  }
}
