/**
 * Verify a USP webhook request: RFC 9421 signature, RFC 9530 digest, replay window, under the
 * same policy and in the same order as the Python `usp-receiver`: parse the fields, check the
 * digest (a hash), apply the policy to the signature parameters (free), resolve the key, and only
 * then spend the public-key operation. Of several signatures (a key rotation sends `sig1` with the
 * new key and `sig2` with the old one) the first that verifies from a trusted key wins.
 */
import { httpbis } from "http-message-signatures";
import { type InnerList, type Item, isInnerList, serializeInnerList, serializeItem } from "structured-headers";

import { checkContentDigest } from "./digest.js";
import {
  BadSignature,
  ExpiredSignature,
  FutureSignature,
  MalformedSignature,
  MissingComponent,
  MissingSignature,
  ReceiverError,
  StaleSignature,
  TagMismatch,
  UnknownKey,
  VerificationError,
} from "./errors.js";
import { DEFAULT_ALGORITHMS, type KeyResolver, type PublicKey } from "./keys.js";
import { type Fields, type HeadersInput, fieldValue, normalizeFields } from "./message.js";
import { parseDictionaryStrict } from "./sf.js";

/** What the USP REST profile signs, in order. */
export const PROFILE_COMPONENTS: readonly string[] = ["@method", "@authority", "@path", "content-digest", "content-type"];
/** The application tag USP senders put on webhook signatures. */
export const USP_TAG = "usp-webhook";

/**
 * What a signature must satisfy beyond being cryptographically valid. The defaults are the USP
 * receiver policy: the profile's components covered, `created` no older than 300 s and no more
 * than 60 s ahead, `expires` honoured, the digest always checked, a `tag` other than
 * `usp-webhook` refused while a signature without `tag` is accepted (the USP document's own
 * example has none), and at most 8 signatures per request.
 */
export interface VerificationPolicy {
  requiredComponents: readonly string[];
  maxAge: number;
  maxFuture: number;
  requireCreated: boolean;
  tag: string | null;
  requireTag: boolean;
  algorithms: ReadonlySet<string>;
  requireDigest: boolean;
  maxSignatures: number;
}

export const DEFAULT_POLICY: Readonly<VerificationPolicy> = Object.freeze({
  requiredComponents: PROFILE_COMPONENTS,
  maxAge: 300,
  maxFuture: 60,
  requireCreated: true,
  tag: USP_TAG,
  requireTag: false,
  algorithms: DEFAULT_ALGORITHMS,
  requireDigest: true,
  maxSignatures: 8,
});

/** A request to verify. `url` is the full public URL the sender used (scheme, host, path, query). */
export interface SignedRequest {
  method: string;
  url: string;
  headers: HeadersInput;
  body: Uint8Array;
}

/** A signature that verified: who signed (`key`), when, and what it covers. */
export interface Verified {
  scheme: "rfc9421";
  label: string;
  kid: string;
  key: PublicKey;
  created: number | undefined;
  expires: number | undefined;
  tag: string | undefined;
  nonce: string | undefined;
  components: readonly string[];
}

type Params = Record<string, string | number>;

interface Entry {
  label: string;
  components: string[];
  input: InnerList;
  params: Params;
  signature: Uint8Array;
}

const KNOWN_PARAMETERS = new Set(["alg", "created", "expires", "keyid", "nonce", "tag"]);
const DERIVED = new Set(["@method", "@authority", "@path", "@query", "@scheme", "@target-uri"]);
const DEFAULT_PORTS: Record<string, string> = { http: "80", https: "443" };
const URL_PARTS = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#]*)([^?#]*)(?:\?([^#]*))?/;

/** Verifies signed webhook requests against trusted keys under a policy. */
export class Verifier {
  readonly policy: Readonly<VerificationPolicy>;
  private readonly required: readonly string[];

  constructor(
    readonly keys: KeyResolver,
    policy: Partial<VerificationPolicy> = {},
  ) {
    this.policy = Object.freeze({ ...DEFAULT_POLICY, ...policy });
    this.required = this.policy.requiredComponents.map((name) => `"${name}"`);
  }

  /**
   * The first valid signature, or throw the {@link VerificationError} that explains why none is
   * (the one from a key we trust, when there is one). `now` is Unix seconds.
   */
  async verify(request: SignedRequest, now: number = Date.now() / 1000): Promise<Verified> {
    const fields = normalizeFields(request.headers);
    const entries = this.prepare(fields, request.body, now);
    const errors: VerificationError[] = [];
    for (const entry of entries) {
      const key = await this.keys.resolve(String(entry.params.keyid));
      try {
        return this.verifyOne(request, fields, entry, key);
      } catch (error) {
        if (!(error instanceof VerificationError)) throw error;
        errors.push(error);
      }
    }
    throw mostTelling(errors);
  }

  private prepare(fields: Fields, body: Uint8Array, now: number): Entry[] {
    const signatureInput = fieldValue(fields, "signature-input");
    const signature = fieldValue(fields, "signature");
    if (!signatureInput && !signature) {
      throw new MissingSignature("the request carries no Signature-Input/Signature fields");
    }
    if (!signatureInput || !signature) throw new MalformedSignature("Signature-Input and Signature must both be present");
    const entries = parseSignatures(signatureInput, signature);
    if (entries.length > this.policy.maxSignatures) {
      throw new MalformedSignature(
        `the request carries ${entries.length} signatures, more than the ${this.policy.maxSignatures} the policy's maxSignatures allows`,
      );
    }
    const digest = fieldValue(fields, "content-digest");
    // An empty body without a digest has nothing to protect; otherwise the digest is checked
    // whether or not the signature covers it.
    if (this.policy.requireDigest && (body.length > 0 || digest !== undefined)) checkContentDigest(digest, body);
    const errors: VerificationError[] = [];
    const usable: Entry[] = [];
    for (const entry of entries) {
      try {
        this.checkPolicy(entry, now);
        usable.push(entry);
      } catch (error) {
        if (!(error instanceof VerificationError)) throw error;
        errors.push(error);
      }
    }
    if (usable.length === 0) throw errors[0] as VerificationError;
    return usable;
  }

  private checkPolicy(entry: Entry, now: number): void {
    const { params, label } = entry;
    for (const [name, value] of Object.entries(params)) {
      if (!KNOWN_PARAMETERS.has(name)) throw new MalformedSignature(`unknown signature parameter ${name}`);
      const integer = name === "created" || name === "expires";
      if (integer ? !Number.isInteger(value) : typeof value !== "string") {
        throw new MalformedSignature(`parameter ${name} must be a${integer ? "n integer" : " string"}`);
      }
    }
    if (!("keyid" in params)) throw new MissingComponent(`signature ${label} has no keyid`);
    const missing = this.required.filter((name) => !entry.components.includes(name));
    if (missing.length > 0) {
      throw new MissingComponent(`signature ${label} does not cover ${[...missing].sort().join(", ")}`);
    }
    const tag = params.tag as string | undefined;
    if ((tag !== undefined && tag !== this.policy.tag) || (tag === undefined && this.policy.requireTag)) {
      throw new TagMismatch(`signature ${label} has tag ${String(tag)}, expected ${String(this.policy.tag)}`);
    }
    const created = params.created as number | undefined;
    if (created === undefined) {
      if (this.policy.requireCreated) throw new MissingComponent(`signature ${label} has no created parameter`);
    } else if (created > now + this.policy.maxFuture) {
      throw new FutureSignature(`signature ${label} was created ${Math.round(created - now)} s in the future`);
    } else if (created < now - this.policy.maxAge) {
      throw new StaleSignature(`signature ${label} is ${Math.round(now - created)} s old`);
    }
    const expires = params.expires as number | undefined;
    if (expires !== undefined && expires < now) {
      throw new ExpiredSignature(`signature ${label} expired ${Math.round(now - expires)} s ago`);
    }
  }

  private verifyOne(request: SignedRequest, fields: Fields, entry: Entry, key: PublicKey | undefined): Verified {
    const { params } = entry;
    if (key === undefined) throw new UnknownKey(`no trusted key has keyid ${String(params.keyid)}`);
    const alg = params.alg ?? key.alg;
    if (alg !== key.alg || !this.policy.algorithms.has(key.alg)) {
      throw new BadSignature(`algorithm ${String(alg)} is not allowed for key ${key.kid}`);
    }
    const base = signatureBase(request, fields, entry);
    if (!key.verify(entry.signature, base)) throw new BadSignature(`signature ${entry.label} does not verify`);
    return {
      scheme: "rfc9421",
      label: entry.label,
      kid: key.kid,
      key,
      created: params.created as number | undefined,
      expires: params.expires as number | undefined,
      tag: params.tag as string | undefined,
      nonce: params.nonce as string | undefined,
      components: entry.components,
    };
  }
}

/** Pair the members of both fields by label; throw {@link MalformedSignature} on any flaw. */
function parseSignatures(signatureInput: string, signature: string): Entry[] {
  const inputs = parseField(signatureInput, "Signature-Input");
  const signatures = parseField(signature, "Signature");
  const labels = [...inputs.keys()];
  if (labels.length !== signatures.size || !labels.every((label) => signatures.has(label))) {
    throw new MalformedSignature("Signature-Input and Signature have different labels");
  }
  return labels.map((label) => {
    const input = inputs.get(label) as Item | InnerList;
    const sig = signatures.get(label) as Item | InnerList;
    if (!isInnerList(input)) throw new MalformedSignature(`Signature-Input member ${label} must be an inner list`);
    if (isInnerList(sig) || !(sig[0] instanceof ArrayBuffer) || sig[1].size > 0) {
      throw new MalformedSignature(`Signature member ${label} must be a byte sequence`);
    }
    const components = input[0].map((item) => {
      if (typeof item[0] !== "string") throw new MalformedSignature(`component ids of ${label} must be strings`);
      return serializeItem(item);
    });
    if (new Set(components).size !== components.length) {
      throw new MalformedSignature(`signature ${label} covers a component twice`);
    }
    const params: Params = {};
    for (const [name, value] of input[1]) {
      // A token, boolean or byte sequence where a string or integer belongs: refused by the policy.
      params[name] = typeof value === "string" || typeof value === "number" ? value : Number.NaN;
    }
    return { label, components, input, params, signature: new Uint8Array(sig[0]) };
  });
}

function parseField(value: string, name: string): Map<string, Item | InnerList> {
  let parsed;
  try {
    parsed = parseDictionaryStrict(value);
  } catch (error) {
    throw new MalformedSignature(`${name} is not a valid Structured Field dictionary: ${(error as Error).message}`);
  }
  if (parsed.size === 0) throw new MalformedSignature(`${name} has no members`);
  return parsed;
}

/**
 * The signature base: the derived components of our profile and plain fields from the message
 * as received (the URL's path and query exactly as sent, no WHATWG normalisation), everything
 * else (`@query-param`, `;sf`, `;key`, `;bs`, `@request-target`) from `http-message-signatures`.
 */
function signatureBase(request: SignedRequest, fields: Fields, entry: Entry): Uint8Array {
  if (request.method !== request.method.toUpperCase()) {
    throw new MalformedSignature("HTTP request method must be an uppercase string");
  }
  const flat: Record<string, string[]> = {};
  for (const [name, lines] of fields) if (name !== "signature" && name !== "signature-input") flat[name] = lines;
  const message = { method: request.method, url: request.url, headers: flat };
  const componentParser = (name: string, params: Map<string, unknown>): string[] | null => {
    if (params.size > 0) return null;
    if (name.startsWith("@")) return DERIVED.has(name) ? [derived(name, request.method, request.url)] : null;
    const lines = fields.get(name);
    if (lines === undefined) throw new MissingComponent(`covered field ${name} is absent from the message`);
    return [lines.join(", ")];
  };
  let base: [string, string[]][];
  try {
    base = httpbis.createSignatureBase({ fields: [...entry.components], componentParser }, message);
  } catch (error) {
    if (error instanceof ReceiverError) throw error;
    const text = (error as Error).message;
    if (/^No header .* found/.test(text) || /not found$/.test(text)) throw new MissingComponent(text);
    throw new MalformedSignature(text);
  }
  const lines = base.map(([component, values]) => [component, values] as [string, string[]]);
  lines.push(['"@signature-params"', [serializeInnerList(entry.input)]]);
  return Buffer.from(httpbis.formatSignatureBase(lines), "latin1");
}

function derived(name: string, method: string, url: string): string {
  const match = URL_PARTS.exec(url);
  if (match === null) throw new MalformedSignature(`cannot derive ${name} from URL ${JSON.stringify(url)}`);
  const [, schemeText = "", authorityText = "", path = "", query] = match;
  const scheme = schemeText.toLowerCase();
  switch (name) {
    case "@method":
      return method;
    case "@authority": {
      const [host, port] = splitAuthority(authorityText);
      const stripped = port !== undefined && port.replace(/^0+/, "") === DEFAULT_PORTS[scheme];
      return port === undefined || port === "" || stripped ? host : `${host}:${port}`;
    }
    case "@path":
      return path || "/";
    case "@query":
      return `?${query ?? ""}`;
    case "@scheme":
      return scheme;
    default: {
      const kept = method === "OPTIONS" ? path : path || "/";
      return `${scheme}://${authorityText}${kept}${query === undefined ? "" : `?${query}`}`;
    }
  }
}

function splitAuthority(authority: string): [string, string | undefined] {
  const hostPort = authority.slice(authority.lastIndexOf("@") + 1);
  const match = /^(\[[^\]]*\]|[^:]*)(?::(.*))?$/.exec(hostPort);
  return [(match?.[1] ?? hostPort).toLowerCase(), match?.[2]];
}

/**
 * Of several failed signatures, report one from a key we trust: an unknown old key next to a
 * forged new signature must not hide the forgery.
 */
function mostTelling(errors: VerificationError[]): VerificationError {
  const trusted = errors.filter((error) => !(error instanceof UnknownKey));
  return (trusted[0] ?? errors[0]) as VerificationError;
}
