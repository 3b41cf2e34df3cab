// SPDX-License-Identifier: Apache-2.0
/**
 * What coordinates consumer groups: membership, generations and which member owns which
 * partition (GRP-1). The broker takes it from its engine when the engine offers one (the
 * PostgreSQL engine keeps it in the database, so members on several broker nodes form one
 * group: PG-1), else it coordinates in process (src/streams/group-coordinator.ts).
 *
 * Why an interface: the subscription (src/streams/subscription.ts) and the broker's group
 * administration must not care where a group's state lives; both implementations keep the
 * same rules (cooperative rebalances, at most one owner per partition, commits only by the
 * owner of the ownership period).
 */
import type { AssignmentStrategy } from "../streams/assignment.js";

export interface GroupMember {
  readonly memberId: string;
  /** Stop using these partitions. Ownership is already gone when this is called. */
  revoke(partitions: number[], generation: number): void | Promise<void>;
  /** Partitions now owned by this member, in ownership periods of `generation`. */
  assign(partitions: number[], generation: number): void;
}

/**
 * Who commits (`StorageEngine.commitOffsets`): the member and, per partition, the generation of
 * the ownership period the commit belongs to. An engine whose coordination is shared by several
 * nodes refuses, inside the commit's own transaction, a commit whose member no longer owns a
 * partition in that period (NotAssignedError); an in-process coordinator checks it before the
 * call (`checkOwner`), synchronously, so an engine without shared coordination ignores it.
 */
export interface CommitFence {
  memberId: string;
  generations: ReadonlyMap<number, number>;
}

export interface GroupCoordination {
  /** Adds a member; resolves once the rebalance it starts has assigned what it can here. */
  join(group: string, topic: string, partitions: number, strategy: AssignmentStrategy, member: GroupMember): Promise<void>;
  /** Removes a member; its partitions go to the others. */
  leave(group: string, topic: string, memberId: string): Promise<void>;
  /** Throws NotAssignedError unless `memberId` owns `partition` now (as far as this node knows). */
  checkOwner(group: string, topic: string, partition: number, memberId: string): void;
  /**
   * Runs `fn` with assignments of the group held back (GRP-2): a member joining meanwhile is
   * assigned only after `fn`, so it starts from what `fn` wrote. Sections run one at a time.
   */
  exclusive<T>(group: string, topic: string, fn: () => Promise<T>): Promise<T>;
  hasMembers(group: string, topic: string): Promise<boolean>;
  /** The group's generation (rebalances so far); 0 for a group never joined. */
  generation(group: string, topic: string): Promise<number>;
  /** The group's members in join order and the partitions each owns. */
  members(group: string, topic: string): Promise<{ memberId: string; partitions: number[] }[]>;
  /** (group, topic, members) of every group with members now. */
  activeGroups(): Promise<{ group: string; topic: string; members: number }[]>;
}
