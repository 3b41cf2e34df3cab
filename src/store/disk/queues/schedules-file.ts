// SPDX-License-Identifier: Apache-2.0
/**
 * The disk engine's schedule store: `<dataDir>/queues/schedules.json`, replaced whole with
 * `writeFileAtomic` (temp + fdatasync + rename + fsync dir, META-1), so `save` resolves only
 * once the new document is durable and a crash leaves the old or the new one (SCHED-1).
 */
import { join } from "node:path";
import { readJsonFile, writeFileAtomic, type FileSystem } from "../../../log/io.js";
import type { ScheduleStore, StoredSchedule } from "../../schedule-store.js";

export const SCHEDULES_FILE = "schedules.json";

interface ScheduleDocument {
  version: 1;
  schedules: StoredSchedule[];
}

export class DiskScheduleStore implements ScheduleStore {
  private readonly path: string;
  constructor(
    private readonly fs: FileSystem,
    dir: string,
  ) {
    this.path = join(dir, SCHEDULES_FILE);
  }

  async load(): Promise<StoredSchedule[]> {
    const doc = await readJsonFile<ScheduleDocument>(this.fs, this.path);
    return doc?.schedules ?? [];
  }

  save(all: readonly StoredSchedule[]): Promise<void> {
    const doc: ScheduleDocument = { version: 1, schedules: [...all] };
    return writeFileAtomic(this.fs, this.path, JSON.stringify(doc));
  }
}
