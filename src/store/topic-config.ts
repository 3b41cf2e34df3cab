// SPDX-License-Identifier: Apache-2.0
/**
 * Topic configuration: defaults and limits, declared once, and their validation. Engine
 * neutral: the broker resolves a topic's config here before any engine sees it.
 */
import { isAbsolute } from "node:path";
import { ValidationError } from "../errors.js";
import type { ArchiveConfig, CleanupPolicy, TopicConfig } from "../types.js";

/** Partitions per topic. */
export const MAX_PARTITIONS = 10_000;
/** Segment size bounds (a segment's offsets are 32-bit relative to its base, its positions too). */
export const MIN_SEGMENT_BYTES = 1024;
export const MAX_SEGMENT_BYTES = 2 ** 31 - 1;
/** Largest record, whatever the segment size. */
export const MAX_MESSAGE_BYTES = 32 * 1024 * 1024;
export const MAX_FLUSH_INTERVAL_MS = 3_600_000;

export const TOPIC_DEFAULTS: Required<TopicConfig> = {
  partitions: 1,
  retentionMs: -1,
  retentionBytes: -1,
  segmentBytes: 256 * 1024 * 1024,
  segmentMs: 7 * 86_400_000,
  maxMessageBytes: 1024 * 1024,
  durability: "always",
  flushIntervalMs: 1000,
  archive: null,
  archiveRetentionMs: -1,
  cleanupPolicy: "delete",
  minCompactionLagMs: 0,
  deleteRetentionMs: 86_400_000,
  encrypted: false,
};

export const CLEANUP_POLICIES: readonly CleanupPolicy[] = ["delete", "compact", "compact,delete"];
export { isCompacted, keyRequiredError } from "../log/compaction-policy.js";

function intIn(name: string, v: unknown, min: number, max: number): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min || v > max)
    throw new ValidationError(`${name} must be an integer in [${min}, ${max}], got ${JSON.stringify(v)}`);
  return v;
}

/** The live-changeable keys of a topic config, validated as at creation (ValidationError names the key). */
export function resolveTopicAlteration(changes: unknown): { retentionMs?: number; retentionBytes?: number } {
  if (typeof changes !== "object" || changes === null || Array.isArray(changes)) throw new ValidationError("topic changes must be an object");
  const out: { retentionMs?: number; retentionBytes?: number } = {};
  for (const [k, v] of Object.entries(changes)) {
    if (v === undefined) continue;
    if (k !== "retentionMs" && k !== "retentionBytes") {
      throw new ValidationError(k in TOPIC_DEFAULTS ? `${k} cannot be changed on an existing topic (only retentionMs and retentionBytes)` : `unknown topic config key ${JSON.stringify(k)}`);
    }
    intIn(k, v as number, -1, Number.MAX_SAFE_INTEGER);
    out[k] = v as number;
  }
  if (Object.keys(out).length === 0) throw new ValidationError("nothing to change: give retentionMs and/or retentionBytes");
  return out;
}

export function resolveTopicConfig(config: TopicConfig = {}): Required<TopicConfig> {
  if (typeof config !== "object" || config === null) throw new ValidationError("topic config must be an object");
  for (const k of Object.keys(config)) if (!(k in TOPIC_DEFAULTS)) throw new ValidationError(`unknown topic config key ${JSON.stringify(k)}`);
  const c = { ...TOPIC_DEFAULTS, ...Object.fromEntries(Object.entries(config).filter(([, v]) => v !== undefined)) } as Required<TopicConfig>;
  intIn("partitions", c.partitions, 1, MAX_PARTITIONS);
  intIn("retentionMs", c.retentionMs, -1, Number.MAX_SAFE_INTEGER);
  intIn("retentionBytes", c.retentionBytes, -1, Number.MAX_SAFE_INTEGER);
  intIn("segmentBytes", c.segmentBytes, MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES);
  intIn("segmentMs", c.segmentMs, 1, Number.MAX_SAFE_INTEGER);
  // The default record limit shrinks with small segments; an explicit one must fit a segment.
  if (config.maxMessageBytes === undefined) c.maxMessageBytes = Math.min(c.maxMessageBytes, c.segmentBytes);
  intIn("maxMessageBytes", c.maxMessageBytes, 1, Math.min(c.segmentBytes, MAX_MESSAGE_BYTES));
  intIn("flushIntervalMs", c.flushIntervalMs, 1, MAX_FLUSH_INTERVAL_MS);
  if (!["always", "interval", "never"].includes(c.durability)) throw new ValidationError(`durability must be always|interval|never`);
  c.archive = resolveArchive(c.archive);
  intIn("archiveRetentionMs", c.archiveRetentionMs, -1, Number.MAX_SAFE_INTEGER);
  if (c.archive === null && c.archiveRetentionMs !== -1) throw new ValidationError("archiveRetentionMs needs an archive");
  if (!CLEANUP_POLICIES.includes(c.cleanupPolicy)) throw new ValidationError(`cleanupPolicy must be ${CLEANUP_POLICIES.join("|")}, got ${JSON.stringify(c.cleanupPolicy)}`);
  intIn("minCompactionLagMs", c.minCompactionLagMs, 0, Number.MAX_SAFE_INTEGER);
  intIn("deleteRetentionMs", c.deleteRetentionMs, 0, Number.MAX_SAFE_INTEGER);
  if (typeof c.encrypted !== "boolean") throw new ValidationError(`encrypted must be true or false, got ${JSON.stringify(c.encrypted)}`);
  if (c.encrypted) {
    // The cleaner reads record keys and rewrites batches without keys (docs/security.md,
    // "Encryption at rest"). Archived segments stay encrypted and are decrypted when read.
    if (c.cleanupPolicy !== "delete") throw new ValidationError(`encrypted topics cannot use cleanupPolicy ${JSON.stringify(c.cleanupPolicy)} (the cleaner would need the keys)`);
  }
  return c;
}

/** `archive`: null, or `{ dir }` with an absolute directory (ARC-1..4 in docs/ARCHITECTURE.md). */
function resolveArchive(a: unknown): ArchiveConfig | null {
  if (a === null) return null;
  if (typeof a !== "object" || Array.isArray(a)) throw new ValidationError(`archive must be null or { dir: "/absolute/path" }`);
  const keys = Object.keys(a);
  const dir = (a as { dir?: unknown }).dir;
  if (keys.some((k) => k !== "dir") || typeof dir !== "string" || !isAbsolute(dir) || dir.includes("\0"))
    throw new ValidationError(`archive must be { dir: "/absolute/path" }, got ${JSON.stringify(a)}`);
  return { dir };
}
