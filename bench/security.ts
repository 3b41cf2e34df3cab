// SPDX-License-Identifier: Apache-2.0
/**
 * The cost of security (the `security` section): the same `sluice serve` twice, once open on
 * loopback and once with TLS, a logged-in client (bearer token) and an authorization policy
 * that is checked on every request (docs/security.md), in the same client shapes as the
 * server section's rows. Goal: within 15% (ratio >= 0.85). Like the metrics section's on/off
 * rows, each row runs 6 interleaved repetitions whose order alternates (a threshold on the
 * ratio of two figures of the same system: with 3, one slow repetition of either side on this
 * shared machine decided the row). The consume row also runs TLS alone and login + ACL alone,
 * so the report shows which half costs what.
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
/** The two halves of SECURE, measured beside it in the consume row to show where its cost lies. */
export const TLS_ONLY = "sluice-server tls only";
export const AUTH_ONLY = "sluice-server auth+acl only";
const ON_OFF_REPS = 6;

export async function runSecurityBench(opts: { tmpDir: string; run: RunGroupOptions; only?: Set<string> | null }): Promise<BenchRow[]> {
  const plainDir = join(opts.tmpDir, "security-plain");
  const secureDir = join(opts.tmpDir, "security-secure");
  const certDir = join(opts.tmpDir, "security-certs");
  const tlsDir = join(opts.tmpDir, "security-tls-only");
  const authDir = join(opts.tmpDir, "security-auth-only");
  for (const d of [plainDir, secureDir, certDir, tlsDir, authDir]) mkdirSync(d, { recursive: true });
  const ca = makeCa(certDir, "bench-ca");
  const leaf = makeLeaf(certDir, ca, { name: "bench-server", cn: "localhost", serial: 1 });
  const token = await securedDir(secureDir);
  const authToken = await securedDir(authDir);
  const plain = await serve(plainDir);
  const secure = await serve(secureDir, ["--tls-cert", leaf.cert, "--tls-key", leaf.key]);
  const tlsOnly = await serve(tlsDir, ["--tls-cert", leaf.cert, "--tls-key", leaf.key]);
  const authOnly = await serve(authDir);
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
    const tlsOnlyT: SluiceTarget = { system: TLS_ONLY, durability: `${SLUICE_DURABILITY}; TLS 1.3, no login`, embedded: false, open: () => connect({ url: tlsOnly.url, tls: { caFile: ca.cert } }), release: (b) => b.close(), pid: tlsOnly.child.pid };
    const authOnlyT: SluiceTarget = {
      system: AUTH_ONLY,
      durability: `${SLUICE_DURABILITY}; plain TCP, bearer token, ACL checked per request`,
      embedded: false,
      open: () => connect({ url: authOnly.url, auth: { token: authToken } }),
      release: (b) => b.close(),
      pid: authOnly.child.pid,
    };
    const ratio = [{ sluice: SECURE, peer: SERVER, goal: { atLeast: 0.85 } }];
    const parts = [...ratio, { sluice: TLS_ONLY, peer: SERVER }, { sluice: AUTH_ONLY, peer: SERVER }];
    const groups: BenchGroup[] = [
      { id: "security-publish-msg", table: "per-message", metrics: [{ key: "rate", name: `publish per message, window ${fmt(1000)}, acked: security on vs off`, unit: "msg/s" }], cases: [publishPerMessage(plainT), publishPerMessage(secureT)], ratios: ratio, alternate: true, reps: ON_OFF_REPS },
      { id: "security-publish-batch", table: "batch", metrics: [{ key: "rate", name: "publish 1,000 x 8 in flight, acked: security on vs off", unit: "msg/s" }], cases: [publishBatches(plainT, 1000, 8), publishBatches(secureT, 1000, 8)], ratios: ratio, alternate: true, reps: ON_OFF_REPS },
      { id: "security-consume-batch", table: "batch", metrics: [{ key: "rate", name: "consume from backlog, commit per batch: security on vs off", unit: "msg/s" }], cases: [consumeBatches(plainT), consumeBatches(secureT), consumeBatches(tlsOnlyT), consumeBatches(authOnlyT)], ratios: parts, alternate: true, reps: ON_OFF_REPS },
    ];
    const rows = await runGroups(groups, { ...opts.run, only: opts.only });
    if (!opts.only || opts.only.has("security-quota")) rows.push(...(await quotaRows(opts.tmpDir)));
    return rows;
  } finally {
    await plain.stop().catch(() => {});
    await secure.stop().catch(() => {});
    await tlsOnly.stop().catch(() => {});
    await authOnly.stop().catch(() => {});
  }
}

/** A data dir with a bench token and a realistic policy: the principal's rules by prefix, among others', not a super user. */
async function securedDir(dir: string): Promise<string> {
  const token = (await (await CredentialStore.open(dir)).createToken("bench")).token;
  const policy = await PolicyStore.open(dir);
  await policy.addRule({ principal: "bench", effect: "allow", operation: "admin", resourceType: "topic", pattern: "prefix", name: "bench-" });
  await policy.addRule({ principal: "bench", effect: "allow", operation: "admin", resourceType: "group", pattern: "prefix", name: "" });
  for (let i = 0; i < 50; i++) await policy.addRule({ principal: `other-${i}`, effect: "allow", operation: "publish", resourceType: "topic", pattern: "prefix", name: `other-${i}.` });
  return token;
}
