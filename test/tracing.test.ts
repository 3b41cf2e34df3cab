// SPDX-License-Identifier: Apache-2.0
/**
 * Tracing (src/observability/tracing.ts): with @opentelemetry/api and a tiny in-memory tracer
 * provider (below, implementing the API's interfaces), a publish and its consumption, and an
 * enqueue and its processing, are one trace: the PRODUCER span's context travels in the
 * record's `traceparent` header, the CONSUMER span continues it. Embedded and through a real
 * server. With tracing off (the API absent, or no provider registered), headers are unchanged.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { AsyncLocalStorage } from "node:async_hooks";
import { randomBytes } from "node:crypto";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as api from "@opentelemetry/api";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { startServer } from "../src/server/index.js";
import { processOrdered } from "../src/contracts/ordered.js";
import { loadTracing, setTracingApi, traceContextOf, withTraceContext } from "../src/observability/tracing.js";
import { waitUntil } from "../src/testing/helpers.js";
import type { Broker, Message } from "../src/types.js";
import type { Job, Queue } from "../src/queues/types.js";

// ── A minimal in-memory tracer provider and context manager ───────────────────────────────

interface Recorded {
  name: string;
  kind: api.SpanKind;
  traceId: string;
  spanId: string;
  parentSpanId: string | undefined;
  attributes: api.Attributes;
  links: api.Link[];
  status: api.SpanStatus;
}

const finished: Recorded[] = [];

class TestSpan implements api.Span {
  private readonly ctx: api.SpanContext;
  private readonly rec: Recorded;
  private ended = false;
  constructor(name: string, opts: api.SpanOptions, parent: api.SpanContext | undefined) {
    const valid = parent !== undefined && api.isSpanContextValid(parent);
    this.ctx = { traceId: valid ? parent.traceId : randomBytes(16).toString("hex"), spanId: randomBytes(8).toString("hex"), traceFlags: api.TraceFlags.SAMPLED };
    this.rec = { name, kind: opts.kind ?? api.SpanKind.INTERNAL, traceId: this.ctx.traceId, spanId: this.ctx.spanId, parentSpanId: valid ? parent.spanId : undefined, attributes: { ...opts.attributes }, links: [...(opts.links ?? [])], status: { code: api.SpanStatusCode.UNSET } };
  }
  spanContext(): api.SpanContext {
    return this.ctx;
  }
  setAttribute(k: string, v: api.SpanAttributeValue): this {
    this.rec.attributes[k] = v;
    return this;
  }
  setAttributes(a: api.SpanAttributes): this {
    Object.assign(this.rec.attributes, a);
    return this;
  }
  addEvent(): this {
    return this;
  }
  addLink(l: api.Link): this {
    this.rec.links.push(l);
    return this;
  }
  addLinks(ls: api.Link[]): this {
    this.rec.links.push(...ls);
    return this;
  }
  setStatus(s: api.SpanStatus): this {
    this.rec.status = s;
    return this;
  }
  updateName(n: string): this {
    this.rec.name = n;
    return this;
  }
  end(): void {
    if (this.ended) return;
    this.ended = true;
    finished.push(this.rec);
  }
  isRecording(): boolean {
    return !this.ended;
  }
  recordException(): void {}
}

class TestTracer implements api.Tracer {
  startSpan(name: string, opts: api.SpanOptions = {}, ctx: api.Context = api.context.active()): api.Span {
    return new TestSpan(name, opts, opts.root ? undefined : api.trace.getSpanContext(ctx));
  }
  startActiveSpan<F extends (span: api.Span) => unknown>(name: string, ...args: unknown[]): ReturnType<F> {
    const fn = args[args.length - 1] as (span: api.Span) => ReturnType<F>;
    const opts = (args.length > 1 ? args[0] : {}) as api.SpanOptions;
    const span = this.startSpan(name, opts);
    return api.context.with(api.trace.setSpan(api.context.active(), span), fn, undefined, span) as ReturnType<F>;
  }
}

class TestProvider implements api.TracerProvider {
  readonly tracer = new TestTracer();
  getTracer(): api.Tracer {
    return this.tracer;
  }
}

class AlsContextManager implements api.ContextManager {
  private readonly als = new AsyncLocalStorage<api.Context>();
  active(): api.Context {
    return this.als.getStore() ?? api.ROOT_CONTEXT;
  }
  with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(ctx: api.Context, fn: F, thisArg?: ThisParameterType<F>, ...args: A): ReturnType<F> {
    return this.als.run(ctx, () => fn.apply(thisArg, args));
  }
  bind<T>(ctx: api.Context, target: T): T {
    if (typeof target !== "function") return target;
    const f = target as unknown as (...a: unknown[]) => unknown;
    return ((...a: unknown[]) => this.with(ctx, f, undefined, ...a)) as unknown as T;
  }
  enable(): this {
    return this;
  }
  disable(): this {
    return this;
  }
}

const provider = new TestProvider();
api.context.setGlobalContextManager(new AlsContextManager());
api.trace.setGlobalTracerProvider(provider);
const userTracer = api.trace.getTracer("test-app");

// ── Helpers ───────────────────────────────────────────────────────────────────────────────

function tmpDir(): string {
  return mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-tracing-"));
}

async function withEmbedded(fn: (b: EmbeddedBroker) => Promise<void>): Promise<void> {
  const dir = tmpDir();
  const b = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  try {
    await fn(b);
  } finally {
    await b.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

async function withServer(fn: (client: Broker & { queue<T>(name: string): Queue<T> }, broker: EmbeddedBroker) => Promise<void>): Promise<void> {
  const dir = tmpDir();
  const broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  const srv = await startServer({ broker, port: 0, httpPort: null });
  const client = await connect({ url: srv.url });
  try {
    await fn(client, broker);
  } finally {
    await client.close();
    await srv.close({ graceMs: 200 });
    await broker.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

function spanNamed(name: string, kind: api.SpanKind): Promise<Recorded> {
  return waitUntil(() => finished.find((s) => s.name === name && s.kind === kind), `a finished span ${name}`);
}

function header(h: Record<string, Uint8Array>, name: string): string | undefined {
  return h[name] === undefined ? undefined : Buffer.from(h[name]).toString("utf8");
}

/** Takes the first message of `topic` from a fresh group, leaves the group. */
async function firstMessage(b: Broker, topic: string): Promise<Message> {
  const ac = new AbortController();
  const sub = b.subscribe(topic, { group: `g-${randomBytes(4).toString("hex")}`, start: "earliest", signal: ac.signal });
  try {
    for await (const msg of sub) return msg;
    throw new Error("subscription ended without a message");
  } finally {
    await sub.close();
  }
}

/** publish → consume in a `for await` loop continued with withTraceContext. */
async function checkPublishConsume(b: Broker, topic: string): Promise<void> {
  await b.createTopic(topic, { partitions: 2 });
  const receipt = await b.publish(topic, { n: 1 }, { key: "k", headers: { app: "x" } });
  const pub = await spanNamed(`publish ${topic}`, api.SpanKind.PRODUCER);
  assert.equal(pub.attributes["messaging.system"], "sluice");
  assert.equal(pub.attributes["messaging.destination.name"], topic);
  assert.equal(pub.attributes["messaging.operation.type"], "send");
  assert.equal(pub.attributes["messaging.message.id"], `${receipt.partition}-${receipt.offset}`);

  const msg = await firstMessage(b, topic);
  assert.equal(header(msg.headers, "app"), "x");
  assert.equal(header(msg.headers, "traceparent"), `00-${pub.traceId}-${pub.spanId}-01`);
  assert.equal(api.trace.getSpanContext(traceContextOf(msg) as api.Context)?.traceId, pub.traceId);

  let inner: api.SpanContext | undefined;
  const out = await withTraceContext(msg, async () => {
    await new Promise((r) => setImmediate(r));
    inner = api.trace.getActiveSpan()?.spanContext();
    return 7;
  });
  assert.equal(out, 7);
  const proc = await spanNamed(`process ${topic}`, api.SpanKind.CONSUMER);
  assert.equal(proc.traceId, pub.traceId, "the consumer continues the producer's trace");
  assert.equal(proc.parentSpanId, pub.spanId);
  assert.equal(proc.attributes["messaging.operation.type"], "process");
  assert.equal(inner?.spanId, proc.spanId, "the process span is active inside withTraceContext");
  // Through a server too: the client's span only (the server stores the client's batch as is).
  assert.equal(finished.filter((s) => s.name === `publish ${topic}`).length, 1);
}

/** enqueue → process(): the handler runs in a process span continuing the enqueue's trace. */
async function checkEnqueueProcess(b: { queue<T>(name: string): Queue<T> }, name: string): Promise<void> {
  const q = b.queue<{ n: number }>(name);
  const r = await q.enqueue({ n: 1 }, { headers: { app: "y" } });
  const enq = await spanNamed(`enqueue ${name}`, api.SpanKind.PRODUCER);
  assert.equal(enq.attributes["messaging.message.id"], r.id);
  assert.equal(enq.attributes["messaging.operation.name"], "enqueue");

  const ac = new AbortController();
  let seen: { job: Job<{ n: number }>; active: api.SpanContext | undefined } | null = null;
  const running = q.process(
    async (job) => {
      seen = { job, active: api.trace.getActiveSpan()?.spanContext() };
      ac.abort();
    },
    { signal: ac.signal },
  );
  await running;
  const proc = await spanNamed(`process ${name}`, api.SpanKind.CONSUMER);
  assert.ok(seen !== null);
  const { job, active } = seen as { job: Job<{ n: number }>; active: api.SpanContext | undefined };
  assert.equal(header(job.headers, "app"), "y");
  assert.equal(header(job.headers, "traceparent"), `00-${enq.traceId}-${enq.spanId}-01`);
  assert.equal(proc.traceId, enq.traceId, "processing continues the enqueue's trace");
  assert.equal(proc.parentSpanId, enq.spanId);
  assert.equal(proc.attributes["messaging.message.id"], r.id);
  assert.equal(active?.spanId, proc.spanId, "the process span is active in the handler");
  assert.equal(finished.filter((s) => s.name === `enqueue ${name}`).length, 1, "one producer span, none on the server");
}

// ── With tracing on ───────────────────────────────────────────────────────────────────────

test("embedded: publish → consume (withTraceContext) carries one trace", async () => {
  await withEmbedded((b) => checkPublishConsume(b, "orders"));
});

test("embedded: enqueue → process() carries one trace", async () => {
  await withEmbedded((b) => checkEnqueueProcess(b, "emails"));
});

test("server: publish → consume through startServer + connect carries one trace", { timeout: 60_000 }, async () => {
  await withServer((client) => checkPublishConsume(client, "remote-orders"));
});

test("server: enqueue → process() through startServer + connect carries one trace", { timeout: 60_000 }, async () => {
  await withServer((client) => checkEnqueueProcess(client, "remote-emails"));
});

test("server: enqueue by the client, processed embedded on the server's broker: one trace", { timeout: 60_000 }, async () => {
  await withServer(async (client, broker) => {
    await client.queue<{ n: number }>("mixed").enqueue({ n: 1 });
    const enq = await spanNamed("enqueue mixed", api.SpanKind.PRODUCER);
    const ac = new AbortController();
    await broker.queue("mixed").process(() => ac.abort(), { signal: ac.signal });
    const proc = await spanNamed("process mixed", api.SpanKind.CONSUMER);
    assert.equal(proc.traceId, enq.traceId);
    assert.equal(proc.parentSpanId, enq.spanId);
  });
});

test("a publish inside the application's span is its child; a traceparent the user set is kept", async () => {
  await withEmbedded(async (b) => {
    await b.createTopic("nested", { partitions: 1 });
    const appSpan = await userTracer.startActiveSpan("http request", async (span) => {
      await b.publish("nested", "a");
      span.end();
      return span.spanContext();
    });
    const pub = await spanNamed("publish nested", api.SpanKind.PRODUCER);
    assert.equal(pub.traceId, appSpan.traceId);
    assert.equal(pub.parentSpanId, appSpan.spanId);

    const own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    await b.publish("nested", "b", { headers: { traceparent: own, tracestate: "k=v" } });
    const sub = b.subscribe("nested", { group: "g", start: "earliest" });
    const got: Message[] = [];
    for await (const m of sub) {
      got.push(m);
      if (got.length === 2) break;
    }
    await sub.close();
    assert.equal(header(got[1].headers, "traceparent"), own, "the user's traceparent wins");
    assert.equal(header(got[1].headers, "tracestate"), "k=v");
    const ctx = traceContextOf(got[1]) as api.Context;
    assert.equal(api.trace.getSpanContext(ctx)?.traceId, "0af7651916cd43dd8448eb211c80319c");
    assert.equal(api.trace.getSpanContext(ctx)?.traceState?.get("k"), "v");
  });
});

test("publishBatch and enqueueBatch: one span per batch, linked to the contexts records carried", async () => {
  await withEmbedded(async (b) => {
    await b.createTopic("batch", { partitions: 2 });
    const own = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    await b.publishBatch("batch", [{ value: 1 }, { value: 2, headers: { traceparent: own } }, { value: 3, key: "x" }]);
    const pub = await spanNamed("publish batch", api.SpanKind.PRODUCER);
    assert.equal(pub.attributes["messaging.batch.message_count"], 3);
    assert.deepEqual(pub.links.map((l) => l.context.traceId), ["4bf92f3577b34da6a3ce929d0e0e4736"]);
    const { records } = await b.fetch("batch", 0, 0);
    const { records: more } = await b.fetch("batch", 1, 0);
    const tps = [...records, ...more].map((r) => header(r.headers, "traceparent")).sort();
    assert.deepEqual(tps, [own, `00-${pub.traceId}-${pub.spanId}-01`, `00-${pub.traceId}-${pub.spanId}-01`].sort());

    await b.queue("jobs").enqueueBatch([{ data: 1 }, { data: 2 }]);
    const enq = await spanNamed("enqueue jobs", api.SpanKind.PRODUCER);
    assert.equal(enq.attributes["messaging.batch.message_count"], 2);
  });
});

test("processOrdered: a process span per handler call, continuing the publish's trace; failures marked", async () => {
  await withEmbedded(async (b) => {
    await b.createTopic("ordered", { partitions: 1 });
    await b.publish("ordered", "x");
    const pub = await spanNamed("publish ordered", api.SpanKind.PRODUCER);
    const ac = new AbortController();
    const sub = b.subscribe<string>("ordered", { group: "g", start: "earliest", signal: ac.signal });
    let calls = 0;
    await processOrdered(
      sub,
      async () => {
        if (++calls === 1) throw new Error("first attempt fails");
        ac.abort();
      },
      { maxAttempts: 2, minDelayMs: 1, maxDelayMs: 1, signal: ac.signal },
    );
    await sub.close();
    await waitUntil(() => finished.filter((s) => s.name === "process ordered").length === 2, "two process spans");
    const procs = finished.filter((s) => s.name === "process ordered");
    for (const p of procs) {
      assert.equal(p.traceId, pub.traceId);
      assert.equal(p.parentSpanId, pub.spanId);
    }
    assert.deepEqual(procs.map((p) => p.status.code), [api.SpanStatusCode.ERROR, api.SpanStatusCode.UNSET]);
  });
});

test("withTraceContext over a batch of messages: one process span linked to each publish", async () => {
  await withEmbedded(async (b) => {
    await b.createTopic("many", { partitions: 1 });
    await b.publish("many", 1);
    await b.publish("many", 2);
    const pubs = await waitUntil(() => {
      const ps = finished.filter((s) => s.name === "publish many");
      return ps.length === 2 ? ps : null;
    }, "two publish spans");
    const ac = new AbortController();
    const sub = b.subscribe("many", { group: "g", start: "earliest", signal: ac.signal });
    const got: Message[] = [];
    for await (const batch of sub.batches({ maxMessages: 2, maxWaitMs: 1000 })) {
      got.push(...batch.messages);
      if (got.length >= 2) break;
    }
    assert.equal(await withTraceContext(got, async () => 3), 3);
    await sub.close();
    const proc = await spanNamed("process many", api.SpanKind.CONSUMER);
    assert.equal(proc.attributes["messaging.batch.message_count"], 2);
    assert.deepEqual(proc.links.map((l) => l.context.spanId).sort(), pubs.map((p) => p.spanId).sort());
  });
});

// ── With tracing off (these change the module's state: they run last) ─────────────────────

async function checkHeadersUnchanged(b: EmbeddedBroker, suffix: string): Promise<void> {
  const before = finished.length;
  await b.createTopic(`plain-${suffix}`, { partitions: 1 });
  await b.publish(`plain-${suffix}`, 1, { headers: { app: "z" } });
  await b.publishBatch(`plain-${suffix}`, [{ value: 2 }]);
  const { records } = await b.fetch(`plain-${suffix}`, 0, 0);
  assert.deepEqual(records.map((r) => Object.keys(r.headers)), [["app"], []]);
  const q = b.queue(`plain-${suffix}`);
  await q.enqueue(1, { headers: { app: "z" } });
  const ac = new AbortController();
  let headers: string[] = [];
  let active: api.Span | undefined;
  await q.process(
    (job) => {
      headers = Object.keys(job.headers);
      active = api.trace.getActiveSpan();
      ac.abort();
    },
    { signal: ac.signal },
  );
  assert.deepEqual(headers, ["app"]);
  assert.equal(active, undefined);
  assert.equal(withTraceContext(records[0], () => 5), 5);
  assert.equal(traceContextOf(records[0]), undefined);
  assert.equal(finished.length, before, "no spans");
}

test("tracing off (no tracer provider registered): no spans, headers unchanged", async () => {
  api.trace.disable();
  try {
    await withEmbedded((b) => checkHeadersUnchanged(b, "noprovider"));
  } finally {
    api.trace.setGlobalTracerProvider(provider);
    await loadTracing();
  }
});

test("tracing off (@opentelemetry/api absent): no spans, headers unchanged", async () => {
  setTracingApi(null);
  await withEmbedded((b) => checkHeadersUnchanged(b, "absent"));
});

test("@opentelemetry/api not installed: the import fails quietly, nothing is traced, headers unchanged (child process)", { timeout: 60_000 }, () => {
  const dir = tmpDir();
  try {
    // A module hook that makes the package unresolvable, as if it were not installed.
    writeFileSync(
      join(dir, "hooks.mjs"),
      `export async function resolve(s, c, next) {
        if (s === "@opentelemetry/api") { const e = new Error("Cannot find package '@opentelemetry/api'"); e.code = "ERR_MODULE_NOT_FOUND"; throw e; }
        return next(s, c);
      }`,
    );
    writeFileSync(join(dir, "register.mjs"), `import { register } from "node:module"; register(${JSON.stringify(new URL(`file://${join(dir, "hooks.mjs")}`).href)});`);
    const broker = new URL("../src/broker/broker.js", import.meta.url).href;
    const tracingModule = new URL("../src/observability/tracing.js", import.meta.url).href;
    writeFileSync(
      join(dir, "main.mjs"),
      `import { openBroker } from ${JSON.stringify(broker)};
      import * as t from ${JSON.stringify(tracingModule)};
      const b = await openBroker({ dataDir: ${JSON.stringify(join(dir, "data"))}, retentionCheckIntervalMs: 0 });
      await b.createTopic("t", { partitions: 1 });
      await b.publish("t", 1, { headers: { app: "z" } });
      const { records } = await b.fetch("t", 0, 0);
      const q = b.queue("q");
      await q.enqueue(1, { headers: { app: "z" } });
      const ac = new AbortController();
      let jobHeaders = null;
      await q.process((job) => { jobHeaders = Object.keys(job.headers); ac.abort(); }, { signal: ac.signal });
      await b.close();
      let importable = true;
      try { await import("@opentelemetry/api"); } catch { importable = false; }
      console.log(JSON.stringify({ tracing: t.tracing, importable, headers: Object.keys(records[0].headers), jobHeaders }));`,
    );
    const r = spawnSync(process.execPath, ["--import", join(dir, "register.mjs"), join(dir, "main.mjs")], { encoding: "utf8", timeout: 50_000 });
    assert.equal(r.status, 0, r.stderr);
    const out = JSON.parse(r.stdout.trim().split("\n").pop()!);
    assert.deepEqual(out, { tracing: null, importable: false, headers: ["app"], jobHeaders: ["app"] });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
