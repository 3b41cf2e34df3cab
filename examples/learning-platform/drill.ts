// SPDX-License-Identifier: Apache-2.0
/**
 * The crash-and-rebalance drill on group "analytics":
 * 1. A member in a child process applies facts and commits each; after the 8th it has committed
 *    the database transaction but not the group position, and is SIGKILLed there.
 * 2. The group empties (the broker sees the connection die). member-1 joins in this process and
 *    resumes from the last committed position, so the 8th fact comes back: the inbox skips it.
 * 3. After member-1 has handled 5 records, member-2 joins: the group rebalances and the two
 *    split the partitions until the group's lag is 0.
 * The child reaches the broker over the network: through SLUICE_URL, or, embedded, through a
 * server this process starts on its embedded broker (`startServer` from "sluice/server").
 */
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import type pg from "pg";
import { connect, type Broker, type SubscriptionStatus } from "sluice";
import { analyticsMember, analyticsTotals, type ConsumerCounts } from "./consumers.js";
import { log, namesFor, pgPool, waitFor, type Checks, type Names } from "./runtime.js";

export const CHILD_FLAG = "--analytics-member";
const CRASH_AFTER = 8;

/** Entry of the child process (main.js --analytics-member): one analytics member that crashes. */
export async function childMember(): Promise<void> {
  const names = namesFor(process.env.LP_RUN!);
  const broker = await connect({ url: process.env.LP_BROKER_URL! });
  const pool = pgPool(process.env.LP_PG_SCHEMA!, 2);
  const counts: ConsumerCounts = { applied: 0, duplicates: 0 };
  const emit = (o: object): void => void process.stdout.write(JSON.stringify(o) + "\n");
  await analyticsMember(broker, pool, names.completions, {
    name: "child",
    signal: new AbortController().signal,
    counts,
    crashAfter: CRASH_AFTER,
    onRebalance: (e) => emit({ event: "rebalance", assigned: e.assigned }),
    onCrashPoint: (m) => emit({ event: "crash-point", applied: counts.applied, partition: m.partition, offset: m.offset }),
  });
}

interface ChildCrash {
  pid: number;
  signal: NodeJS.Signals | null;
  applied: number;
  partition: number;
  offset: number;
}

async function crashChild(url: string, names: Names, schema: string): Promise<ChildCrash> {
  const child = spawn(process.execPath, [fileURLToPath(new URL("./main.js", import.meta.url)), CHILD_FLAG], {
    env: { ...process.env, LP_BROKER_URL: url, LP_RUN: names.run, LP_PG_SCHEMA: schema },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const exited = new Promise<NodeJS.Signals | null>((resolve) => child.once("exit", (_code, signal) => resolve(signal)));
  let crash: { applied: number; partition: number; offset: number } | null = null;
  let exitedEarly = false;
  void exited.then(() => (exitedEarly = true));
  createInterface({ input: child.stdout! }).on("line", (line) => {
    try {
      const e = JSON.parse(line) as { event: string; applied: number; partition: number; offset: number };
      if (e.event === "crash-point") crash = e;
    } catch {
      /* not one of the child's event lines */
    }
  });
  try {
    await waitFor(() => crash !== null || exitedEarly, "the child member to reach its crash point");
  } finally {
    child.kill("SIGKILL");
  }
  const signal = await exited;
  if (!crash) throw new Error("the child member exited before its crash point");
  const c = crash as { applied: number; partition: number; offset: number };
  return { pid: child.pid!, signal, ...c };
}

/** Runs the drill; returns nothing, records its outcomes in `checks`. */
export async function crashAndRebalance(broker: Broker, pool: pg.Pool, names: Names, schema: string, url: string, expected: number, checks: Checks): Promise<void> {
  const crash = await crashChild(url, names, schema);
  log(`analytics: child member (pid ${crash.pid}) applied ${crash.applied} facts, committed all but the last (partition ${crash.partition} offset ${crash.offset}), killed with ${crash.signal}`);
  checks.check(crash.signal === "SIGKILL" && crash.applied === CRASH_AFTER, "child consumer killed with SIGKILL mid-work", `${crash.applied} applied`);
  await waitFor(async () => ((await broker.listGroups({ topic: names.completions })).find((g) => g.group === "analytics")?.members ?? 0) === 0, "the dead member to leave group analytics");

  const m1: ConsumerCounts = { applied: 0, duplicates: 0 };
  const m2: ConsumerCounts = { applied: 0, duplicates: 0 };
  const events: string[] = [];
  let m1Revoked: number[] = [];
  let m2Assigned: number[] = [];
  const ac = new AbortController();
  const note = (who: string) => (e: SubscriptionStatus) => {
    events.push(`${who}: generation ${e.generation}, assigned [${e.assigned}], revoked [${e.revoked}]`);
    if (who === "member-1" && e.revoked.length > 0) m1Revoked = e.revoked;
    if (who === "member-2" && e.assigned.length > 0) m2Assigned = e.assigned;
  };
  let member2: Promise<void> | null = null;
  const startMember2 = (): void => {
    member2 ??= analyticsMember(broker, pool, names.completions, { name: "member-2", signal: ac.signal, counts: m2, onRebalance: note("member-2") });
  };
  const member1 = analyticsMember(broker, pool, names.completions, {
    name: "member-1",
    signal: ac.signal,
    counts: m1,
    onRebalance: note("member-1"),
    // After 5 records, member-2 joins and member-1 waits for the rebalance before going on.
    beforeEach: async () => {
      if (m1.applied + m1.duplicates < 5 || member2) return;
      startMember2();
      await waitFor(() => m2Assigned.length > 0, "member-2 to get partitions");
    },
  });
  try {
    await waitFor(async () => member2 !== null && m2Assigned.length > 0 && (await broker.groupLag("analytics", names.completions)).totalRecords === 0 && (await analyticsTotals(pool)).completions === expected, "group analytics to catch up after the rebalance");
  } finally {
    ac.abort();
    await Promise.all([member1, member2]);
  }
  for (const e of events) log(`  rebalance ${e}`);
  log(`analytics: member-1 applied ${m1.applied} (${m1.duplicates} duplicates skipped), member-2 applied ${m2.applied} (${m2.duplicates} duplicates skipped)`);
  const totals = await analyticsTotals(pool);
  checks.check(m1Revoked.length > 0 && m2Assigned.length > 0, "a second member joined: member-1 gave up partitions to member-2", `revoked [${m1Revoked}], member-2 got [${m2Assigned}]`);
  checks.check(totals.completions === expected, "no completion lost or counted twice by analytics after the crash", `${totals.completions} of ${expected}`);
  checks.check(m1.duplicates + m2.duplicates >= 1, "the fact applied but not committed before the crash came back and the inbox skipped it", `${m1.duplicates + m2.duplicates} skipped`);
}
