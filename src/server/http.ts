// SPDX-License-Identifier: Apache-2.0
/**
 * HTTP port: health (`/healthz` liveness, `/readyz` readiness), admin and simple JSON
 * produce/consume for callers without the client. Request bodies are limited while they
 * stream in (Content-Length is checked first; a body that grows past `maxBodyBytes` is cut off
 * with 413), so a large or endless upload never sits in memory.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { BodyTooLargeError, BrokerError, httpStatusOf, InternalError, NotFoundError, ValidationError } from "../errors.js";
import type { BrokerHost } from "../broker/host.js";
import type { ConsumedRecord, PublishRecord, PublishValue, ResetTarget } from "../types.js";
import { errorToWire } from "../wire/index.js";
import { HTTP_DEFAULT_FETCH_BYTES, HTTP_MAX_FETCH_BYTES, MAX_HTTP_ITEMS_PER_REQUEST } from "./limits.js";

export interface HttpOptions {
  broker: BrokerHost;
  maxBodyBytes: number;
  isReady(): boolean;
  stats(): Record<string, unknown>;
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

export function createHttpServer(opts: HttpOptions): Server {
  const { broker } = opts;
  const server = createServer(async (req, res) => {
    try {
      const url = new URL(req.url ?? "/", "http://localhost");
      const parts = url.pathname.split("/").filter(Boolean).map(decodeURIComponent);
      const method = req.method ?? "GET";
      const route = `${method} /${parts.map((p, i) => (i >= 2 && i % 2 === 0 ? ":" : p)).join("/")}`;
      if (url.pathname === "/healthz") return send(res, 200, { status: "ok" });
      if (url.pathname === "/readyz") {
        return opts.isReady() ? send(res, 200, { status: "ready" }) : send(res, 503, { status: "not ready" });
      }
      if (url.pathname === "/v1/stats") return send(res, 200, opts.stats());
      if (parts[0] !== "v1") throw new NotFoundError(`no route for ${method} ${url.pathname}`);
      // Routes: /v1/topics[/:name[/records | /partitions/:p/records]], /v1/groups/:g/topics/:t/{lag,reset}
      switch (route) {
        case "GET /v1/topics":
          return send(res, 200, { topics: await broker.listTopics() });
        case "POST /v1/topics": {
          const body = (await readBody(req, opts.maxBodyBytes)) as Record<string, unknown>;
          if (typeof body.name !== "string") throw new ValidationError("name is required");
          return send(res, 201, await broker.createTopic(body.name, (body.config ?? {}) as object));
        }
        case "GET /v1/topics/:":
          return send(res, 200, await broker.describeTopic(parts[2]));
        case "DELETE /v1/topics/:":
          await broker.deleteTopic(parts[2]);
          return send(res, 200, { deleted: parts[2] });
        case "POST /v1/topics/:/records": {
          const body = (await readBody(req, opts.maxBodyBytes)) as Record<string, unknown>;
          const list = Array.isArray(body.records) ? body.records : [body];
          if (list.length > MAX_HTTP_ITEMS_PER_REQUEST) throw new ValidationError(`at most ${MAX_HTTP_ITEMS_PER_REQUEST} records per request`);
          const receipts = await broker.publishBatch(parts[2], list.map(jsonToRecord));
          return send(res, 200, { receipts });
        }
        case "GET /v1/topics/:/partitions/:/records": {
          const partition = Number(parts[4]);
          if (!Number.isSafeInteger(partition)) throw new ValidationError("partition must be an integer");
          const r = await broker.fetch(parts[2], partition, intParam(url, "offset", 0), {
            maxBytes: Math.min(intParam(url, "maxBytes", HTTP_DEFAULT_FETCH_BYTES), HTTP_MAX_FETCH_BYTES),
            maxWaitMs: Math.min(intParam(url, "maxWaitMs", 0), 30_000),
          });
          return send(res, 200, { ...r, records: r.records.map(recordToJson) });
        }
        case "GET /v1/queues":
          return send(res, 200, { queues: await broker.listQueues() });
        case "DELETE /v1/queues/:":
          await broker.deleteQueue(parts[2]);
          return send(res, 200, { deleted: parts[2] });
        case "GET /v1/queues/:/stats":
          return send(res, 200, await broker.queue(parts[2]).stats());
        case "POST /v1/queues/:/jobs": {
          const body = (await readBody(req, opts.maxBodyBytes)) as Record<string, unknown>;
          const list = Array.isArray(body.jobs) ? body.jobs : [body];
          if (list.length > MAX_HTTP_ITEMS_PER_REQUEST) throw new ValidationError(`at most ${MAX_HTTP_ITEMS_PER_REQUEST} jobs per request`);
          const items = list.map((j: unknown) => {
            if (j === null || typeof j !== "object") throw new ValidationError("each job must be an object");
            const o = j as Record<string, unknown>;
            return { data: (o.data ?? null) as PublishValue, key: o.key as string | undefined, delayMs: o.delayMs as number | undefined, dedupeId: o.dedupeId as string | undefined };
          });
          return send(res, 200, { results: await broker.queue(parts[2]).enqueueBatch(items) });
        }
        case "POST /v1/queues/:/purge":
          return send(res, 200, { purged: await broker.queue(parts[2]).purge() });
        case "POST /v1/queues/:/redrive": {
          // Redrive from a dead-letter queue (e.g. /v1/queues/emails.dlq/redrive).
          const body = (await readBody(req, opts.maxBodyBytes)) as Record<string, unknown>;
          return send(res, 200, await broker.queue(parts[2]).redrive(body as object));
        }
        case "GET /v1/groups/:/topics/:/lag":
          return send(res, 200, await broker.groupLag(parts[2], parts[4]));
        case "POST /v1/groups/:/topics/:/reset": {
          const body = (await readBody(req, opts.maxBodyBytes)) as Record<string, unknown>;
          return send(res, 200, await broker.resetGroup(parts[2], parts[4], body.to as ResetTarget, { dryRun: body.dryRun === true }));
        }
        default:
          throw new NotFoundError(`no route for ${method} ${url.pathname}`);
      }
    } catch (err) {
      const status = statusFor(err);
      const wire = errorToWire(err);
      if (!res.headersSent) {
        if (status === 413) res.setHeader("connection", "close");
        send(res, status, { error: wire });
      }
      // Stop reading an oversized upload: close once the error response is written.
      if (status === 413) res.on("finish", () => req.destroy());
    }
  });
  server.requestTimeout = 60_000;
  server.headersTimeout = 10_000;
  server.maxHeadersCount = 100;
  return server;
}
