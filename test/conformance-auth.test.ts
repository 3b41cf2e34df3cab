// SPDX-License-Identifier: Apache-2.0
// The Broker contract through connect() to a server that requires authentication: every test
// on its own connection logged in with SCRAM-SHA-256 (docs/security.md#authentication).
import { after, before } from "node:test";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { startServer, type ServerHandle } from "../src/server/index.js";
import { CredentialStore } from "../src/security/auth/credential-store.js";
import { defineConformanceSuite } from "../src/testing/conformance.js";
import { tempDir } from "../src/testing/helpers.js";
import { grantAdmin } from "./fixtures/acl.js";

let dir: ReturnType<typeof tempDir>;
let broker: EmbeddedBroker;
let server: ServerHandle;

before(async () => {
  dir = tempDir("sluice-conf-auth-");
  const dataDir = join(dir.dir, "data");
  broker = await openBroker({ dataDir });
  await (await CredentialStore.open(dataDir)).addUser("conformance", "conformance-password", 4096);
  await grantAdmin(dataDir, "conformance");
  server = await startServer({ broker, port: 0, httpPort: null, dataDir });
});

after(async () => {
  await server.close();
  await broker.close();
  dir.cleanup();
});

defineConformanceSuite("server-auth", async () => {
  const client = await connect({ url: server.url, auth: { username: "conformance", password: "conformance-password" } });
  return { broker: client, cleanup: () => client.close() };
});
