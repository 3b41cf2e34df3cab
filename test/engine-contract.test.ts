// SPDX-License-Identifier: Apache-2.0
/** Runs the StorageEngine contract against the on-disk engine (a PostgreSQL engine will join). */
import { defineEngineContract } from "../src/testing/engine-contract.js";
import { DiskEngine } from "../src/store/disk/disk-engine.js";
import { NodeFileSystem } from "../src/log/io.js";
import { tempDir } from "../src/testing/helpers.js";

defineEngineContract("disk", async () => {
  const tmp = tempDir();
  let engine = new DiskEngine({ dataDir: tmp.dir, fs: new NodeFileSystem() });
  await engine.open();
  const fixture = {
    engine,
    async reopen() {
      await engine.close();
      engine = new DiskEngine({ dataDir: tmp.dir, fs: new NodeFileSystem() });
      await engine.open();
      fixture.engine = engine;
      return engine;
    },
    async cleanup() {
      await engine.close();
      tmp.cleanup();
    },
  };
  return fixture;
});
