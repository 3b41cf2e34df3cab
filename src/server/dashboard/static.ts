// SPDX-License-Identifier: Apache-2.0
/**
 * The web dashboard's files, served read-only on the HTTP port (`/`, `/dashboard/...`).
 *
 * The browser code is plain ES modules in `src/server/dashboard/public/`, shipped as they are
 * (package.json `files` lists the folder): no bundler, and tsc leaves the folder alone. Only
 * the files named in `ASSETS` are served, so a request path never reaches the file system.
 * uPlot (charts) comes from its own package, resolved like any dependency.
 */
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { join } from "node:path";

/** This module runs as dist/src/server/dashboard/static.js: four levels up is the package root. */
const PUBLIC_DIR = fileURLToPath(new URL("../../../../src/server/dashboard/public/", import.meta.url));
const require = createRequire(import.meta.url);

const JS = "text/javascript; charset=utf-8";
const CSS = "text/css; charset=utf-8";
const HTML = "text/html; charset=utf-8";

/** URL path → where the file is and its type. */
const ASSETS = new Map<string, { file: () => string; type: string }>();
const page = { file: () => join(PUBLIC_DIR, "index.html"), type: HTML };
for (const p of ["/", "/dashboard", "/dashboard/", "/dashboard/index.html"]) ASSETS.set(p, page);
for (const f of ["app.js", "api.js", "login.js", "format.js", "history.js", "charts.js", "poll.js", "overview.js", "topics.js", "storage.js", "groups.js", "queues.js", "schedules.js", "dlq.js", "alerts.js"]) {
  ASSETS.set(`/dashboard/${f}`, { file: () => join(PUBLIC_DIR, f), type: JS });
}
ASSETS.set("/dashboard/style.css", { file: () => join(PUBLIC_DIR, "style.css"), type: CSS });
ASSETS.set("/dashboard/vendor/uPlot.iife.min.js", { file: () => require.resolve("uplot/dist/uPlot.iife.min.js"), type: JS });
ASSETS.set("/dashboard/vendor/uPlot.min.css", { file: () => require.resolve("uplot/dist/uPlot.min.css"), type: CSS });

/** Every path the dashboard answers (the HTTP route table registers each). */
export const DASHBOARD_PATHS: readonly string[] = [...ASSETS.keys()];

/**
 * The page runs only its own scripts, is never framed (its buttons purge and redrive: no
 * clickjacking), and talks only to this origin. uPlot sets inline styles, hence 'unsafe-inline'
 * for styles only.
 */
const HEADERS: Record<string, string> = {
  "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
  // Small files read from the package: always revalidate, so an upgrade shows at once.
  "cache-control": "no-cache",
};

export interface DashboardAsset {
  contentType: string;
  body: string;
  headers: Record<string, string>;
}

const cache = new Map<string, string>();

/** The file for a dashboard path, or null when the path is not one of the dashboard's. */
export async function dashboardAsset(path: string): Promise<DashboardAsset | null> {
  const a = ASSETS.get(path);
  if (a === undefined) return null;
  const file = a.file();
  let body = cache.get(file);
  if (body === undefined) {
    body = await readFile(file, "utf8");
    cache.set(file, body);
  }
  return { contentType: a.type, body, headers: HEADERS };
}
