// SPDX-License-Identifier: Apache-2.0
/**
 * The consumer test kit's rebalance run (consumer-kit.ts): partitions move between members of
 * the group while a handler is in flight, twice, and the run then continues to the end.
 *
 * 1. Member A consumes alone, one stored batch per fetch so it moves between partitions as it
 *    goes. Its handler of the first message of the last partition with records is held at
 *    `msg.commit()` (its work done, nothing committed).
 * 2. Member B joins: that partition moves to B (the range assignment gives a newcomer the last
 *    partitions), which redelivers from the last commit while A's handler is still held. Then
 *    A's handler is released: its commit is refused (NotAssignedError), as in production.
 * 3. A's next handler is held the same way and A's subscription is aborted (it leaves at once):
 *    B takes over every partition and redelivers the held message; A's handler is released.
 * 4. B consumes to the end.
 *
 * Each step waits on a condition with a deadline; the moves are read from `onRebalance`.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker } from "../broker/broker.js";
import type { Broker, Message, PublishRecord, Subscription, SubscriptionStatus } from "../types.js";
import { newWorld, wrapMessage, type KitHandler, type KitWorld } from "./consumer-kit-world.js";

/** What moved in the rebalance run, from the members' rebalance events. */
export interface KitRebalanceReport {
  /** Partitions taken from the first member when the second joined. */
  movedOnJoin: number[];
  /** The message whose handler was in flight (held before its commit) when the second member joined. */
  inFlightOnJoin: { partition: number; offset: number; moved: boolean } | null;
  /** Partitions the second member took over when the first member's subscription was aborted. */
  movedOnAbort: number[];
  /** The message in flight at the first member when its subscription was aborted. */
  inFlightOnAbort: { partition: number; offset: number; moved: boolean } | null;
  /** Commits refused because the message's partition had moved (it is redelivered to the new owner). */
  refusedCommits: number;
}

const TOPIC = "kit";
const GROUP = "kit-consumer";
const STEP_MS = 10_000;

/** A handler held before its commit: `arrived` is its message once it got there. */
interface Hold {
  match(msg: Message): boolean;
  arrived: Message | null;
  release(): void;
  released: Promise<void>;
}

function newHold(match: (msg: Message) => boolean): Hold {
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  return { match, arrived: null, release, released };
}

class Member {
  readonly ac = new AbortController();
  readonly events: SubscriptionStatus[] = [];
  readonly sub: Subscription;
  hold: Hold | null = null;
  done: Promise<void> = Promise.resolve();
  constructor(broker: Broker) {
    // One stored batch per fetch (maxBytes 1): the member moves between its partitions as it goes.
    this.sub = broker.subscribe(TOPIC, { group: GROUP, start: "earliest", maxBytes: 1, signal: this.ac.signal, drainTimeoutMs: 0, onRebalance: (e) => this.events.push(e) });
  }
  revoked(): number[] {
    return [...new Set(this.events.flatMap((e) => e.revoked))].sort((a, b) => a - b);
  }
}

/** Publishes in small batches (at most ~50 calls), in order, so partitions hold several batches. */
async function publishInterleaved(broker: Broker, records: PublishRecord[]): Promise<Set<number>> {
  const chunk = Math.max(1, Math.ceil(records.length / 50));
  const used = new Set<number>();
  for (let i = 0; i < records.length; i += chunk) {
    for (const r of await broker.publishBatch(TOPIC, records.slice(i, i + chunk))) used.add(r.partition);
  }
  return used;
}

/** The run; see the file comment. */
export async function rebalanceRun(handler: KitHandler, records: PublishRecord[], partitions: number): Promise<{ world: KitWorld; rebalance: KitRebalanceReport }> {
  const dir = mkdtempSync(join(tmpdir(), "sluice-kit-"));
  const broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  const world = newWorld(null);
  const report: KitRebalanceReport = { movedOnJoin: [], inFlightOnJoin: null, movedOnAbort: [], inFlightOnAbort: null, refusedCommits: 0 };
  const members: Member[] = [];
  let failure: unknown = null;
  const start = (m: Member): void => {
    members.push(m);
    m.done = consume(m, handler, world, report).catch((e: unknown) => void (failure ??= e));
  };
  /** Waits for `cond`, failing at once if a member's loop failed, or after the deadline. */
  const until = async (cond: () => boolean | Promise<boolean>, what: string, ms = STEP_MS): Promise<void> => {
    const deadline = Date.now() + ms;
    for (;;) {
      if (failure !== null) throw failure;
      if (await cond()) return;
      if (Date.now() > deadline) throw new Error(`rebalance run: timed out after ${ms} ms waiting for ${what} (lag per partition: ${await lagSummary()})`);
      await new Promise((r) => setTimeout(r, 5));
    }
  };
  const lagSummary = async (): Promise<string> => JSON.stringify((await broker.groupLag(GROUP, TOPIC)).partitions.map((p) => p.lagRecords));
  const caughtUp = async (): Promise<boolean> => (await broker.groupLag(GROUP, TOPIC)).totalRecords === 0;
  try {
    await broker.createTopic(TOPIC, { partitions });
    const used = await publishInterleaved(broker, records);
    const target = Math.max(...used);
    const a = new Member(broker);
    const first = (a.hold = newHold((m) => m.partition === target));
    start(a);
    await until(async () => first.arrived !== null || (await caughtUp()), `a handler of partition ${target} in flight`);
    if (first.arrived !== null) await joinWhileHeld(a, first, broker, start, until, report);
    const b = members[1];
    if (b !== undefined && a.hold !== null) await abortWhileHeld(a, b, partitions, until, caughtUp, report);
    await until(caughtUp, "every record committed", 30_000);
  } finally {
    for (const m of members) {
      m.hold?.release();
      m.ac.abort();
    }
    await Promise.all(members.map((m) => m.done));
    for (const m of members) await m.sub.close();
    await broker.close();
    rmSync(dir, { recursive: true, force: true });
  }
  if (failure !== null) throw failure;
  return { world, rebalance: report };
}

type Until = (cond: () => boolean | Promise<boolean>, what: string, ms?: number) => Promise<void>;

/** Step 2: B joins while A's handler of `held` waits before its commit; then A goes on. */
async function joinWhileHeld(a: Member, first: Hold, broker: Broker, start: (m: Member) => void, until: Until, report: KitRebalanceReport): Promise<void> {
  const held = first.arrived!;
  const b = new Member(broker);
  start(b);
  await until(() => a.revoked().length > 0 && b.sub.assignment().length > 0, "the second member to take partitions");
  report.movedOnJoin = a.revoked();
  report.inFlightOnJoin = { partition: held.partition, offset: held.offset, moved: report.movedOnJoin.includes(held.partition) };
  a.hold = newHold(() => true); // A's next handler, held the same way for step 3
  first.release();
}

/** Step 3: A's subscription aborts while its next handler waits before its commit; B takes over. */
async function abortWhileHeld(a: Member, b: Member, partitions: number, until: Until, caughtUp: () => Promise<boolean>, report: KitRebalanceReport): Promise<void> {
  const hold = a.hold!;
  await until(async () => hold.arrived !== null || (await caughtUp()), "the first member's next handler in flight");
  const held = hold.arrived;
  if (held === null) return; // A had nothing more to do: nothing was in flight to move
  const before = b.sub.assignment();
  a.ac.abort(); // drainTimeoutMs 0: A leaves the group at once, its handler still running
  await until(() => b.sub.assignment().length === partitions, "the second member to take every partition");
  report.movedOnAbort = b.sub.assignment().filter((p) => !before.includes(p));
  report.inFlightOnAbort = { partition: held.partition, offset: held.offset, moved: report.movedOnAbort.includes(held.partition) };
  hold.release();
}

/** A member's loop: the handler on each message; a refusal because the partition moved is no finding. */
async function consume(m: Member, handler: KitHandler, world: KitWorld, report: KitRebalanceReport): Promise<void> {
  for await (const msg of m.sub) {
    const hold = m.hold;
    const beforeCommit =
      hold !== null && hold.match(msg)
        ? async () => {
            m.hold = null;
            hold.arrived = msg;
            await hold.released;
          }
        : undefined;
    try {
      await handler(wrapMessage(msg, world, beforeCommit, () => void (msg.signal.aborted && report.refusedCommits++)), world);
    } catch (e) {
      // The partition moved (or the member left) while the handler ran: its commit is refused
      // and the new owner redelivers the message, as in production.
      if (!msg.signal.aborted) throw e;
    }
  }
}
