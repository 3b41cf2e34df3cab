// SPDX-License-Identifier: Apache-2.0
// The Broker contract through connect() over TLS: a server with `tls` on an embedded broker,
// every test on its own `sluice+tls://` connection (certificates from openssl at test time).
import { after, before } from "node:test";
import { join } from "node:path";
import { openBroker, type EmbeddedBroker } from "../src/broker/broker.js";
import { connect } from "../src/client/index.js";
import { startServer, type ServerHandle } from "../src/server/index.js";
import { defineConformanceSuite } from "../src/testing/conformance.js";
import { tempDir } from "../src/testing/helpers.js";
import { makeCa, makeLeaf, type CertFiles } from "./fixtures/tls-certs.js";

let dir: ReturnType<typeof tempDir>;
let broker: EmbeddedBroker;
let server: ServerHandle;
let ca: CertFiles;

before(async () => {
  dir = tempDir("sluice-conf-tls-");
  ca = makeCa(dir.dir, "ca");
  const cert = makeLeaf(dir.dir, ca, { name: "server", cn: "localhost", serial: 1 });
  broker = await openBroker({ dataDir: join(dir.dir, "data") });
  server = await startServer({ broker, port: 0, httpPort: null, tls: { certFile: cert.cert, keyFile: cert.key, watchIntervalMs: 0 } });
});

after(async () => {
  await server.close();
  await broker.close();
  dir.cleanup();
});

defineConformanceSuite("server-tls", async () => {
  const client = await connect({ url: server.url, tls: { caFile: ca.cert } });
  return { broker: client, cleanup: () => client.close() };
});
