// SPDX-License-Identifier: Apache-2.0
/**
 * Consumer group membership for members in this process. One group state per (group, topic).
 *
 * Rebalances are incremental (cooperative): a partition that keeps its owner keeps flowing;
 * a partition that moves is first revoked from its old owner, which stops and aborts
 * `msg.signal` for it, and only then assigned to the new owner. Invariant GRP-1: at any
 * moment a partition has at most one owner; only the owner's commits are accepted (others get
 * NotAssignedError), so a revoked member that is still busy cannot move the group's position.
 */
import { NotAssignedError } from "../errors.js";
import type { GroupCoordination, GroupMember } from "../store/group-coordination.js";
import { assignPartitions, type AssignmentStrategy } from "./assignment.js";

export type { GroupMember };

interface GroupState {
  key: string;
  members: Map<string, GroupMember>;
  owners: Map<number, string>;
  generation: number;
  strategy: AssignmentStrategy;
  partitions: number;
  lock: Promise<void>;
}

let memberSeq = 0;
export function newMemberId(prefix = "member"): string {
  return `${prefix}-${process.pid}-${++memberSeq}-${Math.random().toString(36).slice(2, 8)}`;
}

export class GroupCoordinator implements GroupCoordination {
  private groups = new Map<string, GroupState>();
  /** Administrative sections running per group and topic (`exclusive`); rebalances wait for them. */
  private admin = new Map<string, Promise<void>>();
  /** Last generation of groups that emptied, so a re-formed group never reuses a generation. */
  private lastGeneration = new Map<string, number>();

  private key(group: string, topic: string): string {
    return `${group}\u0000${topic}`;
  }

  private state(group: string, topic: string, partitions: number, strategy: AssignmentStrategy): GroupState {
    const k = this.key(group, topic);
    let g = this.groups.get(k);
    if (!g) {
      g = { key: k, members: new Map(), owners: new Map(), generation: this.lastGeneration.get(k) ?? 0, strategy, partitions, lock: Promise.resolve() };
      this.groups.set(k, g);
    }
    return g;
  }

  /** (group, topic, members) of every group with members now. */
  async activeGroups(): Promise<{ group: string; topic: string; members: number }[]> {
    const out: { group: string; topic: string; members: number }[] = [];
    for (const [k, g] of this.groups) {
      if (g.members.size === 0) continue;
      const [group, topic] = k.split("\u0000");
      out.push({ group, topic, members: g.members.size });
    }
    return out;
  }

  /** The group's members now and the partitions each owns (empty when it has none here). */
  async members(group: string, topic: string): Promise<{ memberId: string; partitions: number[] }[]> {
    const g = this.groups.get(this.key(group, topic));
    if (!g) return [];
    const owned = new Map<string, number[]>([...g.members.keys()].map((id) => [id, []]));
    for (const [p, owner] of g.owners) owned.get(owner)?.push(p);
    return [...owned].map(([memberId, partitions]) => ({ memberId, partitions: partitions.sort((a, b) => a - b) }));
  }

  /**
   * Runs `fn` with the group's assignments held back (GRP-2): a member that joins while `fn`
   * runs is assigned its partitions, and so reads its committed offsets, only after `fn` is
   * done, so it starts from what `fn` wrote (an offset reset), never from what it replaced.
   * Sections on one group run one at a time.
   */
  async exclusive<T>(group: string, topic: string, fn: () => Promise<T>): Promise<T> {
    const k = this.key(group, topic);
    const before = this.admin.get(k) ?? Promise.resolve();
    let release!: () => void;
    const done = new Promise<void>((r) => (release = r));
    const mine = before.then(() => done);
    this.admin.set(k, mine);
    await before;
    try {
      return await fn();
    } finally {
      release();
      if (this.admin.get(k) === mine) this.admin.delete(k);
    }
  }

  async hasMembers(group: string, topic: string): Promise<boolean> {
    return (this.groups.get(this.key(group, topic))?.members.size ?? 0) > 0;
  }

  async generation(group: string, topic: string): Promise<number> {
    const k = this.key(group, topic);
    return this.groups.get(k)?.generation ?? this.lastGeneration.get(k) ?? 0;
  }

  join(group: string, topic: string, partitions: number, strategy: AssignmentStrategy, member: GroupMember): Promise<void> {
    const g = this.state(group, topic, partitions, strategy);
    g.members.set(member.memberId, member);
    return this.rebalance(g);
  }

  leave(group: string, topic: string, memberId: string): Promise<void> {
    const k = this.key(group, topic);
    const g = this.groups.get(k);
    if (!g || !g.members.delete(memberId)) return Promise.resolve();
    for (const [p, owner] of g.owners) if (owner === memberId) g.owners.delete(p);
    return this.rebalance(g).then(() => {
      if (g.members.size === 0 && this.groups.get(k) === g) {
        this.groups.delete(k);
        // Bounded by the number of (group, topic) pairs ever used in this process.
        this.lastGeneration.set(k, g.generation);
      }
    });
  }

  /** Throws NotAssignedError unless `memberId` owns `partition`. (Commits of an earlier
   * ownership period are refused by the member itself, which knows its periods.) */
  checkOwner(group: string, topic: string, partition: number, memberId: string): void {
    const g = this.groups.get(this.key(group, topic));
    if (!g || g.owners.get(partition) !== memberId)
      throw new NotAssignedError(`partition ${topic}/${partition} is not assigned to this member of group ${group}; the new owner resumes from the last commit`);
  }

  private rebalance(g: GroupState): Promise<void> {
    const run = async (): Promise<void> => {
      g.generation++;
      const gen = g.generation;
      const ids = [...g.members.keys()];
      const target = assignPartitions(ids, g.partitions, g.strategy);
      // Phase 1: revoke what moves (GRP-1: ownership is dropped before the owner is told).
      const revokes: Promise<void>[] = [];
      for (const [id, m] of g.members) {
        const keep = new Set(target.get(id));
        const revoked: number[] = [];
        for (const [p, owner] of g.owners) if (owner === id && !keep.has(p)) revoked.push(p);
        for (const p of revoked) g.owners.delete(p);
        if (revoked.length > 0) revokes.push(Promise.resolve(m.revoke(revoked, gen)));
      }
      await Promise.all(revokes);
      // Phase 2: assign what is now free.
      for (const [id, m] of g.members) {
        const added: number[] = [];
        for (const p of target.get(id) ?? []) {
          if (!g.owners.has(p)) {
            g.owners.set(p, id);
            added.push(p);
          }
        }
        m.assign(added, gen);
      }
    };
    // GRP-2: no assignment while an administrative section (a reset) runs on this group.
    const gate = (): Promise<void> | undefined => this.admin.get(g.key);
    const r = g.lock.then(gate, gate).then(run, run);
    g.lock = r.catch(() => {});
    return r;
  }
}
