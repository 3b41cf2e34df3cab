// SPDX-License-Identifier: Apache-2.0
/**
 * QUEUE_SCHEDULE (docs/protocol.md §7): a queue's job schedules over the network. The schedules
 * run here, in the server's broker (the process holding the data dir); clients only manage them.
 * Data and user headers travel as publish records in the body, the rest in the meta.
 */
import { ProtocolError, ValidationError } from "../errors.js";
import type { ScheduleInfo, ScheduleOptions } from "../queues/types.js";
import type { PublishValue } from "../types.js";
import { decodePublishRecords, encodePublishRecords, type Frame } from "../wire/index.js";
import { str, type Reply, type RequestHandler, type Session } from "./session.js";

/** Schedule infos as QUEUE_SCHEDULE answers them: metadata in the meta, data and headers in the body. */
function infosReply(list: ScheduleInfo[]): Reply {
  const schedules = list.map(({ data: _d, headers: _h, ...meta }) => meta);
  const body = encodePublishRecords(list.map((i) => ({ value: i.data as PublishValue, headers: i.headers })));
  return { meta: { schedules }, body };
}

async function schedule(s: Session, f: Frame): Promise<Reply> {
  const m = f.meta;
  // With the handle's config (as every write of it): an upsert creates the queue like an enqueue.
  const q = s.queueFor(m);
  const action = str(m, "action", 16);
  if (action === "list") return infosReply(await q.listSchedules());
  const name = str(m, "name", 1024);
  switch (action) {
    case "upsert": {
      const o = m.opts;
      if (o === null || typeof o !== "object" || Array.isArray(o)) throw new ValidationError("upsert needs opts");
      const recs = f.body === null || f.body.length === 0 ? [] : decodePublishRecords(f.body, 1);
      if (recs.length !== 1) throw new ProtocolError("QUEUE_SCHEDULE upsert: expected one publish record (data, headers)");
      const { data: _ignored, headers: _h, ...rest } = o as ScheduleOptions;
      const opts: ScheduleOptions = { ...rest, data: recs[0].value, headers: recs[0].headers };
      return infosReply([await q.upsertSchedule(name, opts)]);
    }
    case "pause":
      await q.pauseSchedule(name);
      return { meta: {} };
    case "resume":
      await q.resumeSchedule(name);
      return { meta: {} };
    case "remove":
      return { meta: { removed: await q.removeSchedule(name) } };
    default:
      throw new ValidationError(`unknown schedule action ${JSON.stringify(action)}`);
  }
}

export const SCHEDULE_HANDLERS: { readonly QueueSchedule: RequestHandler } = { QueueSchedule: schedule };
