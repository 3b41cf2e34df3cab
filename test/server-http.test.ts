// SPDX-License-Identifier: Apache-2.0
/**
 * `sluice serve`: configuration (flags > env > file, validated with clear messages), the HTTP
 * port (health, readiness, admin, JSON produce/consume, streaming body limit), and graceful
 * SIGTERM shutdown (exits promptly; acknowledged records survive).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { resolveServeConfig } from "../src/cli/serve.js";
import { connect } from "../src/client/index.js";
import { ValidationError } from "../src/errors.js";
import { spawnServer } from "./fixtures/server-spawn.js";

function tmp(): string {
  return mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-srv-http-"));
}

test("config: flags override env, env overrides the file; bad values name their source", () => {
  const dir = tmp();
  try {
    const file = join(dir, "sluice.json");
    writeFileSync(file, JSON.stringify({ data: "/from-file", port: 7000, httpPort: 7001, logLevel: "warn" }));
    const c = resolveServeConfig(["--config", file, "--port", "7100"], { SLUICE_PORT: "7200", SLUICE_HTTP_PORT: "7201" });
    assert.equal(c.data, "/from-file");
    assert.equal(c.port, 7100, "flag wins");
    assert.equal(c.httpPort, 7201, "env beats file");
    assert.equal(c.logLevel, "warn");
    assert.equal(c.host, "127.0.0.1", "listens on loopback by default");
    assert.equal(resolveServeConfig(["--data", "d", "--http-port", "off"], {}).httpPort, null);
    const bad = (argv: string[], env: NodeJS.ProcessEnv, re: RegExp): void =>
      assert.throws(() => resolveServeConfig(argv, env), (e: unknown) => e instanceof ValidationError && re.test(e.message));
    bad(["--data", "d"], { SLUICE_PORT: "abc" }, /invalid port "abc" \(from SLUICE_PORT\): expected an integer 0\.\.65535/);
    bad(["--data", "d", "--port", "70000"], {}, /invalid port "70000" \(from --port\)/);
    bad([], {}, /--data DIR is required/);
    bad(["--data", "d", "--bogus"], {}, /Unknown option '--bogus'/);
    bad(["--data", "d", "--log-level", "loud"], {}, /invalid log level "loud"/);
    bad(["--data", "d", "--port", "7000", "--http-port", "7000"], {}, /must differ/);
    writeFileSync(file, JSON.stringify({ data: "x", prot: 1 }));
    bad(["--config", file], {}, /unknown key "prot" in config file/);
    writeFileSync(file, "{not json");
    bad(["--config", file], {}, /cannot read config file/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

function http(
  port: number,
  method: string,
  path: string,
  body?: unknown,
  rawBody?: { chunks: number; chunkBytes: number },
  headers: Record<string, string> = {},
): Promise<{ status: number; json: any }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, method, path, headers: { "content-type": "application/json", ...headers } }, (res) => {
      let text = "";
      res.on("data", (d) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode!, json: text ? JSON.parse(text) : null }));
    });
    req.on("error", (e) => (rawBody ? resolve({ status: 413, json: { error: { code: "BODY_TOO_LARGE", note: e.message } } }) : reject(e)));
    if (rawBody) {
      // Streamed upload without Content-Length: the limit must be enforced while streaming.
      const chunk = Buffer.alloc(rawBody.chunkBytes, 0x20);
      let i = 0;
      const pump = (): void => {
        while (i < rawBody.chunks) {
          i++;
          if (!req.write(chunk)) {
            req.once("drain", pump);
            return;
          }
        }
        req.end();
      };
      pump();
    } else {
      if (body !== undefined) req.write(JSON.stringify(body));
      req.end();
    }
  });
}

function httpText(port: number, path: string): Promise<{ status: number; contentType: string; text: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, method: "GET", path }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (text += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, contentType: String(res.headers["content-type"] ?? ""), text }));
    });
    req.on("error", reject);
    req.end();
  });
}

test("HTTP: health, readiness, admin, JSON produce/consume, body limit; SIGTERM shuts down gracefully", { timeout: 60_000 }, async () => {
  const dir = tmp();
  let server = await spawnServer(["--data", dir, "--port", "0", "--http-port", "0", "--log-level", "warn", "--max-body-bytes", "65536"]);
  try {
    const hp = server.httpPort!;
    const health = await http(hp, "GET", "/healthz");
    assert.equal(health.status, 200);
    const version = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")).version;
    assert.deepEqual({ ...health.json, uptimeSeconds: 0 }, { status: "ok", version, pid: server.proc.pid, dataDir: dir, uptimeSeconds: 0 });
    assert.ok(Number.isInteger(health.json.uptimeSeconds) && health.json.uptimeSeconds >= 0);
    const ready = await http(hp, "GET", "/readyz");
    assert.equal(ready.status, 200);
    assert.equal(ready.json.version, version);
    assert.equal((await http(hp, "POST", "/v1/topics", { name: "web", config: { partitions: 2 } })).status, 201);
    assert.equal((await http(hp, "POST", "/v1/topics", { name: "web" })).json.error.code, "TOPIC_EXISTS");
    assert.equal((await http(hp, "POST", "/v1/topics", { name: "../evil" })).status, 400);
    assert.deepEqual((await http(hp, "GET", "/v1/topics")).json.topics, ["web"]);
    const prod = await http(hp, "POST", "/v1/topics/web/records", {
      records: [
        { value: { order: 1 }, key: "a", partition: 1, headers: { src: "http" } },
        { valueBase64: Buffer.from("raw").toString("base64"), partition: 1 },
      ],
    });
    assert.equal(prod.status, 200);
    assert.deepEqual(prod.json.receipts.map((r: any) => [r.partition, r.offset]), [
      [1, 0],
      [1, 1],
    ]);
    const cons = await http(hp, "GET", "/v1/topics/web/partitions/1/records?offset=0");
    assert.deepEqual(cons.json.records[0].value, { order: 1 });
    assert.equal(cons.json.records[0].headers.src, "http");
    assert.deepEqual(cons.json.records[1].value, { base64: Buffer.from("raw").toString("base64") });
    assert.equal(cons.json.nextOffset, 2);
    // sluice serve exposes Prometheus metrics: the broker's and the process's.
    const scrape = await httpText(hp, "/metrics");
    assert.equal(scrape.status, 200);
    assert.match(scrape.contentType, /^text\/plain/);
    assert.match(scrape.text, /^sluice_records_appended_total\{topic="web",partition="1"\} 2$/m);
    assert.match(scrape.text, /^sluice_partition_high_watermark\{topic="web",partition="1"\} 2$/m);
    assert.match(scrape.text, /^process_cpu_user_seconds_total /m);
    assert.equal((await http(hp, "GET", "/v1/topics/nope")).status, 404);
    assert.equal((await http(hp, "GET", "/v1/groups/g/topics/web/lag")).json.totalRecords, 2);
    assert.equal((await http(hp, "POST", "/v1/groups/g/topics/web/reset", { to: "latest", dryRun: true })).json.dryRun, true);
    // Queues: enqueue and stats over HTTP.
    const enq = await http(hp, "POST", "/v1/queues/web-jobs/jobs", { jobs: [{ data: { a: 1 } }, { data: "two", key: "k", group: "tenant-1" }] });
    assert.equal(enq.status, 200);
    assert.equal(enq.json.results.length, 2);
    assert.equal((await http(hp, "GET", "/v1/queues/web-jobs/stats")).json.waiting, 2);
    const job = await http(hp, "GET", `/v1/queues/web-jobs/jobs/${enq.json.results[0].id}`);
    assert.deepEqual(job.json, { id: enq.json.results[0].id, state: "waiting", attempts: 0, data: { a: 1 } });
    assert.equal((await http(hp, "GET", "/v1/queues/web-jobs/jobs/424242")).status, 404);
    assert.equal((await http(hp, "GET", "/v1/queues/no-such-queue/jobs/0")).status, 404);
    assert.equal((await http(hp, "GET", "/v1/queues")).json.queues.includes("no-such-queue"), false, "reading a job creates no queue");
    // Browsing lists jobs without leasing them, a page at a time.
    const page1 = await http(hp, "GET", "/v1/queues/web-jobs/browse?limit=1");
    assert.equal(page1.status, 200);
    assert.equal(page1.json.jobs.length, 1);
    assert.deepEqual([page1.json.jobs[0].data, page1.json.jobs[0].dataEncoding, page1.json.jobs[0].attempts], [{ a: 1 }, "json", 0]);
    assert.equal(page1.json.next, enq.json.results[0].id);
    const page2 = await http(hp, "GET", `/v1/queues/web-jobs/browse?limit=1&after=${page1.json.next}`);
    assert.deepEqual([page2.json.jobs[0].data, page2.json.jobs[0].dataEncoding, page2.json.jobs[0].key, page2.json.jobs[0].group, page2.json.next], ["two", "utf8", "k", "tenant-1", null]);
    const noQueue = await http(hp, "GET", "/v1/queues/no-such-queue/browse");
    assert.deepEqual([noQueue.status, noQueue.json.error.code], [404, "QUEUE_NOT_FOUND"]);
    // Schedules are listed read-only; a missing queue is 404 and stays missing.
    const scheduler = await connect({ url: server.url });
    await scheduler.queue("web-sched", {}).upsertSchedule("hourly", { everyMs: 3_600_000, data: { report: "usage" }, headers: { src: "http-test" } });
    await scheduler.close();
    const scheds = await http(hp, "GET", "/v1/queues/web-sched/schedules");
    assert.equal(scheds.status, 200);
    assert.deepEqual(scheds.json.schedules.map((x: any) => [x.name, x.everyMs, x.data, x.dataEncoding, x.headers.src]), [["hourly", 3_600_000, { report: "usage" }, "json", "http-test"]]);
    assert.deepEqual((await http(hp, "GET", "/v1/queues/web-jobs/schedules")).json, { schedules: [] });
    const noSched = await http(hp, "GET", "/v1/queues/no-such-queue/schedules");
    assert.deepEqual([noSched.status, noSched.json.error.code], [404, "QUEUE_NOT_FOUND"]);
    assert.equal((await http(hp, "GET", "/v1/queues")).json.queues.includes("no-such-queue"), false, "listing schedules creates no queue");
    const typo = await http(hp, "GET", "/v1/queues/web-jbos/stats");
    assert.equal(typo.status, 404);
    assert.equal(typo.json.error.code, "QUEUE_NOT_FOUND");
    assert.equal((await http(hp, "POST", "/v1/queues/web-jbos/purge")).status, 404);
    assert.equal((await http(hp, "GET", "/v1/queues")).json.queues.includes("web-jbos"), false, "reading stats creates no queue");
    assert.equal((await http(hp, "POST", "/v1/queues/web-jobs/purge")).json.purged, 2);
    // Cross-site requests (CSRF from a page the operator visits) are refused, nothing changed.
    const evil = await http(hp, "POST", "/v1/topics", { name: "csrf" }, undefined, { origin: "http://evil.example" });
    assert.deepEqual([evil.status, evil.json.error.code], [403, "FORBIDDEN"]);
    assert.match(evil.json.error.message, /Origin "http:\/\/evil.example" is not this server/);
    const form = await http(hp, "DELETE", "/v1/topics/web", undefined, undefined, { "content-type": "application/x-www-form-urlencoded" });
    assert.deepEqual([form.status, form.json.error.code], [403, "FORBIDDEN"]);
    assert.equal((await http(hp, "POST", "/v1/topics", { name: "csrf" }, undefined, { "sec-fetch-site": "cross-site" })).status, 403);
    assert.deepEqual((await http(hp, "GET", "/v1/topics")).json.topics, ["web"], "nothing was created or deleted");
    // The dashboard's own requests (same origin) pass.
    const same = await http(hp, "POST", "/v1/topics", { name: "same-origin" }, undefined, { origin: `http://127.0.0.1:${hp}` });
    assert.equal(same.status, 201);
    assert.equal((await http(hp, "DELETE", "/v1/topics/same-origin", undefined, undefined, { origin: `http://127.0.0.1:${hp}` })).status, 200);
    // A body larger than the limit is refused while streaming (no Content-Length).
    const big = await http(hp, "POST", "/v1/topics/web/records", undefined, { chunks: 64, chunkBytes: 16 * 1024 });
    assert.equal(big.status, 413);
    // The server still serves.
    assert.equal((await http(hp, "GET", "/healthz")).status, 200);

    // Graceful shutdown: acknowledged records published over the binary protocol survive.
    const client = await connect({ url: server.url });
    const receipts = await client.publishBatch("web", Array.from({ length: 100 }, (_, i) => ({ value: i, partition: 0 })));
    assert.equal(receipts.length, 100);
    const t0 = Date.now();
    server.proc.kill("SIGTERM");
    const code = await server.exited;
    assert.equal(code, 0);
    assert.ok(Date.now() - t0 < 10_000, "exits within 10 s");
    await client.close();
    server = await spawnServer(["--data", dir, "--port", "0", "--http-port", "off", "--log-level", "warn"]);
    const c2 = await connect({ url: server.url });
    const r = await c2.fetch("web", 0, 0);
    assert.deepEqual(r.records.map((x) => x.value), Array.from({ length: 100 }, (_, i) => i));
    await c2.close();
  } finally {
    server.proc.kill("SIGKILL");
    await server.exited;
    rmSync(dir, { recursive: true, force: true });
  }
});
