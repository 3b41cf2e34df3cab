// SPDX-License-Identifier: Apache-2.0
/**
 * Consumer groups coordinated through PostgreSQL, so members on any number of broker nodes
 * form one group (PG-1). Three tables (migrations.ts v3):
 *   groups         (group, topic) -> generation, partition count, strategy
 *   group_members  one row per member: its node, join order (seq), last heartbeat
 *   group_owners   one row per owned partition: its member and the generation it was granted
 *                  in; the primary key makes a second owner impossible (GRP-1), the foreign key
 *                  removes a member's partitions with it
 *
 * The protocol, with no coordinator node to elect:
 * - join and leave change the member rows and bump the generation in one transaction, then
 *   NOTIFY `sluice_groups`; every node with members in the group reconciles.
 * - reconcile: each node computes the target assignment from the member rows (join order, the
 *   same function as in process: streams/assignment.ts), so all nodes agree on it. A node
 *   revokes from its own members what the target gives to others (it stops them, waits for
 *   them, only then deletes the owner rows: cooperative, the new owner starts after the old
 *   one stopped), and claims for its members what the target gives them and no row holds. A
 *   claim waiting on another node's revocation is made when that node's NOTIFY arrives (or on
 *   the next heartbeat: notifications are not durable).
 * - liveness: each node stamps its members' heartbeats every `heartbeatMs`; any node deletes
 *   members silent for `sessionTimeoutMs` (database clock, so node clocks do not matter) and
 *   bumps the generation, so a killed node's partitions move to live members. A node that
 *   finds one of its members deleted (it was paused longer than the timeout) stops it and
 *   joins it again.
 * - fencing: commits carry (member, generation) per partition and the commit transaction
 *   checks the owner row under FOR SHARE (group-offsets.ts), so a member that lost a partition
 *   cannot move the group's position, even a member on a node that was paused.
 * - GRP-2: `exclusive` holds a session advisory lock of (group, topic); join takes it (as a
 *   transaction lock) too, so a member cannot join while a reset is written.
 */
import { randomUUID } from "node:crypto";
import type pg from "pg";
import { NotAssignedError } from "../../errors.js";
import { assignPartitions, type AssignmentStrategy } from "../../streams/assignment.js";
import type { GroupCoordination, GroupMember } from "../group-coordination.js";
import { num, translateError, type Db } from "./database.js";
import { ListenConnection } from "./listen-connection.js";

export const GROUP_CHANNEL = "sluice_groups";
/** A member not heard of for this long is removed and its partitions reassigned. */
export const DEFAULT_GROUP_SESSION_TIMEOUT_MS = 10_000;
/** How often a node stamps its members' heartbeats and reconciles its groups. */
export const DEFAULT_GROUP_HEARTBEAT_MS = 1_000;

export interface GroupMembershipOptions {
  sessionTimeoutMs?: number;
  heartbeatMs?: number;
  logger?: { warn(obj: object, msg: string): void };
}

interface LocalGroup {
  readonly key: string;
  readonly group: string;
  readonly topic: string;
  readonly partitions: number;
  readonly strategy: AssignmentStrategy;
  /** Members on this node, in join order. */
  readonly members: Map<string, GroupMember>;
  /** Partitions owned by members of this node and not being revoked: partition -> member. */
  readonly owned: Map<number, string>;
  /** The generation each member was last told of (assign), so each rebalance reaches it once. */
  readonly told: Map<string, number>;
  /** Members of this node whose row was inserted (a member missing from the table is rejoined only then). */
  readonly inserted: Set<string>;
  /** Runs join, leave and reconcile of this group one at a time on this node. */
  chain: Promise<void>;
  /** A reconcile queued behind the chain and not started (further requests share it). */
  queued: Promise<void> | null;
}

interface MemberRow {
  member_id: string;
}
interface OwnerRow {
  partition: number;
  member_id: string;
}

export class PgGroupMembership implements GroupCoordination {
  readonly nodeId = randomUUID();
  private readonly local = new Map<string, LocalGroup>();
  private readonly listen: ListenConnection;
  private readonly sessionTimeoutMs: number;
  private readonly heartbeatMs: number;
  private timer: NodeJS.Timeout | null = null;
  private ticking = false;
  private closed = false;

  constructor(
    private readonly db: Db,
    clientConfig: pg.ClientConfig,
    private readonly opts: GroupMembershipOptions = {},
  ) {
    this.sessionTimeoutMs = opts.sessionTimeoutMs ?? DEFAULT_GROUP_SESSION_TIMEOUT_MS;
    this.heartbeatMs = opts.heartbeatMs ?? DEFAULT_GROUP_HEARTBEAT_MS;
    this.listen = new ListenConnection(clientConfig, GROUP_CHANNEL, (payload) => this.onNotify(payload));
  }

  async start(): Promise<void> {
    await this.listen.start();
    this.timer = setInterval(() => void this.tick(), this.heartbeatMs);
    this.timer.unref();
  }

  /** Removes this node's members (their partitions go to other nodes at once), stops listening. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.timer !== null) clearInterval(this.timer);
    await this.listen.close();
    if (this.local.size === 0) return;
    this.local.clear();
    await this.db
      .tx(async (c) => {
        const gone = await c.query<{ group_name: string; topic: string }>(`DELETE FROM ${this.db.t.groupMembers} WHERE node_id = $1 RETURNING group_name, topic`, [this.nodeId]);
        await this.bumpAndNotify(c, gone.rows);
      })
      .catch((e: unknown) => this.opts.logger?.warn({ err: e }, "leaving consumer groups at close failed; other nodes reassign after the session timeout"));
  }

  private lockKey(group: string, topic: string): string {
    return `sluice-members:${JSON.stringify([this.db.schemaName, group, topic])}`;
  }

  // ── membership ──

  async join(group: string, topic: string, partitions: number, strategy: AssignmentStrategy, member: GroupMember): Promise<void> {
    const key = `${group}\u0000${topic}`;
    let g = this.local.get(key);
    if (g === undefined) {
      g = { key, group, topic, partitions, strategy, members: new Map(), owned: new Map(), told: new Map(), inserted: new Set(), chain: Promise.resolve(), queued: null };
      this.local.set(key, g);
    }
    const lg = g;
    lg.members.set(member.memberId, member);
    await this.serialized(lg, async () => {
      await this.insertMember(lg, member.memberId);
      lg.inserted.add(member.memberId);
      await this.rebalance(lg);
    });
  }

  /** The member row, with the generation bumped and the other nodes told, in one transaction. */
  private insertMember(g: LocalGroup, memberId: string): Promise<void> {
    const t = this.db.t;
    return this.db.tx(async (c) => {
      // GRP-2: waits while a reset of this group runs (exclusive).
      await c.query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", [this.lockKey(g.group, g.topic)]);
      await c.query(
        `INSERT INTO ${t.groups} (group_name, topic, generation, partitions, strategy) VALUES ($1, $2, 0, $3, $4)
         ON CONFLICT (group_name, topic) DO UPDATE SET partitions = EXCLUDED.partitions,
           strategy = CASE WHEN EXISTS (SELECT 1 FROM ${t.groupMembers} m WHERE m.group_name = $1 AND m.topic = $2) THEN ${t.groups}.strategy ELSE EXCLUDED.strategy END`,
        [g.group, g.topic, g.partitions, g.strategy],
      );
      await c.query(`INSERT INTO ${t.groupMembers} (group_name, topic, member_id, node_id) VALUES ($1, $2, $3, $4)`, [g.group, g.topic, memberId, this.nodeId]);
      await this.bumpAndNotify(c, [{ group_name: g.group, topic: g.topic }]);
    });
  }

  async leave(group: string, topic: string, memberId: string): Promise<void> {
    const g = this.local.get(`${group}\u0000${topic}`);
    if (g === undefined || !g.members.delete(memberId)) return;
    for (const [p, owner] of g.owned) if (owner === memberId) g.owned.delete(p);
    g.told.delete(memberId);
    g.inserted.delete(memberId);
    await this.serialized(g, async () => {
      await this.db.tx(async (c) => {
        const gone = await c.query(`DELETE FROM ${this.db.t.groupMembers} WHERE group_name = $1 AND topic = $2 AND member_id = $3`, [group, topic, memberId]);
        if ((gone.rowCount ?? 0) > 0) await this.bumpAndNotify(c, [{ group_name: group, topic }]);
      });
      if (g.members.size > 0) await this.rebalance(g);
    });
    if (g.members.size === 0 && this.local.get(g.key) === g) this.local.delete(g.key);
  }

  /** Bumps the generation of each (group, topic) and tells every node, at the transaction's commit. */
  private async bumpAndNotify(c: pg.PoolClient, groups: { group_name: string; topic: string }[]): Promise<void> {
    const seen = new Set<string>();
    for (const { group_name, topic } of groups) {
      const k = `${group_name}\u0000${topic}`;
      if (seen.has(k)) continue;
      seen.add(k);
      await c.query(`UPDATE ${this.db.t.groups} SET generation = generation + 1 WHERE group_name = $1 AND topic = $2`, [group_name, topic]);
      await c.query("SELECT pg_notify($1, $2)", [GROUP_CHANNEL, JSON.stringify([this.db.schemaName, group_name, topic])]);
    }
  }

  checkOwner(group: string, topic: string, partition: number, memberId: string): void {
    if (this.local.get(`${group}\u0000${topic}`)?.owned.get(partition) !== memberId)
      throw new NotAssignedError(`partition ${topic}/${partition} is not assigned to this member of group ${group}; the new owner resumes from the last commit`);
  }

  // ── rebalancing ──

  private serialized(g: LocalGroup, fn: () => Promise<void>): Promise<void> {
    const r = g.chain.then(fn, fn);
    g.chain = r.catch(() => {});
    return r;
  }

  /** A rebalance pass soon (after the one running); requests made meanwhile share it. */
  private reconcile(g: LocalGroup): Promise<void> {
    if (g.queued !== null) return g.queued;
    const pass = async (): Promise<void> => {
      g.queued = null;
      if (g.members.size > 0 && !this.closed) await this.rebalance(g);
    };
    const r = this.serialized(g, pass);
    g.queued = r;
    return r;
  }

  /** One pass: revoke what the target moves away from this node's members, then claim what is free for them. */
  private async rebalance(g: LocalGroup): Promise<void> {
    const t = this.db.t;
    // One snapshot: the generation with exactly the members it counts, so every node computes
    // the same target for a generation (no partition given to two members in one generation).
    const [st, mem, own] = await this.db.tx(async (c) => {
      await c.query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY");
      const args = [g.group, g.topic];
      return [
        await c.query<{ generation: string; partitions: number; strategy: AssignmentStrategy }>(`SELECT generation, partitions, strategy FROM ${t.groups} WHERE group_name = $1 AND topic = $2`, args),
        await c.query<MemberRow>(`SELECT member_id FROM ${t.groupMembers} WHERE group_name = $1 AND topic = $2 ORDER BY seq`, args),
        await c.query<OwnerRow>(`SELECT partition, member_id FROM ${t.groupOwners} WHERE group_name = $1 AND topic = $2`, args),
      ] as const;
    });
    if (st.rows.length === 0) return;
    const generation = num(st.rows[0].generation);
    const ids = mem.rows.map((r) => r.member_id);
    const present = new Set(ids);
    const target = assignPartitions(ids, st.rows[0].partitions, st.rows[0].strategy);
    const rows = new Map<string, number[]>();
    for (const o of own.rows) rows.set(o.member_id, [...(rows.get(o.member_id) ?? []), o.partition]);
    for (const [id, m] of [...g.members]) {
      // Deleted by another node (this one was silent past the session timeout): stop it, join it again.
      if (!present.has(id) && g.inserted.has(id)) await this.rejoin(g, id, m, generation);
    }
    for (const [id, m] of [...g.members]) {
      if (!present.has(id)) continue;
      const keep = new Set(target.get(id) ?? []);
      const revoked = (rows.get(id) ?? []).filter((p) => !keep.has(p));
      if (revoked.length > 0) await this.revoke(g, id, m, revoked, generation);
    }
    for (const [id, m] of [...g.members]) {
      if (!present.has(id) || g.members.get(id) !== m) continue;
      const mine = new Set(rows.get(id) ?? []);
      const wanted = (target.get(id) ?? []).filter((p) => !mine.has(p));
      const got = wanted.length === 0 ? [] : await this.claim(g, id, wanted, generation);
      for (const p of got) g.owned.set(p, id);
      if (got.length > 0 || g.told.get(id) !== generation) {
        g.told.set(id, generation);
        m.assign(got, generation);
      }
    }
  }

  /** GRP-1: dropped here first (checkOwner refuses), the member stopped, then the rows deleted. */
  private async revoke(g: LocalGroup, id: string, m: GroupMember, partitions: number[], generation: number): Promise<void> {
    for (const p of partitions) if (g.owned.get(p) === id) g.owned.delete(p);
    // The rows stay while the member stops, so the commits it writes on its way out (COMMIT-1)
    // pass the fence and no other member starts before it has stopped.
    await m.revoke(partitions, generation);
    await this.db.tx(async (c) => {
      await c.query(`DELETE FROM ${this.db.t.groupOwners} WHERE group_name = $1 AND topic = $2 AND member_id = $3 AND partition = ANY($4::int[])`, [g.group, g.topic, id, partitions]);
      await c.query("SELECT pg_notify($1, $2)", [GROUP_CHANNEL, JSON.stringify([this.db.schemaName, g.group, g.topic])]);
    });
  }

  /** Owner rows for the partitions no one holds; returns those obtained. */
  private async claim(g: LocalGroup, id: string, partitions: number[], generation: number): Promise<number[]> {
    try {
      const r = await this.db.query<{ partition: number }>(
        `INSERT INTO ${this.db.t.groupOwners} (group_name, topic, partition, member_id, generation)
         SELECT $1, $2, p, $3, $4 FROM unnest($5::int[]) AS p ON CONFLICT DO NOTHING RETURNING partition`,
        [g.group, g.topic, id, generation, partitions],
      );
      return r.rows.map((x) => x.partition).sort((a, b) => a - b);
    } catch (e) {
      // 23503: the member row is gone (deleted by another node meanwhile): the next pass rejoins it.
      if ((e as { code?: unknown }).code === "23503") return [];
      throw translateError(e);
    }
  }

  private async rejoin(g: LocalGroup, id: string, m: GroupMember, generation: number): Promise<void> {
    const lost: number[] = [];
    for (const [p, owner] of g.owned) if (owner === id) lost.push(p);
    for (const p of lost) g.owned.delete(p);
    this.opts.logger?.warn({ group: g.group, topic: g.topic, memberId: id, partitions: lost }, "consumer group member was removed after its session timeout; rejoining");
    if (lost.length > 0) await m.revoke(lost, generation);
    if (g.members.get(id) === m) await this.insertMember(g, id);
  }

  // ── liveness ──

  private onNotify(payload: string): void {
    let parsed: unknown;
    try {
      parsed = JSON.parse(payload);
    } catch {
      return;
    }
    if (!Array.isArray(parsed) || parsed[0] !== this.db.schemaName) return;
    const g = this.local.get(`${String(parsed[1])}\u0000${String(parsed[2])}`);
    if (g !== undefined) void this.reconcile(g).catch((e: unknown) => this.opts.logger?.warn({ err: e, group: g.group, topic: g.topic }, "consumer group rebalance failed; retried on the next heartbeat"));
  }

  /** Heartbeats of this node's members, removal of silent members anywhere, a reconcile of each local group. */
  private async tick(): Promise<void> {
    if (this.ticking || this.closed) return;
    this.ticking = true;
    try {
      const t = this.db.t;
      if (this.local.size > 0) await this.db.query(`UPDATE ${t.groupMembers} SET heartbeat_at = now() WHERE node_id = $1`, [this.nodeId]);
      await this.db.tx(async (c) => {
        const gone = await c.query<{ group_name: string; topic: string }>(
          `DELETE FROM ${t.groupMembers} WHERE heartbeat_at < now() - $1 * interval '1 millisecond' RETURNING group_name, topic`,
          [this.sessionTimeoutMs],
        );
        await this.bumpAndNotify(c, gone.rows);
      });
      for (const g of [...this.local.values()]) await this.reconcile(g);
    } catch (e) {
      this.opts.logger?.warn({ err: e }, "consumer group heartbeat failed; retried");
    } finally {
      this.ticking = false;
    }
  }

  // ── administration ──

  async exclusive<T>(group: string, topic: string, fn: () => Promise<T>): Promise<T> {
    let client: pg.PoolClient;
    try {
      client = await this.db.pool.connect();
    } catch (e) {
      throw translateError(e);
    }
    let broken: Error | undefined;
    try {
      await client.query("SELECT pg_advisory_lock(hashtextextended($1, 0))", [this.lockKey(group, topic)]);
      try {
        return await fn();
      } finally {
        // A connection that cannot unlock is dropped, which releases the lock with the session.
        await client.query("SELECT pg_advisory_unlock(hashtextextended($1, 0))", [this.lockKey(group, topic)]).catch((e: Error) => (broken = e));
      }
    } catch (e) {
      throw translateError(e);
    } finally {
      client.release(broken);
    }
  }

  async hasMembers(group: string, topic: string): Promise<boolean> {
    const r = await this.db.query(`SELECT 1 FROM ${this.db.t.groupMembers} WHERE group_name = $1 AND topic = $2 LIMIT 1`, [group, topic]);
    return r.rows.length > 0;
  }

  async generation(group: string, topic: string): Promise<number> {
    const r = await this.db.query<{ generation: string }>(`SELECT generation FROM ${this.db.t.groups} WHERE group_name = $1 AND topic = $2`, [group, topic]);
    return r.rows.length === 0 ? 0 : num(r.rows[0].generation);
  }

  async members(group: string, topic: string): Promise<{ memberId: string; partitions: number[] }[]> {
    const t = this.db.t;
    const r = await this.db.query<{ member_id: string; partitions: number[] }>(
      `SELECT m.member_id, coalesce(array_agg(o.partition ORDER BY o.partition) FILTER (WHERE o.partition IS NOT NULL), '{}') AS partitions
         FROM ${t.groupMembers} m LEFT JOIN ${t.groupOwners} o ON o.group_name = m.group_name AND o.topic = m.topic AND o.member_id = m.member_id
        WHERE m.group_name = $1 AND m.topic = $2 GROUP BY m.member_id, m.seq ORDER BY m.seq`,
      [group, topic],
    );
    return r.rows.map((x) => ({ memberId: x.member_id, partitions: x.partitions }));
  }

  async activeGroups(): Promise<{ group: string; topic: string; members: number }[]> {
    const r = await this.db.query<{ group_name: string; topic: string; n: string }>(`SELECT group_name, topic, count(*) AS n FROM ${this.db.t.groupMembers} GROUP BY group_name, topic`);
    return r.rows.map((x) => ({ group: x.group_name, topic: x.topic, members: num(x.n) }));
  }
}
