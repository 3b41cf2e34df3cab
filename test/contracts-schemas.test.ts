// SPDX-License-Identifier: Apache-2.0
/** Envelope headers, schema validation (JSON Schema and zod-style) and the backward-compatibility check. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { causedBy, envelope, ENVELOPE_HEADERS, readEnvelope } from "../src/contracts/envelope.js";
import { SchemaRegistry, type ParseSchema } from "../src/contracts/schemas.js";
import { backwardProblems } from "../src/contracts/compat.js";
import { InvalidEnvelopeError, SchemaIncompatibleError, SchemaViolationError } from "../src/errors.js";
import { openBroker } from "../src/broker/broker.js";
import { startServer } from "../src/server/index.js";
import { connect } from "../src/client/index.js";
import { tempDir } from "../src/testing/helpers.js";

test("envelope(): defaults, round trip through string and byte headers", () => {
  const h = envelope({ type: "OrderAccepted", tenant: "acme", occurredAt: new Date("2026-12-01T10:00:00Z") });
  assert.match(h[ENVELOPE_HEADERS.messageId], /^[0-9a-f-]{36}$/);
  const asBytes = Object.fromEntries(Object.entries(h).map(([k, v]) => [k, new TextEncoder().encode(v)]));
  for (const headers of [h, asBytes]) {
    const e = readEnvelope(headers)!;
    assert.equal(e.type, "OrderAccepted");
    assert.equal(e.kind, "event");
    assert.equal(e.schemaVersion, 1);
    assert.equal(e.tenant, "acme");
    assert.equal(e.occurredAt, Date.parse("2026-12-01T10:00:00Z"));
    assert.equal(e.correlationId, undefined);
  }
  assert.equal(readEnvelope({ "x-other": "1" }), null, "no envelope: null");
  assert.equal(readEnvelope(undefined), null);
});

test("causedBy(): correlation carried over, causation = the cause's id", () => {
  const first = readEnvelope(envelope({ type: "OrderPlaced" }))!;
  const cmd = readEnvelope(causedBy(first, { type: "ReserveInventory", kind: "command" }))!;
  assert.equal(cmd.correlationId, first.messageId);
  assert.equal(cmd.causationId, first.messageId);
  const third = readEnvelope(causedBy(cmd, { type: "InventoryReserved" }))!;
  assert.equal(third.correlationId, first.messageId, "one correlation id for the whole flow");
  assert.equal(third.causationId, cmd.messageId);
});

test("malformed envelopes are refused with the header named", () => {
  const bad = (headers: Record<string, string>, header: string) =>
    assert.throws(() => readEnvelope(headers), (e: unknown) => e instanceof InvalidEnvelopeError && e.header === header && e.code === "INVALID_ENVELOPE");
  const ok = envelope({ type: "T" });
  bad({ ...ok, [ENVELOPE_HEADERS.schemaVersion]: "two" }, ENVELOPE_HEADERS.schemaVersion);
  bad({ ...ok, [ENVELOPE_HEADERS.kind]: "rumour" }, ENVELOPE_HEADERS.kind);
  bad({ [ENVELOPE_HEADERS.type]: "T" }, ENVELOPE_HEADERS.messageId);
  bad({ ...ok, [ENVELOPE_HEADERS.occurredAt]: "yesterday" }, ENVELOPE_HEADERS.occurredAt);
  assert.throws(() => envelope({ type: "" }), InvalidEnvelopeError);
  assert.throws(() => envelope({ type: "T", schemaVersion: 0 }), InvalidEnvelopeError);
  assert.throws(() => envelope({ type: "x".repeat(300) }), InvalidEnvelopeError);
});

const orderV1 = {
  type: "object",
  properties: { orderId: { type: "string" }, total: { type: "integer" }, customer: { type: "object", properties: { name: { type: "string" } }, required: ["name"] } },
  required: ["orderId", "total"],
};

test("JSON Schema: a violation names the field (JSON pointer) and the reason", () => {
  const reg = new SchemaRegistry();
  reg.topic("orders").add("OrderAccepted", 1, orderV1);
  const h = envelope({ type: "OrderAccepted" });
  reg.validate("topic", "orders", { orderId: "o-1", total: 3 }, h);
  const refused = (value: unknown, headers: Record<string, string>, field: string, reason: RegExp) =>
    assert.throws(
      () => reg.validate("topic", "orders", value, headers),
      (e: unknown) => e instanceof SchemaViolationError && e.field === field && reason.test(e.reason) && e.code === "SCHEMA_VIOLATION" && e.target === "orders",
    );
  refused({ orderId: "o-1" }, h, "/total", /required/);
  refused({ orderId: "o-1", total: "3" }, h, "/total", /integer/);
  refused({ orderId: "o-1", total: 3, customer: {} }, h, "/customer/name", /required/);
  refused({ orderId: "o-1", total: 3 }, {}, "", /sluice-type/);
  refused({ orderId: "o-1", total: 3 }, envelope({ type: "Unknown" }), "", /no schema for type/);
  refused({ orderId: "o-1", total: 3 }, envelope({ type: "OrderAccepted", schemaVersion: 2 }), "", /version 2/);
  // Targets without schemas are not checked; a target may allow unknown types.
  reg.validate("topic", "other", 42, undefined);
  reg.validate("queue", "orders", 42, undefined);
  reg.topic("orders", { unknownTypes: "allow" });
  reg.validate("topic", "orders", 42, envelope({ type: "Unknown" }));
});

test("zod-style schemas in code (anything with safeParse)", () => {
  const positive: ParseSchema = {
    safeParse: (v) =>
      typeof (v as { n?: unknown })?.n === "number" && (v as { n: number }).n > 0
        ? { success: true }
        : { success: false, error: { issues: [{ path: ["n"], message: "Number must be greater than 0" }] } },
  };
  const reg = new SchemaRegistry();
  reg.queue("emails").add("SendEmail", 1, positive);
  reg.validate("queue", "emails", { n: 1 }, envelope({ type: "SendEmail", kind: "command" }));
  assert.throws(
    () => reg.validate("queue", "emails", { n: -1 }, envelope({ type: "SendEmail", kind: "command" })),
    (e: unknown) => e instanceof SchemaViolationError && e.field === "/n" && /greater than 0/.test(e.reason),
  );
});

test("backward compatibility: new optional fields pass; new required, retyped, removed enum values and reused fields are refused", () => {
  const v2 = { ...orderV1, properties: { ...orderV1.properties, currency: { type: "string" } } };
  assert.deepEqual(backwardProblems(orderV1, v2), []);
  const reg = new SchemaRegistry();
  const t = reg.topic("orders");
  t.add("OrderAccepted", 1, orderV1).add("OrderAccepted", 2, v2);
  const required = { ...v2, required: [...orderV1.required, "currency"] };
  assert.throws(() => t.add("OrderAccepted", 3, required), (e: unknown) => e instanceof SchemaIncompatibleError && e.problems.some((p) => p.includes("/currency: required now")));
  const retyped = { ...v2, properties: { ...v2.properties, total: { type: "string" } } };
  assert.throws(() => t.add("OrderAccepted", 3, retyped), (e: unknown) => e instanceof SchemaIncompatibleError && e.problems.some((p) => p.includes("/total: type integer became string")));
  assert.deepEqual(backwardProblems({ type: "integer" }, { type: "number" }), [], "integer widens to number");
  assert.equal(backwardProblems({ enum: ["a", "b"] }, { enum: ["a"] }).length, 1);
  // v3 drops `currency`; v4 brings it back as a number: checked against every earlier version.
  const { currency: _c, ...withoutCurrency } = v2.properties;
  const v3 = { ...v2, properties: withoutCurrency };
  t.add("OrderAccepted", 3, v3);
  const v4 = { ...v3, properties: { ...v3.properties, currency: { type: "number" } } };
  assert.throws(() => t.add("OrderAccepted", 4, v4), (e: unknown) => e instanceof SchemaIncompatibleError && e.problems.some((p) => p.startsWith("vs v2: /currency")));
  t.add("OrderAccepted", 4, v4, { compatibility: "none" });
  assert.deepEqual(t.versions("OrderAccepted"), [1, 2, 3, 4]);
});

test("queues with schemas: enqueue and enqueueBatch refused whole, embedded and through a client; nothing stored", async () => {
  const d = tempDir("sluice-queue-schemas-");
  const schemas = new SchemaRegistry();
  schemas.queue("emails").add("SendEmail", 1, { type: "object", properties: { to: { type: "string", pattern: "@" } }, required: ["to"] });
  const b = await openBroker({ dataDir: d.dir, retentionCheckIntervalMs: 0, schemas });
  const server = await startServer({ broker: b, port: 0, httpPort: 0 });
  const c = await connect({ url: server.url, schemas });
  try {
    const h = envelope({ type: "SendEmail", kind: "command" });
    for (const api of [b, c]) {
      const q = api.queue("emails");
      await q.enqueue({ to: "ada@example.com" }, { headers: h });
      await assert.rejects(q.enqueue({ to: "nobody" }, { headers: h }), (e: unknown) => e instanceof SchemaViolationError && e.field === "/to");
      await assert.rejects(q.enqueueBatch([{ data: { to: "bob@example.com" }, headers: h }, { data: {}, headers: h }]), (e: unknown) => e instanceof SchemaViolationError && e.field === "/to");
      await assert.rejects(q.enqueue({ to: "x@example.com" }), (e: unknown) => e instanceof SchemaViolationError && /sluice-type/.test(e.reason), "no type header");
    }
    assert.equal((await b.queue("emails").stats()).waiting, 2, "only the two valid jobs were stored");
    await b.queue("other").enqueue({ anything: true }); // queues without schemas are not checked
  } finally {
    await c.close();
    await server.close({ graceMs: 100 });
    await b.close();
    d.cleanup();
  }
});
