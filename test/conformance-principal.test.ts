// SPDX-License-Identifier: Apache-2.0
// The Broker contract through an embedded principal view (`broker.as(principal)`, ACL-5) of a
// principal with admin rights: a checked view behaves as the broker itself in everything the
// contract covers (subscriptions, batches, commits, queues, workers, process(), events...).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openBroker } from "../src/broker/broker.js";
import { defineConformanceSuite } from "../src/testing/conformance.js";
import { grantAdmin } from "./fixtures/acl.js";

defineConformanceSuite("embedded-principal", async () => {
  const dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-conf-principal-"));
  await grantAdmin(dir, "conformance");
  let broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
  return {
    broker: broker.as("conformance"),
    // A restart: the same data dir, a new broker, a new view.
    reopen: async () => {
      await broker.close();
      broker = await openBroker({ dataDir: dir, retentionCheckIntervalMs: 0 });
      return broker.as("conformance");
    },
    cleanup: async () => {
      await broker.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
});
