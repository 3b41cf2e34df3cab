// SPDX-License-Identifier: Apache-2.0
// Queues: depth, oldest waiting age, jobs in flight, flow parents, completion rate over time; purge.
import { h, fill, table, n, num, rate, bytes, seconds, empty } from "./format.js";
import { api, enc } from "./api.js";
import { Chart } from "./charts.js";
import { hist, LIMITS } from "./poll.js";

export function createQueuesPage() {
  const el = h("section", { class: "page", "aria-label": "Queues" });
  const depth = new Chart("Depth per queue", "jobs");
  const completion = new Chart("Completion rate per queue", "jobs/s");
  const oldest = new Chart("Oldest waiting job per queue", "seconds");
  const list = h("div");
  fill(
    el,
    h("h2", null, "Queues"),
    h(
      "p",
      { class: "hint" },
      "Depth: every live job (waiting + delayed + in flight + blocked behind an earlier job of its key + waiting for children). Oldest waiting: how long the oldest deliverable job has waited. ",
      "Waiting for children: flow parents (enqueueFlow) held until all their children have completed. ",
      "Completion rate: acknowledgements per second over the broker's last ~10 s. Dead-lettered: jobs this queue has moved to its dead-letter queue since it was opened.",
    ),
    h("div", { class: "charts" }, depth.el, completion.el, oldest.el),
    list,
  );
  return {
    el,
    render(ctx) {
      const { state } = ctx;
      const queues = state.queues ?? [];
      const names = queues.map((q) => q.name);
      depth.update(hist.queueDepth, names);
      completion.update(hist.queueCompletion, names);
      oldest.update(hist.queueOldest, names);
      if (state.queues === null) {
        fill(list, empty("Queues could not be read (see the error line above)."));
        return;
      }
      if (queues.length === 0) {
        fill(list, empty("No queues yet.", "A queue appears with its first job: queue.enqueue(...) from a client, or POST /v1/queues/NAME/jobs { \"data\": ... }."));
        return;
      }
      const rows = queues.map((q) => ({
        attrs: { "data-queue": q.name },
        cells: [
          q.name,
          { v: num(q.depth), class: "num depth" },
          n(num(q.waiting)),
          n(num(q.delayed)),
          n(num(q.inFlight)),
          n(num(q.blockedByKey)),
          // Servers from before flows do not send the field: none can be waiting there.
          { v: num(q.waitingChildren ?? 0), class: "num waiting-children" },
          n(seconds(q.oldestWaitingAgeMs / 1000)),
          n(rate(q.completionRatePerSec)),
          n(num(q.completed)),
          n(num(q.deadLettered)),
          n(bytes(q.bytes)),
          h(
            "span",
            { class: "actions" },
            h("button", { class: "link", onclick: () => ctx.show("dlq", { queue: q.name }) }, q.name.endsWith(".dlq") ? "Browse dead letters" : "Browse"),
            " ",
            h("button", { class: "danger", onclick: () => purge(ctx, q) }, "Purge…"),
          ),
        ],
      }));
      fill(
        list,
        state.queueCount > LIMITS.queues ? h("p", { class: "hint" }, `Showing the first ${LIMITS.queues} of ${state.queueCount} queues.`) : null,
        table(["Queue", n("Depth (jobs)"), n("Waiting"), n("Delayed"), n("In flight"), n("Blocked by key"), n("Waiting for children"), n("Oldest waiting"), n("Completion (jobs/s)"), n("Completed"), n("Dead-lettered"), n("Payload bytes"), "Actions"], rows),
      );
    },
  };
}

/** Purge through POST /v1/queues/:queue/purge, after a confirmation. */
export function purge(ctx, q) {
  return ctx.act(
    `Purge queue “${q.name}”?\n\nThis durably drops every job enqueued so far (now ${num(q.depth)}: waiting, delayed and in flight). It cannot be undone.`,
    async () => {
      const r = await api("POST", `/v1/queues/${enc(q.name)}/purge`, {});
      return `Purged ${num(r.purged)} jobs from ${q.name}.`;
    },
  );
}
