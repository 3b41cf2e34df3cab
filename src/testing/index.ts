// SPDX-License-Identifier: Apache-2.0
export { FaultyFileSystem, type FaultOp } from "./faulty-fs.js";
export { tempDir, waitUntil } from "./helpers.js";
export { defineEngineContract, type EngineFixture } from "./engine-contract.js";
export { defineConformanceSuite } from "./conformance.js";
