// SPDX-License-Identifier: Apache-2.0
/** The one Logger type lives with the telemetry seam; re-exported here for the log layer's imports. */
export { silentLogger, type Logger } from "../observability/telemetry.js";
