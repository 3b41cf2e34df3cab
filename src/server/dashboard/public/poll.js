// SPDX-License-Identifier: Apache-2.0
// One poll of the broker's HTTP API, and the histories the charts and rates are computed from.
import { api, apiText, enc, errorLine, mapLimit } from "./api.js";
import { History } from "./history.js";

/** Per poll the dashboard describes at most this many topics and queues (one request each). */
export const LIMITS = { topics: 50, queues: 100 };
/** Disk space comes from /metrics, which computes every scrape-time metric: read it less often. */
const METRICS_EVERY = 5;

/** A group on a topic, as one key. */
export const gkey = (g) => `${g.group} · ${g.topic}`;

export const hist = {
  /** topic → Σ high watermarks (records appended). */
  topicHw: new History(),
  /** "topic/partition" → high watermark. */
  partHw: new History(),
  /** "topic/partition" → bytes served from the archive (topics with an archive). */
  archiveRead: new History(),
  /** gkey → Σ positions the group has committed (high watermarks − lag). */
  groupPos: new History(),
  groupLagRecords: new History(),
  groupLagSeconds: new History(),
  queueDepth: new History(),
  queueCompletion: new History(),
  queueDeadLettered: new History(),
  queueOldest: new History(),
  /** "publish" / "consume": records per second over all topics / all groups. */
  totals: new History(),
  /** topic → append rate (records/s), for the topics chart. */
  topicRate: new History(),
};

let polls = 0;
let disk = { unavailable: "not read yet" };

/** Reads everything the pages show; a failing part is reported in `errors`, the rest still shows.
 * `identity`: GET /v1/whoami of the login in use (null: not known). */
export async function poll(identity = null) {
  const errors = [];
  const guard = async (what, p) => {
    try {
      return await p;
    } catch (e) {
      errors.push(`${what}: ${errorLine(e)}`);
      return null;
    }
  };
  const [health, topicList, groupList, queueList] = await Promise.all([
    guard("GET /healthz", api("GET", "/healthz")),
    guard("GET /v1/topics", api("GET", "/v1/topics")),
    guard("GET /v1/groups", api("GET", "/v1/groups")),
    guard("GET /v1/queues", api("GET", "/v1/queues")),
  ]);
  const topicNames = (topicList?.topics ?? []).slice().sort();
  const queueNames = (queueList?.queues ?? []).slice().sort();
  const [topicRes, queueRes] = await Promise.all([
    mapLimit(topicNames.slice(0, LIMITS.topics), 6, (t) => api("GET", `/v1/topics/${enc(t)}`)),
    mapLimit(queueNames.slice(0, LIMITS.queues), 6, (q) => api("GET", `/v1/queues/${enc(q)}/stats`)),
  ]);
  // A topic or queue deleted between the list and its read is simply left out.
  const topics = topicRes.filter((r) => r.ok).map((r) => r.value);
  const queues = queueRes.filter((r) => r.ok).map((r) => r.value);
  for (const r of [...topicRes, ...queueRes]) if (!r.ok && r.error?.status !== 404) errors.push(errorLine(r.error));
  if (polls++ % METRICS_EVERY === 0) disk = await readDisk(identity);
  const state = {
    at: Date.now() / 1000,
    health,
    topics,
    topicCount: topicList ? topicNames.length : null,
    groups: groupList?.groups ?? null,
    queues: queueList ? queues : null,
    queueCount: queueList ? queueNames.length : null,
    disk,
    errors,
  };
  record(state);
  return state;
}

async function readDisk(identity) {
  // /metrics names every resource: only for a login that may describe the cluster. Not asked
  // at all otherwise, as the server says (a refused read would be audited every time).
  if (identity !== null && !identity.cluster.includes("describe")) return { unavailable: `reading it (GET /metrics) needs describe on the cluster, which ${identity.principal} may not do` };
  try {
    const text = await apiText("/metrics");
    if (text === null) return { unavailable: "this server does not export /metrics" };
    const read = (name) => {
      const m = new RegExp(`^${name}(?:\\{[^}]*\\})? ([^\\s]+)`, "m").exec(text);
      return m ? Number(m[1]) : null;
    };
    const free = read("sluice_data_dir_free_bytes");
    const size = read("sluice_data_dir_size_bytes");
    if (free === null || size === null) return { unavailable: "/metrics has no data-directory figures (a broker without a data directory)" };
    return { free, size };
  } catch (e) {
    return { unavailable: `/metrics: ${errorLine(e)}` };
  }
}

/** Appends this poll to the histories (and derives the rates charted over time). */
function record(s) {
  const t = s.at;
  const topicHw = new Map();
  const partHw = new Map();
  const archiveRead = new Map();
  for (const d of s.topics) {
    let sum = 0;
    for (const p of d.partitions) {
      sum += p.highWatermark;
      partHw.set(`${d.name}/${p.partition}`, p.highWatermark);
      if (p.archiveReadBytes !== undefined) archiveRead.set(`${d.name}/${p.partition}`, p.archiveReadBytes);
    }
    topicHw.set(d.name, sum);
  }
  hist.topicHw.push(t, topicHw);
  hist.partHw.push(t, partHw);
  hist.archiveRead.push(t, archiveRead);
  const pos = new Map();
  const lagR = new Map();
  const lagS = new Map();
  for (const g of s.groups ?? []) {
    const k = gkey(g);
    if (topicHw.has(g.topic)) pos.set(k, topicHw.get(g.topic) - g.lagRecords);
    lagR.set(k, g.lagRecords);
    lagS.set(k, g.maxLagMs / 1000);
  }
  hist.groupPos.push(t, pos);
  hist.groupLagRecords.push(t, lagR);
  hist.groupLagSeconds.push(t, lagS);
  const qs = (f) => new Map((s.queues ?? []).map((q) => [q.name, f(q)]));
  hist.queueDepth.push(t, qs((q) => q.depth));
  hist.queueCompletion.push(t, qs((q) => q.completionRatePerSec));
  hist.queueDeadLettered.push(t, qs((q) => q.deadLettered));
  hist.queueOldest.push(t, qs((q) => q.oldestWaitingAgeMs / 1000));
  const topicRate = new Map(s.topics.map((d) => [d.name, hist.topicHw.rate(d.name)]));
  hist.topicRate.push(t, topicRate);
  const sum = (xs) => {
    const v = xs.filter((x) => x !== null);
    return v.length === 0 ? null : v.reduce((a, b) => a + b, 0);
  };
  hist.totals.push(t, {
    publish: sum([...topicRate.values()]),
    consume: sum([...pos.keys()].map((k) => hist.groupPos.rate(k))),
  });
}
