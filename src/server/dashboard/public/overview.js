// SPDX-License-Identifier: Apache-2.0
// Overview: counts, publish/consume rates, storage and disk space, firing checks.
import { h, fill, num, rate, bytes, percent, empty } from "./format.js";
import { Chart } from "./charts.js";
import { hist, LIMITS } from "./poll.js";
import { firingLines } from "./alerts.js";

function card(label, value, note, attrs = {}) {
  return h("div", { class: "card", ...attrs }, h("div", { class: "label" }, label), h("div", { class: "value" }, value), note ? h("div", { class: "note" }, note) : null);
}

export function createOverviewPage() {
  const el = h("section", { class: "page", "aria-label": "Overview" });
  const cards = h("div", { class: "cards" });
  const alerts = h("div");
  const storage = h("div");
  const chart = new Chart("Publish and consume rate", "records/s");
  fill(el, h("h2", null, "Overview"), cards, alerts, h("h3", null, "Throughput"), chart.el, h("h3", null, "Storage"), storage);
  return {
    el,
    render({ state }) {
      const s = state;
      const partitions = s.topics.reduce((a, d) => a + d.partitions.length, 0);
      const groups = s.groups === null ? null : new Set(s.groups.map((g) => g.group)).size;
      const dlqs = (s.queues ?? []).filter((q) => q.name.endsWith(".dlq")).length;
      const totals = { publish: hist.totals.latest("publish"), consume: hist.totals.latest("consume") };
      fill(
        cards,
        card("Topics", num(s.topicCount), `${num(partitions)} partitions${s.topicCount > LIMITS.topics ? ` (first ${LIMITS.topics} topics read)` : ""}`),
        card("Consumer groups", num(groups), s.groups === null ? null : `${num(s.groups.length)} group × topic pairs`),
        card("Queues", num(s.queueCount), s.queues === null ? null : `${num(dlqs)} dead-letter queues`),
        card("Publish rate", `${rate(totals.publish)} records/s`, "all topics: growth of the high watermarks", { "data-metric": "publish-rate" }),
        card("Consume rate", `${rate(totals.consume)} records/s`, "summed over groups: growth of their committed offsets", { "data-metric": "consume-rate" }),
      );
      const firing = firingLines(s);
      fill(
        alerts,
        firing.length === 0
          ? h("p", { class: "ok-line" }, h("span", { class: "badge ok" }, "ok"), " None of the dashboard's checks is firing (see Alerts).")
          : h("div", { class: "firing-list" }, h("p", null, h("span", { class: "badge firing" }, `firing (${firing.length})`), " the dashboard's own checks (see Alerts):"), h("ul", null, firing.map((l) => h("li", null, l)))),
      );
      chart.update(hist.totals, ["publish", "consume"], (k) => (k === "publish" ? "published" : "consumed (committed)"));
      renderStorage(storage, s);
    },
  };
}

function renderStorage(el, s) {
  const topicBytes = s.topics.reduce((a, d) => a + d.partitions.reduce((b, p) => b + p.sizeBytes, 0), 0);
  const queueBytes = (s.queues ?? []).reduce((a, q) => a + q.bytes, 0);
  const d = s.disk;
  const diskCard =
    d.unavailable !== undefined
      ? card("Free space", "not available", `Free space is not available: ${d.unavailable}.`)
      : card("Free space", bytes(d.free), `${percent(d.free / d.size)} of ${bytes(d.size)} on the data directory's file system (from /metrics, every 10 s)`, { "data-metric": "free-space" });
  const nodes = [
    card("Topic partitions on disk", bytes(topicBytes), "all segments of the topics read (after retention)"),
    card("Live queue payloads", bytes(queueBytes), "bytes of the payloads of jobs not yet completed"),
    diskCard,
  ];
  const nothing = s.topics.length === 0 && (s.queues ?? []).length === 0;
  fill(el, nothing ? empty("Nothing stored yet.", "Create a topic (sluice topics create NAME) or enqueue a job to see sizes here.") : null, h("div", { class: "cards" }, nodes));
}
