// SPDX-License-Identifier: Apache-2.0
// The Broker contract against a spawned `sluice serve` child process, through connect().
import { after, before } from "node:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "../src/client/index.js";
import { defineConformanceSuite } from "../src/testing/conformance.js";
import { spawnServer, type SpawnedServer } from "./fixtures/server-spawn.js";

let server: SpawnedServer;
let dir: string;

before(async () => {
  dir = mkdtempSync(join(process.env.SLUICE_TEST_TMP ?? tmpdir(), "sluice-conf-srv-"));
  server = await spawnServer(["--data", dir, "--port", "0", "--http-port", "0", "--log-level", "warn"]);
});

after(async () => {
  server.proc.kill("SIGTERM");
  await server.exited;
  rmSync(dir, { recursive: true, force: true });
});

// One server for the file; every test gets its own client connection (tests use unique names).
defineConformanceSuite("server", async () => {
  const broker = await connect({ url: server.url });
  return { broker, cleanup: () => broker.close() };
});
