// SPDX-License-Identifier: Apache-2.0
// Topics and partitions: high watermarks, append rates, sizes, skew; the cleaner's figures of
// compacted topics and the archive's of topics with an archive (storage.js).
import { h, fill, table, n, num, rate, bytes, percent, empty } from "./format.js";
import { Chart } from "./charts.js";
import { hist, LIMITS } from "./poll.js";
import { ARCHIVE_HEADERS, CLEANER_HEADERS, archiveRows, cleanerRows, isArchived, isCompacted } from "./storage.js";

export function createTopicsPage() {
  const el = h("section", { class: "page", "aria-label": "Topics" });
  const intro = h("div");
  const chart = new Chart("Append rate per topic", "records/s");
  const list = h("div");
  fill(el, h("h2", null, "Topics and partitions"), intro, chart.el, list);
  return {
    el,
    render({ state }) {
      const s = state;
      fill(
        intro,
        h(
          "p",
          { class: "hint" },
          "High watermark: the next offset to be written (records appended since the topic was created). Append rate: growth of the high watermark over the last 10 s. ",
          "Skew: the hottest partition's share of all records appended to the topic (1/partitions is even; 100 % means one partition took everything).",
          s.topicCount > LIMITS.topics ? ` Showing the first ${LIMITS.topics} of ${s.topicCount} topics.` : "",
        ),
      );
      chart.update(hist.topicRate, s.topics.map((d) => d.name));
      if (s.topics.length === 0) {
        fill(list, empty("No topics yet.", "Create one with `sluice topics create NAME --partitions N` or POST /v1/topics { \"name\": \"NAME\" }, then publish to it."));
        return;
      }
      fill(list, s.topics.map(topicBlock));
    },
  };
}

function topicBlock(d) {
  const hws = d.partitions.map((p) => p.highWatermark);
  const total = hws.reduce((a, b) => a + b, 0);
  const skew = total > 0 ? Math.max(...hws) / total : null;
  const size = d.partitions.reduce((a, p) => a + p.sizeBytes, 0);
  const retention = d.config.retentionMs === -1 ? "no time retention" : `retention ${num(d.config.retentionMs / 1000)} s`;
  const rows = d.partitions.map((p) => [
    n(p.partition),
    n(num(p.logStartOffset)),
    n(num(p.highWatermark)),
    n(rate(hist.partHw.rate(`${d.name}/${p.partition}`))),
    n(total > 0 ? percent(p.highWatermark / total) : "—"),
    n(bytes(p.sizeBytes)),
    n(num(p.segments)),
  ]);
  return h(
    "div",
    { class: "topic", "data-topic": d.name },
    h("h3", null, d.name),
    h(
      "p",
      { class: "summary" },
      `${d.partitions.length} partitions · ${num(total)} records appended · ${rate(hist.topicHw.rate(d.name))} records/s · ${bytes(size)} on disk · skew `,
      h("strong", { class: skew !== null && skew > 0.5 && d.partitions.length >= 3 ? "warn" : null }, skew === null ? "—" : percent(skew)),
      ` · ${retention}`,
      isCompacted(d) ? " · compacted" : "",
      isArchived(d) ? ` · ${bytes(d.partitions.reduce((a, p) => a + (p.archivedBytes ?? 0), 0))} archived` : "",
    ),
    table(
      [
        "Partition",
        n("Log start (offset)"),
        n("High watermark (offset)"),
        n("Append rate (records/s)"),
        n("Share of records"),
        n("Size on disk"),
        n("Segments"),
      ],
      rows,
    ),
    storageFigures(d),
  );
}

/** Compaction and archive tables, for the topics they concern (figures since the broker opened). */
function storageFigures(d) {
  const out = [];
  if (isCompacted(d)) {
    out.push(
      h("h4", null, "Compaction"),
      h("p", { class: "hint" }, "Not yet compacted: share of sealed bytes no pass has covered (a pass starts at 50 %; 100 % after a restart until the first). Reclaimed bytes and passes count since the broker started."),
      table(CLEANER_HEADERS.map((x, i) => (i === 0 || i > 3 ? x : n(x))), cleanerRows(d, Date.now()), { class: "cleaner" }),
    );
  }
  if (isArchived(d)) {
    out.push(
      h("h4", null, "Archive"),
      h("p", { class: "hint" }, "Waiting to be archived: bytes of local segments retention is waiting to delete that are not archived yet (they stay on local disk until they are). Reads from the archive count since the broker started; their rate is over the last 10 s."),
      table(ARCHIVE_HEADERS.map((x, i) => (i === 0 ? x : n(x))), archiveRows(d, (p) => hist.archiveRead.rate(`${d.name}/${p}`)), { class: "archive" }),
    );
  }
  return out;
}
