// SPDX-License-Identifier: Apache-2.0
/** The running sluice's version, for the health probes and `sluice_build_info`-style reporting. */
import { readFileSync } from "node:fs";

let cached: string | null = null;

/** The `version` of sluice's package.json ("unknown" when it cannot be read). */
export function sluiceVersion(): string {
  if (cached !== null) return cached;
  try {
    // Compiled to dist/src/observability/: the package root is three levels up.
    const pkg = JSON.parse(readFileSync(new URL("../../../package.json", import.meta.url), "utf8")) as { version?: unknown };
    cached = typeof pkg.version === "string" ? pkg.version : "unknown";
  } catch {
    cached = "unknown";
  }
  return cached;
}
