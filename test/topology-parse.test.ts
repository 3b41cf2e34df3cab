// SPDX-License-Identifier: Apache-2.0
/**
 * Topology files (src/topology/parse.ts): the documented example parses to the API configs it
 * stands for; bad values, unknown keys (with a suggestion), `jitter` against the backoff type,
 * duplicates and YAML syntax errors are refused with messages naming their path; every
 * problem of a file is reported, not only the first.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseTopology, TopologyValidationError } from "../src/topology/index.js";

const EXAMPLE = `
queues:
  - name: certificate-generation
    visibilityTimeoutMs: 120000
    retries: { maximumAttempts: 5, backoff: exponential, jitter: true, minDelayMs: 1000, maxDelayMs: 60000 }
    deadLetter: certificate-generation-failures
    dedupeWindowMs: 3600000
    concurrencyHint: 8
  - name: emails
    maxAttempts: 3
    backoff: { type: fixed, minDelayMs: 500 }
    redactHeaders: [Authorization]
topics:
  - name: learning-domain-events
    partitions: 12
    retentionMs: 604800000
    groups: [notifications, { name: analytics, start: earliest }]
`;

test("the documented example maps to the API's queue and topic configs", () => {
  const t = parseTopology(EXAMPLE);
  assert.deepEqual(t.queues[0], {
    name: "certificate-generation",
    config: {
      visibilityTimeoutMs: 120000,
      deadLetter: "certificate-generation-failures",
      dedupeWindowMs: 3600000,
      maxAttempts: 5,
      backoff: { type: "exponential", minDelayMs: 1000, maxDelayMs: 60000 },
    },
    concurrencyHint: 8,
  });
  assert.deepEqual(t.queues[1], { name: "emails", config: { maxAttempts: 3, backoff: { type: "fixed", minDelayMs: 500 }, redactHeaders: ["Authorization"] } });
  assert.deepEqual(t.topics, [
    {
      name: "learning-domain-events",
      config: { partitions: 12, retentionMs: 604800000 },
      groups: [
        { name: "notifications", start: "latest" },
        { name: "analytics", start: "earliest" },
      ],
    },
  ]);
  assert.deepEqual(parseTopology(""), { queues: [], topics: [] });
  assert.deepEqual(parseTopology("# nothing yet\n"), { queues: [], topics: [] });
});

function problem(yaml: string): string {
  try {
    parseTopology(yaml, "t.yaml");
  } catch (e) {
    assert.ok(e instanceof TopologyValidationError, `a TopologyValidationError, got ${String(e)}`);
    assert.equal(e.code, "VALIDATION");
    assert.ok(!e.message.includes("\n"), "one line");
    return e.message;
  }
  assert.fail(`accepted:\n${yaml}`);
}

const q = (body: string): string => `queues:\n  - name: a\n${body.replace(/^/gm, "    ")}\n`;

test("bad values are refused with the path of the field and the API's rule", () => {
  const cases: [string, RegExp][] = [
    [q("retries: { maximumAttempts: 0 }"), /^queues\[0\]\.retries\.maximumAttempts: must be an integer 1\.\.1000, got 0$/],
    [q("retries: { maximumAttempts: 2.5 }"), /^queues\[0\]\.retries\.maximumAttempts: must be an integer 1\.\.1000/],
    [q("maxAttempts: 1001"), /^queues\[0\]\.maxAttempts: must be a number in \[1, 1000\], got 1001$/],
    [q("maxDepth: 1.5"), /^queues\[0\]\.maxDepth: must be an integer, got 1\.5$/],
    [q("visibilityTimeoutMs: 5"), /^queues\[0\]\.visibilityTimeoutMs: must be a number in \[10, 43200000\], got 5$/],
    [q('visibilityTimeoutMs: "120000"'), /^queues\[0\]\.visibilityTimeoutMs: must be a number/],
    [q("retries: { minDelayMs: 5000, maxDelayMs: 100 }"), /^queues\[0\]\.retries\.maxDelayMs: must be a number in \[5000, /],
    [q("retries: { backoff: linear }"), /^queues\[0\]\.retries\.backoff: must be "exponential" or "fixed"$/],
    [q("backoff: { type: linear }"), /^queues\[0\]\.backoff\.type: must be "exponential" or "fixed"$/],
    [q("overflow: drop"), /^queues\[0\]\.overflow: must be "reject" or "block"$/],
    [q("deadLetter: a"), /^queues\[0\]\.deadLetter: queue a cannot be its own dead-letter queue$/],
    [q('deadLetter: "b/c"'), /^queues\[0\]\.deadLetter: invalid queue name "b\/c"/],
    [q("concurrencyHint: 0"), /^queues\[0\]\.concurrencyHint: must be an integer 1\.\.10000, got 0$/],
    [q("retries: 5"), /^queues\[0\]\.retries: must be a map/],
    [q("retries: { maximumAttempts: 3 }\nmaxAttempts: 3"), /^queues\[0\]\.retries\.maximumAttempts: give retries\.maximumAttempts or maxAttempts, not both$/],
    ["queues:\n  - visibilityTimeoutMs: 1000\n", /^queues\[0\]\.name: is required$/],
    ["queues:\n  - name: 'a b'\n", /^queues\[0\]\.name: invalid queue name "a b"/],
    ["queues: [{ name: a }, { name: a }]\n", /^queues\[1\]\.name: queue a is declared twice \(also queues\[0\]\)$/],
    ["queues: { name: a }\n", /^queues: must be a list$/],
    ["topics:\n  - name: t\n    partitions: 0\n", /^topics\[0\]\.partitions: must be an integer in \[1, 10000\], got 0$/],
    ["topics:\n  - name: t\n    retentionMs: -2\n", /^topics\[0\]\.retentionMs: must be an integer in \[-1, /],
    ["topics:\n  - name: t\n    segmentBytes: 4096\n    maxMessageBytes: 8192\n", /^topics\[0\]: maxMessageBytes must be an integer in \[1, 4096\], got 8192$/],
    ["topics:\n  - name: t\n    groups: [g, g]\n", /^topics\[0\]\.groups\[1\]: group g is listed twice$/],
    ["topics:\n  - name: t\n    groups: [{ name: g, start: middle }]\n", /^topics\[0\]\.groups\[0\]\.start: must be earliest or latest, got "middle"$/],
    ["topics:\n  - name: t\n    groups: ['a/b']\n", /^topics\[0\]\.groups\[0\]: invalid group name "a\/b"/],
    ["topics:\n  - name: '..'\n", /^topics\[0\]\.name: invalid topic name/],
    ["- a\n- b\n", /^the file must be a map with queues: and\/or topics:$/],
  ];
  for (const [yaml, re] of cases) assert.match(problem(yaml), re, yaml);
});

test("unknown keys are errors with a did-you-mean, at every level", () => {
  assert.match(problem("topic:\n  - name: t\n"), /^topic: unknown key \(did you mean topics\?\)$/);
  assert.match(problem(q("visibilityTimout: 1000")), /^queues\[0\]\.visibilityTimout: unknown key \(did you mean visibilityTimeoutMs\?\)$/);
  assert.match(problem(q("retries: { maxAttempts: 3 }")), /^queues\[0\]\.retries\.maxAttempts: unknown key \(did you mean maximumAttempts\?\)$/);
  assert.match(problem(q("backoff: { minDelay: 3 }")), /^queues\[0\]\.backoff\.minDelay: unknown key \(did you mean minDelayMs\?\)$/);
  assert.match(problem("topics:\n  - name: t\n    partition: 3\n"), /^topics\[0\]\.partition: unknown key \(did you mean partitions\?\)$/);
  assert.match(problem("topics:\n  - name: t\n    groups: [{ name: g, begin: earliest }]\n"), /^topics\[0\]\.groups\[0\]\.begin: unknown key/);
  // No close match: the known keys are listed instead.
  assert.match(problem(q("zzzzzzzzzz: 1")), /^queues\[0\]\.zzzzzzzzzz: unknown key; known: name, retries, concurrencyHint, visibilityTimeoutMs, /);
});

test("jitter may only say what the backoff type does: exponential always jitters, fixed never", () => {
  assert.match(problem(q("retries: { jitter: false }")), /^queues\[0\]\.retries\.jitter: exponential backoff always uses full jitter .*use backoff: fixed$/);
  assert.match(problem(q("retries: { backoff: fixed, jitter: true }")), /^queues\[0\]\.retries\.jitter: fixed backoff has no jitter/);
  assert.match(problem(q("retries: { jitter: sometimes }")), /^queues\[0\]\.retries\.jitter: must be true or false/);
  assert.deepEqual(parseTopology(q("retries: { backoff: fixed, jitter: false, minDelayMs: 10 }")).queues[0].config, { backoff: { type: "fixed", minDelayMs: 10 } });
  assert.deepEqual(parseTopology(q("retries: { jitter: true }")).queues[0].config, {});
});

test("every problem of a file is reported; YAML syntax errors name the line and column", () => {
  const m = problem("queues:\n  - name: a\n    maxAttempts: 0\n  - name: b\n    overflow: x\ntopics:\n  - name: t\n    partitions: 0\n    partitons: 2\n");
  assert.match(m, /^queues\[0\]\.maxAttempts: .*; queues\[1\]\.overflow: .*; topics\[0\]\.partitons: unknown key \(did you mean partitions\?\); and 1 more$/);
  try {
    parseTopology("queues:\n  - name: a\n    maxAttempts: 0\n  - name: b\n    overflow: x\n", "t.yaml");
  } catch (e) {
    assert.ok(e instanceof TopologyValidationError);
    assert.equal(e.problems.length, 2);
  }
  assert.match(problem("queues:\n  - name: a\n   bad: indent\n"), /^t\.yaml:3:\d+: /);
  assert.match(problem("queues:\n  - name: a\n    name: b\n"), /^t\.yaml:3:5: Map keys must be unique$/);
});
