// SPDX-License-Identifier: Apache-2.0
/**
 * The shipped Prometheus alert rules (ops/prometheus/sluice-alerts.yml): Prometheus's own
 * `promtool` checks them and runs their unit tests (sluice-alerts.test.yml); every metric a rule
 * reads is one the broker exports (the METRICS table), every alert has a unit test, and every
 * runbook link points to a section of docs/runbooks.md. promtool comes from Debian's
 * `prometheus` package, installed by scripts/ensure-tool.sh when missing.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { parse } from "yaml";
import { METRICS } from "../src/observability/metrics.js";
import { CONTRACT_METRICS } from "../src/observability/contract-metrics.js";

const root = fileURLToPath(new URL("../../", import.meta.url));
const dir = `${root}ops/prometheus/`;
const RULES = `${dir}sluice-alerts.yml`;
const TESTS = `${dir}sluice-alerts.test.yml`;

interface Rule {
  alert: string;
  expr: string;
  annotations?: { runbook?: string };
}
const rules = (parse(readFileSync(RULES, "utf8")) as { groups: { rules: Rule[] }[] }).groups.flatMap((g) => g.rules);

function promtool(): string {
  const r = spawnSync("bash", [`${root}scripts/ensure-tool.sh`, "promtool", "prometheus"], { encoding: "utf8" });
  assert.equal(r.status, 0, `promtool could not be installed: ${r.stderr}`);
  return r.stdout.trim();
}

test("promtool: the alert rules are valid and pass their unit tests", { timeout: 600_000 }, () => {
  const bin = promtool();
  const check = spawnSync(bin, ["check", "rules", RULES], { encoding: "utf8" });
  assert.equal(check.status, 0, check.stdout + check.stderr);
  assert.match(check.stdout, new RegExp(`SUCCESS: ${rules.length} rules found`));
  const run = spawnSync(bin, ["test", "rules", TESTS], { encoding: "utf8", cwd: dir });
  assert.equal(run.status, 0, run.stdout + run.stderr);
  assert.match(run.stdout, /SUCCESS/);
});

test("every alert has a unit test, and every metric a rule reads is exported by the broker", () => {
  const tested = new Set<string>();
  for (const t of (parse(readFileSync(TESTS, "utf8")) as { tests: { alert_rule_test?: { alertname: string; exp_alerts: unknown[] }[] }[] }).tests) {
    for (const a of t.alert_rule_test ?? []) if (a.exp_alerts.length > 0) tested.add(a.alertname);
  }
  const exported = new Set([...Object.values(METRICS), ...Object.values(CONTRACT_METRICS)].map((m) => m.name));
  for (const r of rules) {
    assert.ok(tested.has(r.alert), `${r.alert} has no unit test that makes it fire`);
    for (const name of r.expr.match(/\bsluice_[a-z_]+/g) ?? []) assert.ok(exported.has(name), `${r.alert} reads ${name}, which the broker does not export`);
  }
});

test("every runbook link of an alert names a section of docs/runbooks.md", () => {
  const doc = readFileSync(`${root}docs/runbooks.md`, "utf8");
  const anchors = new Set([...doc.matchAll(/^## (.+)$/gm)].map((m) => m[1].toLowerCase().replace(/[^a-z0-9 -]/g, "").replace(/ /g, "-")));
  for (const r of rules) {
    const link = r.annotations?.runbook ?? "";
    assert.ok(link.startsWith("docs/runbooks.md#"), `${r.alert} has a runbook link`);
    assert.ok(anchors.has(link.split("#")[1]), `${r.alert}: ${link} is not a section of docs/runbooks.md (sections: ${[...anchors].join(", ")})`);
  }
});
