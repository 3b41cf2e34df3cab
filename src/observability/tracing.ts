// SPDX-License-Identifier: Apache-2.0
/**
 * OpenTelemetry tracing, in this one place. W3C trace context (`traceparent`, `tracestate`)
 * travels in ordinary record headers from a publish or an enqueue to whoever consumes or
 * processes it, embedded and through the server (headers pass the wire unchanged).
 *
 * `@opentelemetry/api` is an optional peer dependency. It is looked for once, lazily, when a
 * broker is opened or a client connects (`loadTracing()`, a dynamic import allowed to fail);
 * `SLUICE_TRACING=off` skips the lookup. Tracing is on when it was found and a tracer provider
 * is registered (checked at each open / connect: the API alone hands out no-op tracers).
 * While it is off, `tracing` below is null and every hook costs one branch on a module
 * binding: no import, no span, no header, no promise (the publish path does no extra async
 * hop per message; with tracing on it does none either: the span ends in a reaction to the
 * engine's own promise, which is returned as is).
 *
 * With the API present, sluice makes (messaging semantic conventions, `messaging.system` =
 * `sluice`):
 *  - a PRODUCER span per publish / enqueue call (`publish <topic>`, `enqueue <queue>`), per
 *    batch for `publishBatch` / `enqueueBatch` (`messaging.batch.message_count`), linked to the
 *    contexts records already carried; its context goes into each record's headers unless the
 *    record already has a `traceparent` (the user's wins, and the record is left untouched);
 *  - a CONSUMER span `process <queue>` around each `process()` handler call and
 *    `process <topic>` around each `processOrdered` handler call, a child of the context the
 *    message carries, active while the handler runs (spans the handler makes are its children);
 *  - for `for await` loops, `withTraceContext(msg, fn)` does the same around `fn`, and
 *    `traceContextOf(msg)` returns the carried context.
 * A span that does not record (sampled out) still carries its context; nothing waits for it.
 */
import type * as Otel from "@opentelemetry/api";
import type { Headers } from "../value-types.js";
import type { Message, PublishOptions, PublishReceipt, PublishRecord } from "../types.js";
import type { EnqueueItem, EnqueueResult, Job } from "../queues/types.js";
import { sluiceVersion } from "./build-info.js";

type Api = typeof Otel;

/**
 * An OpenTelemetry `Context` (structurally the API's own interface: pass it to
 * `context.with(ctx, fn)` or as a span's parent). Declared here so that sluice's types never
 * need `@opentelemetry/api` installed.
 */
export interface TraceContext {
  getValue(key: symbol): unknown;
  setValue(key: symbol, value: unknown): TraceContext;
  deleteValue(key: symbol): TraceContext;
}

/** What `withTraceContext` and `traceContextOf` read: a topic message or a job. */
export type Traced = Pick<Message, "headers"> | Pick<Job, "headers">;

export const TRACEPARENT = "traceparent";
export const TRACESTATE = "tracestate";
/** A batch span links to at most this many contexts its records carried. */
const MAX_LINKS = 128;
const W3C = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-|$)/;

type AnyHeaders = Record<string, string | Uint8Array>;

const getter: Otel.TextMapGetter<AnyHeaders> = {
  keys: (c) => Object.keys(c),
  get: (c, k) => {
    const v = c[k];
    return v === undefined ? undefined : typeof v === "string" ? v : Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("latin1");
  },
};
const setter: Otel.TextMapSetter<Record<string, string>> = { set: (c, k, v) => void (c[k] = v) };

function isThenable(v: unknown): v is PromiseLike<unknown> {
  return v !== null && (typeof v === "object" || typeof v === "function") && typeof (v as { then?: unknown }).then === "function";
}

/** Headers we may add to: absent or a plain object (anything else is left for validation to refuse). */
function injectable(h: unknown): h is Headers | undefined {
  return h === undefined || (typeof h === "object" && h !== null && !(h instanceof Uint8Array));
}

/**
 * What the hooks call while tracing is on. Declared without `@opentelemetry/api` types so that
 * sluice's declaration files never need the optional peer installed.
 */
export interface TracingHooks {
  /** `publish()`: a PRODUCER span around `send`, its context injected into the record. */
  publishOne(topic: string, opts: PublishOptions | undefined, send: (opts: PublishOptions | undefined) => Promise<PublishReceipt>): Promise<PublishReceipt>;
  /** `publishBatch()`: one PRODUCER span for the batch. */
  publishBatch(topic: string, records: PublishRecord[], send: (records: PublishRecord[]) => Promise<PublishReceipt[]>): Promise<PublishReceipt[]>;
  /** `enqueue()` / `enqueueBatch()`: one PRODUCER span per call. */
  enqueue(queue: string, items: EnqueueItem[], send: (items: EnqueueItem[]) => Promise<EnqueueResult[]>): Promise<EnqueueResult[]>;
  /** A `process()` handler wrapped: a CONSUMER span `process <queue>` around each call. */
  jobHandler<J extends Job<unknown>>(queue: string, fn: (job: J) => unknown): (job: J) => unknown;
  /** A `processOrdered` handler wrapped: a CONSUMER span `process <topic>` around each call. */
  messageHandler<M extends Message<unknown>>(fn: (msg: M) => unknown): (msg: M) => unknown;
}

/** The live tracer: exists only once `@opentelemetry/api` was loaded and a provider registered. */
class Tracing implements TracingHooks {
  private readonly tracer: Otel.Tracer;

  constructor(readonly api: Api) {
    this.tracer = api.trace.getTracer("sluice", sluiceVersion());
  }

  /** `publish()`: a PRODUCER span around `send`, its context injected into the record. */
  publishOne(topic: string, opts: PublishOptions | undefined, send: (opts: PublishOptions | undefined) => Promise<PublishReceipt>): Promise<PublishReceipt> {
    // Options or headers of the wrong shape: left for the publish's validation to refuse.
    if ((opts !== undefined && (typeof opts !== "object" || opts === null)) || !injectable(opts?.headers)) return send(opts);
    const s = this.startSend("publish", topic, [opts?.headers], 1);
    if (s === null) return send(opts);
    const headers = s.carrier === null ? undefined : withCarrier(opts?.headers, s.carrier);
    return this.finish(s.span, () => send(headers === undefined ? opts : { ...opts, headers }), (r) => {
      s.span.setAttribute("messaging.destination.partition.id", String(r.partition));
      s.span.setAttribute("messaging.message.id", `${r.partition}-${r.offset}`);
    });
  }

  /** `publishBatch()`: one PRODUCER span for the batch. */
  publishBatch(topic: string, records: PublishRecord[], send: (records: PublishRecord[]) => Promise<PublishReceipt[]>): Promise<PublishReceipt[]> {
    const s = this.startSend("publish", topic, records.map((r) => (typeof r === "object" && r !== null ? r.headers : undefined)), records.length);
    if (s === null) return send(records);
    const carrier = s.carrier;
    const out = carrier === null ? records : records.map((r) => (typeof r !== "object" || r === null || !injectable(r.headers) || hasTraceparent(r.headers) ? r : { ...r, headers: withCarrier(r.headers, carrier) }));
    return this.finish(s.span, () => send(out), (rs) => {
      if (rs.length === 1) s.span.setAttribute("messaging.message.id", `${rs[0].partition}-${rs[0].offset}`);
    });
  }

  /** `enqueue()` / `enqueueBatch()`: one PRODUCER span per call. */
  enqueue(queue: string, items: EnqueueItem[], send: (items: EnqueueItem[]) => Promise<EnqueueResult[]>): Promise<EnqueueResult[]> {
    const s = this.startSend("enqueue", queue, items.map((it) => (typeof it === "object" && it !== null ? it.headers : undefined)), items.length);
    if (s === null) return send(items);
    const carrier = s.carrier;
    const out = carrier === null ? items : items.map((it) => (typeof it !== "object" || it === null || !injectable(it.headers) || hasTraceparent(it.headers) ? it : { ...it, headers: withCarrier(it.headers, carrier) }));
    return this.finish(s.span, () => send(out), (rs) => {
      if (rs.length === 1) s.span.setAttribute("messaging.message.id", rs[0].id);
    });
  }

  /** A `process()` handler wrapped: a CONSUMER span `process <queue>` around each call. */
  jobHandler<J extends Job<unknown>>(queue: string, fn: (job: J) => unknown): (job: J) => unknown {
    return (job) =>
      this.runProcess(job.headers, queue, fn, job, {
        "messaging.message.id": job.id,
        "messaging.sluice.job.attempt": job.attempt,
      });
  }

  /** A `processOrdered` handler wrapped: a CONSUMER span `process <topic>` around each call. */
  messageHandler<M extends Message<unknown>>(fn: (msg: M) => unknown): (msg: M) => unknown {
    return (msg) => this.runProcess(msg.headers, msg.topic, fn, msg, messageAttributes(msg));
  }

  /** The context `headers` carry, over `base` (`base` itself when they carry none). */
  extract(headers: AnyHeaders | undefined, base: Otel.Context): Otel.Context {
    if (headers === undefined || headers === null || typeof headers !== "object") return base;
    const api = this.api;
    const viaPropagator = api.propagation.extract(base, headers, getter);
    if (api.trace.getSpan(viaPropagator) !== api.trace.getSpan(base)) return viaPropagator;
    // No global propagator registered (or it ignored the headers): read W3C ourselves.
    const tp = getter.get(headers, TRACEPARENT);
    const m = typeof tp === "string" ? W3C.exec(tp) : null;
    if (m === null || m[1] === "ff") return base;
    const ts = getter.get(headers, TRACESTATE);
    const sc: Otel.SpanContext = {
      traceId: m[2],
      spanId: m[3],
      traceFlags: parseInt(m[4], 16) & 1,
      isRemote: true,
      traceState: typeof ts === "string" && ts.length > 0 ? api.createTraceState(ts) : undefined,
    };
    return api.isSpanContextValid(sc) ? api.trace.setSpanContext(base, sc) : base;
  }

  /** Runs `fn(arg)` in a CONSUMER span that continues the trace `headers` carry. */
  runProcess<A, R>(headers: AnyHeaders | undefined, destination: string | undefined, fn: (arg: A) => R, arg: A, attributes: Otel.Attributes = {}, links?: Otel.Link[]): R {
    const api = this.api;
    const parent = this.extract(headers, api.context.active());
    const span = this.tracer.startSpan(
      destination === undefined ? "process" : `process ${destination}`,
      {
        kind: api.SpanKind.CONSUMER,
        attributes: {
          "messaging.system": "sluice",
          ...(destination === undefined ? {} : { "messaging.destination.name": destination }),
          "messaging.operation.type": "process",
          "messaging.operation.name": "process",
          ...attributes,
        },
        links,
      },
      parent,
    );
    let r: R;
    try {
      r = api.context.with(api.trace.setSpan(parent, span), fn, undefined, arg);
    } catch (e) {
      failed(api, span, e);
      throw e;
    }
    if (!isThenable(r)) {
      span.end();
      return r;
    }
    return r.then(
      (v) => {
        span.end();
        return v;
      },
      (e: unknown) => {
        failed(api, span, e);
        throw e;
      },
    ) as R;
  }

  /**
   * Starts a PRODUCER span for a send of `count` records whose headers are `headers`. Null when
   * there is nothing to do: the span does not record and no valid context exists to inject.
   * `carrier`: the headers to add to records without a `traceparent` (null: none to add).
   */
  private startSend(op: "publish" | "enqueue", destination: string, headers: (Headers | undefined)[], count: number): { span: Otel.Span; carrier: Record<string, string> | null } | null {
    const api = this.api;
    let parent = api.context.active();
    const links: Otel.Link[] = [];
    if (count === 1 && api.trace.getSpan(parent) === undefined) {
      // One record that carries a context and no ambient span: continue that trace (a server
      // publishing what an HTTP client sent, a relay forwarding a record).
      parent = this.extract(headers[0], parent);
    } else if (count > 1) {
      links.push(...this.linksOf(headers));
    }
    const attributes: Otel.Attributes = {
      "messaging.system": "sluice",
      "messaging.destination.name": destination,
      "messaging.operation.type": "send",
      "messaging.operation.name": op,
    };
    if (count !== 1) attributes["messaging.batch.message_count"] = count;
    const span = this.tracer.startSpan(`${op} ${destination}`, { kind: api.SpanKind.PRODUCER, attributes, links }, parent);
    const valid = api.isSpanContextValid(span.spanContext());
    if (!valid && !span.isRecording()) return null;
    if (!valid) return { span, carrier: null };
    const carrier: Record<string, string> = {};
    api.propagation.inject(api.trace.setSpan(parent, span), carrier, setter);
    if (carrier[TRACEPARENT] === undefined) {
      // No global propagator registered: write W3C trace context ourselves.
      const sc = span.spanContext();
      carrier[TRACEPARENT] = `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, "0")}`;
      const ts = sc.traceState?.serialize();
      if (ts !== undefined && ts.length > 0) carrier[TRACESTATE] = ts;
    }
    return { span, carrier };
  }

  /** Links to the contexts these headers carry (at most MAX_LINKS). */
  linksOf(headers: readonly (AnyHeaders | undefined)[]): Otel.Link[] {
    const links: Otel.Link[] = [];
    for (const h of headers) {
      if (links.length >= MAX_LINKS) break;
      if (!hasTraceparent(h)) continue;
      const sc = this.api.trace.getSpanContext(this.extract(h, this.api.ROOT_CONTEXT));
      if (sc !== undefined) links.push({ context: sc });
    }
    return links;
  }

  /** Runs `send`, ending `span` when it settles; returns `send`'s own promise. */
  private finish<R>(span: Otel.Span, send: () => Promise<R>, ok: (r: R) => void): Promise<R> {
    let p: Promise<R>;
    try {
      p = send();
    } catch (e) {
      failed(this.api, span, e);
      throw e;
    }
    if (!span.isRecording()) return p;
    p.then(
      (r) => {
        ok(r);
        span.end();
      },
      (e: unknown) => failed(this.api, span, e),
    );
    return p;
  }
}

function failed(api: Api, span: Otel.Span, e: unknown): void {
  if (e instanceof Error) span.recordException(e);
  span.setStatus({ code: api.SpanStatusCode.ERROR, message: e instanceof Error ? e.message : String(e) });
  span.end();
}

function hasTraceparent(h: AnyHeaders | undefined): boolean {
  return h !== undefined && h !== null && typeof h === "object" && Object.prototype.hasOwnProperty.call(h, TRACEPARENT);
}

/** The user's headers plus the carrier's; a `traceparent` the user set wins (with everything else they set). */
function withCarrier(h: Headers | undefined, carrier: Record<string, string>): Headers {
  if (h === undefined) return carrier;
  if (hasTraceparent(h)) return h;
  const out: Headers = { ...carrier };
  for (const k of Object.keys(h)) out[k] = h[k];
  return out;
}

function messageAttributes(msg: Message<unknown>): Otel.Attributes {
  return {
    "messaging.destination.partition.id": String(msg.partition),
    "messaging.message.id": `${msg.partition}-${msg.offset}`,
  };
}

/**
 * The tracer while tracing is on: `@opentelemetry/api` loaded and a tracer provider registered
 * (as of the last `loadTracing()`). Null otherwise. Hot paths test this binding and nothing else.
 */
export let tracing: TracingHooks | null = null;
/** The same object as `tracing`, with its API (for traceContextOf / withTraceContext). */
let live: Tracing | null = null;

function setLive(t: Tracing | null): void {
  live = t;
  tracing = t;
}

/** The loaded API (null: absent, not yet looked for, or `SLUICE_TRACING=off`). */
let loaded: Api | null = null;
let loading: Promise<void> | null = null;
/** Kept in a variable so that TypeScript does not resolve the optional peer at build time. */
const OTEL_API = "@opentelemetry/api";

/**
 * Looks for `@opentelemetry/api` once per process (a failed import means no tracing, for good;
 * `SLUICE_TRACING=off` skips the lookup), then turns tracing on when a tracer provider is
 * registered, off when none is. openBroker() and connect() await this: register the provider
 * (start the OpenTelemetry SDK) before opening a broker or connecting.
 */
export async function loadTracing(): Promise<void> {
  if (loading === null) {
    loading =
      process.env.SLUICE_TRACING === "off"
        ? Promise.resolve()
        : import(OTEL_API).then(
            (m: Api) => {
              if (m?.trace !== undefined) loaded = m;
            },
            () => {},
          );
  }
  await loading;
  const api = loaded;
  setLive(api !== null && providerRegistered(api) ? (live?.api === api ? live : new Tracing(api)) : null);
}

/**
 * Whether a tracer provider is registered. The API's global provider is a proxy that hands out
 * no-op tracers until one is: the proxy's `getDelegateTracer` says which (no span is made).
 */
function providerRegistered(api: Api): boolean {
  const p = api.trace.getTracerProvider() as Partial<Otel.ProxyTracerProvider>;
  if (typeof p.getDelegateTracer !== "function") return true;
  return p.getDelegateTracer("sluice") !== undefined;
}

/**
 * @internal Tests: use this API from now on, tracing on whatever provider is registered
 * (`null`: behave as if `@opentelemetry/api` were absent). Takes a fresh tracer.
 */
export function setTracingApi(api: object | null): void {
  loading = Promise.resolve();
  loaded = api as Api | null;
  setLive(loaded === null ? null : new Tracing(loaded));
}

/**
 * The trace context a message or job carries (its `traceparent` / `tracestate` headers), as an
 * OpenTelemetry `Context` over the active one; undefined when tracing is off or it carries none.
 *
 * @example
 * for await (const msg of sub) {
 *   const parent = traceContextOf(msg);
 *   const span = tracer.startSpan("handle order", { kind: SpanKind.CONSUMER }, parent);
 *   ...
 * }
 */
export function traceContextOf(msg: Traced): TraceContext | undefined {
  const t = live;
  if (t === null || msg === null || typeof msg !== "object") return undefined;
  const base = t.api.context.active();
  const ctx = t.extract(msg.headers, base);
  return ctx === base ? undefined : (ctx as TraceContext);
}

/**
 * Runs `fn` in a CONSUMER span `process <topic or queue>` that continues the trace the message
 * or job carries, active while `fn` runs; the span ends when `fn` (or its promise) does, with
 * an error status if it throws. Without tracing it just calls `fn`. For `for await` loops; the
 * span name uses the message's topic, or `opts.destination` (a job's queue name).
 *
 * Given several messages (a `sub.batches()` batch's `messages`, jobs handled together), the
 * span is a child of the active context and **links** to each context they carry (at most
 * 128), with `messaging.batch.message_count`, as the messaging conventions say for batches.
 *
 * @example
 * for await (const job of emails.work()) {
 *   await withTraceContext(job, () => send(job.data), { destination: "emails" });
 *   await job.ack();
 * }
 */
export function withTraceContext<R>(msg: Traced | readonly Traced[], fn: () => R, opts: { destination?: string } = {}): R {
  const t = live;
  if (t === null || msg === null || typeof msg !== "object") return fn();
  if (Array.isArray(msg)) {
    const msgs = msg as readonly Traced[];
    const first = msgs[0] as Partial<Message<unknown>> | undefined;
    const destination = opts.destination ?? (typeof first?.topic === "string" ? first.topic : undefined);
    const links = t.linksOf(msgs.map((x) => (x !== null && typeof x === "object" ? x.headers : undefined)));
    return t.runProcess(undefined, destination, fn, undefined, { "messaging.batch.message_count": msgs.length }, links);
  }
  const m = msg as Partial<Message<unknown>> & Partial<Job<unknown>>;
  const destination = opts.destination ?? (typeof m.topic === "string" ? m.topic : undefined);
  const attributes: Otel.Attributes =
    typeof m.topic === "string" && typeof m.partition === "number" ? messageAttributes(m as Message<unknown>) : typeof m.id === "string" ? { "messaging.message.id": m.id } : {};
  return t.runProcess(m.headers, destination, fn, undefined, attributes);
}
