// SPDX-License-Identifier: Apache-2.0
// Dead letters: list a dead-letter queue's entries (the browse route), inspect one with its
// metadata and attempt history, redrive one or all, purge. Actions confirm first.
import { h, fill, table, n, num, time, empty } from "./format.js";
import { api, enc, errorLine } from "./api.js";
import { purge } from "./queues.js";

const PAGE = 50;

export function createDlqPage() {
  const el = h("section", { class: "page", "aria-label": "Dead letters" });
  const select = h("select", { id: "dlq-queue", "aria-label": "Dead-letter queue" });
  const repeats = h("input", { type: "checkbox", id: "dlq-repeats" });
  const info = h("p", { class: "hint" });
  const list = h("div", { class: "dlq-list" });
  const details = h("div", { class: "dlq-details" });
  const v = { queue: null, jobs: [], next: null, pages: 0, selected: null, error: null, loading: false, names: "" };
  let ctx = null;

  const load = async (more) => {
    if (await fetchPage(v, more)) draw();
  };

  const choose = (name) => {
    if (name === v.queue) return;
    Object.assign(v, { queue: name, jobs: [], next: null, pages: 0, selected: null, error: null });
    select.value = name ?? "";
    draw();
    void load(false);
  };
  select.addEventListener("change", () => choose(select.value || null));

  const redrive = (ids) => {
    const q = v.queue;
    if (q === null) return;
    return ctx.act(redriveQuestion(q, ids, repeats.checked), async () => {
      const body = { includeRepeats: repeats.checked, ...(ids ? { filter: { ids } } : {}) };
      const r = await api("POST", `/v1/queues/${enc(q)}/redrive`, body);
      if (ids) v.selected = null;
      await load(false);
      return `Redrove ${num(r.moved)} job${r.moved === 1 ? "" : "s"} from ${q}${r.skippedRepeats > 0 ? ` (${num(r.skippedRepeats)} marked repeat skipped)` : ""}.`;
    });
  };
  const purgeSelected = () => (v.queue === null ? undefined : purge(ctx, { name: v.queue, depth: depthOf(ctx, v.queue) }).then(() => load(false)));
  const toolbar = h(
    "div",
    { class: "toolbar" },
    h("label", { for: "dlq-queue" }, "Queue "),
    select,
    h("button", { onclick: () => load(false) }, "Refresh"),
    h("button", { id: "dlq-redrive-all", onclick: () => redrive(null) }, "Redrive all…"),
    h("button", { class: "danger", onclick: purgeSelected }, "Purge…"),
    h("label", { class: "check" }, repeats, " include entries marked repeat"),
  );
  fill(el, h("h2", null, "Dead letters"), toolbar, info, h("div", { class: "dlq-body" }, list, details));

  function draw() {
    const count = v.jobs.length;
    fill(
      info,
      v.queue === null ? "" : `${v.queue}: ${num(depthOf(ctx, v.queue))} live jobs now; ${num(count)} listed${v.next !== null ? " (more below)" : ""}. Select an entry to inspect it.`,
    );
    if (v.queue === null) {
      fill(list, noQueueView(v.names !== ""));
      fill(details);
      return;
    }
    fill(list, entriesView(v, (id) => ((v.selected = id), draw()), () => load(true)));
    const job = v.jobs.find((j) => j.id === v.selected);
    fill(details, job === undefined ? null : jobDetails(job, () => redrive([job.id])));
  }

  return {
    el,
    render(c, opts) {
      ctx = c;
      const queues = (c.state.queues ?? []).map((q) => q.name);
      const dlqs = queues.filter((q) => q.endsWith(".dlq"));
      const sig = queues.join("\u0000");
      if (sig !== v.names) {
        v.names = sig;
        fillOptions(select, queues);
        select.value = v.queue ?? "";
      }
      const wanted = opts?.queue ?? (v.queue !== null && queues.includes(v.queue) ? v.queue : dlqs[0] ?? null);
      if (wanted !== v.queue) return choose(wanted);
      if (v.queue === null) return draw();
      // While only the first page is shown it follows the queue; after "load more" it stays put.
      if (v.pages <= 1) void load(false);
      else draw();
    },
  };
}

/** Reads a page of the selected queue into `v` (the first, or the next with `more`); false
 * when nothing changed (a read already running, or the selection moved on meanwhile). */
async function fetchPage(v, more) {
  if (v.queue === null || v.loading) return false;
  v.loading = true;
  const q = v.queue;
  try {
    const after = more && v.next !== null ? `&after=${enc(String(v.next))}` : "";
    const r = await api("GET", `/v1/queues/${enc(q)}/browse?limit=${PAGE}${after}`);
    if (q !== v.queue) return false;
    v.jobs = more ? [...v.jobs, ...r.jobs] : r.jobs;
    v.next = r.next ?? null;
    v.pages = more ? v.pages + 1 : 1;
    v.error = null;
  } catch (e) {
    if (q !== v.queue) return false;
    v.error = e;
    if (!more) v.jobs = [];
  } finally {
    v.loading = false;
  }
  return true;
}

/** The queue picker: dead-letter queues first; any other queue can be browsed too. */
function fillOptions(select, queues) {
  const dlqs = queues.filter((q) => q.endsWith(".dlq"));
  const others = queues.filter((q) => !q.endsWith(".dlq"));
  const opts = (list) => list.map((q) => h("option", { value: q }, q));
  fill(
    select,
    h("option", { value: "" }, "— choose a queue —"),
    dlqs.length > 0 ? h("optgroup", { label: "Dead-letter queues" }, opts(dlqs)) : null,
    others.length > 0 ? h("optgroup", { label: "Other queues" }, opts(others)) : null,
  );
}

function noQueueView(anyQueue) {
  return anyQueue
    ? empty("No dead-letter queue named NAME.dlq exists.", "Choose a queue above to browse its jobs (a dead-letter queue configured with another name is listed under Other queues).")
    : empty("No queues yet.", "A queue's dead-letter queue (NAME.dlq unless configured otherwise) is created with the queue; jobs land there when they fail permanently (PermanentError, nack with requeue: false) or run out of attempts.");
}

/** The list part: the error, "loading", the empty state, or the entries and "load more". */
function entriesView(v, onInspect, onMore) {
  if (v.error !== null) {
    const noRoute = v.error.code === "NOT_FOUND";
    return h("p", { class: "error-line" }, noRoute ? "This server cannot list a queue's jobs (no browse route): Redrive all and Purge still work. " : "", errorLine(v.error));
  }
  if (v.pages === 0) return h("p", { class: "hint" }, "Loading…");
  if (v.jobs.length === 0) return empty(`${v.queue} is empty.`, "Nothing to redrive: jobs that fail permanently or run out of attempts land here.");
  return [
    table(
      ["Job id", "Source queue", "Error class", "Error", n("Attempts"), "Dead-lettered at", n("Redrives"), ""],
      v.jobs.map((j) => ({
        attrs: { "data-job": j.id, class: j.id === v.selected ? "selected" : null },
        cells: [
          j.id,
          j.deadLetter?.sourceQueue ?? "—",
          j.deadLetter?.errorClass ?? "—",
          { v: clip(j.deadLetter?.error ?? ""), class: "clip", title: j.deadLetter?.error },
          n(num(j.attempts)),
          time(j.deadLetter?.deadLetteredAt),
          n(num(j.deadLetter?.redriveCount ?? 0)),
          h("button", { class: "link", onclick: () => onInspect(j.id) }, "Inspect"),
        ],
      })),
    ),
    v.next !== null ? h("button", { onclick: onMore }, `Load ${PAGE} more`) : null,
  ];
}

function redriveQuestion(q, ids, includeRepeats) {
  const one = ids !== null;
  const what = one ? `job ${ids[0]}` : `every entry of ${q}`;
  const where = one ? "The job goes back to its source queue as a new job and leaves" : "The jobs go back to their source queues as new jobs and leave";
  return `Redrive ${what}?\n\n${where} the dead-letter queue.${includeRepeats ? "" : " Entries marked repeat are skipped."}`;
}

function depthOf(ctx, name) {
  return (ctx?.state.queues ?? []).find((q) => q.name === name)?.depth ?? null;
}

const clip = (s) => (s.length > 80 ? `${s.slice(0, 79)}…` : s);

function jobDetails(job, onRedrive) {
  const d = job.deadLetter;
  const row = (k, val) => [h("dt", null, k), h("dd", null, val === undefined || val === null || val === "" ? "—" : val)];
  const headers = Object.entries(job.headers ?? {});
  return h(
    "div",
    { class: "job", "data-job-details": job.id },
    h("h3", null, `Job ${job.id}`),
    h("button", { id: "dlq-redrive-one", onclick: onRedrive }, "Redrive this job…"),
    h(
      "dl",
      null,
      row("State", job.state),
      row("Key", job.key),
      row("Enqueued at", time(job.enqueuedAt)),
      row("Attempts", num(job.attempts)),
      d ? [row("Source queue", d.sourceQueue), row("Source job id", d.sourceId), row("First enqueued at", time(d.firstEnqueuedAt)), row("Dead-lettered at", time(d.deadLetteredAt)), row("Error class", d.errorClass), row("Error", d.error), row("Code version", d.codeVersion), row("Redrives before", num(d.redriveCount)), row("Marked repeat", d.repeat ? "yes: skipped by redrive unless included" : "no"), row("Possible duplicate", d.duplicate ? "yes (a crash during a move)" : "no"), row("Redacted headers", (d.redacted ?? []).join(", "))] : row("Dead-letter record", "none: this job was not dead-lettered"),
    ),
    h("h4", null, "Attempt history"),
    d && d.history.length > 0
      ? table([n("Attempt"), "At", "Consumer", "Error class", "Error", "Code version"], d.history.map((a) => [n(a.attempt), time(a.at), a.consumer, a.errorClass, a.error, a.codeVersion ?? "—"]))
      : h("p", { class: "hint" }, "No failed attempts recorded."),
    h("h4", null, "Headers"),
    headers.length > 0 ? table(["Name", "Value"], headers.map(([k, val]) => [k, typeof val === "string" ? val : JSON.stringify(val)])) : h("p", { class: "hint" }, "None."),
    h("h4", null, `Payload${job.dataEncoding ? ` (${job.dataEncoding})` : ""}`),
    h("pre", { class: "payload" }, typeof job.data === "string" ? job.data : JSON.stringify(job.data, null, 2)),
  );
}
