// SPDX-License-Identifier: Apache-2.0
/**
 * HTTP port: health (`/healthz` liveness, `/readyz` readiness), Prometheus `/metrics`, the web
 * dashboard's static files (`/`, `/dashboard/...`: docs/dashboard.md), admin and simple JSON
 * produce/consume for callers without the client. Request bodies are limited while they
 * stream in (Content-Length is checked first; a body that grows past `maxBodyBytes` is cut off
 * with 413), so a large or endless upload never sits in memory. Every route is one entry of
 * `ROUTES` (method, path pattern, handler).
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer, type ServerOptions as HttpsServerOptions } from "node:https";
import { BodyTooLargeError, BrokerError, ForbiddenError, httpStatusOf, InternalError, NotFoundError, QueueNotFoundError, ValidationError } from "../errors.js";
import type { BrokerHost } from "../broker/host.js";
import type { ConsumedRecord, PublishRecord, PublishValue, ResetTarget, TopicAlteration } from "../types.js";
import { errorToWire } from "../wire/index.js";
import { DEFAULT_BROWSE_LIMIT } from "../queues/config.js";
import type { BrowseOptions, EnqueueItem } from "../queues/types.js";
import { HTTP_DEFAULT_FETCH_BYTES, HTTP_MAX_FETCH_BYTES, MAX_HTTP_ITEMS_PER_REQUEST } from "./limits.js";
import { DASHBOARD_PATHS, dashboardAsset } from "./dashboard/static.js";
import type { ServerAuth } from "./auth.js";
import type { AuditActor } from "../security/audit/record.js";
import { OPERATIONS, type Need, type Operation, type ResourceType } from "../security/acl/model.js";
import type { Gate } from "./authorization.js";
import { clusterNeed, groupNeed, queueNeed, topicNeed } from "./permissions.js";

export interface HttpOptions {
  broker: BrokerHost;
  maxBodyBytes: number;
  isReady(): boolean;
  stats(): Record<string, unknown>;
  /** What the probes report besides their status: version, pid, data dir, uptime. */
  info(): Record<string, unknown>;
  /** `GET /metrics` in the Prometheus text format (a prom-client Registry); absent: 404. */
  metrics?: MetricsEndpoint;
  /** Serve HTTPS with these options (src/server/tls.ts) instead of plain HTTP. */
  tls?: HttpsServerOptions;
  /** Credentials check for every path but the probes (src/server/auth.ts); absent: open. */
  auth?: ServerAuth;
  /** Authorization of authenticated requests (src/server/authorization.ts); absent: open. */
  authz?: Gate;
}

/**
 * Paths answered without credentials (AUTH-3): the probes, which load balancers and
 * orchestrators call, and the dashboard's static files, the same for everyone and shipped in
 * the package: the page must load to show its own login form, and every API call it then makes
 * carries the credential typed there.
 */
const OPEN_PATHS = new Set(["/healthz", "/readyz", ...DASHBOARD_PATHS]);
const CHALLENGE = ['Basic realm="sluice", charset="UTF-8"', 'Bearer realm="sluice"'];

/** The part of a prom-client Registry the `/metrics` route needs. */
export interface MetricsEndpoint {
  readonly contentType: string;
  metrics(): Promise<string>;
}

/** A reply that is not JSON (the Prometheus exposition, the dashboard's files). */
class TextReply {
  constructor(
    readonly contentType: string,
    readonly text: string,
    readonly headers: Record<string, string> = {},
  ) {}
}

/** The status of a failed request: the error class's (src/errors.ts); a non-sluice error is
 * answered as `INTERNAL`. */
function statusFor(err: unknown): number {
  return err instanceof BrokerError ? httpStatusOf(err) : InternalError.spec.httpStatus;
}

function readBody(req: IncomingMessage, maxBytes: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers["content-length"] ?? -1);
    if (declared > maxBytes) {
      reject(new BodyTooLargeError(`request body of ${declared} bytes exceeds the limit of ${maxBytes} bytes`));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    req.on("data", (c: Buffer) => {
      if (done) return;
      size += c.length;
      if (size > maxBytes) {
        done = true;
        chunks.length = 0;
        reject(new BodyTooLargeError(`request body exceeds the limit of ${maxBytes} bytes`));
        return;
      }
      chunks.push(c);
    });
    req.on("end", () => {
      if (done) return;
      done = true;
      if (size === 0) return resolve({});
      try {
        resolve(JSON.parse(Buffer.concat(chunks, size).toString("utf8")));
      } catch {
        reject(new ValidationError("request body is not valid JSON"));
      }
    });
    req.on("error", (e) => {
      if (!done) {
        done = true;
        reject(e);
      }
    });
  });
}

/** Delays an HTTP request by its quota debt (QUO-1). */
function holdFor(ms: number): Promise<void> {
  return ms > 0 ? new Promise((r) => setTimeout(r, ms)) : Promise.resolve();
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

/** JSON rendering of a consumed record: bytes become `{ "base64": ... }`. */
function recordToJson(r: ConsumedRecord): unknown {
  const enc = (b: Uint8Array | null): unknown => (b === null ? null : Buffer.from(b).toString("utf8"));
  const headers: Record<string, string> = {};
  for (const [k, v] of Object.entries(r.headers ?? {})) headers[k] = Buffer.from(v).toString("utf8");
  return {
    partition: r.partition,
    offset: r.offset,
    timestamp: r.timestamp,
    key: enc(r.key),
    value: r.value instanceof Uint8Array ? { base64: Buffer.from(r.value).toString("base64") } : r.value,
    headers,
  };
}

function jsonToRecord(x: unknown): PublishRecord {
  if (x === null || typeof x !== "object" || Array.isArray(x)) throw new ValidationError("each record must be an object");
  const o = x as Record<string, unknown>;
  let value = o.value as PublishValue;
  if (typeof o.valueBase64 === "string") value = Buffer.from(o.valueBase64, "base64");
  const rec: PublishRecord = { value: value === undefined ? null : value };
  if (o.key !== undefined && o.key !== null) {
    if (typeof o.key !== "string") throw new ValidationError("key must be a string");
    rec.key = o.key;
  }
  if (o.partition !== undefined) {
    if (!Number.isSafeInteger(o.partition)) throw new ValidationError("partition must be an integer");
    rec.partition = o.partition as number;
  }
  if (o.headers !== undefined) {
    if (o.headers === null || typeof o.headers !== "object") throw new ValidationError("headers must be an object of strings");
    const h: Record<string, string> = {};
    for (const [k, v] of Object.entries(o.headers)) {
      if (typeof v !== "string") throw new ValidationError(`header ${k} must be a string`);
      h[k] = v;
    }
    rec.headers = h;
  }
  return rec;
}

function intParam(url: URL, name: string, def?: number): number {
  const v = url.searchParams.get(name);
  if (v === null) {
    if (def === undefined) throw new ValidationError(`query parameter ${name} is required`);
    return def;
  }
  const n = Number(v);
  if (!Number.isSafeInteger(n)) throw new ValidationError(`query parameter ${name} must be an integer`);
  return n;
}

/** What a route handler gets: the request, its URL and the path parameters named in its pattern. */
interface RouteContext {
  broker: BrokerHost;
  opts: HttpOptions;
  req: IncomingMessage;
  url: URL;
  params: Record<string, string>;
  /** Who sent the request (src/server/auth.ts); null when the server runs without credentials
   * or the path is a probe. */
  principal: string | null;
  /** Throws the error for the first of `needs` the caller is not allowed (ACL-4). */
  check(needs: readonly Need[]): void;
  /** Keeps what the caller may see (ACL-4). */
  visible<T>(type: ResourceType, items: readonly T[], name: (item: T) => string): T[];
  /** Whether the caller may do `need` (always, on a server without credentials). */
  allows(need: Need): boolean;
  /** The caller's tenant (ACL-2), or null. */
  tenant(): string | null;
}

/** Who an HTTP request's administrative operation is audited as: its authenticated principal
 * ("anonymous" on a server without credentials) and the peer address. */
const actor = (c: RouteContext): AuditActor => ({ principal: c.principal ?? "anonymous", source: `${c.req.socket.remoteAddress}:${c.req.socket.remotePort}` });

/** The status and JSON body to answer with. */
type Reply = readonly [status: number, body: unknown];

interface Route {
  /** `*`: any method, matched on the exact path (the probes and stats). */
  method: string;
  /** Literal segments and `:name` parameters. */
  path: string;
  /** What the request needs to be allowed, checked before the handler (src/server/permissions.ts). */
  needs(c: RouteContext): Need[];
  handler(c: RouteContext): Reply | Promise<Reply>;
}

const body = async (c: RouteContext): Promise<Record<string, unknown>> => (await readBody(c.req, c.opts.maxBodyBytes)) as Record<string, unknown>;

const NONE = (): Need[] => [];
const topicP = (op: Operation) => (c: RouteContext): Need[] => [topicNeed(op, c.params.topic)];
const queueP = (op: Operation) => (c: RouteContext): Need[] => [queueNeed(op, c.params.queue)];
const clusterP = (op: Operation) => (): Need[] => [clusterNeed(op)];

const ROUTES: Route[] = [
  { method: "*", path: "/healthz", needs: NONE, handler: (c) => [200, { status: "ok", ...c.opts.info() }] },
  { method: "*", path: "/readyz", needs: NONE, handler: (c) => (c.opts.isReady() ? [200, { status: "ready", ...c.opts.info() }] : [503, { status: "not ready", ...c.opts.info() }]) },
  // Metrics name every topic, queue and group: only for those who may describe the cluster.
  { method: "*", path: "/metrics", needs: clusterP("describe"), handler: metricsText },
  { method: "*", path: "/v1/stats", needs: clusterP("describe"), handler: (c) => [200, c.opts.stats()] },
  // Only the caller's own identity: any logged-in principal may ask (the dashboard's header).
  { method: "GET", path: "/v1/whoami", needs: NONE, handler: whoami },
  // Lists show only what the caller may see (ACL-4).
  { method: "GET", path: "/v1/topics", needs: NONE, handler: async (c) => [200, { topics: c.visible("topic", await c.broker.listTopics(), (t) => t) }] },
  { method: "POST", path: "/v1/topics", needs: NONE, handler: createTopic }, // the name is in the body: checked there
  { method: "GET", path: "/v1/topics/:topic", needs: topicP("describe"), handler: async (c) => [200, await c.broker.describeTopic(c.params.topic)] },
  { method: "DELETE", path: "/v1/topics/:topic", needs: topicP("delete"), handler: deleteTopic },
  { method: "PATCH", path: "/v1/topics/:topic", needs: topicP("alter"), handler: async (c) => [200, await c.broker.alterTopic(c.params.topic, (await body(c)) as TopicAlteration, actor(c))] },
  { method: "POST", path: "/v1/topics/:topic/records", needs: topicP("publish"), handler: publishRecords },
  { method: "GET", path: "/v1/topics/:topic/partitions/:partition/records", needs: topicP("consume"), handler: fetchRecords },
  { method: "GET", path: "/v1/queues", needs: NONE, handler: async (c) => [200, { queues: c.visible("queue", await c.broker.listQueues(), (q) => q) }] },
  { method: "DELETE", path: "/v1/queues/:queue", needs: queueP("delete"), handler: deleteQueue },
  { method: "GET", path: "/v1/queues/:queue/stats", needs: queueP("describe"), handler: async (c) => [200, await c.broker.queue(c.params.queue).stats()] },
  { method: "POST", path: "/v1/queues/:queue/jobs", needs: queueP("publish"), handler: enqueueJobs },
  // A job's payload: reading it is consuming.
  { method: "GET", path: "/v1/queues/:queue/jobs/:id", needs: queueP("consume"), handler: getJob },
  // remove(id): {removed: true|false}; 409 JOB_ACTIVE for a leased job (JOB-4). Destroys a job unrun, as a purge does.
  { method: "DELETE", path: "/v1/queues/:queue/jobs/:id", needs: queueP("purge"), handler: async (c) => [200, { removed: await c.broker.queue(c.params.queue, undefined, actor(c)).remove(c.params.id) }] },
  { method: "GET", path: "/v1/queues/:queue/browse", needs: queueP("consume"), handler: browseJobs },
  { method: "GET", path: "/v1/queues/:queue/schedules", needs: queueP("describe"), handler: listSchedules },
  { method: "POST", path: "/v1/queues/:queue/purge", needs: queueP("purge"), handler: async (c) => [200, { purged: await c.broker.queue(c.params.queue, undefined, actor(c)).purge() }] },
  // Redrive from a dead-letter queue (e.g. /v1/queues/emails.dlq/redrive).
  { method: "POST", path: "/v1/queues/:queue/redrive", needs: (c) => [{ op: "redrive", type: "dlq", name: c.params.queue }], handler: redrive },
  { method: "GET", path: "/v1/groups/:group/topics/:topic/lag", needs: (c) => [groupNeed("describe", c.params.group), topicNeed("describe", c.params.topic)], handler: async (c) => [200, await c.broker.groupLag(c.params.group, c.params.topic)] },
  { method: "GET", path: "/v1/audit", needs: clusterP("admin"), handler: auditList },
  { method: "GET", path: "/v1/groups", needs: NONE, handler: async (c) => [200, { groups: c.visible("topic", c.visible("group", await c.broker.listGroups(), (g) => g.group), (g) => g.topic) }] },
  { method: "POST", path: "/v1/groups/:group/topics/:topic/reset", needs: (c) => [topicNeed("describe", c.params.topic)], handler: resetGroup },
  // The web dashboard (docs/dashboard.md): static files only; its actions use the routes above.
  ...DASHBOARD_PATHS.map((path): Route => ({ method: "*", path, needs: NONE, handler: dashboardFile })),
];

async function dashboardFile(c: RouteContext): Promise<Reply> {
  const method = c.req.method ?? "GET";
  const asset = method === "GET" || method === "HEAD" ? await dashboardAsset(c.url.pathname) : null;
  if (asset === null) throw new NotFoundError(`no route for ${method} ${c.url.pathname}`);
  return [200, new TextReply(asset.contentType, asset.body, asset.headers)];
}

/**
 * The caller as the server sees it: `principal` (null on a server without credentials, where
 * nothing is checked), its `tenant`, the operations it may do on the cluster, and `superuser`
 * (admin on the cluster: every operation everywhere). Computed by the same Authorizer as every
 * check, so a page can leave out what would be refused without guessing.
 */
function whoami(c: RouteContext): Reply {
  const cluster = OPERATIONS.filter((op) => c.allows(clusterNeed(op)));
  return [200, { principal: c.principal, tenant: c.tenant(), superuser: cluster.includes("admin"), cluster }];
}

async function metricsText(c: RouteContext): Promise<Reply> {
  const m = c.opts.metrics;
  if (m === undefined) throw new NotFoundError("metrics are not enabled on this server");
  return [200, new TextReply(m.contentType, await m.metrics())];
}

async function createTopic(c: RouteContext): Promise<Reply> {
  const b = await body(c);
  if (typeof b.name !== "string") throw new ValidationError("name is required");
  c.check([topicNeed("create", b.name)]);
  return [201, await c.broker.createTopic(b.name, (b.config ?? {}) as object, actor(c))];
}

/** A job by id (`Queue.getJob`): 404 when the queue does not know it; never creates the queue. */
async function getJob(c: RouteContext): Promise<Reply> {
  const job = await c.broker.queue(c.params.queue).getJob(c.params.id);
  if (job === null) throw new NotFoundError(`queue ${JSON.stringify(c.params.queue)} has no job ${JSON.stringify(c.params.id)}`);
  // Byte payloads as in fetched records: {base64}.
  return [200, job.data instanceof Uint8Array ? { ...job, data: { base64: Buffer.from(job.data).toString("base64") } } : job];
}

/**
 * `Queue.browse` (no lease, no attempt counted, nothing created: 404 QUEUE_NOT_FOUND for a
 * missing queue). Query: `limit`, `after` (a page's `next`), `state` (waiting|delayed|all).
 */
async function browseJobs(c: RouteContext): Promise<Reply> {
  const { url } = c;
  const state = url.searchParams.get("state") ?? undefined;
  const page = await c.broker.queue(c.params.queue).browse({
    limit: intParam(url, "limit", DEFAULT_BROWSE_LIMIT),
    after: url.searchParams.get("after") ?? undefined,
    state: state as BrowseOptions["state"],
  });
  return [200, { jobs: page.jobs.map(withReadablePayload), next: page.next }];
}

/**
 * A browsed job as JSON: `data` is the JSON value (`dataEncoding: "json"`), the text
 * (`"utf8"`) or base64 of the bytes (`"base64"`); header values are strings, or `{base64}`
 * for values that are not UTF-8.
 */
/** `Queue.listSchedules` (nothing created: 404 QUEUE_NOT_FOUND for a missing queue); data and headers as in browse. */
async function listSchedules(c: RouteContext): Promise<Reply> {
  if (!(await c.broker.listQueues()).includes(c.params.queue)) throw new QueueNotFoundError(c.params.queue);
  const list = await c.broker.queue(c.params.queue).listSchedules();
  return [200, { schedules: list.map(withReadablePayload) }];
}

/** A job's or a schedule's data and headers as JSON: bytes as base64, with `dataEncoding`. */
function withReadablePayload<J extends { data: unknown; headers: Record<string, string | Uint8Array> }>(j: J): Record<string, unknown> {
  const headers: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(j.headers)) headers[k] = typeof v === "string" ? v : { base64: Buffer.from(v).toString("base64") };
  const { data, ...rest } = j;
  const [value, dataEncoding] =
    data instanceof Uint8Array ? [Buffer.from(data).toString("base64"), "base64"] : typeof data === "string" ? [data, "utf8"] : [data ?? null, "json"];
  return { ...rest, headers, data: value, dataEncoding };
}

async function deleteTopic(c: RouteContext): Promise<Reply> {
  await c.broker.deleteTopic(c.params.topic, actor(c));
  return [200, { deleted: c.params.topic }];
}

async function publishRecords(c: RouteContext): Promise<Reply> {
  const b = await body(c);
  const list = Array.isArray(b.records) ? b.records : [b];
  if (list.length > MAX_HTTP_ITEMS_PER_REQUEST) throw new ValidationError(`at most ${MAX_HTTP_ITEMS_PER_REQUEST} records per request`);
  const receipts = await c.broker.publishBatch(c.params.topic, list.map(jsonToRecord));
  return [200, { receipts }];
}

async function fetchRecords(c: RouteContext): Promise<Reply> {
  const { url } = c;
  const partition = Number(c.params.partition);
  if (!Number.isSafeInteger(partition)) throw new ValidationError("partition must be an integer");
  const r = await c.broker.fetch(c.params.topic, partition, intParam(url, "offset", 0), {
    maxBytes: Math.min(intParam(url, "maxBytes", HTTP_DEFAULT_FETCH_BYTES), HTTP_MAX_FETCH_BYTES),
    maxWaitMs: Math.min(intParam(url, "maxWaitMs", 0), 30_000),
  });
  return [200, { ...r, records: r.records.map(recordToJson) }];
}

/** The audit log (docs/security.md): `?limit=` (1..10000, default 100) and `?since=` (ms since the epoch). */
async function auditList(c: RouteContext): Promise<Reply> {
  const limit = intParam(c.url, "limit", 100);
  if (limit < 1 || limit > 10_000) throw new ValidationError("query parameter limit must be in [1, 10000]");
  const since = c.url.searchParams.has("since") ? intParam(c.url, "since") : undefined;
  return [200, { records: await c.broker.listAudit({ limit, since }) }];
}

async function deleteQueue(c: RouteContext): Promise<Reply> {
  await c.broker.deleteQueue(c.params.queue, actor(c));
  return [200, { deleted: c.params.queue }];
}

async function enqueueJobs(c: RouteContext): Promise<Reply> {
  const b = await body(c);
  const list = Array.isArray(b.jobs) ? b.jobs : [b];
  if (list.length > MAX_HTTP_ITEMS_PER_REQUEST) throw new ValidationError(`at most ${MAX_HTTP_ITEMS_PER_REQUEST} jobs per request`);
  const items = list.map((j: unknown) => {
    if (j === null || typeof j !== "object") throw new ValidationError("each job must be an object");
    const o = j as Record<string, unknown>;
    // Checked by the queue (prepare.ts), as every enqueue is.
    return {
      data: (o.data ?? null) as PublishValue,
      key: o.key as string | undefined,
      delayMs: o.delayMs as number | undefined,
      dedupeId: o.dedupeId as string | undefined,
      priority: o.priority as number | undefined,
      group: o.group as string | undefined,
      expireInMs: o.expireInMs as number | undefined,
      expiresAt: o.expiresAt as number | undefined,
      singletonKey: o.singletonKey as string | undefined,
      singletonMode: o.singletonMode as EnqueueItem["singletonMode"],
      singletonWindowMs: o.singletonWindowMs as number | undefined,
    };
  });
  return [200, { results: await c.broker.queue(c.params.queue, undefined, actor(c)).enqueueBatch(items) }];
}

async function redrive(c: RouteContext): Promise<Reply> {
  const b = await body(c);
  if (typeof b.target === "string") c.check([queueNeed("publish", b.target)]);
  return [200, await c.broker.queue(c.params.queue, undefined, actor(c)).redrive(b as object)];
}

async function resetGroup(c: RouteContext): Promise<Reply> {
  const b = await body(c);
  c.check([groupNeed(b.dryRun === true ? "describe" : "reset-offsets", c.params.group)]);
  return [200, await c.broker.resetGroup(c.params.group, c.params.topic, b.to as ResetTarget, { dryRun: b.dryRun === true }, actor(c))];
}

/**
 * A route's lookup key: method and path with every parameter position replaced by `:`.
 * Parameters sit at the even positions from 2 on (`/v1/<collection>/<name>/<sub>/<name>/...`),
 * so a request's key is computed the same way without knowing the route.
 */
function routeKey(method: string, parts: readonly string[]): string {
  return `${method} /${parts.map((p, i) => (i >= 2 && i % 2 === 0 ? ":" : p)).join("/")}`;
}

interface CompiledRoute {
  route: Route;
  /** Parameter name and its position in the path. */
  params: [string, number][];
}

/** The probes, by exact path (any method). */
const EXACT = new Map<string, Route>();
/** The API routes, by `routeKey`. */
const BY_KEY = new Map<string, CompiledRoute>();
for (const route of ROUTES) {
  if (route.method === "*") {
    EXACT.set(route.path, route);
    continue;
  }
  const segs = route.path.split("/").filter(Boolean);
  const params: [string, number][] = [];
  segs.forEach((s, i) => {
    // A table mistake would make a route unreachable or too greedy: refuse it at load.
    if (s.startsWith(":") !== (i >= 2 && i % 2 === 0)) throw new Error(`route ${route.method} ${route.path}: parameters must be exactly the even segments from the third on`);
    if (s.startsWith(":")) params.push([s.slice(1), i]);
  });
  BY_KEY.set(routeKey(route.method, segs), { route, params });
}

/** The route for a request and its parameters, or null (404). */
function findRoute(method: string, url: URL): { route: Route; params: Record<string, string> } | null {
  // Decoded before anything else: a malformed escape fails the request whatever the path.
  const parts = url.pathname.split("/").filter(Boolean).map(decodeURIComponent);
  const exact = EXACT.get(url.pathname);
  if (exact !== undefined) return { route: exact, params: {} };
  if (parts[0] !== "v1") return null;
  const found = BY_KEY.get(routeKey(method, parts));
  if (found === undefined) return null;
  const params: Record<string, string> = {};
  for (const [name, i] of found.params) params[name] = parts[i];
  return { route: found.route, params };
}

/** Body types a browser sends from a plain HTML form, cross-site and without asking first. */
const FORM_TYPES = ["application/x-www-form-urlencoded", "multipart/form-data", "text/plain"];

/**
 * A state-changing request a web page on another site could have sent (cross-site request
 * forgery: a page the operator visits posting to localhost) is refused before its body is
 * read: an Origin naming another host, a Sec-Fetch-Site of "cross-site", or a form body.
 * Programs (the CLI, curl with `content-type: application/json`) and the dashboard, served by
 * this port, pass.
 */
function refuseCrossSite(req: IncomingMessage): void {
  const origin = req.headers.origin;
  if (origin !== undefined && origin !== "null") {
    let host: string | null = null;
    try {
      host = new URL(origin).host;
    } catch {
      /* not a URL: refused below */
    }
    if (host === null || host !== req.headers.host) throw new ForbiddenError(`cross-origin request refused: Origin ${JSON.stringify(origin.slice(0, 200))} is not this server (${req.headers.host ?? "no Host"})`);
  } else if (origin === "null") throw new ForbiddenError("cross-origin request refused: Origin null (a sandboxed or file page)");
  if (req.headers["sec-fetch-site"] === "cross-site") throw new ForbiddenError("cross-site request refused (Sec-Fetch-Site: cross-site)");
  const type = (req.headers["content-type"] ?? "").split(";")[0].trim().toLowerCase();
  if (FORM_TYPES.includes(type)) throw new ForbiddenError(`a ${type} body is refused (what an HTML form on any site can send): send JSON with content-type: application/json`);
}

export function createHttpServer(opts: HttpOptions): Server {
  const { broker } = opts;
  const handler = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    try {
      const url = new URL(req.url ?? "/", "http://localhost");
      const method = req.method ?? "GET";
      // Before routing: without credentials not even which paths exist is revealed.
      const principal = opts.auth && !OPEN_PATHS.has(url.pathname) ? await opts.auth.httpPrincipal(req.headers.authorization, req.socket.remoteAddress ?? "unknown", `${req.socket.remoteAddress}:${req.socket.remotePort}`, req.socket) : null;
      const found = findRoute(method, url);
      if (found === null) throw new NotFoundError(`no route for ${method} ${url.pathname}`);
      if (method !== "GET" && method !== "HEAD" && method !== "OPTIONS") refuseCrossSite(req);
      const gate = opts.authz;
      const ctx: RouteContext = {
        broker,
        opts,
        req,
        url,
        params: found.params,
        principal,
        check: (needs) => gate?.check(principal, needs, { principal: principal ?? "anonymous", source: `${req.socket.remoteAddress}:${req.socket.remotePort}` }),
        visible: (type, items, name) => (gate ? gate.visible(principal, type, items, name) : [...items]),
        allows: (need) => gate?.allows(principal, need) ?? true,
        tenant: () => (principal !== null && gate ? gate.tenantOf(principal) : null),
      };
      const needs = found.route.needs(ctx);
      ctx.check(needs);
      // QUO-1: HTTP requests count against the same quotas, delayed rather than refused.
      await holdFor(gate?.chargeHttp(principal, needs, "request", Number(req.headers["content-length"]) || 0) ?? 0);
      const [status, reply] = await found.route.handler(ctx);
      if (gate && principal !== null && needs.some((n) => n.op === "consume")) {
        await holdFor(gate.chargeHttp(principal, needs, "reply", Buffer.byteLength(reply instanceof TextReply ? reply.text : JSON.stringify(reply))));
      }
      if (reply instanceof TextReply) {
        res.writeHead(status, { ...reply.headers, "content-type": reply.contentType, "content-length": Buffer.byteLength(reply.text) });
        res.end(reply.text);
      } else send(res, status, reply);
    } catch (err) {
      const status = statusFor(err);
      const wire = errorToWire(err);
      if (!res.headersSent) {
        if (status === 413) res.setHeader("connection", "close");
        if (status === 401) res.setHeader("www-authenticate", CHALLENGE);
        send(res, status, { error: wire });
      }
      // Stop reading an oversized upload: close once the error response is written.
      if (status === 413) res.on("finish", () => req.destroy());
    }
  };
  // An https.Server is an http.Server with TLS underneath: the routes are the same.
  const server: Server = opts.tls ? createHttpsServer(opts.tls, handler) : createServer(handler);
  server.requestTimeout = 60_000;
  server.headersTimeout = 10_000;
  server.maxHeadersCount = 100;
  return server;
}
