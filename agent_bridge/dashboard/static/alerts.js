// agent-bridge dashboard: the owner's alerts (SPEC §4.6 "The owner is told"). A browser
// notification for a new open question, a job that ended and a message to the owner, once the
// owner allowed notifications (the "Allow alerts" button), and the count of open questions in
// the tab title. app.js calls abAlerts.seen(...) after each refresh; the first one only learns
// what is there. Texts are one line of at most 200 characters; Notification shows them as text.
"use strict";

window.abAlerts = (function () {
  const TEXT_MAX = 200;
  const ENDED = new Set(["finished", "failed", "cancelled", "interrupted"]);
  const OWNER = "cli"; // the owner's address in bridge.db (`send` to "owner" lands there)
  const baseTitle = document.title;
  let known = null; // what the page has seen: question ids, job id -> state, message ids

  function line(text) {
    const flat = String(text || "").replace(/[\s\u0000-\u001f\u007f-\u009f]+/g, " ").trim();
    return flat.length <= TEXT_MAX ? flat : flat.slice(0, TEXT_MAX - 1) + "…";
  }

  function supported() {
    return typeof window.Notification === "function";
  }

  function allowed() {
    return supported() && window.Notification.permission === "granted";
  }

  function notify(title, body, tag) {
    if (!allowed()) return;
    try {
      new window.Notification(line(title), { body: line(body), tag: tag });
    } catch (_) {
      // Some browsers allow notifications only from a service worker: the tab title still counts.
    }
  }

  function toOwner(m) {
    return m.kind === "message" && m.to && m.to.id === OWNER && !(m.from && m.from.id === OWNER);
  }

  function who(author) {
    return author && author.name ? author.name : "an agent";
  }

  // questions: the open ones; jobs: every job; messages: the newest, or null when the page
  // does not have them (the notices filter).
  function seen(questions, jobs, messages) {
    document.title = questions.length > 0 ? "(" + questions.length + ") " + baseTitle : baseTitle;
    const first = known === null;
    if (first) {
      known = { questions: new Set(), jobs: new Map(), messages: new Set() };
      document.documentElement.dataset.alerts = "watching"; // from here on, what is new alerts
    }
    for (const q of questions) {
      if (known.questions.has(q.id)) continue;
      known.questions.add(q.id);
      if (!first) notify("Question from " + who(q.askedBy && q.askedBy[0]), q.question, "question-" + q.id);
    }
    for (const j of jobs) {
      const before = known.jobs.get(j.id);
      known.jobs.set(j.id, j.state);
      if (!first && ENDED.has(j.state) && !ENDED.has(before)) {
        notify("Job " + j.name + " " + j.state, j.title, "job-" + j.id + "-" + j.state);
      }
    }
    for (const m of messages || []) {
      if (!toOwner(m) || known.messages.has(m.id)) continue;
      known.messages.add(m.id);
      if (!first) notify("Message from " + who(m.from), m.text, "message-" + m.id);
    }
  }

  function offer() {
    const button = document.getElementById("alerts-allow");
    if (!button) return;
    button.hidden = !(supported() && window.Notification.permission === "default");
  }

  document.addEventListener("DOMContentLoaded", () => {
    const button = document.getElementById("alerts-allow");
    if (button) {
      button.addEventListener("click", () => {
        Promise.resolve(window.Notification.requestPermission()).then(offer, offer);
      });
    }
    offer();
  });

  return { seen: seen };
})();
