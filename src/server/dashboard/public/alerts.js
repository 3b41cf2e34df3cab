// SPDX-License-Identifier: Apache-2.0
// The dashboard's own alert checks: evaluated in this browser on every poll, from what it has
// polled since the page opened. They mirror three of the shipped Prometheus alert rules, without
// their `for:` durations (a check fires as soon as its condition holds). For paging, use
// Prometheus and the rules themselves.
import { h, fill, table, seconds, num, empty } from "./format.js";
import { hist } from "./poll.js";

export const THRESHOLDS = { queueOldestWaitingS: 300, groupLagS: 300, deadLetterWindowS: 900 };

export const RULES = [
  {
    id: "queue-oldest-waiting",
    title: `Oldest waiting job older than ${THRESHOLDS.queueOldestWaitingS} s`,
    mirrors: "SluiceQueueOldestWaitingTooOld",
    help: "Workers are not keeping up, or none is running: start or scale workers for the queue.",
  },
  {
    id: "group-lag",
    title: `Consumer group more than ${THRESHOLDS.groupLagS} s behind`,
    mirrors: "SluiceGroupLagTooOld",
    help: "The group's oldest unprocessed record is old: its consumers are slow, stuck or gone.",
  },
  {
    id: "dlq-growing",
    title: `Dead-letter queue growing (within ${THRESHOLDS.deadLetterWindowS / 60} min)`,
    mirrors: "SluiceDeadLetterGrowing",
    help: "Jobs fail permanently or exhaust their attempts: inspect them under Dead letters, fix the cause, then redrive.",
  },
];

/** Every check's subjects and whether each fires, from the latest poll and the history. */
export function evaluate(state) {
  const out = [];
  for (const q of state?.queues ?? []) {
    const age = q.oldestWaitingAgeMs / 1000;
    out.push({ rule: "queue-oldest-waiting", subject: `queue ${q.name}`, value: seconds(age), firing: age > THRESHOLDS.queueOldestWaitingS });
  }
  for (const g of state?.groups ?? []) {
    const lag = g.maxLagMs / 1000;
    out.push({ rule: "group-lag", subject: `group ${g.group} on ${g.topic}`, value: seconds(lag), firing: lag > THRESHOLDS.groupLagS });
  }
  const names = new Set((state?.queues ?? []).map((q) => q.name));
  for (const q of state?.queues ?? []) {
    // A source queue's dead-lettered counter rose, or a dead-letter queue's depth rose.
    const counterRose = hist.queueDeadLettered.rose(q.name, THRESHOLDS.deadLetterWindowS);
    const isDlq = q.name.endsWith(".dlq") && names.has(q.name.slice(0, -4));
    const depthRose = isDlq && hist.queueDepth.rose(q.name, THRESHOLDS.deadLetterWindowS);
    if (q.deadLettered === 0 && !isDlq) continue;
    out.push({
      rule: "dlq-growing",
      subject: isDlq ? `dead-letter queue ${q.name}` : `queue ${q.name}`,
      value: isDlq ? `${num(q.depth)} jobs` : `${num(q.deadLettered)} dead-lettered since opened`,
      firing: counterRose || depthRose,
    });
  }
  return out;
}

export function firingCount(state) {
  return evaluate(state).filter((a) => a.firing).length;
}

export function createAlertsPage() {
  const el = h("section", { class: "page", "aria-label": "Alerts" });
  return {
    el,
    render(ctx) {
      const results = evaluate(ctx.state);
      fill(
        el,
        h("h2", null, "Alerts"),
        h(
          "p",
          { class: "hint" },
          "These are the dashboard's own checks, evaluated in this browser every poll from what it has seen since the page opened. ",
          "They mirror the Prometheus alert rules named below but ignore their “for:” durations. Closing the page stops them: alert through Prometheus for paging.",
        ),
        RULES.map((r) => {
          const subjects = results.filter((a) => a.rule === r.id);
          const firing = subjects.filter((a) => a.firing);
          return h(
            "div",
            { class: "rule", "data-rule": r.id },
            h("h3", null, h("span", { class: firing.length > 0 ? "badge firing" : "badge ok" }, firing.length > 0 ? `firing (${firing.length})` : "ok"), " ", r.title),
            h("p", { class: "hint" }, `Mirrors ${r.mirrors}. ${r.help}`),
            subjects.length === 0
              ? empty("Nothing to check yet.", r.id === "group-lag" ? "Groups appear when consumers subscribe with a group." : "Queues appear with their first job.")
              : table(["State", "Subject", "Now"], subjects.map((a) => [h("span", { class: a.firing ? "badge firing" : "badge ok" }, a.firing ? "firing" : "ok"), a.subject, a.value])),
          );
        }),
      );
    },
  };
}

/** The firing checks as short lines (the overview lists them). */
export function firingLines(state) {
  const title = new Map(RULES.map((r) => [r.id, r.title]));
  return evaluate(state)
    .filter((a) => a.firing)
    .map((a) => `${title.get(a.rule)}: ${a.subject} (${a.value})`);
}
