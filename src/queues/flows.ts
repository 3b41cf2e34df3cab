// SPDX-License-Identifier: Apache-2.0
/**
 * `queue.enqueueFlow(flow)`: a tree of jobs becomes one enqueue call of its jobs in pre-order
 * (each parent before its children), each carrying its `FlowLink` (how far back its parent is,
 * how many children it waits for). One call is one append: the flow is stored whole or not at
 * all (FLOW-1). Shared by the embedded queue and the network client; the queue checks the
 * shape again (`checkFlowShape`) whoever sent it.
 */
import { ValidationError } from "../errors.js";
import type { FlowLink } from "../store/queue-store.js";
import { MAX_BATCH_ITEMS } from "./config.js";
import type { EnqueueItem, EnqueueResult, FlowJob, FlowResult } from "./types.js";

/** An enqueue item of a flow (its `flow` link travels with its other options). */
export type FlowItem = EnqueueItem & { flow: FlowLink };

/** The flow's jobs in pre-order; at most MAX_BATCH_ITEMS (ValidationError before anything is sent). */
export function flattenFlow(root: FlowJob): FlowItem[] {
  const items: FlowItem[] = [];
  // Iterative pre-order (a deep flow cannot overflow the stack): [node, index of its parent].
  const stack: [FlowJob, number][] = [[root, -1]];
  while (stack.length > 0) {
    const [node, parent] = stack.pop()!;
    if (node === null || typeof node !== "object") throw new ValidationError("a flow job must be an object { data, children?, ... }");
    if (items.length >= MAX_BATCH_ITEMS) throw new ValidationError(`a flow has at most ${MAX_BATCH_ITEMS} jobs`);
    const { children, onChildFailure, ...item } = node;
    if (children !== undefined && !Array.isArray(children)) throw new ValidationError("flow children must be an array");
    if (onChildFailure !== undefined && onChildFailure !== "fail" && onChildFailure !== "continue") throw new ValidationError(`onChildFailure must be "fail" or "continue"`);
    const at = items.length;
    const kids = children ?? [];
    items.push({ ...item, flow: { parentDelta: parent < 0 ? 0 : at - parent, children: kids.length, onChildFailure: onChildFailure ?? "fail" } });
    // Pushed in reverse so the first child is stored first.
    for (let k = kids.length - 1; k >= 0; k--) stack.push([kids[k], at]);
  }
  return items;
}

/** The stored ids in the shape of the flow (results in the order `flattenFlow` gave). */
export function flowResult(items: readonly FlowItem[], results: readonly EnqueueResult[]): FlowResult {
  const nodes: FlowResult[] = results.map((r) => ({ id: r.id, children: [] }));
  for (let i = 1; i < items.length; i++) nodes[i - items[i].flow.parentDelta].children.push(nodes[i]);
  return nodes[0];
}
