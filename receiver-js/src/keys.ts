/**
 * Keys as JWK (RFC 7517), named by their RFC 7638 thumbprint, bound to one RFC 9421 algorithm. A
 * key knows its algorithm so that a signature without `alg` (the USP document's own example has
 * none) verifies under exactly one: the one its JWK names. The primitives are Node's `crypto`.
 */
import { type JsonWebKey, type KeyObject, constants, createHmac, createPublicKey, timingSafeEqual, verify } from "node:crypto";
import { calculateJwkThumbprint } from "jose";

export type Algorithm = "ed25519" | "ecdsa-p256-sha256" | "rsa-pss-sha512" | "rsa-v1_5-sha256" | "hmac-sha256";

/** The algorithms of the USP signature profile; the others verify only when a policy opts in. */
export const DEFAULT_ALGORITHMS: ReadonlySet<string> = new Set(["ed25519", "ecdsa-p256-sha256"]);

const ALGORITHMS: ReadonlySet<string> = new Set([
  "ed25519",
  "ecdsa-p256-sha256",
  "rsa-pss-sha512",
  "rsa-v1_5-sha256",
  "hmac-sha256",
]);
/** JOSE `alg` names (RFC 7518, RFC 8037) for the same algorithms. */
const JOSE_TO_HTTPSIG: Record<string, Algorithm> = {
  EdDSA: "ed25519",
  Ed25519: "ed25519",
  ES256: "ecdsa-p256-sha256",
  PS512: "rsa-pss-sha512",
  RS256: "rsa-v1_5-sha256",
  HS256: "hmac-sha256",
};
const HTTPSIG_TO_JOSE: Record<Algorithm, string> = {
  ed25519: "EdDSA",
  "ecdsa-p256-sha256": "ES256",
  "rsa-pss-sha512": "PS512",
  "rsa-v1_5-sha256": "RS256",
  "hmac-sha256": "HS256",
};
const PUBLIC_MEMBERS: Record<string, string[]> = {
  OKP: ["kty", "crv", "x"],
  EC: ["kty", "crv", "x", "y"],
  RSA: ["kty", "e", "n"],
  oct: ["kty", "k"],
};

export type Jwk = Record<string, unknown>;

/** A trusted verification key: its `kid`, the one algorithm it verifies, the key itself. */
export class PublicKey {
  private constructor(
    readonly kid: string,
    readonly alg: Algorithm,
    /** The public members, plus `kid` and the JOSE `alg`: what a JWKS publishes. */
    readonly jwk: Readonly<Jwk>,
    private readonly key: KeyObject | Buffer,
  ) {}

  /**
   * Load a public JWK. `kid` is the JWK's own, else its RFC 7638 thumbprint. The algorithm comes
   * from `alg`, else the JWK's `alg`, else its curve; RSA keys without either are refused:
   * guessing between PSS and PKCS#1 v1.5 would let a signature choose its own algorithm.
   */
  static async fromJwk(jwk: Jwk, alg?: string): Promise<PublicKey> {
    try {
      const kty = String(jwk.kty);
      const names = PUBLIC_MEMBERS[kty];
      if (names === undefined) throw new Error(`unsupported kty ${JSON.stringify(jwk.kty)}`);
      const members: Jwk = {};
      for (const name of names) {
        if (typeof jwk[name] !== "string") throw new Error(`member ${name} is missing`);
        members[name] = jwk[name];
      }
      let key: KeyObject | Buffer;
      if (kty === "oct") {
        key = Buffer.from(String(jwk.k), "base64url");
      } else {
        if (kty === "OKP" && jwk.crv !== "Ed25519") throw new Error(`unsupported OKP curve ${String(jwk.crv)}`);
        if (kty === "EC" && jwk.crv !== "P-256") throw new Error(`unsupported EC curve ${String(jwk.crv)}`);
        key = createPublicKey({ key: members as JsonWebKey, format: "jwk" });
      }
      const algorithm = algorithmFor(jwk, alg);
      const kid = typeof jwk.kid === "string" && jwk.kid ? jwk.kid : await calculateJwkThumbprint(members as never, "sha256");
      const published = { ...members, kid, alg: HTTPSIG_TO_JOSE[algorithm] };
      return new PublicKey(kid, algorithm, Object.freeze(published), key);
    } catch (error) {
      throw new Error(`unusable JWK: ${(error as Error).message}`);
    }
  }

  /** The JOSE name of this key's algorithm (`EdDSA`, `ES256` ...). */
  get joseAlg(): string {
    return HTTPSIG_TO_JOSE[this.alg];
  }

  /** True when `signature` (raw; r‖s for ECDSA) is valid over `data`. Never throws. */
  verify(signature: Uint8Array, data: Uint8Array): boolean {
    try {
      const key = this.key;
      switch (this.alg) {
        case "ed25519":
          return verify(null, data, key as KeyObject, signature);
        case "ecdsa-p256-sha256":
          return verify("sha256", data, { key: key as KeyObject, dsaEncoding: "ieee-p1363" }, signature);
        case "rsa-pss-sha512":
          return verify(
            "sha512",
            data,
            { key: key as KeyObject, padding: constants.RSA_PKCS1_PSS_PADDING, saltLength: 64 },
            signature,
          );
        case "rsa-v1_5-sha256":
          return verify("sha256", data, key as KeyObject, signature);
        case "hmac-sha256": {
          const mac = createHmac("sha256", key as Buffer).update(data).digest();
          return mac.length === signature.length && timingSafeEqual(mac, signature);
        }
      }
    } catch {
      return false;
    }
  }
}

function algorithmFor(jwk: Jwk, alg: string | undefined): Algorithm {
  if (alg !== undefined) {
    if (!ALGORITHMS.has(alg)) throw new Error(`unsupported algorithm ${alg}`);
    return alg as Algorithm;
  }
  if (jwk.alg !== undefined) {
    const named = JOSE_TO_HTTPSIG[String(jwk.alg)] ?? String(jwk.alg);
    if (!ALGORITHMS.has(named)) throw new Error(`unsupported JWK alg ${String(jwk.alg)}`);
    return named as Algorithm;
  }
  if (jwk.kty === "OKP" && jwk.crv === "Ed25519") return "ed25519";
  if (jwk.kty === "EC" && jwk.crv === "P-256") return "ecdsa-p256-sha256";
  if (jwk.kty === "oct") return "hmac-sha256";
  throw new Error(`JWK of kty ${String(jwk.kty)} must name its alg`);
}

/** Where a verifier finds the key named by a signature's `keyid`; `undefined` means "not trusted". */
export interface KeyResolver {
  resolve(kid: string): Promise<PublicKey | undefined>;
}
