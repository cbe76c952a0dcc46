/** Hono middleware: `app.post("/webhooks/usp", uspWebhook(receiver))`. */
import type { Context } from "hono";

import { type HttpOptions, fetchHandler } from "./http.js";
import type { WebhookReceiver } from "./receive.js";

export function uspWebhook(receiver: WebhookReceiver, options: HttpOptions = {}) {
  const handle = fetchHandler(receiver, options);
  return (context: Context): Promise<Response> => handle(context.req.raw);
}
