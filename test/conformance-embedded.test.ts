// SPDX-License-Identifier: Apache-2.0
// The Broker contract against the embedded engine (openBroker).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { defineConformanceSuite } from "../src/testing/conformance.js";

defineConformanceSuite("embedded", async () => {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-conf-"));
  let broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  return {
    broker,
    // A restart: the same data dir, a new broker.
    reopen: async () => {
      await broker.close();
      broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
      return broker;
    },
    cleanup: async () => {
      await broker.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
});
