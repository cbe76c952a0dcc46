// A platform on the TypeScript MCP SDK (@modelcontextprotocol/sdk, protocol 2025-11-25: a
// session) against the API started by tests/dispatcher/mcp_live/test_typescript.py: it subscribes,
// books, and hears its booking as a usp_webhook on the session's stream. The params it got are
// written to USP_OUT for the Python side to verify against the business's keys.
import { test } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const { USP_MCP_URL, USP_API_KEY, USP_PROFILE, USP_OUT } = process.env;
const usp = { _meta: { usp: { profile: USP_PROFILE } } };

test("a TypeScript SDK session hears its own booking as a signed usp_webhook", async () => {
  const transport = new StreamableHTTPClientTransport(new URL(USP_MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${USP_API_KEY}` } },
  });
  const client = new Client({ name: "ts-platform", version: "1.0.0" });
  const heard = [];
  let wake = () => {};
  client.fallbackNotificationHandler = async (notification) => {
    if (notification.method === "usp_webhook") {
      heard.push(notification.params);
      wake();
    }
  };
  await client.connect(transport);
  try {
    assert.equal(transport.protocolVersion, "2025-11-25");
    assert.ok(transport.sessionId, "a stateful session");
    const subscribed = await client.callTool({
      name: "usp_feed_subscriptions_create",
      arguments: { url: "http://127.0.0.1:9/hooks", event_types: ["booking.*"], ...usp },
    });
    assert.ok(!subscribed.isError, JSON.stringify(subscribed));
    const today = new Date();
    const later = new Date(today.getTime() + 4 * 86_400_000);
    const found = await client.callTool({
      name: "usp_availability_query",
      arguments: {
        service_id: "svc_haircut_001",
        start_date: today.toISOString().slice(0, 10),
        end_date: later.toISOString().slice(0, 10),
      },
    });
    const slot = found.structuredContent.slots[0];
    const booked = await client.callTool({
      name: "usp_bookings_create",
      arguments: { service_id: "svc_haircut_001", slot_id: slot.id, buyer: { first_name: "Ada" }, ...usp },
    });
    assert.ok(!booked.isError, JSON.stringify(booked));
    const bookingId = booked.structuredContent.booking.id;
    const deadline = Date.now() + 30_000;
    while (!heard.some((p) => p.booking_id === bookingId)) {
      assert.ok(Date.now() < deadline, "no usp_webhook for the booking within 30 s");
      await new Promise((resolve) => {
        wake = resolve;
        setTimeout(resolve, 500);
      });
    }
    const mine = heard.find((p) => p.booking_id === bookingId);
    assert.equal(mine.event, "booking.created");
    assert.ok(mine._meta.usp.signature, "signed in band");
    writeFileSync(USP_OUT, JSON.stringify(mine));
  } finally {
    await transport.terminateSession().catch(() => {});
    await client.close();
  }
});
