/**
 * Key sets: a static JWKS, a remote JWKS fetched over HTTPS with HTTP caching, and a chain of
 * both. The rules are the Python receiver's (docs/architecture.md, `usp_receiver._jwks`).
 */
import { KeyFetchError } from "./errors.js";
import { type Jwk, type KeyResolver, PublicKey } from "./keys.js";

/** Largest JWKS document {@link RemoteJWKS} reads: a real key set is a few KiB. */
export const DEFAULT_MAX_BYTES = 256 * 1024;

const SUPPORTED_CURVES: Record<string, ReadonlySet<string> | null> = {
  OKP: new Set(["Ed25519"]),
  EC: new Set(["P-256"]),
  RSA: null,
};
const ACCEPT =
  "application/jwk-set+json, application/http-message-signatures-directory+json, application/json;q=0.9";
const MAX_AGE = /^max-age\s*=\s*"?(\d+)"?$/i;

/** An immutable set of trusted public keys, looked up by `kid`. */
export class JWKS implements KeyResolver {
  private readonly byKid: ReadonlyMap<string, PublicKey>;

  /** A kid bound to two different keys is refused: which one a signature meant would be a guess. */
  constructor(keys: Iterable<PublicKey> = []) {
    const byKid = new Map<string, PublicKey>();
    for (const key of keys) {
      const known = byKid.get(key.kid);
      if (known !== undefined && !sameKey(known, key)) throw new Error(`kid ${key.kid} names two different keys`);
      if (known === undefined) byKid.set(key.kid, key);
    }
    this.byKid = byKid;
  }

  /**
   * Parse a JWK Set (`{"keys": [...]}`). Keys we cannot or must not verify with are skipped, as
   * RFC 7517 §5 says: unsupported `kty`/`crv`/`alg`, `use` other than `sig`, `key_ops` without
   * `verify`, and symmetric keys (a secret published in a public document is no secret).
   */
  static async fromDocument(document: unknown): Promise<JWKS> {
    if (typeof document !== "object" || document === null || Array.isArray(document)) {
      throw new Error("a JWKS document must be a JSON object");
    }
    const entries = (document as { keys?: unknown }).keys;
    if (!Array.isArray(entries)) throw new Error('a JWKS document must have a "keys" array');
    const keys: PublicKey[] = [];
    for (const [index, entry] of entries.entries()) {
      if (typeof entry !== "object" || entry === null || Array.isArray(entry)) {
        throw new Error(`JWKS keys[${index}] is not an object`);
      }
      const key = await usableKey(entry as Jwk);
      if (key !== undefined) keys.push(key);
    }
    return new JWKS(keys);
  }

  /** Parse a JSON JWKS document. */
  static async fromJson(text: string): Promise<JWKS> {
    let document: unknown;
    try {
      document = JSON.parse(text);
    } catch (error) {
      throw new Error(`JWKS is not valid JSON: ${(error as Error).message}`);
    }
    return JWKS.fromDocument(document);
  }

  get(kid: string): PublicKey | undefined {
    return this.byKid.get(kid);
  }

  async resolve(kid: string): Promise<PublicKey | undefined> {
    return this.byKid.get(kid);
  }

  get size(): number {
    return this.byKid.size;
  }

  [Symbol.iterator](): Iterator<PublicKey> {
    return this.byKid.values();
  }
}

function sameKey(a: PublicKey, b: PublicKey): boolean {
  return a.kid === b.kid && a.alg === b.alg && JSON.stringify(a.jwk) === JSON.stringify(b.jwk);
}

async function usableKey(jwk: Jwk): Promise<PublicKey | undefined> {
  const kty = jwk.kty;
  if (typeof kty !== "string" || !(kty in SUPPORTED_CURVES)) return undefined;
  const curves = SUPPORTED_CURVES[kty];
  if (curves && !curves.has(String(jwk.crv))) return undefined;
  if ("use" in jwk && jwk.use !== "sig") return undefined;
  const ops = jwk.key_ops;
  if (ops !== undefined && (!Array.isArray(ops) || !ops.includes("verify"))) return undefined;
  try {
    return await PublicKey.fromJwk(jwk);
  } catch {
    return undefined; // an unsupported alg, an RSA key without alg, bad coordinates
  }
}

export interface RemoteJWKSOptions {
  /** At most one refetch per this many seconds on an unknown kid or after a failure (30). */
  minRefreshInterval?: number;
  /** Freshness when the response names none (300 s). */
  defaultMaxAge?: number;
  /** The longest freshness a response may claim (one day). */
  maxMaxAge?: number;
  /** Seconds a fetch may take, body included (5). */
  timeout?: number;
  /** Plain http, for local tests only. */
  allowInsecureHttp?: boolean;
  maxBytes?: number;
  /** Monotonic seconds; injectable so tests move time without sleeping. */
  clock?: () => number;
  fetch?: typeof fetch;
  /** Where a failed refresh that keeps the cached keys is reported (console.warn). */
  warn?: (message: string) => void;
}

/**
 * A {@link KeyResolver} over a JWKS URL, cached as HTTP says, refetched on key rotation:
 * - freshness follows `Cache-Control: max-age` (minus `Age`), clamped to
 *   `[minRefreshInterval, maxMaxAge]`; refreshes are conditional and a 304 renews the cache;
 * - an unknown kid triggers one refetch, at most once per `minRefreshInterval`; concurrent misses
 *   share that fetch;
 * - a failed refresh keeps the cached keys in service and is retried after `minRefreshInterval`;
 *   with nothing cached the lookup throws {@link KeyFetchError};
 * - only `https` URLs, unless `allowInsecureHttp`; redirects are not followed.
 */
export class RemoteJWKS implements KeyResolver {
  readonly url: string;
  private readonly minRefreshInterval: number;
  private readonly defaultMaxAge: number;
  private readonly maxMaxAge: number;
  private readonly timeout: number;
  private readonly maxBytes: number;
  private readonly clock: () => number;
  private readonly fetcher: typeof fetch;
  private readonly warn: (message: string) => void;
  private jwks: JWKS | undefined;
  private etag: string | undefined;
  private lastModified: string | undefined;
  private freshUntil = 0;
  private lastAttempt: number | undefined;
  private lastError: string | undefined;
  private inflight: Promise<void> | undefined;

  constructor(url: string, options: RemoteJWKSOptions = {}) {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new Error(`JWKS URL is not a URL: ${url}`);
    }
    const allowed = options.allowInsecureHttp ? ["https:", "http:"] : ["https:"];
    if (!allowed.includes(parsed.protocol) || !parsed.hostname) {
      throw new Error(`JWKS URL must be https (got ${url}); plain http only with allowInsecureHttp`);
    }
    this.url = parsed.href;
    this.minRefreshInterval = options.minRefreshInterval ?? 30;
    this.defaultMaxAge = options.defaultMaxAge ?? 300;
    this.maxMaxAge = options.maxMaxAge ?? 86400;
    if (!(this.minRefreshInterval >= 0 && this.minRefreshInterval <= this.maxMaxAge)) {
      throw new Error("need 0 <= minRefreshInterval <= maxMaxAge");
    }
    this.timeout = options.timeout ?? 5;
    this.maxBytes = options.maxBytes ?? DEFAULT_MAX_BYTES;
    this.clock = options.clock ?? (() => performance.now() / 1000);
    this.fetcher = options.fetch ?? fetch;
    this.warn = options.warn ?? ((message) => console.warn(message));
  }

  /** The current key set, fetched or refreshed first when it is missing or stale. */
  async keys(): Promise<JWKS> {
    if (!this.fresh()) await this.once(false);
    return this.require();
  }

  /** Refetch now (an operator's call, so not rate-limited). */
  async refresh(): Promise<JWKS> {
    await this.once(true);
    return this.require();
  }

  async resolve(kid: string): Promise<PublicKey | undefined> {
    const key = (await this.keys()).get(kid);
    if (key !== undefined) return key;
    if (this.inflight !== undefined) await this.inflight; // someone is fetching already: share it
    else if (this.mayRefetch()) await this.once(true);
    return this.require().get(kid);
  }

  private fresh(): boolean {
    return this.jwks !== undefined && this.clock() < this.freshUntil;
  }

  private require(): JWKS {
    if (this.jwks === undefined) throw new KeyFetchError(`no keys from ${this.url}`);
    return this.jwks;
  }

  private mayRefetch(): boolean {
    return this.lastAttempt === undefined || this.clock() - this.lastAttempt >= this.minRefreshInterval;
  }

  /** One fetch at a time: a caller arriving while one runs waits for it instead. */
  private async once(force: boolean): Promise<void> {
    if (this.inflight === undefined) {
      this.inflight = this.fetchKeys(force).finally(() => {
        this.inflight = undefined;
      });
    }
    await this.inflight;
  }

  private async fetchKeys(force: boolean): Promise<void> {
    if (!force && this.jwks === undefined && !this.mayRefetch()) {
      throw new KeyFetchError(`JWKS ${this.url} unavailable (${this.lastError}); retrying later`);
    }
    this.lastAttempt = this.clock();
    const headers: Record<string, string> = { Accept: ACCEPT, "Accept-Encoding": "identity" };
    if (this.jwks !== undefined) {
      if (this.etag !== undefined) headers["If-None-Match"] = this.etag;
      if (this.lastModified !== undefined) headers["If-Modified-Since"] = this.lastModified;
    }
    try {
      const response = await this.fetcher(this.url, {
        headers,
        redirect: "manual",
        signal: AbortSignal.timeout(this.timeout * 1000),
      });
      const body = await this.read(response);
      await this.accept(response, body);
    } catch (error) {
      if (error instanceof KeyFetchError) throw error;
      const reason = error instanceof FetchFailed ? error.message : `${(error as Error).name}: ${(error as Error).message}`;
      this.fail(reason);
    }
  }

  private async read(response: Response): Promise<string> {
    if (response.status === 304 && this.jwks !== undefined) return "";
    if (response.status < 200 || response.status >= 300) {
      await response.body?.cancel();
      const where = response.headers.get("location");
      const redirect = where && response.status >= 300 && response.status < 400 ? `, redirect to ${where} not followed` : "";
      throw new FetchFailed(`HTTP ${response.status}${redirect}`);
    }
    const length = response.headers.get("content-length");
    if (length !== null && /^\d+$/.test(length) && Number(length) > this.maxBytes) {
      await response.body?.cancel();
      throw new FetchFailed(`body of ${length} bytes exceeds ${this.maxBytes}`);
    }
    const chunks: Uint8Array[] = [];
    let size = 0;
    if (response.body !== null) {
      for await (const chunk of response.body as AsyncIterable<Uint8Array>) {
        size += chunk.length;
        if (size > this.maxBytes) throw new FetchFailed(`body exceeds ${this.maxBytes} bytes`);
        chunks.push(chunk);
      }
    }
    return Buffer.concat(chunks).toString("utf8");
  }

  private async accept(response: Response, body: string): Promise<void> {
    if (response.status !== 304) {
      try {
        this.jwks = await JWKS.fromJson(body);
      } catch (error) {
        throw new FetchFailed(`invalid JWKS document: ${(error as Error).message}`);
      }
      this.etag = undefined;
      this.lastModified = undefined;
    }
    this.etag = response.headers.get("etag") ?? this.etag;
    this.lastModified = response.headers.get("last-modified") ?? this.lastModified;
    this.freshUntil = this.clock() + this.lifetime(response.headers);
    this.lastError = undefined;
  }

  private fail(reason: string): void {
    this.lastError = reason;
    if (this.jwks === undefined) throw new KeyFetchError(`cannot fetch JWKS ${this.url}: ${reason}`);
    this.freshUntil = this.clock() + this.minRefreshInterval;
    this.warn(
      `JWKS refresh from ${this.url} failed (${reason}); serving cached keys, retrying in ${this.minRefreshInterval} s`,
    );
  }

  /** Seconds the response stays fresh, per RFC 9111 `max-age` and `Age`, clamped. */
  private lifetime(headers: Headers): number {
    let lifetime = this.defaultMaxAge;
    const directives = (headers.get("cache-control") ?? "").split(",").map((d) => d.trim());
    if (directives.some((d) => ["no-store", "no-cache"].includes(d.toLowerCase()))) return this.minRefreshInterval;
    for (const directive of directives) {
      const match = MAX_AGE.exec(directive);
      if (match) {
        lifetime = Number(match[1]);
        break;
      }
    }
    const age = headers.get("age") ?? "";
    if (/^\d+$/.test(age)) lifetime -= Number(age);
    return Math.min(Math.max(lifetime, this.minRefreshInterval), this.maxMaxAge);
  }
}

class FetchFailed extends Error {}

/** Several resolvers asked in order; the first that knows the kid wins (pin a key, fall back to the JWKS). */
export class KeyRing implements KeyResolver {
  readonly resolvers: readonly KeyResolver[];

  constructor(...resolvers: KeyResolver[]) {
    this.resolvers = resolvers;
  }

  async resolve(kid: string): Promise<PublicKey | undefined> {
    for (const resolver of this.resolvers) {
      const key = await resolver.resolve(kid);
      if (key !== undefined) return key;
    }
    return undefined;
  }
}
