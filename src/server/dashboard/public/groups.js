// SPDX-License-Identifier: Apache-2.0
// Consumer groups: lag in records and in seconds over time, members, consume rates.
import { h, fill, table, n, num, rate, seconds, time, empty } from "./format.js";
import { api, enc, errorLine } from "./api.js";
import { Chart } from "./charts.js";
import { gkey, hist } from "./poll.js";

export function createGroupsPage() {
  const el = h("section", { class: "page", "aria-label": "Consumer groups" });
  const lagRecords = new Chart("Lag per group", "records");
  const lagSeconds = new Chart("Age of the oldest unprocessed record per group", "seconds");
  const list = h("div");
  /** gkey → the element showing its partitions (open rows keep updating). */
  const open = new Map();
  fill(
    el,
    h("h2", null, "Consumer groups"),
    h(
      "p",
      { class: "hint" },
      "Lag: records published but not yet committed by the group (high watermark − committed offset). Lag in seconds: how old the oldest unprocessed record is (0 when caught up). ",
      "Consume rate: growth of the group's committed offsets over the last 10 s. Members: subscribers connected now.",
    ),
    h("div", { class: "charts" }, lagRecords.el, lagSeconds.el),
    list,
  );
  const page = {
    el,
    render({ state }) {
      const groups = state.groups ?? [];
      const keys = groups.map(gkey);
      lagRecords.update(hist.groupLagRecords, keys);
      lagSeconds.update(hist.groupLagSeconds, keys);
      if (state.groups === null) {
        fill(list, empty("Groups could not be read (see the error line above)."));
        return;
      }
      if (groups.length === 0) {
        fill(list, empty("No consumer groups yet.", "A group appears when a consumer subscribes with a group name (e.g. `sluice tail TOPIC --group NAME`) or commits offsets."));
        return;
      }
      const rows = [];
      for (const g of groups) {
        const k = gkey(g);
        const toggle = h("button", { class: "link", "aria-expanded": open.has(k) ? "true" : "false", onclick: () => (open.has(k) ? open.delete(k) : open.set(k, h("div", { class: "details" }, "Loading…")), page.render({ state })) }, open.has(k) ? "Hide" : "Partitions");
        rows.push({
          attrs: { "data-group": g.group, "data-topic": g.topic },
          cells: [g.group, g.topic, n(num(g.members)), n(num(g.committedPartitions)), { v: num(g.lagRecords), class: "num lag-records" }, { v: seconds(g.maxLagMs / 1000), class: "num lag-seconds" }, n(rate(hist.groupPos.rate(k))), toggle],
        });
        const details = open.get(k);
        if (details !== undefined) {
          rows.push({ attrs: { class: "details-row" }, cells: [{ v: details, class: "details-cell" }] });
          void loadPartitions(g, details);
        }
      }
      const t = table(["Group", "Topic", n("Members"), n("Committed partitions"), n("Lag (records)"), n("Lag (seconds)"), n("Consume rate (records/s)"), ""], rows);
      for (const td of t.querySelectorAll("td.details-cell")) td.colSpan = 8;
      fill(list, t);
    },
  };
  return page;
}

async function loadPartitions(g, el) {
  try {
    const lag = await api("GET", `/v1/groups/${enc(g.group)}/topics/${enc(g.topic)}/lag`);
    fill(
      el,
      table(
        [n("Partition"), n("Committed offset"), n("Log start"), n("High watermark"), n("Lag (records)"), n("Lag (seconds)")],
        lag.partitions.map((p) => [n(p.partition), n(p.committedOffset === null ? "none" : num(p.committedOffset)), n(num(p.logStartOffset)), n(num(p.highWatermark)), n(num(p.lagRecords)), n(seconds(p.lagMs / 1000))]),
      ),
      h("p", { class: "hint" }, `read ${time(Date.now())}; “none”: nothing committed on that partition yet (the group starts per its start policy).`),
    );
  } catch (e) {
    fill(el, h("p", { class: "error-line" }, errorLine(e)));
  }
}
