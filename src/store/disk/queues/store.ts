// SPDX-License-Identifier: Apache-2.0
/**
 * The disk engine's queue store: the registry of queues under `<dataDir>/queues/`.
 *
 * `queues.json` (writeFileAtomic) maps each queue name to its current incarnation directory
 * and stored config. Q-8: deleting a queue removes its manifest entry durably *before* deleting
 * its directory, and re-creating the name makes a new incarnation directory, so a deleted then
 * re-created queue never delivers old jobs (directories not in the manifest are removed on
 * open).
 */
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { BrokerClosedError, EncryptionConfigError, EncryptionKeyMissingError, QueueNotFoundError, ValidationError } from "../../../errors.js";
import { ENCRYPTION_KEYS_ENV, type Keyring } from "../../../log/keyring.js";
import { readJsonFile, writeFileAtomic, type FileSystem } from "../../../log/io.js";
import type { Telemetry } from "../../../observability/telemetry.js";
import type { QueueConfig } from "../../../queues/types.js";
import type { OpenQueueRequest, QueueStore, StoredQueue } from "../../queue-store.js";
import { DiskQueue } from "./disk-queue.js";
import { DiskScheduleStore, SCHEDULES_FILE } from "./schedules-file.js";

const MANIFEST = "queues.json";

interface ManifestEntry {
  incarnation: string;
  config: QueueConfig;
  createdAt: number;
}

interface Manifest {
  version: 1;
  queues: Record<string, ManifestEntry>;
}

export interface DiskQueueStoreOptions {
  /** `<dataDir>/queues` (the engine checked it lies inside the data dir, FS-1). */
  dir: string;
  fs: FileSystem;
  telemetry: Telemetry;
  /** The engine's keyring (encryption at rest), null without one. */
  keyring(): Keyring | null;
}

/** ENC-1: `encrypted` needs a keyring, and never changes on an existing queue (its files say which). */
function checkEncryption(name: string, wanted: boolean, stored: boolean | null, haveKeys: boolean): void {
  if (stored !== null && stored !== wanted) throw new ValidationError(`queue ${JSON.stringify(name)}: encrypted cannot be changed on an existing queue (it is ${stored})`);
  if (wanted && !haveKeys && stored !== null) throw new EncryptionKeyMissingError("", `queue ${JSON.stringify(name)}`);
  if (wanted && !haveKeys) throw new EncryptionConfigError(`queue ${JSON.stringify(name)} is encrypted, but no encryption keys are configured (encryptionKeys, --encryption-key-file or ${ENCRYPTION_KEYS_ENV})`);
}

export class DiskQueueStore implements QueueStore {
  private manifest: Manifest = { version: 1, queues: {} };
  private readonly open_ = new Map<string, Promise<DiskQueue>>();
  private lock: Promise<unknown> = Promise.resolve();
  private closed = false;

  /** Job schedules of every queue (src/queues/schedules/), beside the manifest. */
  readonly schedules: DiskScheduleStore;

  constructor(private readonly o: DiskQueueStoreOptions) {
    this.schedules = new DiskScheduleStore(o.fs, o.dir);
  }

  /** Loads the manifest; removes incarnation directories it does not name (an interrupted delete). */
  async start(): Promise<void> {
    const { fs, dir } = this.o;
    await fs.mkdir(dir);
    this.manifest = (await readJsonFile<Manifest>(fs, join(dir, MANIFEST))) ?? { version: 1, queues: {} };
    const live = new Set(Object.values(this.manifest.queues).map((e) => e.incarnation));
    for (const n of await fs.readdir(dir)) {
      if (n === MANIFEST || n === SCHEDULES_FILE || n.endsWith(".tmp")) continue;
      if (!live.has(n)) await fs.rm(join(dir, n));
    }
  }

  /** Serialises manifest changes and queue opens/deletes. */
  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.lock.then(fn, fn);
    this.lock = run.catch(() => {});
    return run;
  }

  private saveManifest(): Promise<void> {
    return writeFileAtomic(this.o.fs, join(this.o.dir, MANIFEST), JSON.stringify(this.manifest));
  }

  open(name: string, req: OpenQueueRequest): Promise<StoredQueue> {
    if (this.closed) return Promise.reject(new BrokerClosedError());
    const cached = this.open_.get(name);
    if (cached !== undefined && req.config === undefined) return cached;
    const p = this.exclusive(async () => {
      if (this.closed) throw new BrokerClosedError();
      const entry = this.manifest.queues[name];
      // Dead-letter queues created implicitly do not dead-letter further.
      let config = entry?.config ?? req.config ?? (req.implicit ? { deadLetter: null, ...(req.encrypted === true ? { encrypted: true } : {}) } : {});
      if (entry !== undefined && req.config !== undefined && JSON.stringify(req.config) !== JSON.stringify(entry.config)) config = req.config;
      // Validated before anything is stored (ValidationError).
      const settings = req.settings(config);
      checkEncryption(name, settings.encrypted === true, entry === undefined ? null : req.settings(entry.config).encrypted === true, this.o.keyring() !== null);
      if (entry === undefined) {
        const now = this.o.telemetry.clock.now();
        this.manifest.queues[name] = { incarnation: `${name}.${now.toString(36)}${randomBytes(4).toString("hex")}`, config, createdAt: now };
        await this.saveManifest();
        req.changed?.("create");
      } else if (config !== entry.config) {
        entry.config = config;
        await this.saveManifest();
        req.changed?.("alter");
      }
      const incarnation = this.manifest.queues[name].incarnation;
      if (cached !== undefined) {
        const q = await cached;
        q.configure(settings);
        return q;
      }
      return DiskQueue.open({
        name,
        incarnation,
        dir: join(this.o.dir, incarnation),
        fs: this.o.fs,
        settings,
        telemetry: this.o.telemetry,
        peer: req.peer,
        keyring: this.o.keyring(),
      });
    });
    this.open_.set(name, p);
    p.catch(() => {
      if (this.open_.get(name) === p) this.open_.delete(name);
    });
    return p;
  }

  async list(): Promise<string[]> {
    await this.lock;
    return Object.keys(this.manifest.queues).sort();
  }

  async delete(name: string): Promise<void> {
    await this.exclusive(async () => {
      const entry = this.manifest.queues[name];
      if (entry === undefined) throw new QueueNotFoundError(name);
      const cached = this.open_.get(name);
      this.open_.delete(name);
      if (cached) await (await cached.catch(() => null))?.close();
      delete this.manifest.queues[name];
      await this.saveManifest();
      await this.o.fs.rm(join(this.o.dir, entry.incarnation));
      await this.o.fs.fsyncDir(this.o.dir);
    });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.lock;
    this.closed = true;
    const queues = [...this.open_.values()];
    this.open_.clear();
    for (const q of queues) await (await q.catch(() => null))?.close();
  }
}
