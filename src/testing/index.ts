// SPDX-License-Identifier: Apache-2.0
export {
  FaultyFileSystem,
  prng,
  type FaultOp,
  type IoOp,
  type IoOpKind,
  type CrashPoint,
  type FaultyFileSystemOptions,
  type CrashModelOptions,
  type PowerLossMode,
  type PowerLossOptions,
  type PowerLossReport,
} from "./faulty-fs.js";
export { tempDir, waitUntil } from "./helpers.js";
export { defineEngineContract, type EngineFixture } from "./engine-contract.js";
export { defineConformanceSuite, type ConformanceScope } from "./conformance.js";
export {
  runCrashPoints,
  formatCrashPointReport,
  DEFAULT_EXHAUSTIVE_PHASES,
  type CrashPointOptions,
  type CrashPointReport,
  type CrashPointResult,
  type PhaseReport,
  type Problem,
} from "./crash-points.js";
export {
  verifyConsumer,
  kitRecordSet,
  KitStore,
  KitEffects,
  KIT_CRASH_POINTS,
  type KitHandler,
  type KitWorld,
  type KitReport,
  type KitRunReport,
  type KitCrashPoint,
  type KitRebalanceReport,
  type KitEvent,
  type KitRecordSetOptions,
  type VerifyOptions,
} from "./consumer-kit.js";
export {
  capacityRun,
  formatCapacityReport,
  CAPACITY_LIMITS,
  type CapacityRunOptions,
  type CapacityStep,
  type CapacityStepResult,
  type CapacityResult,
} from "./capacity-run.js";
