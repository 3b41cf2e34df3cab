// SPDX-License-Identifier: Apache-2.0
// The dashboard's shell: the login when the server asks for one, tabs, the poll loop (every
// 2 s), the error line and admin actions.
import { h, fill, time, seconds } from "./format.js";
import { credential, errorLine, whenRefused } from "./api.js";
import { createLogin, endLogin, showWho, takeNotice, whoami } from "./login.js";
import { poll } from "./poll.js";
import { createOverviewPage } from "./overview.js";
import { createTopicsPage } from "./topics.js";
import { createGroupsPage } from "./groups.js";
import { createQueuesPage } from "./queues.js";
import { createSchedulesPage } from "./schedules.js";
import { createDlqPage } from "./dlq.js";
import { createAlertsPage, firingCount } from "./alerts.js";

const POLL_MS = 2000;

const TABS = [
  ["overview", "Overview", createOverviewPage()],
  ["topics", "Topics", createTopicsPage()],
  ["groups", "Consumer groups", createGroupsPage()],
  ["queues", "Queues", createQueuesPage()],
  ["schedules", "Schedules", createSchedulesPage()],
  ["dlq", "Dead letters", createDlqPage()],
  ["alerts", "Alerts", createAlertsPage()],
];
const pages = new Map(TABS.map(([id, , page]) => [id, page]));

const nav = document.getElementById("tabs");
const main = document.getElementById("main");
const status = document.getElementById("status");
const errorBar = document.getElementById("error");
const notice = document.getElementById("notice");
const who = document.getElementById("who");
const footer = document.querySelector("footer");

let state = null;
/** GET /v1/whoami of the login in use (what the server says it may do on the cluster). */
let identity = null;
let current = "overview";
let busy = false;

const tabButtons = new Map();
for (const [id, label, page] of TABS) {
  const b = h("a", { href: `#${id}`, role: "tab", id: `tab-${id}`, "aria-controls": `page-${id}` }, label);
  tabButtons.set(id, b);
  nav.append(b);
  page.el.id = `page-${id}`;
  page.el.setAttribute("role", "tabpanel");
  page.el.hidden = true;
  main.append(page.el);
}

/** What the pages get: the latest poll and the shell's services. */
const ctx = {
  get state() {
    return state;
  },
  show(tab, opts) {
    if (location.hash !== `#${tab}`) history.pushState(null, "", `#${tab}`);
    select(tab, opts);
  },
  /** An admin action: confirm, run, report one line (the broker's error code on failure), refresh. */
  async act(question, run) {
    if (!window.confirm(question)) return;
    try {
      say(await run(), "ok");
    } catch (e) {
      say(errorLine(e), "error");
    }
    await refresh();
  },
};

function say(text, kind) {
  notice.hidden = false;
  notice.className = kind === "error" ? "notice error-line" : "notice ok-line";
  fill(notice, text, " ", h("button", { class: "link", "aria-label": "dismiss", onclick: () => (notice.hidden = true) }, "×"));
}

function select(tab, opts) {
  current = pages.has(tab) ? tab : "overview";
  for (const [id, page] of pages) page.el.hidden = id !== current;
  for (const [id, b] of tabButtons) b.setAttribute("aria-selected", String(id === current));
  render(opts);
}

function render(opts) {
  if (state === null) return;
  try {
    pages.get(current).render(ctx, opts);
  } catch (e) {
    errorBar.hidden = false;
    fill(errorBar, `dashboard error: ${e.message}`);
  }
  const firing = firingCount(state);
  fill(tabButtons.get("alerts"), "Alerts", firing > 0 ? h("span", { class: "badge firing", id: "alerts-badge" }, String(firing)) : null);
  const hz = state.health;
  fill(status, hz ? `sluice ${hz.version ?? ""} · up ${seconds(hz.uptimeSeconds)} · ` : "", `updated ${time(state.at * 1000)}`);
  errorBar.hidden = state.errors.length === 0;
  fill(errorBar, state.errors.length === 0 ? "" : state.errors[0], state.errors.length > 1 ? ` (and ${state.errors.length - 1} more)` : "");
  document.body.dataset.polls = String(Number(document.body.dataset.polls ?? 0) + 1);
}

async function refresh() {
  if (busy) return;
  busy = true;
  try {
    state = await poll(identity);
  } catch (e) {
    errorBar.hidden = false;
    fill(errorBar, errorLine(e));
  } finally {
    busy = false;
  }
  render();
}

async function loop() {
  const started = performance.now();
  await refresh();
  setTimeout(loop, Math.max(200, POLL_MS - (performance.now() - started)));
}

const refusedLine = (e) => `The server no longer accepts this login (${errorLine(e)}): log in again.`;

/** Logged in (or an open server): the pages show and the poll loop runs. */
function start(me) {
  identity = me;
  login.hide();
  showWho(who, me);
  if (me.principal === null) footer.append(" This server has no users or tokens: anyone who can reach this port can read everything and act, so keep it on a trusted network.");
  // A 401 from now on: the credential no longer works (user removed, token revoked or expired).
  whenRefused((e) => endLogin(refusedLine(e), true));
  nav.hidden = false;
  main.hidden = false;
  window.addEventListener("hashchange", () => select(location.hash.slice(1)));
  window.addEventListener("resize", () => render());
  select(location.hash.slice(1) || "overview");
  void loop();
}

const login = createLogin(document.getElementById("login"), start);

function needLogin(line) {
  fill(status, "not logged in");
  login.show(line);
}

/**
 * Whether a login is needed is the server's answer to GET /v1/whoami: 401 shows the form (an
 * open server answers at once). After a log out the page knows without asking: a request
 * without credentials counts as a failed login against this address (AUTH-4).
 */
async function boot() {
  const left = takeNotice();
  if (left !== null && credential.get() === null) return needLogin(left);
  try {
    start(await whoami(credential.get()));
  } catch (e) {
    if (e.status === 401) {
      const stored = credential.get() !== null;
      credential.forget();
      return needLogin(stored ? { text: refusedLine(e), error: true } : null);
    }
    // Unreachable or failing: say so and ask again.
    errorBar.hidden = false;
    fill(errorBar, errorLine(e));
    setTimeout(boot, POLL_MS);
  }
}

void boot();
