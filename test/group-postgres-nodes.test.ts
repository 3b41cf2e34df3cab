// SPDX-License-Identifier: Apache-2.0
/**
 * Consumer groups across broker nodes on one PostgreSQL schema (PG-1): members on two nodes
 * split the partitions and each record is delivered once; a member leaving hands its
 * partitions to the other node's member, which resumes from the commits; a commit whose member
 * does not own the partition in that generation is refused inside the commit transaction; a
 * member removed behind its node's back (as another node does after the session timeout) is
 * stopped, rejoins, and its old ownership period cannot commit.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { NotAssignedError } from "../src/errors.js";
import { waitUntil } from "../src/testing/helpers.js";
import type { Message, Subscription } from "../src/types.js";
import { dropSchema, freshSchema, needingPostgres, newPgEngine, PG_TEST_URL } from "./fixtures/postgres.js";

const PARTITIONS = 4;

async function twoNodes(): Promise<{ a: EmbeddedBroker; b: EmbeddedBroker; schema: string; close(): Promise<void> }> {
  const schema = freshSchema();
  const open = (): Promise<EmbeddedBroker> => needingPostgres(() => openBroker({ engine: newPgEngine(schema, { groupHeartbeatMs: 100, groupSessionTimeoutMs: 1000 }), retentionCheckIntervalMs: 0 }));
  const a = await open();
  const b = await open();
  return {
    a,
    b,
    schema,
    async close() {
      await a.close().catch(() => {});
      await b.close().catch(() => {});
      await dropSchema(schema);
    },
  };
}

/** Reads `sub` in the background, committing each message; records what it got. */
function consume(sub: Subscription<string>, got: string[]): Promise<void> {
  return (async () => {
    for await (const msg of sub) {
      got.push(msg.value);
      await msg.commit().catch(() => {});
    }
  })();
}

const publishN = (b: EmbeddedBroker, from: number, n: number) => b.publishBatch("t", Array.from({ length: n }, (_, i) => ({ value: `v${from + i}`, key: `k${from + i}` })));

test("postgres groups, two nodes: members on each node split the partitions; a leaving member's partitions move to the other node, from its commits", { timeout: 60_000 }, async () => {
  const n = await twoNodes();
  const gotA: string[] = [];
  const gotB: string[] = [];
  try {
    await n.a.createTopic("t", { partitions: PARTITIONS });
    const subA = n.a.subscribe<string>("t", { group: "g", start: "earliest" });
    const subB = n.b.subscribe<string>("t", { group: "g", start: "earliest" });
    const runs = [consume(subA, gotA), consume(subB, gotB)];
    // Both nodes see one group of two members with two partitions each.
    await waitUntil(async () => {
      const ms = (await n.b.groupLag("g", "t")).members;
      return ms.length === 2 && ms.every((m) => m.partitions.length === 2);
    }, "two members with two partitions each");
    assert.deepEqual((await n.a.groupLag("g", "t")).members, (await n.b.groupLag("g", "t")).members, "both nodes describe the same group");
    assert.deepEqual((await n.a.listGroups()).map((g) => [g.group, g.members]), [["g", 2]]);
    await publishN(n.a, 0, 200);
    await waitUntil(() => gotA.length + gotB.length >= 200, () => `200 delivered (have ${gotA.length + gotB.length})`);
    assert.ok(gotA.length > 0 && gotB.length > 0, `both members consumed (${gotA.length} and ${gotB.length})`);
    assert.equal(new Set([...gotA, ...gotB]).size, 200, "each record once");
    await waitUntil(async () => (await n.a.groupLag("g", "t")).totalRecords === 0, "everything committed");

    // B's member leaves: A's member takes all four partitions and resumes from the commits.
    await subB.close();
    await runs[1];
    await waitUntil(async () => {
      const ms = (await n.a.groupLag("g", "t")).members;
      return ms.length === 1 && ms[0].partitions.length === PARTITIONS;
    }, "one member with every partition");
    const before = gotA.length;
    await publishN(n.b, 200, 100);
    await waitUntil(() => gotA.length >= before + 100, "the remaining member gets the new records");
    assert.equal(new Set([...gotA, ...gotB]).size, 300, "nothing delivered twice, nothing skipped");
    await subA.close();
    await runs[0];
    assert.equal((await n.a.groupLag("g", "t")).members.length, 0);
  } finally {
    await n.close();
  }
});

test("postgres groups: a commit is fenced by member and generation inside the commit transaction; a member removed behind its node's back rejoins", { timeout: 60_000 }, async () => {
  const n = await twoNodes();
  const admin = new pg.Client({ connectionString: PG_TEST_URL });
  await admin.connect();
  try {
    await n.a.createTopic("t", { partitions: PARTITIONS });
    await publishN(n.a, 0, 40);
    const sub = n.a.subscribe<string>("t", { group: "g", start: "earliest" });
    const it = sub[Symbol.asyncIterator]();
    const first = (await it.next()).value as Message<string>;
    await first.commit();
    const [member] = (await n.a.groupLag("g", "t")).members;
    assert.equal(member.partitions.length, PARTITIONS);
    const generation = (await n.a.groupLag("g", "t")).generation;
    const fenced = (memberId: string, gen: number) => n.b.engine.commitOffsets("g", "t", new Map([[first.partition, first.offset + 1]]), { memberId, generations: new Map([[first.partition, gen]]) });

    // The owner in its generation may commit (from any node: the fence is in the database).
    await fenced(member.memberId, generation);
    // Another member, or the owner with another generation: refused, nothing written.
    await assert.rejects(fenced("someone-else", generation), NotAssignedError);
    await assert.rejects(fenced(member.memberId, generation + 1), NotAssignedError);

    // Another node removes the member (as after its session timeout while this node was
    // paused): its ownership period ends; a commit of that period is refused.
    await admin.query(`DELETE FROM "${n.schema}".group_members WHERE member_id = $1`, [member.memberId]);
    await admin.query(`UPDATE "${n.schema}".groups SET generation = generation + 1`);
    await assert.rejects(fenced(member.memberId, generation), NotAssignedError);
    await assert.rejects(first.commit(), NotAssignedError, "the message's own commit is refused once the member is stopped");
    // The node notices on its next heartbeat, stops the member and joins it again.
    await waitUntil(async () => {
      const ms = (await n.b.groupLag("g", "t")).members;
      return ms.length === 1 && ms[0].memberId === member.memberId && ms[0].partitions.length === PARTITIONS;
    }, "the member rejoined with every partition");
    const now = (await n.a.groupLag("g", "t")).generation;
    assert.ok(now > generation + 1, `a new generation (${generation} -> ${now})`);
    // It reads on from the last commit and commits in its new period.
    const next = (await it.next()).value as Message<string>;
    await next.commit();
    await sub.close();
  } finally {
    await admin.end();
    await n.close();
  }
});
