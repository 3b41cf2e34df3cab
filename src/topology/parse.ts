// SPDX-License-Identifier: Apache-2.0
/**
 * A topology file (YAML, docs/topology.md): queues and topics with their groups, declared.
 * `parseTopology` reads and validates it with the API's own rules (resolveQueueConfig,
 * resolveTopicConfig, the name rules), so that a file accepted here is accepted by the broker
 * with the same meaning. Problems name their path (`queues[0].retries.maximumAttempts: ...`);
 * an unknown key suggests the closest known one.
 */
import { parseDocument } from "yaml";
import { BrokerError, ValidationError } from "../errors.js";
import { MAX_ATTEMPTS_LIMIT, MAX_PREFETCH, resolveQueueConfig, validateQueueName } from "../queues/config.js";
import type { QueueConfig } from "../queues/types.js";
import { validateName } from "../store/names.js";
import { MAX_SEGMENT_BYTES, TOPIC_DEFAULTS, resolveTopicConfig } from "../store/topic-config.js";
import type { TopicConfig } from "../types.js";
import { suggest } from "../cli/args.js";

export interface QueueDeclaration {
  name: string;
  /** The API config the entry maps to (`broker.queue(name, config)`). */
  config: QueueConfig;
  /** Advisory, for workers and operators; the broker stores no such setting. */
  concurrencyHint?: number;
}

export interface GroupDeclaration {
  name: string;
  /** Where a new group's offsets are initialised. Default "latest". */
  start: "earliest" | "latest";
}

export interface TopicDeclaration {
  name: string;
  /** The API config (`broker.createTopic(name, config)`): only the keys the file gives. */
  config: TopicConfig;
  groups: GroupDeclaration[];
}

export interface Topology {
  queues: QueueDeclaration[];
  topics: TopicDeclaration[];
}

/** A topology file that does not parse or validate: every problem, each naming its path. */
export class TopologyValidationError extends ValidationError {
  constructor(readonly problems: string[]) {
    super(problems.length <= 3 ? problems.join("; ") : `${problems.slice(0, 3).join("; ")}; and ${problems.length - 3} more`);
  }
}

const TOP_KEYS = ["queues", "topics"];
/** Every QueueConfig field, by its API name (the keys of a resolved config are exactly those). */
const QUEUE_CONFIG_KEYS = Object.keys(resolveQueueConfig("x", {}));
const QUEUE_KEYS = ["name", "retries", "concurrencyHint", ...QUEUE_CONFIG_KEYS];
const RETRY_KEYS = ["maximumAttempts", "backoff", "jitter", "minDelayMs", "maxDelayMs"];
const BACKOFF_KEYS = ["type", "minDelayMs", "maxDelayMs"];
const TOPIC_KEYS = ["name", "groups", ...Object.keys(TOPIC_DEFAULTS)];
const GROUP_KEYS = ["name", "start"];
/** Fields the API floors to an integer: the file wants an integer (no silent rounding). */
const INTEGER_FIELDS = new Set(["maxAttempts", "maxDepth", "maxBytes", "maxDedupeEntries", "maxRedrives", "maxMessageBytes", "maxInFlight", "segmentBytes", "resultRetentionMs"]);

type Obj = Record<string, unknown>;

/** Collects problems; `at` runs a check and records its ValidationError under a path. */
class Problems {
  readonly list: string[] = [];
  add(path: string, msg: string): void {
    this.list.push(path === "" ? msg : `${path}: ${msg}`);
  }
  at(path: string, fn: () => void): boolean {
    try {
      fn();
      return true;
    } catch (e) {
      if (!(e instanceof BrokerError)) throw e;
      this.add(path, e.message);
      return false;
    }
  }
}

function isObj(v: unknown): v is Obj {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

/** Names people reach for that spelling distance does not find: the API's names in `retries`, and back. */
const ALIASES: Record<string, string> = { maxAttempts: "maximumAttempts", type: "backoff", maximumAttempts: "maxAttempts", retry: "retries", jitter: "retries.jitter" };

/** Unknown keys of `o` (with a did-you-mean); false when there were any. */
function knownKeys(p: Problems, path: string, o: Obj, known: readonly string[]): boolean {
  let ok = true;
  for (const k of Object.keys(o)) {
    if (known.includes(k)) continue;
    const alias = Object.hasOwn(ALIASES, k) ? ALIASES[k] : undefined;
    const guess = alias !== undefined && known.includes(alias.split(".")[0]) ? alias : suggest(k, known);
    p.add(`${path === "" ? "" : path + "."}${k}`, `unknown key${guess ? ` (did you mean ${guess}?)` : `; known: ${known.join(", ")}`}`);
    ok = false;
  }
  return ok;
}

function list(p: Problems, path: string, v: unknown): unknown[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) {
    p.add(path, "must be a list");
    return [];
  }
  return v;
}

/** Parses and validates a topology file's text. Throws TopologyValidationError. */
export function parseTopology(text: string, source = "topology"): Topology {
  const doc = parseDocument(text, { prettyErrors: true, uniqueKeys: true });
  if (doc.errors.length > 0) {
    const e = doc.errors[0];
    const pos = e.linePos?.[0];
    throw new TopologyValidationError([`${source}${pos ? `:${pos.line}:${pos.col}` : ""}: ${e.message.split("\n")[0].replace(/ at line \d+, column \d+:?$/, "")}`]);
  }
  return validateTopology(doc.toJS({ maxAliasCount: 100 }) as unknown);
}

/** Validates a topology given as plain data (the parsed YAML). Throws TopologyValidationError. */
export function validateTopology(raw: unknown): Topology {
  const p = new Problems();
  const out: Topology = { queues: [], topics: [] };
  if (raw === null || raw === undefined) return out;
  if (!isObj(raw)) throw new TopologyValidationError(["the file must be a map with queues: and/or topics:"]);
  knownKeys(p, "", raw, TOP_KEYS);
  const seenQ = new Map<string, number>();
  list(p, "queues", raw.queues).forEach((e, i) => {
    const q = queueEntry(p, `queues[${i}]`, e);
    if (q === null) return;
    const prev = seenQ.get(q.name);
    if (prev !== undefined) p.add(`queues[${i}].name`, `queue ${q.name} is declared twice (also queues[${prev}])`);
    else seenQ.set(q.name, i);
    out.queues.push(q);
  });
  const seenT = new Map<string, number>();
  list(p, "topics", raw.topics).forEach((e, i) => {
    const t = topicEntry(p, `topics[${i}]`, e);
    if (t === null) return;
    const prev = seenT.get(t.name);
    if (prev !== undefined) p.add(`topics[${i}].name`, `topic ${t.name} is declared twice (also topics[${prev}])`);
    else seenT.set(t.name, i);
    out.topics.push(t);
  });
  if (p.list.length > 0) throw new TopologyValidationError(p.list);
  return out;
}

function queueEntry(p: Problems, path: string, e: unknown): QueueDeclaration | null {
  if (!isObj(e)) {
    p.add(path, "must be a map with at least name:");
    return null;
  }
  const before = p.list.length;
  knownKeys(p, path, e, QUEUE_KEYS);
  if (e.name === undefined) p.add(`${path}.name`, "is required");
  else p.at(`${path}.name`, () => validateQueueName(e.name));
  // Maps each API field to the path it came from, to name it in the API's messages.
  const origin = new Map<string, string>();
  const config: QueueConfig = {};
  for (const k of QUEUE_CONFIG_KEYS) {
    if (e[k] === undefined) continue;
    (config as Obj)[k] = e[k];
    origin.set(k, `${path}.${k}`);
    if (INTEGER_FIELDS.has(k) && typeof e[k] === "number" && !Number.isInteger(e[k])) p.add(`${path}.${k}`, `must be an integer, got ${String(e[k])}`);
  }
  if (isObj(e.backoff)) {
    knownKeys(p, `${path}.backoff`, e.backoff, BACKOFF_KEYS);
    for (const k of BACKOFF_KEYS) origin.set(`backoff.${k}`, `${path}.backoff.${k}`);
  }
  if (e.retries !== undefined) retries(p, `${path}.retries`, e, config, origin);
  if (e.concurrencyHint !== undefined) {
    const c = e.concurrencyHint;
    if (typeof c !== "number" || !Number.isInteger(c) || c < 1 || c > MAX_PREFETCH) p.add(`${path}.concurrencyHint`, `must be an integer 1..${MAX_PREFETCH}, got ${JSON.stringify(c)}`);
  }
  if (p.list.length > before || typeof e.name !== "string") return null;
  // The API's own validation, on exactly the config `apply` will declare.
  try {
    resolveQueueConfig(e.name, config);
  } catch (err) {
    if (!(err instanceof ValidationError)) throw err;
    let field = /^([\w.]+) must /.exec(err.message)?.[1];
    let at = field === undefined ? undefined : origin.get(field);
    if (at === undefined && config.deadLetter !== undefined && /dead-letter|queue name/.test(err.message)) {
      at = origin.get("deadLetter");
      field = undefined;
    }
    p.add(at ?? path, at === undefined || field === undefined ? err.message : err.message.slice(field.length + 1));
    return null;
  }
  const decl: QueueDeclaration = { name: e.name, config };
  if (e.concurrencyHint !== undefined) decl.concurrencyHint = e.concurrencyHint as number;
  return decl;
}

/**
 * `retries: {maximumAttempts, backoff, jitter, minDelayMs, maxDelayMs}` → `maxAttempts` and
 * `backoff {type, minDelayMs, maxDelayMs}`. Jitter is not a setting of the broker: exponential
 * backoff always draws each delay at random up to the step (full jitter), fixed backoff never
 * does, so `jitter` may only say what the backoff type does anyway.
 */
function retries(p: Problems, path: string, e: Obj, config: QueueConfig, origin: Map<string, string>): void {
  const r = e.retries;
  if (!isObj(r)) {
    p.add(path, "must be a map (maximumAttempts, backoff, jitter, minDelayMs, maxDelayMs)");
    return;
  }
  knownKeys(p, path, r, RETRY_KEYS);
  if (r.maximumAttempts !== undefined) {
    if (e.maxAttempts !== undefined) p.add(`${path}.maximumAttempts`, "give retries.maximumAttempts or maxAttempts, not both");
    const m = r.maximumAttempts;
    if (typeof m !== "number" || !Number.isInteger(m) || m < 1 || m > MAX_ATTEMPTS_LIMIT) p.add(`${path}.maximumAttempts`, `must be an integer 1..${MAX_ATTEMPTS_LIMIT}, got ${JSON.stringify(m)}`);
    config.maxAttempts = m as number;
    origin.set("maxAttempts", `${path}.maximumAttempts`);
  }
  const fields: [string, string][] = [
    ["backoff", "type"],
    ["minDelayMs", "minDelayMs"],
    ["maxDelayMs", "maxDelayMs"],
  ];
  const given = fields.filter(([f]) => r[f] !== undefined);
  if (given.length > 0 && e.backoff !== undefined) p.add(path, "give the backoff in retries or in backoff:, not both");
  if (given.length > 0) {
    const b: Obj = {};
    for (const [f, api] of given) {
      b[api] = r[f];
      origin.set(`backoff.${api}`, `${path}.${f}`);
    }
    config.backoff = b as QueueConfig["backoff"];
  }
  if (r.jitter !== undefined) {
    const type = config.backoff?.type ?? "exponential";
    if (typeof r.jitter !== "boolean") p.add(`${path}.jitter`, `must be true or false, got ${JSON.stringify(r.jitter)}`);
    else if (!r.jitter && type === "exponential")
      p.add(`${path}.jitter`, "exponential backoff always uses full jitter (each delay is drawn between minDelayMs and the step); for exact delays use backoff: fixed");
    else if (r.jitter && type === "fixed") p.add(`${path}.jitter`, "fixed backoff has no jitter (every retry waits minDelayMs); use backoff: exponential for jittered delays");
  }
}

function topicEntry(p: Problems, path: string, e: unknown): TopicDeclaration | null {
  if (!isObj(e)) {
    p.add(path, "must be a map with at least name:");
    return null;
  }
  const before = p.list.length;
  knownKeys(p, path, e, TOPIC_KEYS);
  if (e.name === undefined) p.add(`${path}.name`, "is required");
  else p.at(`${path}.name`, () => validateName("topic", e.name));
  const config: TopicConfig = {};
  for (const k of Object.keys(TOPIC_DEFAULTS)) if (e[k] !== undefined) (config as Obj)[k] = e[k];
  // Field by field first, so that a bad value is named by its path; then the whole config.
  for (const k of Object.keys(config)) {
    const only = { [k]: (config as Obj)[k] } as TopicConfig;
    // Cross-field rules (maxMessageBytes against segmentBytes) are left to the whole check.
    if (k === "maxMessageBytes") only.segmentBytes = MAX_SEGMENT_BYTES;
    p.at(`${path}.${k}`, () => {
      try {
        resolveTopicConfig(only);
      } catch (err) {
        if (err instanceof ValidationError) throw new ValidationError(err.message.replace(/^\w+ must/, "must"));
        throw err;
      }
    });
  }
  const groups: GroupDeclaration[] = [];
  const seen = new Set<string>();
  list(p, `${path}.groups`, e.groups).forEach((g, i) => {
    const gd = groupEntry(p, `${path}.groups[${i}]`, g);
    if (gd === null) return;
    if (seen.has(gd.name)) p.add(`${path}.groups[${i}]`, `group ${gd.name} is listed twice`);
    seen.add(gd.name);
    groups.push(gd);
  });
  if (p.list.length > before || typeof e.name !== "string") return null;
  if (!p.at(path, () => resolveTopicConfig(config))) return null;
  return { name: e.name, config, groups };
}

function groupEntry(p: Problems, path: string, g: unknown): GroupDeclaration | null {
  const o: Obj = typeof g === "string" ? { name: g } : isObj(g) ? g : {};
  if (!isObj(g) && typeof g !== "string") {
    p.add(path, "must be a group name or a map {name, start}");
    return null;
  }
  const before = p.list.length;
  knownKeys(p, path, o, GROUP_KEYS);
  if (o.name === undefined) p.add(`${path}.name`, "is required");
  else p.at(typeof g === "string" ? path : `${path}.name`, () => validateName("group", o.name));
  const start = o.start ?? "latest";
  if (start !== "earliest" && start !== "latest") p.add(`${path}.start`, `must be earliest or latest, got ${JSON.stringify(start)}`);
  if (p.list.length > before) return null;
  return { name: o.name as string, start: start as "earliest" | "latest" };
}
