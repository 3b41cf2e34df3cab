// SPDX-License-Identifier: Apache-2.0
/**
 * Poison policy for streams: a handler failure is classified, and each class has one answer
 * (docs/patterns.md, "Poison policy"):
 *
 * - `transient`: retried with jittered backoff, blocking only its key; when the attempts are
 *   spent it is treated as a defect;
 * - `permanent`: published to the dead-letter topic with the original record and why (source
 *   topic, partition and offset, error class and message, attempt history, code version;
 *   secret headers redacted), then counted as finished;
 * - `missing-predecessor`: the key is parked (paused) until resumed;
 * - `defect` (anything unknown once retries are spent): the key is paused, the record is never
 *   committed past and never dropped; paused keys are listed and resumed by API.
 *
 * Dead-letter topics are redriven like queue dead-letter queues, with the same loop guard: a
 * record redriven `maxRedrives` times that dead-letters again is a repeat and is skipped.
 */
import { BrokerError, InvalidEnvelopeError, PermanentError, SchemaViolationError } from "../errors.js";
import type { Broker, ConsumedRecord, Message, PublishRecord } from "../types.js";

export type FailureClass = "transient" | "permanent" | "missing-predecessor" | "defect";

/** Thrown by a handler whose record depends on one not seen yet (a version gap, an unknown parent). */
export class MissingPredecessorError extends Error {
  readonly failureClass = "missing-predecessor";
}

/**
 * The default classification: `PermanentError`, schema and envelope violations and JSON syntax
 * errors are permanent; `MissingPredecessorError` is a missing predecessor; everything else is
 * transient (retried, then a defect).
 */
export function classifyFailure(err: unknown): FailureClass {
  if (err instanceof MissingPredecessorError) return "missing-predecessor";
  if (err instanceof PermanentError || err instanceof SchemaViolationError || err instanceof InvalidEnvelopeError || err instanceof SyntaxError) return "permanent";
  if (err instanceof BrokerError && !err.retriable) return "permanent";
  const declared = (err as { failureClass?: unknown } | null)?.failureClass;
  if (declared === "transient" || declared === "permanent" || declared === "missing-predecessor" || declared === "defect") return declared;
  return "transient";
}

/** Header names removed from dead-letter copies unless the policy says otherwise. */
export const DEFAULT_REDACTED_HEADERS: readonly string[] = ["authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key", "x-auth-token", "x-access-token", "password", "secret", "token"];

export interface DeadLetterTopicOptions {
  broker: Pick<Broker, "publish">;
  topic: string;
  /** Version of the consuming code, recorded with each dead letter. */
  codeVersion?: string;
  /** Header names (case-insensitive) left out of the copy. Default `DEFAULT_REDACTED_HEADERS`. */
  redactHeaders?: readonly string[];
}

export interface AttemptRecord {
  at: number;
  attempt: number;
  errorClass: string;
  error: string;
}

/** Headers a dead letter carries on top of the original (redacted) ones. */
export const DLQ_HEADERS = {
  sourceTopic: "sluice-dlq-source-topic",
  sourcePartition: "sluice-dlq-source-partition",
  sourceOffset: "sluice-dlq-source-offset",
  errorClass: "sluice-dlq-error-class",
  error: "sluice-dlq-error",
  failureClass: "sluice-dlq-failure-class",
  attempts: "sluice-dlq-attempts",
  codeVersion: "sluice-dlq-code-version",
  failedAt: "sluice-dlq-failed-at",
  redacted: "sluice-dlq-redacted",
  redriveCount: "sluice-redrive-count",
} as const;

const text = (v: string | Uint8Array | undefined): string | undefined => (v === undefined ? undefined : typeof v === "string" ? v : Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("utf8"));

/** The dead-letter copy of `msg`: original key, value and headers (redacted), and why. */
export function deadLetterRecord(msg: ConsumedRecord, failure: FailureClass, history: AttemptRecord[], opts: Pick<DeadLetterTopicOptions, "codeVersion" | "redactHeaders">): PublishRecord {
  const redact = new Set((opts.redactHeaders ?? DEFAULT_REDACTED_HEADERS).map((h) => h.toLowerCase()));
  const headers: Record<string, string | Uint8Array> = {};
  const removed: string[] = [];
  for (const [k, v] of Object.entries(msg.headers)) {
    if (redact.has(k.toLowerCase())) removed.push(k);
    else if (!k.startsWith("sluice-dlq-")) headers[k] = v;
  }
  const last = history[history.length - 1];
  Object.assign(headers, {
    [DLQ_HEADERS.sourceTopic]: msg.topic,
    [DLQ_HEADERS.sourcePartition]: String(msg.partition),
    [DLQ_HEADERS.sourceOffset]: String(msg.offset),
    [DLQ_HEADERS.errorClass]: last?.errorClass ?? "Error",
    [DLQ_HEADERS.error]: (last?.error ?? "").slice(0, 1024),
    [DLQ_HEADERS.failureClass]: failure,
    [DLQ_HEADERS.attempts]: JSON.stringify(history.slice(-20)),
    [DLQ_HEADERS.failedAt]: String(Date.now()),
    [DLQ_HEADERS.redacted]: removed.join(","),
  });
  if (opts.codeVersion !== undefined) headers[DLQ_HEADERS.codeVersion] = opts.codeVersion;
  return { key: msg.key, value: msg.value as PublishRecord["value"], headers, timestamp: msg.timestamp };
}

export function attemptRecord(attempt: number, err: unknown): AttemptRecord {
  const e = err as { name?: unknown; message?: unknown } | null;
  return { at: Date.now(), attempt, errorClass: typeof e?.name === "string" ? e.name : typeof err, error: typeof e?.message === "string" ? e.message : String(err) };
}

export interface RedriveTopicOptions {
  /** Group used to remember which dead letters were redriven. Default "sluice-redrive". */
  group?: string;
  /** A dead letter whose record was already redriven this many times is a repeat: skipped. Default 3. */
  maxRedrives?: number;
  includeRepeats?: boolean;
  /**
   * Only these (e.g. by `sluice-dlq-error-class`). The others are passed over: this group's
   * position moves past them, so a later pass over them needs another `group`.
   */
  filter?: (msg: Message) => boolean;
  /** Stop after this many redriven records. Default: everything in the topic now. */
  limit?: number;
}

/**
 * Moves dead letters back to their source topics (their key, value and original headers, with
 * `sluice-redrive-count` incremented), through a consumer group on the dead-letter topic so
 * each one is redriven once. Repeats (redriven `maxRedrives` times already) are skipped unless
 * `includeRepeats`. Returns counts.
 */
export async function redriveTopic(broker: Pick<Broker, "subscribe" | "publish" | "groupLag">, deadLetterTopic: string, opts: RedriveTopicOptions = {}): Promise<{ redriven: number; repeats: number; filtered: number }> {
  const group = opts.group ?? "sluice-redrive";
  const maxRedrives = opts.maxRedrives ?? 3;
  const limit = opts.limit ?? Number.POSITIVE_INFINITY;
  let left = (await broker.groupLag(group, deadLetterTopic)).totalRecords;
  const out = { redriven: 0, repeats: 0, filtered: 0 };
  if (left === 0) return out;
  const ac = new AbortController();
  const sub = broker.subscribe(deadLetterTopic, { group, start: "earliest", signal: ac.signal, drainTimeoutMs: 0 });
  try {
    for await (const msg of sub) {
      const count = Number(text(msg.headers[DLQ_HEADERS.redriveCount]) ?? "0");
      const source = text(msg.headers[DLQ_HEADERS.sourceTopic]);
      if (opts.filter && !opts.filter(msg)) out.filtered++;
      else if (count >= maxRedrives && !opts.includeRepeats) out.repeats++;
      else if (source !== undefined) {
        const headers: Record<string, string | Uint8Array> = {};
        for (const [k, v] of Object.entries(msg.headers)) if (!k.startsWith("sluice-dlq-") && k !== DLQ_HEADERS.redriveCount) headers[k] = v;
        headers[DLQ_HEADERS.redriveCount] = String(count + 1);
        await broker.publish(source, msg.value as PublishRecord["value"], { key: msg.key, headers });
        out.redriven++;
      }
      await msg.commit();
      if (--left <= 0 || out.redriven >= limit) break;
    }
  } finally {
    ac.abort();
    await sub.close();
  }
  return out;
}
