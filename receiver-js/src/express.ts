/**
 * Express middleware: `app.post("/webhooks/usp", uspWebhook(receiver))`. Mount it before any body
 * parser on that route (it must see the bytes the sender signed); `express.raw()` before it is
 * fine, `express.json()` is not.
 */
import type { NextFunction, Request, Response } from "express";

import { type HttpOptions, nodeHandler, readLimited, payloadTooLarge, sendNode, DEFAULT_MAX_BODY_BYTES } from "./http.js";
import type { WebhookReceiver } from "./receive.js";

export function uspWebhook(receiver: WebhookReceiver, options: HttpOptions = {}) {
  const handle = nodeHandler(receiver, options);
  const limit = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  return async (request: Request, response: Response, next: NextFunction): Promise<void> => {
    try {
      let body: Uint8Array | undefined;
      if (Buffer.isBuffer(request.body)) {
        body = request.body; // express.raw() read it: the bytes as sent
        if (body.length > limit) return sendNode(response, payloadTooLarge(limit));
      } else if (request.readableEnded) {
        throw new Error(
          "uspWebhook: a body parser consumed the request before it (express.json()?); mount uspWebhook first, or use express.raw() for this route",
        );
      } else if (request.method === "POST") {
        body = await readLimited(request, limit);
        if (body === undefined) return sendNode(response, payloadTooLarge(limit));
      }
      await handle(request, response, body);
    } catch (error) {
      next(error);
    }
  };
}
