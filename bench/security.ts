// SPDX-License-Identifier: Apache-2.0
/**
 * The cost of security (the `security` section): the same `sluice serve` twice, once open on
 * loopback and once with TLS, a logged-in client (bearer token) and an authorization policy
 * that is checked on every request (docs/security.md), in the same client shapes as the
 * server section's rows. Goal: within 15% (ratio >= 0.85). Like the metrics section's on/off
 * rows, each row runs 6 interleaved repetitions whose order alternates (a threshold on the
 * ratio of two figures of the same system: with 3, one slow repetition of either side on this
 * shared machine decided the row).
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { connect } from "../src/client/index.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { PolicyStore } from "../src/security/acl/policy-store.js";
import { makeCa, makeLeaf } from "../test/fixtures/tls-certs.js";
import { runGroups, type BenchGroup, type RunGroupOptions } from "./harness.js";
import type { BenchRow } from "./report.js";
import { serve, SERVER } from "./server.js";
import { consumeBatches, publishPerMessage, SLUICE_DURABILITY, type SluiceTarget } from "./sluice-topics.js";
import { fmt } from "./shapes.js";
import { publishBatches } from "./sluice-topics.js";
import { quotaRows } from "./quota.js";

export const SECURE = "sluice-server tls+auth+acl";
const ON_OFF_REPS = 6;

export async function runSecurityBench(opts: { tmpDir: string; run: RunGroupOptions; only?: Set<string> | null }): Promise<BenchRow[]> {
  const plainDir = join(opts.tmpDir, "security-plain");
  const secureDir = join(opts.tmpDir, "security-secure");
  const certDir = join(opts.tmpDir, "security-certs");
  for (const d of [plainDir, secureDir, certDir]) mkdirSync(d, { recursive: true });
  const ca = makeCa(certDir, "bench-ca");
  const leaf = makeLeaf(certDir, ca, { name: "bench-server", cn: "localhost", serial: 1 });
  const token = (await (await CredentialStore.open(secureDir)).createToken("bench")).token;
  const policy = await PolicyStore.open(secureDir);
  // A realistic policy: the principal's rules by prefix, among others', not a super user.
  await policy.addRule({ principal: "bench", effect: "allow", operation: "admin", resourceType: "topic", pattern: "prefix", name: "bench-" });
  await policy.addRule({ principal: "bench", effect: "allow", operation: "admin", resourceType: "group", pattern: "prefix", name: "" });
  for (let i = 0; i < 50; i++) await policy.addRule({ principal: `other-${i}`, effect: "allow", operation: "publish", resourceType: "topic", pattern: "prefix", name: `other-${i}.` });
  const plain = await serve(plainDir);
  const secure = await serve(secureDir, ["--tls-cert", leaf.cert, "--tls-key", leaf.key]);
  try {
    const plainT: SluiceTarget = { system: SERVER, durability: SLUICE_DURABILITY, embedded: false, open: () => connect({ url: plain.url }), release: (b) => b.close(), pid: plain.child.pid };
    const secureT: SluiceTarget = {
      system: SECURE,
      durability: `${SLUICE_DURABILITY}; TLS 1.3, bearer token, ACL checked per request`,
      embedded: false,
      open: () => connect({ url: secure.url, tls: { caFile: ca.cert }, auth: { token } }),
      release: (b) => b.close(),
      pid: secure.child.pid,
    };
    const ratio = [{ sluice: SECURE, peer: SERVER, goal: { atLeast: 0.85 } }];
    const groups: BenchGroup[] = [
      { id: "security-publish-msg", table: "per-message", metrics: [{ key: "rate", name: `publish per message, window ${fmt(1000)}, acked: security on vs off`, unit: "msg/s" }], cases: [publishPerMessage(plainT), publishPerMessage(secureT)], ratios: ratio, alternate: true, reps: ON_OFF_REPS },
      { id: "security-publish-batch", table: "batch", metrics: [{ key: "rate", name: "publish 1,000 x 8 in flight, acked: security on vs off", unit: "msg/s" }], cases: [publishBatches(plainT, 1000, 8), publishBatches(secureT, 1000, 8)], ratios: ratio, alternate: true, reps: ON_OFF_REPS },
      { id: "security-consume-batch", table: "batch", metrics: [{ key: "rate", name: "consume from backlog, commit per batch: security on vs off", unit: "msg/s" }], cases: [consumeBatches(plainT), consumeBatches(secureT)], ratios: ratio, alternate: true, reps: ON_OFF_REPS },
    ];
    const rows = await runGroups(groups, { ...opts.run, only: opts.only });
    if (!opts.only || opts.only.has("security-quota")) rows.push(...(await quotaRows(opts.tmpDir)));
    return rows;
  } finally {
    await plain.stop().catch(() => {});
    await secure.stop().catch(() => {});
  }
}
