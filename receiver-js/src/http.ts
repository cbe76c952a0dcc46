/**
 * The thinnest HTTP skins over {@link WebhookReceiver}: Node's `http` (which Express builds on)
 * and the fetch API (which Hono, Bun, Deno and Workers build on). Each reads the body, never more
 * than `maxBodyBytes` (the signature can only be checked once the whole body is in memory, so the
 * cap is what bounds a hostile sender), rebuilds the URL the sender signed, and answers the
 * receiver's {@link Outcome} as JSON.
 */
import type { IncomingMessage, ServerResponse } from "node:http";

import { type Outcome, type WebhookReceiver, problem } from "./receive.js";

/** The default body cap: 1 MiB, far above any USP event (a few KiB). */
export const DEFAULT_MAX_BODY_BYTES = 1 << 20;

export interface HttpOptions {
  /**
   * The URL the sender signed, when a proxy stands between it and this app
   * (`https://platform.example/hooks`): absolute http(s), no query (the request's is used).
   */
  publicUrl?: string;
  maxBodyBytes?: number;
}

/** Validate a configured `publicUrl` up front: a mistake would fail every delivery. */
export function checkPublicUrl(publicUrl: string): URL {
  let url: URL;
  try {
    url = new URL(publicUrl);
  } catch {
    throw new Error(`publicUrl must be an absolute http(s) URL, got ${JSON.stringify(publicUrl)}`);
  }
  if (!["http:", "https:"].includes(url.protocol)) {
    throw new Error(`publicUrl must be an absolute http(s) URL, got ${JSON.stringify(publicUrl)}`);
  }
  if (url.search || url.hash) {
    throw new Error(`publicUrl must not have a query or fragment (the request's is used): ${publicUrl}`);
  }
  return url;
}

/**
 * The URL to verify against: `publicUrl` with the request's query, or the request's own scheme,
 * `Host` and target exactly as received (`target` is the raw request-target, escapes intact).
 */
export function signedUrl(publicUrl: URL | undefined, scheme: string, host: string | undefined, target: string): string {
  const queryAt = target.indexOf("?");
  if (publicUrl !== undefined) {
    const query = queryAt < 0 ? "" : target.slice(queryAt);
    return `${publicUrl.protocol}//${publicUrl.host}${publicUrl.pathname}${query}`;
  }
  return `${scheme}://${host ?? "localhost"}${target}`;
}

export const methodNotAllowed = (): Outcome =>
  problem(405, "method_not_allowed", "Method not allowed", "webhooks are delivered by POST", { Allow: "POST" });

export const payloadTooLarge = (limit: number): Outcome =>
  problem(413, "payload_too_large", "Payload too large", `the body exceeds ${limit} bytes`);

/** A Node `http` request handler: `http.createServer(nodeHandler(receiver))`. */
export function nodeHandler(receiver: WebhookReceiver, options: HttpOptions = {}) {
  const publicUrl = options.publicUrl === undefined ? undefined : checkPublicUrl(options.publicUrl);
  const limit = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  return async (request: IncomingMessage, response: ServerResponse, preread?: Uint8Array): Promise<void> => {
    let result: Outcome;
    if (request.method !== "POST") {
      result = methodNotAllowed();
    } else {
      const body = preread ?? (await readLimited(request, limit));
      if (body === undefined) {
        result = payloadTooLarge(limit);
      } else {
        // Express adds `protocol` (which honours "trust proxy") and `originalUrl` (the target before
        // a router stripped its mount path); plain Node has the socket and `url`.
        const express = request as IncomingMessage & { protocol?: string; originalUrl?: string };
        const encrypted = (request.socket as { encrypted?: boolean }).encrypted;
        const scheme = express.protocol ?? (encrypted ? "https" : "http");
        const url = signedUrl(publicUrl, scheme, request.headers.host, express.originalUrl ?? request.url ?? "/");
        result = await receiver.receive("POST", url, request.rawHeaders, body);
      }
    }
    sendNode(response, result);
  };
}

/** The whole body, or `undefined` as soon as it is declared or grows past `limit` bytes. */
export async function readLimited(request: IncomingMessage, limit: number): Promise<Uint8Array | undefined> {
  const declared = request.headers["content-length"];
  if (declared !== undefined && /^\d+$/.test(declared) && Number(declared) > limit) {
    request.resume(); // drain, so the connection can carry the answer
    return undefined;
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of request as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > limit) {
      request.resume();
      return undefined;
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

export function sendNode(response: ServerResponse, result: Outcome): void {
  const payload = Buffer.from(JSON.stringify(result.body));
  response.writeHead(result.status, {
    ...result.headers,
    "Content-Type": result.mediaType,
    "Content-Length": String(payload.length),
  });
  response.end(payload);
}

/** A fetch-API handler: `(request: Request) => Promise<Response>`. */
export function fetchHandler(receiver: WebhookReceiver, options: HttpOptions = {}) {
  const publicUrl = options.publicUrl === undefined ? undefined : checkPublicUrl(options.publicUrl);
  const limit = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  return async (request: Request): Promise<Response> => {
    if (request.method !== "POST") return toResponse(methodNotAllowed());
    const body = await readFetchBody(request, limit);
    if (body === undefined) return toResponse(payloadTooLarge(limit));
    // The fetch API has parsed the URL already (WHATWG): its path is what the sender signed for
    // every ordinary path; behind a proxy, pass publicUrl.
    const parsed = new URL(request.url);
    const url = signedUrl(publicUrl, parsed.protocol.slice(0, -1), parsed.host, parsed.pathname + parsed.search);
    return toResponse(await receiver.receive("POST", url, request.headers, body));
  };
}

async function readFetchBody(request: Request, limit: number): Promise<Uint8Array | undefined> {
  const declared = request.headers.get("content-length");
  if (declared !== null && /^\d+$/.test(declared) && Number(declared) > limit) return undefined;
  if (request.body === null) return new Uint8Array();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of request.body as AsyncIterable<Uint8Array>) {
    size += chunk.length;
    if (size > limit) return undefined;
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

export function toResponse(result: Outcome): Response {
  return new Response(JSON.stringify(result.body), {
    status: result.status,
    headers: { ...result.headers, "Content-Type": result.mediaType },
  });
}
