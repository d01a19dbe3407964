// agent-bridge dashboard. Plain JavaScript under script-src 'self'.
// Data from the API is only ever put in the page with textContent (never innerHTML).
"use strict";

(function () {
  const POLL_MS = 5000; // without a live stream, the page asks again this often
  const HIDDEN_POLL_MS = 15000; // a hidden tab gives its stream back but still asks, for the alerts
  const STREAM_RETRY_MS = [2000, 5000, 10000]; // waits before trying the stream again
  const SEARCH_DELAY_MS = 250;
  const NOTICE_TAGS = { decision: "decision notice", retraction: "retraction notice" };
  const ANSWER_TAGS = { answered: "answer", declined: "declined" };

  const $ = (id) => document.getElementById(id);
  const state = {
    topic: null,
    historyAsked: 0, // history loads started: only the latest one's answer is shown
    searchTimer: null,
    findTimer: null, // the search box's pause before it asks
    findAsked: 0, // searches started: only the latest one's answer is shown
    loading: false,
    again: false, // a change arrived while loading: load once more afterwards
    names: new Map(),
    projects: new Set(),
    messageKind: "",
    hopLimit: null,
    denied: false, // the dashboard answered 403: this page's token is no longer valid
    canAct: false, // a broker serves this page: the owner's actions work
    stream: null,
    streamLive: false,
    streamFailures: 0,
    streamTimer: null,
    pollTimer: null,
    hiddenTimer: null,
    seen: { questions: [], jobs: [], messages: [] }, // the last lists loaded, for the alerts
  };

  // --- DOM helpers -------------------------------------------------------------------------

  function el(tag, options, children) {
    const node = document.createElement(tag);
    const o = options || {};
    if (o.className) node.className = o.className;
    if (o.text !== undefined && o.text !== null) node.textContent = String(o.text);
    if (o.title) node.title = o.title;
    if (o.type) node.type = o.type;
    for (const child of children || []) {
      if (child) node.appendChild(child);
    }
    return node;
  }

  function text(value) {
    return document.createTextNode(String(value));
  }

  function show(node, visible) {
    node.hidden = !visible;
  }

  function setCount(id, n) {
    $(id).textContent = String(n);
  }

  // --- formatting --------------------------------------------------------------------------

  function absolute(ms) {
    return new Date(ms).toLocaleString();
  }

  function age(ms) {
    const seconds = Math.round((Date.now() - ms) / 1000);
    if (seconds < 45) return "";
    const minutes = Math.round(seconds / 60);
    if (minutes < 60) return minutes + " min";
    const hours = Math.round(minutes / 60);
    if (hours < 24) return hours + " h";
    const days = Math.round(hours / 24);
    return days + " d";
  }

  function relative(ms) {
    const a = age(ms);
    if (!a) return "just now";
    if (Date.now() - ms > 30 * 86400000) return new Date(ms).toLocaleDateString();
    return a + " ago";
  }

  function when(ms) {
    return el("time", { text: relative(ms), title: absolute(ms) });
  }

  function sessionName(address) {
    return state.names.get(address) || address;
  }

  // A scope in words: who a decision is for.
  function scopeWords(scope) {
    if (scope === "all") return "everyone (all sessions)";
    if (scope && typeof scope.project === "string") return "sessions in " + scope.project;
    if (scope && Array.isArray(scope.sessions)) {
      const names = scope.sessions.map(sessionName);
      return (names.length === 1 ? "session " : "sessions ") + names.join(", ");
    }
    return "an unknown scope";
  }

  function scopeBadge(scope) {
    const words = scopeWords(scope);
    if (scope === "all") return el("span", { className: "scope all", text: words });
    const title = scope && Array.isArray(scope.sessions) ? "addresses: " + scope.sessions.join(", ") : words;
    return el("span", { className: "scope", text: words, title: title });
  }

  // --- API ---------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(path) {
    const response = await fetch(path, { credentials: "same-origin", cache: "no-store" });
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    if (!response.ok) {
      const message = body && typeof body.error === "string" ? body.error : "HTTP " + response.status;
      throw new ApiError(response.status, message);
    }
    return body;
  }

  // The owner's actions (SPEC §6): POSTs with the page's token, JSON, from this origin.
  const PAGE_TOKEN = (document.querySelector('meta[name="ab-token"]') || {}).content || "";

  async function post(path, body) {
    const response = await fetch(path, {
      method: "POST",
      credentials: "same-origin",
      cache: "no-store",
      headers: { "Content-Type": "application/json", "X-AB-Token": PAGE_TOKEN },
      body: JSON.stringify(body),
    });
    let result = null;
    try {
      result = await response.json();
    } catch (_) {
      result = null;
    }
    if (!response.ok) {
      const message = result && typeof result.error === "string" ? result.error : "HTTP " + response.status;
      throw new ApiError(response.status, message);
    }
    return result;
  }

  function names(list) {
    return list.length ? list.join(", ") : "";
  }

  // What an action did, in one line, as the command line says it.
  function toldWords(told, later) {
    return told && told.length ? "told " + names(told) : "no session in scope is connected; " + later;
  }

  function say(id, message, isError) {
    const line = $(id);
    line.textContent = message;
    line.className = isError ? "action-result error" : "action-result";
    show(line, Boolean(message));
  }

  async function act(resultId, run) {
    try {
      say(resultId, await run(), false);
      refresh();
      return true;
    } catch (error) {
      if (error instanceof ApiError && error.status === 403 && /token|Origin/.test(error.message) === false) deny();
      say(resultId, error instanceof ApiError ? error.message : explain(error), true);
      return false;
    }
  }

  function decideScope() {
    const kind = $("decide-scope-kind").value;
    const value = $("decide-scope-value").value.trim();
    if (kind === "project") return { project: value };
    if (kind === "sessions") return { sessions: value.split(",").map((x) => x.trim()).filter((x) => x) };
    return "all";
  }

  function syncDecideScope() {
    const kind = $("decide-scope-kind").value;
    const input = $("decide-scope-value");
    show(input, kind !== "all");
    input.placeholder = kind === "project" ? "/absolute/project/folder" : "session names or ids, comma-separated";
    input.setAttribute("list", kind === "project" ? "projects" : "sessions-list");
  }

  async function recordDecision(event) {
    event.preventDefault();
    const done = await act("decide-result", async () => {
      const r = await post("/api/decisions", {
        topic: $("decide-topic").value, text: $("decide-text").value, scope: decideScope(),
      });
      const d = r.decision;
      return "Recorded “" + d.topic + "” for " + scopeWords(d.scope) + (d.supersedes ? " (replacing the earlier one)" : "") +
        "; " + toldWords(r.deliveredTo, "sessions that start later see it in their start note") + ".";
    });
    if (done) {
      $("decide-text").value = "";
    }
  }

  async function retractDecision() {
    const topic = state.topic;
    if (topic === null) return;
    const reason = $("retract-reason").value.trim();
    const done = await act("retract-result", async () => {
      const r = await post("/api/decisions/" + encodeURIComponent(topic) + "/retract", reason ? { reason: reason } : {});
      return "Retracted “" + r.retraction.topic + "”; " +
        toldWords(r.notified, "sessions that start later no longer see it") + ".";
    });
    if (done) $("retract-reason").value = "";
  }

  function changeDecision() {
    if (state.topic === null) return;
    $("decide-topic").value = state.topic;
    $("decide-box").open = true;
    $("decide-text").focus();
  }

  async function sendMessage(event) {
    event.preventDefault();
    const done = await act("send-result", async () => {
      const r = await post("/api/messages", { to: $("send-to").value.trim(), text: $("send-text").value });
      const to = r.message.to && r.message.to.name ? r.message.to.name : $("send-to").value;
      return (r.recipientConnected ? "Sent to " + to + " (connected)."
        : "Queued for " + to + " (not connected); it gets it when it connects.") + " Message " + r.message.id + ".";
    });
    if (done) $("send-text").value = "";
  }

  // Sessions whose Forget was clicked once: kept here, not on the button, so that a live
  // refresh of the list (which builds new buttons) does not undo the first click.
  const armedForget = new Set();

  function forgetButton(s) {
    const armedText = "Forget " + s.name + "?";
    const button = el("button", { className: "button quiet small forget", type: "button",
                                  text: armedForget.has(s.id) ? armedText : "Forget" });
    button.title = "Forget this gone session and what was queued to it";
    button.addEventListener("click", async () => {
      if (!armedForget.has(s.id)) { // two clicks: nothing is forgotten by a stray one
        armedForget.add(s.id);
        button.textContent = armedText;
        return;
      }
      armedForget.delete(s.id);
      button.disabled = true;
      await act("sessions-result", async () => {
        const r = await post("/api/sessions/" + encodeURIComponent(s.id) + "/forget", {});
        const n = r.forgotten.reduce((sum, f) => sum + f.dropped.length, 0);
        return "Forgot " + s.name + (n ? "; " + n + " queued message" + (n === 1 ? "" : "s") + " dropped." : ".");
      });
    });
    return button;
  }

  // --- questions for the owner (ask_owner) ---------------------------------------------------

  // One item per open question, kept across live refreshes (keyed by id), so that an answer being
  // typed is neither lost nor blurred when something else changes; only the askers are updated.
  const questionItems = new Map();

  function askersWords(q) {
    return "from " + q.askedBy.map((a) => a.name || "(unknown)").join(", ");
  }

  async function answerQuestion(q, body, item) {
    for (const button of item.querySelectorAll("button")) button.disabled = true;
    const done = await act("questions-result", async () => {
      const r = await post("/api/questions/" + encodeURIComponent(q.id) + "/answer", body);
      const asked = r.askersTold && r.askersTold.length ? " Sent to " + names(r.askersTold) + ", who asked." : "";
      if (!r.decision) return "Declined “" + r.question.question + "”." + asked;
      return "Answered “" + r.question.question + "”: recorded “" + r.decision.topic + "” for " +
        scopeWords(r.decision.scope) + "; " + toldWords(r.deliveredTo, "sessions that start later see it in their start note") +
        "." + asked;
    });
    if (!done) for (const button of item.querySelectorAll("button")) button.disabled = false;
  }

  function questionItem(q) {
    const askers = el("span", { className: "askers", text: askersWords(q) });
    const head = el("div", { className: "q-head" }, [
      askers,
      el("span", { text: "for" }),
      scopeBadge(q.scope),
      q.topic ? el("span", { className: "tag decision", text: "topic: " + q.topic }) : null,
      el("span", { className: "when" }, [when(q.createdAt)]),
    ]);
    const item = el("li", { className: "question" }, [
      head,
      el("p", { className: "q-text", text: q.question }),
      q.context ? el("p", { className: "q-context", text: q.context }) : null,
    ]);
    item.dataset.question = q.id;
    if (state.canAct) {
      if (q.options.length) {
        const options = el("div", { className: "q-options" });
        q.options.forEach((option, i) => {
          const recommended = q.recommended === i;
          const button = el("button", { className: "button option" + (recommended ? " recommended" : ""),
                                        type: "button", text: option + (recommended ? " ★ recommended" : ""),
                                        title: "Answer with this option (" + (i + 1) + ")" });
          button.addEventListener("click", () => answerQuestion(q, { option: i + 1 }, item));
          options.appendChild(button);
        });
        item.appendChild(options);
      }
      const answerText = el("input", { className: "q-answer", type: "text" });
      answerText.maxLength = 4000;
      answerText.placeholder = q.options.length ? "or answer in your words…" : "your answer…";
      answerText.setAttribute("aria-label", "Answer to: " + q.question);
      const answerButton = el("button", { className: "button primary", type: "button", text: "Answer" });
      answerButton.addEventListener("click", () => {
        if (answerText.value.trim()) answerQuestion(q, { text: answerText.value }, item);
        else answerText.focus();
      });
      answerText.addEventListener("keydown", (event) => {
        if (event.key === "Enter") answerButton.click();
      });
      const reason = el("input", { className: "q-reason", type: "text" });
      reason.maxLength = 4000;
      reason.placeholder = "why not (to decline)";
      reason.setAttribute("aria-label", "Reason for declining: " + q.question);
      const decline = el("button", { className: "button danger", type: "button", text: "Decline" });
      decline.addEventListener("click", () => {
        if (reason.value.trim()) answerQuestion(q, { decline: reason.value }, item);
        else reason.focus();
      });
      item.appendChild(el("div", { className: "action-row q-actions" }, [answerText, answerButton]));
      item.appendChild(el("div", { className: "action-row q-actions" }, [reason, decline]));
    }
    return { item: item, askers: askers, canAct: state.canAct };
  }

  function renderQuestions(questions) {
    const list = $("questions");
    const open = new Set(questions.map((q) => q.id));
    for (const [id, kept] of questionItems) {
      if (!open.has(id) || kept.canAct !== state.canAct) {
        kept.item.remove();
        questionItems.delete(id);
      }
    }
    for (const q of questions) { // oldest first: a new question is the newest, so it goes last
      const kept = questionItems.get(q.id);
      if (kept) {
        kept.askers.textContent = askersWords(q);
        continue;
      }
      const made = questionItem(q);
      questionItems.set(q.id, made);
      list.appendChild(made.item);
    }
    setCount("question-count", questions.length);
    show($("questions-card"), questions.length > 0 || !$("questions-result").hidden);
  }

  // --- jobs (delegate) ---------------------------------------------------------------------

  const JOBS_ENDED_SHOWN = 5; // besides the running and queued ones, the latest that ended
  const ENDED = new Set(["finished", "failed", "cancelled", "interrupted"]);

  function runtime(j) {
    if (!j.startedAt) return j.endedAt ? "ended " + relative(j.endedAt) : "not started";
    const seconds = Math.max(0, Math.round(((j.endedAt || Date.now()) - j.startedAt) / 1000));
    const words = seconds < 60 ? seconds + " s" : Math.floor(seconds / 60) + " min " + (seconds % 60) + " s";
    return (j.endedAt ? "ran " : "running for ") + words;
  }

  function cancelJob(j, button) {
    button.disabled = true;
    act("jobs-result", async () => {
      const r = await post("/api/jobs/" + encodeURIComponent(j.id) + "/cancel", {});
      return r.job.state === "running"
        ? "Stopping " + r.job.name + "; " + (j.parent.name || "its parent") + " gets the cancelled result."
        : "Cancelled " + r.job.name + ".";
    }).then((done) => { if (!done) button.disabled = false; });
  }

  function jobItem(j) {
    const head = el("div", { className: "q-head" }, [
      el("span", { className: "session-name", text: j.name }),
      el("span", { className: "tag job-state " + j.state, text: j.state }),
      el("span", { text: j.agent + ", " + j.access + " access" + (j.branch ? ", branch " + j.branch : "") }),
      el("span", { text: "for " + (j.parent.name || "(gone)") }),
      el("span", { className: "when", text: runtime(j) }),
    ]);
    const item = el("li", { className: "job" }, [head, el("p", { className: "q-text", text: j.title })]);
    item.dataset.job = j.id;
    if (j.lastStep) item.appendChild(el("p", { className: "muted small job-step", text: "last step: " + j.lastStep }));
    if (state.canAct && !ENDED.has(j.state)) {
      const button = el("button", { className: "button danger small", type: "button", text: "Cancel" });
      button.title = "Stop this job (its process group gets SIGTERM, then SIGKILL)";
      button.addEventListener("click", () => cancelJob(j, button));
      item.appendChild(el("div", { className: "action-row" }, [button]));
    }
    return item;
  }

  function renderJobs(jobs) {
    const open = jobs.filter((j) => !ENDED.has(j.state));
    const ended = jobs.filter((j) => ENDED.has(j.state))
      .sort((a, b) => (b.endedAt || 0) - (a.endedAt || 0)).slice(0, JOBS_ENDED_SHOWN);
    $("jobs").replaceChildren(...open.map(jobItem), ...ended.map(jobItem));
    setCount("job-count", open.length + " running or queued");
    show($("jobs-card"), jobs.length > 0 || !$("jobs-result").hidden);
  }

  async function loadJobs() {
    const result = await api("/api/jobs?all=1");
    state.seen.jobs = result.jobs;
    renderJobs(result.jobs);
  }

  function banner(message) {
    $("banner").textContent = message || "";
    show($("banner"), Boolean(message));
  }

  function explain(error) {
    if (error instanceof ApiError && error.status === 403) {
      return "This page is no longer authorized (the dashboard restarted, so its token changed). " +
        "Run `agent-bridge dashboard` in a terminal and open the URL it prints.";
    }
    if (error instanceof ApiError) return error.message;
    return "The dashboard is not answering (" + error.message + "). Is it still running?";
  }

  function failed(error) {
    if (error instanceof ApiError && error.status === 403) {
      deny();
    } else if (!(error instanceof ApiError)) {
      // Nothing answers (the broker stopped, or is restarting): do not claim it runs.
      const mode = $("mode");
      mode.textContent = "not answering";
      mode.className = "pill denied";
      show(mode, true);
    }
    banner(explain(error));
  }

  // The token is gone: say so in the header, stop asking.
  function deny() {
    state.denied = true;
    closeStream();
    clearTimeout(state.streamTimer);
    clearInterval(state.pollTimer);
    clearInterval(state.hiddenTimer);
    const mode = $("mode");
    mode.textContent = "not authorized";
    mode.className = "pill denied";
    show(mode, true);
    show($("live"), false);
  }

  // --- filters -----------------------------------------------------------------------------

  // The scope parameter for the current filter, "" for every scope, or null while incomplete.
  function scopeParam() {
    const kind = $("scope-kind").value;
    const value = $("scope-value").value.trim();
    if (kind === "") return "";
    if (kind === "all") return "all";
    if (!value) return null;
    if (kind === "project") return JSON.stringify({ project: value });
    const names = value.split(",").map((s) => s.trim()).filter((s) => s.length > 0);
    return names.length ? JSON.stringify({ sessions: names }) : null;
  }

  function syncScopeInput() {
    const kind = $("scope-kind").value;
    const input = $("scope-value");
    show(input, kind === "project" || kind === "sessions");
    input.placeholder = kind === "project" ? "pick or type a project folder" : "session names or ids, comma-separated";
    input.setAttribute("list", kind === "project" ? "projects" : "sessions-list");
  }

  function decisionsPath(scope) {
    const params = new URLSearchParams();
    const q = $("q").value;
    if (q) params.set("q", q);
    if (scope) params.set("scope", scope);
    const query = params.toString();
    return "/api/decisions" + (query ? "?" + query : "");
  }

  function fillDatalist(id, values) {
    let list = $(id);
    if (!list) {
      list = el("datalist");
      list.id = id;
      document.body.appendChild(list);
    }
    list.replaceChildren();
    for (const v of Array.from(values).sort()) {
      const option = document.createElement("option");
      option.value = v;
      list.appendChild(option);
    }
  }

  // --- receipts ----------------------------------------------------------------------------

  function groupReceipts(receipts) {
    const byDecision = new Map();
    for (const r of receipts) {
      if (!byDecision.has(r.decisionId)) byDecision.set(r.decisionId, []);
      byDecision.get(r.decisionId).push(r);
    }
    return byDecision;
  }

  function receiptChip(r) {
    const who = r.session.name || r.session.id;
    const title = r.pending
      ? who + ": queued " + absolute(r.queuedAt) + ", not acknowledged yet" + (r.session.connected ? "" : " (not connected)")
      : who + ": acknowledged " + absolute(r.acknowledgedAt);
    return el("li", { className: r.pending ? "receipt pending" : "receipt acked", title: title }, [
      r.session.connected ? el("span", { className: "dot mini on", title: "connected" }) : null,
      r.pending ? null : el("span", { className: "mark", text: "✓" }),
      text(who),
      r.pending ? el("span", { className: "receipt-state", text: "pending" }) : null,
    ]);
  }

  function receiptsCell(receipts) {
    if (!receipts || receipts.length === 0) {
      return el("span", {
        className: "muted small",
        text: "none yet: no session in scope was connected; sessions that start later see it in their start note",
      });
    }
    const pending = receipts.filter((r) => r.pending).length;
    const summary = pending
      ? pending + " of " + receipts.length + " pending"
      : "all " + receipts.length + " acknowledged";
    return el("div", { className: "receipts" }, [
      el("div", { className: pending ? "receipt-summary pending" : "receipt-summary", text: summary }),
      el("ul", { className: "receipt-list" }, receipts.map(receiptChip)),
    ]);
  }

  // --- rendering ---------------------------------------------------------------------------

  function renderDecisions(decisions, receipts, filtered) {
    const body = $("decisions-body");
    body.replaceChildren();
    const byDecision = groupReceipts(receipts);
    for (const d of decisions) {
      const link = el("button", { className: "topic-link", type: "button", text: d.topic, title: "Show the history of " + d.topic });
      link.addEventListener("click", () => openHistory(d.topic, true));
      const mine = byDecision.get(d.id) || [];
      const row = el("tr", {}, [
        el("td", { className: "topic" }, [link]),
        el("td", { className: "text", text: d.text }),
        el("td", { className: "for" }, [scopeBadge(d.scope)]),
        el("td", { className: "delivered" }, [receiptsCell(mine)]),
        el("td", { className: "by" }, [
          el("span", { className: "author", text: d.author.name }),
          ...machineTag(d.author),
          el("div", { className: "when" }, [when(d.createdAt)]),
        ]),
      ]);
      row.dataset.topic = d.topic;
      row.classList.toggle("has-pending", mine.some((r) => r.pending));
      row.classList.toggle("selected", d.topic === state.topic);
      body.appendChild(row);
    }
    setCount("decision-count", decisions.length);
    $("decisions-empty").textContent = filtered ? "No decisions match this search." : "No decisions are pinned right now.";
    show($("decisions-empty"), decisions.length === 0);
    show($("decisions"), decisions.length > 0);
  }

  function markSelected() {
    for (const row of $("decisions-body").children) {
      row.classList.toggle("selected", row.dataset.topic === state.topic);
    }
  }

  // A decision or retraction another machine of the team recorded (SPEC §10): author.machine.
  function machineTag(author) {
    if (!author || !author.machine) return [];
    return [text(" "), el("span", { className: "tag machine", text: "on " + author.machine, title: "recorded on machine " + author.machine + " (SPEC §10)" })];
  }

  function retractionWords(r) {
    const on = r.author && r.author.machine ? " on " + r.author.machine : "";
    const by = r.author && r.author.name ? " by " + r.author.name + on : "";
    return "Retracted " + relative(r.createdAt) + by + (r.reason ? ": " + r.reason : "");
  }

  function renderHistory(result, receipts) {
    $("history-topic").textContent = result.topic;
    const list = $("history-list");
    list.replaceChildren();
    const byDecision = groupReceipts(receipts);
    // Retractions come beside the revisions (newest first), each naming the revision it withdrew.
    const retractions = Array.isArray(result.retractions) ? result.retractions : [];
    const byRevision = new Map(retractions.map((r) => [r.retracts, r]));
    for (const d of result.decisions) {
      const withdrawn = byRevision.get(d.id);
      const status = d.current ? "current" : withdrawn ? "retracted" : "superseded";
      const head = el("div", { className: "rev-head" }, [
        el("span", { className: d.current ? "tag current" : withdrawn ? "tag retracted" : "tag old", text: status }),
        when(d.createdAt),
        el("span", { text: "by " + d.author.name + " (" + d.author.agent + ")" }),
        ...machineTag(d.author),
        el("span", { text: "for" }),
        scopeBadge(d.scope),
      ]);
      const item = el("li", { className: d.current ? "current" : "superseded" }, [
        head,
        el("p", { className: "rev-text", text: d.text }),
        withdrawn ? el("p", { className: "notice-line", text: retractionWords(withdrawn), title: absolute(withdrawn.createdAt) }) : null,
        el("div", { className: "rev-receipts" }, [
          el("span", { className: "muted small", text: "Delivered to: " }),
          receiptsCell(byDecision.get(d.id) || []),
        ]),
      ]);
      item.dataset.decision = d.id;
      list.appendChild(item);
    }
    // The topic has no current decision because its last one was withdrawn: say so on top.
    const latest = result.decisions[0];
    const retractedNow = latest && !latest.current && byRevision.has(latest.id);
    const line = $("history-retracted");
    line.textContent = retractedNow ? "No current decision: its last revision was retracted." : "";
    show(line, Boolean(retractedNow));
    const current = result.decisions.length > 0 && result.decisions[0].current;
    show($("history-actions"), state.canAct);
    show($("retract"), current);
    show($("retract-reason"), current);
    setCount("history-count", result.decisions.length + (result.decisions.length === 1 ? " revision" : " revisions"));
    show($("history-empty"), result.decisions.length === 0);
    show($("history"), true);
  }

  function sessionItem(s) {
    const meta = [s.agent, s.project];
    if (s.hostSessionId) meta.push("host session " + s.hostSessionId);
    const parts = [el("span", { className: "session-name", text: s.name })];
    if (s.kind === "job") parts.push(text(" "), el("span", { className: "tag job", text: "job" }));
    if (s.machine) parts.push(text(" "), el("span", { className: "tag machine", text: "on " + s.machine, title: "a session of machine " + s.machine + " (SPEC §10)" }));
    const busy = busyTag(s);
    if (busy) parts.push(text(" "), busy);
    const gone = age(s.lastSeenAt);
    const status = el("span", {
      className: s.connected ? "session-state on" : "session-state",
      text: s.connected ? "connected" : gone ? "gone " + gone : "just left",
      title: "last seen " + absolute(s.lastSeenAt),
    });
    return el("li", {}, [
      el("span", { className: s.connected ? "dot on" : "dot", title: s.connected ? "connected" : "not connected" }),
      el("div", { className: "session-title" }, parts),
      status,
      el("div", { className: "session-meta", text: meta.join(" · ") }),
      s.connected || !state.canAct ? null : el("div", { className: "session-actions" }, [forgetButton(s)]),
    ]);
  }

  // Busy or idle, from the session's hooks (none: a session without hooks); offline shows as gone.
  function busyTag(s) {
    if (s.state !== "busy" && s.state !== "idle") return null;
    return el("span", {
      className: "tag " + (s.state === "busy" ? "busy" : "idle"),
      text: s.state,
      title: (s.state === "busy" ? "working on a turn" : "waiting for its user") + " since " + absolute(s.stateSince),
    });
  }

  // The team (SPEC §10): this machine's name, the hub, the other machines heard and the outbox.
  function renderFederation(f) {
    const pill = $("federation");
    show(pill, Boolean(f));
    if (!f) return;
    const heard = (f.machines || []).filter((m) => m.name !== f.machine).map((m) => m.name + " " + relative(m.heardAt));
    pill.textContent = "machine " + f.machine + " · hub " + (f.connected ? "connected" : "not connected");
    pill.className = f.connected ? "pill live" : "pill standalone";
    pill.title = ["team " + f.team + ", hub " + f.url,
      heard.length ? "heard: " + heard.join(", ") : "no other machine heard yet",
      (f.outbox ? f.outbox.depth : 0) + " waiting in the outbox",
      f.lastError ? "last error: " + f.lastError : ""].filter((x) => x).join("\n");
  }

  function renderSessions(sessions) {
    state.names = new Map(sessions.map((s) => [s.id, s.name]));
    const live = sessions.filter((s) => s.connected);
    const gone = sessions.filter((s) => !s.connected).sort((a, b) => b.lastSeenAt - a.lastSeenAt);
    $("sessions").replaceChildren(...live.map(sessionItem));
    $("gone-sessions").replaceChildren(...gone.map(sessionItem));
    $("gone-summary").textContent = gone.length + (gone.length === 1 ? " gone session" : " gone sessions") +
      (gone.length ? " (last seen " + relative(gone[0].lastSeenAt) + ")" : "");
    show($("gone"), gone.length > 0);
    show($("sessions-none-live"), live.length === 0 && sessions.length > 0);
    setCount("session-count", live.length + " connected / " + sessions.length);
    show($("sessions-empty"), sessions.length === 0);
    for (const s of sessions) state.projects.add(s.project);
    fillDatalist("sessions-list", new Set(sessions.map((s) => s.name)));
  }

  // What a message does to its recipient, in plain words; the hop count is in the tooltip.
  function hopWords(m) {
    if (m.active === true) return "can wake the session";
    if (m.active === false && m.notice) return "waits until the session checks its messages";
    if (m.active === false) return "a long reply chain: waits until the session checks its messages";
    return "";
  }

  function hopTitle(m) {
    return "hop " + m.hop + (state.hopLimit ? " (messages below hop " + state.hopLimit + " can wake a session)" : "");
  }

  // A message's receipt as its sender sees it (the `sent` tool): shown, read, woken.
  const WOKEN_WORDS = {
    requested: "a wake was requested",
    confirmed: "woken",
    unconfirmed: "a wake was not confirmed",
  };

  function receiptWords(r) {
    const state = { queued: "not shown yet", shown: "shown, not acknowledged yet", acknowledged: "read" }[r.state] || r.state;
    return [state, WOKEN_WORDS[r.woken]].filter((x) => x).join(" · ");
  }

  function receiptTitle(r) {
    const times = [];
    if (r.shownAt) times.push("shown " + absolute(r.shownAt));
    if (r.acknowledgedAt) times.push("acknowledged " + absolute(r.acknowledgedAt));
    return times.length ? "; " + times.join(", ") : "";
  }

  // Decision and retraction notices go out once per receiving session: one line each.
  function foldNotices(messages) {
    const out = [];
    const groups = new Map();
    for (const m of messages) {
      const key = m.decision ? "d:" + m.decision.id : m.retraction ? "r:" + m.retraction.id : null;
      if (key === null) {
        out.push(m);
        continue;
      }
      let group = groups.get(key);
      if (!group) {
        group = Object.assign({}, m, { recipients: [] });
        groups.set(key, group);
        out.push(group);
      }
      group.recipients.push({ name: m.to && m.to.name ? m.to.name : "(unknown)", acked: m.acked });
    }
    return out;
  }

  function renderMessages(messages) {
    const list = $("messages");
    list.replaceChildren();
    const shownItems = foldNotices(messages);
    for (const m of shownItems) {
      const from = m.from && m.from.name ? m.from.name : "(unknown)";
      const to = m.recipients ? m.recipients.map((r) => r.name).join(", ") : m.to && m.to.name ? m.to.name : "(unknown)";
      const head = el("div", { className: "msg-head" }, [
        el("span", { className: "route", text: from + " → " + to }),
        m.notice ? el("span", { className: "tag decision", text: NOTICE_TAGS[m.kind] || "notice" }) : null,
        m.question ? el("span", { className: "tag decision", text: ANSWER_TAGS[m.question.state] || "answer" }) : null,
        m.kind === "job" ? el("span", { className: "tag job", text: "job's answer" }) : null,
        m.active === null || m.active === undefined ? null
          : el("span", { className: m.active ? "tag active" : "tag passive", text: m.active ? "active" : "passive" }),
        el("span", { className: "when" }, [when(m.createdAt)]),
      ]);
      // A decision notice shows the decision in words; the text the session got is one click away.
      let about = null;
      if (m.decision) {
        about = el("div", { className: "msg-about", text: "Decision “" + m.decision.topic + "” for " + scopeWords(m.decision.scope) });
      } else if (m.retraction) {
        const why = m.retraction.reason ? ": " + m.retraction.reason : "";
        about = el("div", { className: "msg-about", text: "Decision “" + m.retraction.topic + "” retracted" + why });
      }
      const shown = m.decision ? m.decision.text : m.text;
      const body = el("p", { className: "msg-text", text: shown, title: "Click to expand" });
      body.addEventListener("click", () => {
        const open = body.classList.toggle("open");
        if (m.decision) body.textContent = open ? m.text : shown;
      });
      let read = m.acked ? "read" : "not read yet";
      if (m.recipients) {
        const unread = m.recipients.filter((r) => !r.acked).length;
        read = unread ? unread + " of " + m.recipients.length + " not read yet" : "read by all";
      } else if (m.receipt) {
        read = receiptWords(m.receipt);
      }
      const foot = el("div", { className: "msg-foot", text: [hopWords(m), read].filter((x) => x).join(" · ") });
      foot.title = hopTitle(m) + (m.receipt && !m.recipients ? receiptTitle(m.receipt) : "");
      list.appendChild(el("li", { className: m.notice ? "notice" : "" }, [head, about, body, foot]));
    }
    setCount("message-count", shownItems.length);
    const empty = { "": "No messages yet.", message: "No conversation yet.", notice: "No notices yet." };
    $("messages-empty").textContent = empty[state.messageKind];
    show($("messages-empty"), messages.length === 0);
  }

  // --- loading -----------------------------------------------------------------------------

  async function loadDecisions() {
    const scope = scopeParam();
    if (scope === null) {
      // The scope value is still empty: no error before the user typed something.
      show($("filter-error"), false);
      return;
    }
    try {
      const [result, receipts] = await Promise.all([api(decisionsPath(scope)), api("/api/receipts")]);
      show($("filter-error"), false);
      renderDecisions(result.decisions, receipts.receipts, Boolean($("q").value || scope));
      for (const d of result.decisions) {
        if (d.scope && typeof d.scope.project === "string") state.projects.add(d.scope.project);
      }
      fillDatalist("projects", state.projects);
    } catch (error) {
      if (error instanceof ApiError && error.status === 400) {
        $("filter-error").textContent = error.message;
        show($("filter-error"), true);
        return;
      }
      throw error;
    }
  }

  async function loadHistory() {
    if (state.topic === null) return;
    const asked = ++state.historyAsked; // a later load (another topic, a refresh) wins
    const path = "/api/decisions/" + encodeURIComponent(state.topic);
    const [result, receipts] = await Promise.all([api(path + "/history"), api(path + "/receipts")]);
    if (asked !== state.historyAsked) return; // answered late: no longer what the page shows
    renderHistory(result, receipts.receipts);
  }

  async function loadQuestions() {
    const result = await api("/api/questions");
    state.seen.questions = result.questions;
    renderQuestions(result.questions);
  }

  async function loadMessages() {
    const kind = state.messageKind ? "&kind=" + state.messageKind : "";
    const result = await api("/api/messages?limit=50" + kind);
    state.seen.messages = state.messageKind === "notice" ? null : result.messages;
    renderMessages(result.messages);
  }

  async function refresh() {
    if (state.denied) return;
    if (state.loading) {
      state.again = true;
      return;
    }
    state.loading = true;
    try {
      // Sessions first: decision scopes name sessions by id, shown by name.
      const [status, sessions] = await Promise.all([api("/api/status"), api("/api/sessions")]);
      state.hopLimit = status.hopLimit;
      state.canAct = status.mode === "broker"; // a standalone dashboard is read-only
      renderSessions(sessions.sessions);
      await Promise.all([loadQuestions(), loadJobs(), loadMessages(), loadDecisions(), loadHistory(), loadSearch()]);
      if (window.abAlerts) window.abAlerts.seen(state.seen.questions, state.seen.jobs, state.seen.messages);
      const mode = $("mode");
      mode.textContent = status.mode === "broker" ? "broker running" : "broker down · read-only";
      mode.className = status.mode === "broker" ? "pill" : "pill standalone";
      show(mode, true);
      renderFederation(status.federation);
      $("home").textContent = status.home;
      $("home").title = "state folder: " + status.home;
      $("hop-note").textContent = status.hopLimit
        ? "A message can wake its session; replies of a long back-and-forth and decision notices wait until the session checks."
        : "";
      for (const id of ["decide-box", "send-box"]) show($(id), state.canAct);
      show($("hop-note"), Boolean(status.hopLimit));
      banner("");
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (error) {
      failed(error);
    } finally {
      state.loading = false;
      if (state.again) {
        state.again = false;
        refresh();
      }
    }
  }

  // --- search: messages, decisions and questions by words (GET /api/search) -------------------

  const FOUND_STATES = { current: "current", superseded: "old", retracted: "retracted" };

  // A snippet with its matched words in <mark>: `highlights` are [start, end) in code points.
  function snippetNode(hit) {
    const chars = Array.from(hit.snippet);
    const node = el("p", { className: "msg-text open" });
    let at = 0;
    for (const [start, end] of hit.highlights) {
      if (start < at || end > chars.length) continue;
      node.appendChild(text(chars.slice(at, start).join("")));
      node.appendChild(el("mark", { text: chars.slice(start, end).join("") }));
      at = end;
    }
    node.appendChild(text(chars.slice(at).join("")));
    return node;
  }

  function foundItem(hit) {
    const from = hit.from && hit.from.name ? hit.from.name : "(unknown)";
    const parts = [el("span", { className: "tag " + (hit.kind === "message" ? "passive" : "decision"), text: hit.kind })];
    if (hit.kind === "message") {
      parts.push(el("span", { className: "route", text: from + " → " + (hit.to && hit.to.name ? hit.to.name : "(unknown)") }));
    } else if (hit.kind === "decision") {
      const link = el("button", { className: "topic-link", type: "button", text: hit.topic, title: "Show this topic's history" });
      link.addEventListener("click", () => openHistory(hit.topic, true));
      parts.push(link, el("span", { className: "tag " + (FOUND_STATES[hit.state] || "old"), text: hit.state }),
        el("span", { className: "muted", text: "by " + from }));
    } else {
      parts.push(el("span", { className: "route", text: from + " asked" }),
        el("span", { className: "tag old", text: hit.state }));
      if (hit.topic) parts.push(el("span", { className: "muted", text: "topic " + hit.topic }));
    }
    parts.push(el("span", { className: "when" }, [when(hit.createdAt)]));
    const item = el("li", { className: "found " + hit.kind }, [el("div", { className: "msg-head" }, parts), snippetNode(hit)]);
    item.dataset.id = hit.id;
    return item;
  }

  async function loadSearch() {
    const query = $("search-q").value.trim();
    const asked = ++state.findAsked;
    if (!query) {
      show($("search-card"), false);
      return;
    }
    let result = null;
    // The server's rule (domain.search_words), said before asking: a 400 would be a console error.
    let problem = /[\p{L}\p{N}]/u.test(query) ? "" : "query: give at least one word to search for (letters or digits)";
    try {
      if (!problem) result = await api("/api/search?q=" + encodeURIComponent(query));
    } catch (error) {
      if (!(error instanceof ApiError) || error.status === 403) throw error;
      problem = error.message;
    }
    if (asked !== state.findAsked) return; // a newer search is on its way
    $("search-error").textContent = problem;
    show($("search-error"), Boolean(problem));
    const hits = result ? result.results : [];
    $("search-results").replaceChildren(...hits.map(foundItem));
    setCount("search-count", hits.length + (result && result.more ? "+" : ""));
    show($("search-empty"), Boolean(result) && hits.length === 0);
    show($("search-more"), Boolean(result && result.more));
    show($("search-card"), true);
  }

  function findSoon() {
    clearTimeout(state.findTimer);
    state.findTimer = setTimeout(() => {
      loadSearch().catch(failed);
    }, SEARCH_DELAY_MS);
  }

  function closeSearch() {
    $("search-q").value = "";
    state.findAsked++;
    show($("search-card"), false);
  }

  // --- live updates: server-sent events, polling while the stream is down --------------------

  function setLive(live) {
    state.streamLive = live;
    const pill = $("live");
    pill.textContent = live ? "live" : "polling every " + POLL_MS / 1000 + " s";
    pill.className = live ? "pill live" : "pill quiet";
    pill.title = live ? "Updates arrive as they happen" : "The live stream is not available; the page asks again regularly";
    show(pill, !state.denied);
    clearInterval(state.pollTimer);
    if (!live && !state.denied) {
      state.pollTimer = setInterval(() => {
        if (!document.hidden) refresh();
      }, POLL_MS);
    }
  }

  function closeStream() {
    if (state.stream) {
      state.stream.close();
      state.stream = null;
    }
  }

  function openStream() {
    clearTimeout(state.streamTimer);
    if (state.denied || state.stream || typeof EventSource !== "function") return;
    const stream = new EventSource("/api/events");
    state.stream = stream;
    stream.addEventListener("hello", () => {
      state.streamFailures = 0;
      setLive(true);
      refresh(); // whatever changed while the stream was down
    });
    stream.addEventListener("change", () => refresh());
    stream.addEventListener("error", () => {
      // Dropped or refused (403 after a restart, 429 with too many tabs): poll instead, and
      // try the stream again later. A poll that gets 403 ends both.
      closeStream();
      setLive(false);
      const wait = STREAM_RETRY_MS[Math.min(state.streamFailures, STREAM_RETRY_MS.length - 1)];
      state.streamFailures += 1;
      refresh();
      state.streamTimer = setTimeout(openStream, wait);
    });
  }

  // --- history -----------------------------------------------------------------------------

  async function openHistory(topic, scroll) {
    state.topic = topic;
    markSelected();
    const hash = "#topic=" + encodeURIComponent(topic);
    if (location.hash !== hash) history.replaceState(null, "", hash);
    try {
      await loadHistory();
      if (scroll) $("history").scrollIntoView({ behavior: "smooth", block: "nearest" });
    } catch (error) {
      failed(error);
    }
  }

  function closeHistory() {
    state.topic = null;
    state.historyAsked++; // a load still on its way must not open it again
    show($("history"), false);
    markSelected();
    history.replaceState(null, "", location.pathname);
  }

  function topicFromHash() {
    const match = /^#topic=(.*)$/.exec(location.hash);
    if (!match) return null;
    try {
      return decodeURIComponent(match[1]);
    } catch (_) {
      return null;
    }
  }

  function searchSoon() {
    clearTimeout(state.searchTimer);
    state.searchTimer = setTimeout(() => {
      loadDecisions().catch(failed);
    }, SEARCH_DELAY_MS);
  }

  function chooseMessageKind(kind) {
    state.messageKind = kind;
    for (const button of $("message-kinds").querySelectorAll("button")) {
      button.setAttribute("aria-pressed", String(button.dataset.kind === kind));
    }
    loadMessages().catch(failed);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("filters").addEventListener("submit", (event) => {
      event.preventDefault(); // form-action 'none': the filters never navigate
      searchSoon();
    });
    $("q").addEventListener("input", searchSoon);
    $("scope-kind").addEventListener("change", () => {
      syncScopeInput();
      searchSoon();
    });
    $("scope-value").addEventListener("input", searchSoon);
    $("refresh").addEventListener("click", refresh);
    $("search-form").addEventListener("submit", (event) => {
      event.preventDefault(); // form-action 'none': searching never navigates
      findSoon();
    });
    $("search-q").addEventListener("input", findSoon);
    $("search-close").addEventListener("click", closeSearch);
    $("history-close").addEventListener("click", closeHistory);
    $("decide-form").addEventListener("submit", recordDecision);
    $("decide-scope-kind").addEventListener("change", syncDecideScope);
    $("send-form").addEventListener("submit", sendMessage);
    $("retract").addEventListener("click", retractDecision);
    $("change").addEventListener("click", changeDecision);
    syncDecideScope();
    for (const button of $("message-kinds").querySelectorAll("button")) {
      button.addEventListener("click", () => chooseMessageKind(button.dataset.kind));
    }
    document.addEventListener("visibilitychange", () => {
      // A hidden tab gives its stream back (the dashboard allows a few per client).
      clearInterval(state.hiddenTimer);
      if (document.hidden) {
        closeStream();
        clearTimeout(state.streamTimer);
        if (!state.denied) state.hiddenTimer = setInterval(refresh, HIDDEN_POLL_MS); // alerts go on
      } else if (!state.denied) {
        refresh();
        openStream();
      }
    });
    syncScopeInput();
    state.topic = topicFromHash();
    setLive(false);
    refresh();
    openStream();
  });
})();
