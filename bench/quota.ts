// SPDX-License-Identifier: Apache-2.0
/**
 * Quota isolation (in the `security` section): a tenant's producer offering well over 10x its
 * publish byte-rate quota, beside another tenant publishing one message at a time. Reports how
 * close the runaway tenant is held to its quota and the other tenant's p99 publish latency
 * beside it against its solo baseline (goals: within 10%; within 1.5x). One run.
 */
import { spawn } from "node:child_process";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect } from "../src/client/index.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { PolicyStore } from "../src/security/acl/policy-store.js";
import type { Broker } from "../src/types.js";
import type { BenchRow } from "./report.js";
import { serve } from "./server.js";
import { SLUICE_DURABILITY } from "./sluice-topics.js";

const HOG = fileURLToPath(new URL("../test/fixtures/quota-hog.js", import.meta.url));
const QUOTA = 1024 * 1024;

function hog(url: string, token: string, seconds: number): Promise<{ t: number; bytes: number }[]> {
  const proc = spawn(process.execPath, [HOG, url, token, "hog.t", String(seconds)], { stdio: ["ignore", "pipe", "inherit"] });
  const ticks: { t: number; bytes: number }[] = [];
  let buf = "";
  proc.stdout!.on("data", (d: Buffer) => {
    buf += d.toString();
    for (let i = buf.indexOf("\n"); i >= 0; i = buf.indexOf("\n")) {
      const j = JSON.parse(buf.slice(0, i)) as { t: number; bytes: number };
      buf = buf.slice(i + 1);
      ticks.push(j);
    }
  });
  return new Promise((resolve, reject) => proc.once("exit", (code) => (code === 0 ? resolve(ticks) : reject(new Error(`producer exited with ${code}`)))));
}

const rateAfter = (ticks: { t: number; bytes: number }[], from: number): number => {
  const a = ticks.find((x) => x.t >= from)!;
  const b = ticks[ticks.length - 1];
  return ((b.bytes - a.bytes) * 1000) / (b.t - a.t);
};

async function p99(b: Broker, until: () => boolean, min: number): Promise<number> {
  const ms: number[] = [];
  while (ms.length < min || !until()) {
    const t0 = performance.now();
    await b.publish("calm.t", "calm");
    ms.push(performance.now() - t0);
  }
  ms.sort((x, y) => x - y);
  return ms[Math.ceil(ms.length * 0.99) - 1];
}

export async function quotaRows(tmpDir: string): Promise<BenchRow[]> {
  const dir = join(tmpDir, "security-quota");
  mkdirSync(dir, { recursive: true });
  const creds = await CredentialStore.open(dir);
  const policy = await PolicyStore.open(dir);
  const tokens: Record<string, string> = {};
  for (const tenant of ["hog", "calm"]) {
    tokens[tenant] = (await creds.createToken(`${tenant}-app`)).token;
    await policy.setTenant(tenant, [`${tenant}-app`]);
    await policy.addRule({ principal: `${tenant}-app`, effect: "allow", operation: "admin", resourceType: "topic", pattern: "prefix", name: `${tenant}.` });
  }
  const served = await serve(dir);
  const calm = await connect({ url: served.url, auth: { token: tokens.calm } });
  const h = await connect({ url: served.url, auth: { token: tokens.hog } });
  const shape = `tenant "hog": publish() per message, 4 KiB values, 16 in flight, from its own process; tenant "calm": publish() per message, one at a time; quota publishBytesPerSec ${QUOTA} on tenant:hog`;
  try {
    await calm.createTopic("calm.t", { partitions: 1 });
    await h.createTopic("hog.t", { partitions: 1 });
    // The solo baseline first: right after the unthrottled run the disk is still flushing it.
    const solo = await p99(calm, () => true, 2000);
    const offered = rateAfter(await hog(served.url, tokens.hog, 2), 500);
    await policy.setQuota("tenant:hog", { publishBytesPerSec: QUOTA });
    await new Promise((r) => setTimeout(r, 1000)); // in force within a second (ACL-3)
    let done = false;
    const run = hog(served.url, tokens.hog, 6).finally(() => (done = true));
    await new Promise((r) => setTimeout(r, 1500));
    const beside = await p99(calm, () => done, 2000);
    const held = rateAfter(await run, 1500);
    const rows: BenchRow[] = [
      { table: "info", shape, name: "quota: runaway tenant's publish rate / its quota (goal 0.9-1.1)", system: "sluice-server", durability: SLUICE_DURABILITY, value: held / QUOTA, unit: "x", note: `offered ${(offered / QUOTA).toFixed(1)}x the quota unthrottled; held at ${(held / 1048576).toFixed(3)} MiB/s` },
      { table: "info", shape, name: "quota: other tenant's p99 publish beside it / solo (goal <= 1.5)", system: "sluice-server", durability: SLUICE_DURABILITY, value: beside / solo, unit: "x", note: `p99 solo ${solo.toFixed(2)} ms, beside ${beside.toFixed(2)} ms` },
    ];
    for (const r of rows) console.log(`  ${r.name}: ${r.value.toFixed(3)}x (${r.note})`);
    return rows;
  } finally {
    await calm.close();
    await h.close();
    await served.stop();
  }
}
