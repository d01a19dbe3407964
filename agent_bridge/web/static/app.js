// agent-bridge dashboard. Plain JavaScript under script-src 'self'.
// Data from the API is only ever put in the page with textContent (never innerHTML).
"use strict";

(function () {
  const REFRESH_MS = 5000;
  const SEARCH_DELAY_MS = 250;

  const $ = (id) => document.getElementById(id);
  const state = { topic: null, timer: null, searchTimer: null, loading: false, names: new Map() };

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

  function relative(ms) {
    const seconds = Math.round((Date.now() - ms) / 1000);
    if (seconds < 45) return "just now";
    const minutes = Math.round(seconds / 60);
    if (minutes < 60) return minutes + " min ago";
    const hours = Math.round(minutes / 60);
    if (hours < 24) return hours + " h ago";
    const days = Math.round(hours / 24);
    if (days < 30) return days + " d ago";
    return new Date(ms).toLocaleDateString();
  }

  function when(ms) {
    return el("time", { text: relative(ms), title: absolute(ms) });
  }

  function scopeBadge(scope) {
    if (scope === "all") return el("span", { className: "scope all", text: "all sessions" });
    if (scope && typeof scope.project === "string") {
      return el("span", { className: "scope", title: scope.project }, [
        el("span", { className: "kind", text: "project" }),
        document.createTextNode(scope.project),
      ]);
    }
    const addresses = scope && Array.isArray(scope.sessions) ? scope.sessions : [JSON.stringify(scope)];
    // Show a session id as the session's name when the dashboard knows it.
    const names = addresses.map((a) => state.names.get(a) || a).join(", ");
    return el("span", { className: "scope", title: addresses.join(", ") }, [
      el("span", { className: "kind", text: "sessions" }),
      document.createTextNode(names),
    ]);
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

  function banner(message) {
    $("banner").textContent = message || "";
    show($("banner"), Boolean(message));
  }

  function explain(error) {
    if (error instanceof ApiError && error.status === 403) {
      return "This page is no longer authorized (the dashboard restarted, or its token changed). " +
        "Run `agent-bridge dashboard` and open the URL it prints.";
    }
    if (error instanceof ApiError) return error.message;
    return "The dashboard is not answering (" + error.message + "). Is it still running?";
  }

  // --- filters -----------------------------------------------------------------------------

  // The scope parameter for the current filter, "" for every scope, or null when incomplete.
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
    input.placeholder = kind === "project" ? "/absolute/project/folder" : "session names or ids, comma-separated";
    input.setAttribute("list", kind === "project" ? "projects" : "");
  }

  function decisionsPath() {
    const params = new URLSearchParams();
    const q = $("q").value;
    if (q) params.set("q", q);
    const scope = scopeParam();
    if (scope) params.set("scope", scope);
    const query = params.toString();
    return "/api/decisions" + (query ? "?" + query : "");
  }

  // --- rendering ---------------------------------------------------------------------------

  function renderDecisions(decisions, filtered) {
    const body = $("decisions-body");
    body.replaceChildren();
    for (const d of decisions) {
      const link = el("button", { className: "topic-link", type: "button", text: d.topic, title: "Show the history of " + d.topic });
      link.addEventListener("click", () => openHistory(d.topic, true));
      const row = el("tr", {}, [
        el("td", { className: "topic" }, [link]),
        el("td", { className: "text", text: d.text }),
        el("td", {}, [scopeBadge(d.scope)]),
        el("td", { className: "by" }, [
          el("span", { text: d.author.name }),
          el("div", { className: "agent", text: d.author.agent }),
        ]),
        el("td", { className: "when" }, [when(d.createdAt)]),
      ]);
      row.dataset.topic = d.topic;
      if (d.topic === state.topic) row.className = "selected";
      body.appendChild(row);
    }
    setCount("decision-count", decisions.length);
    $("decisions-empty").textContent = filtered ? "No decisions match this search." : "No decisions have been pinned yet.";
    show($("decisions-empty"), decisions.length === 0);
    show($("decisions"), decisions.length > 0);
  }

  function markSelected() {
    for (const row of $("decisions-body").children) {
      row.className = row.dataset.topic === state.topic ? "selected" : "";
    }
  }

  function renderHistory(result) {
    $("history-topic").textContent = result.topic;
    const list = $("history-list");
    list.replaceChildren();
    for (const d of result.decisions) {
      const head = el("div", { className: "rev-head" }, [
        el("span", { className: d.current ? "tag current" : "tag old", text: d.current ? "current" : "superseded" }),
        when(d.createdAt),
        el("span", { text: "by " + d.author.name + " (" + d.author.agent + ")" }),
        scopeBadge(d.scope),
      ]);
      const item = el("li", { className: d.current ? "current" : "superseded" }, [
        head,
        el("p", { className: "rev-text", text: d.text }),
      ]);
      list.appendChild(item);
    }
    setCount("history-count", result.decisions.length + (result.decisions.length === 1 ? " revision" : " revisions"));
    show($("history-empty"), result.decisions.length === 0);
    show($("history"), true);
  }

  function renderSessions(sessions) {
    const list = $("sessions");
    list.replaceChildren();
    const ordered = sessions.slice().sort((a, b) => Number(b.connected) - Number(a.connected));
    const projects = new Set();
    state.names = new Map(sessions.map((s) => [s.id, s.name]));
    for (const s of ordered) {
      projects.add(s.project);
      const meta = [s.agent, s.project];
      if (s.hostSessionId) meta.push("host session " + s.hostSessionId);
      const name = el("span", { className: "session-name", text: s.name });
      const parts = [name];
      if (s.kind === "job") parts.push(document.createTextNode(" "), el("span", { className: "tag job", text: "job" }));
      const status = el("span", {
        className: s.connected ? "session-state on" : "session-state",
        text: s.connected ? "connected" : "seen " + relative(s.lastSeenAt),
        title: "last seen " + absolute(s.lastSeenAt),
      });
      list.appendChild(
        el("li", {}, [
          el("span", { className: s.connected ? "dot on" : "dot", title: s.connected ? "connected" : "not connected" }),
          el("div", {}, parts),
          status,
          el("div", { className: "session-meta", text: meta.join(" · ") }),
        ]),
      );
    }
    const connected = sessions.filter((s) => s.connected).length;
    setCount("session-count", connected + " connected / " + sessions.length);
    show($("sessions-empty"), sessions.length === 0);
    const datalist = $("projects");
    datalist.replaceChildren();
    for (const p of projects) {
      const option = document.createElement("option");
      option.value = p;
      datalist.appendChild(option);
    }
  }

  function renderMessages(messages) {
    const list = $("messages");
    list.replaceChildren();
    for (const m of messages) {
      const from = m.from && m.from.name ? m.from.name : "(unknown)";
      const to = m.to && m.to.name ? m.to.name : "(unknown)";
      const head = el("div", { className: "msg-head" }, [
        el("span", { className: "route", text: from + " → " + to }),
        m.kind === "decision" ? el("span", { className: "tag decision", text: "decision" }) : null,
        el("span", { className: "when" }, [when(m.createdAt)]),
      ]);
      const text = el("p", { className: "msg-text", text: m.text, title: "Click to expand" });
      text.addEventListener("click", () => text.classList.toggle("open"));
      const foot = el("div", {
        className: "msg-foot",
        text: "hop " + m.hop + " · " + (m.acked ? "acknowledged" : "not yet acknowledged"),
      });
      list.appendChild(el("li", {}, [head, text, foot]));
    }
    setCount("message-count", messages.length);
    show($("messages-empty"), messages.length === 0);
  }

  // --- loading -----------------------------------------------------------------------------

  async function loadDecisions() {
    const scope = scopeParam();
    if (scope === null) {
      $("filter-error").textContent = $("scope-kind").value === "project"
        ? "Enter an absolute project folder."
        : "Enter at least one session name or id.";
      show($("filter-error"), true);
      return;
    }
    try {
      const result = await api(decisionsPath());
      show($("filter-error"), false);
      renderDecisions(result.decisions, Boolean($("q").value || scope));
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
    const result = await api("/api/decisions/" + encodeURIComponent(state.topic) + "/history");
    renderHistory(result);
  }

  async function refresh() {
    if (state.loading) return;
    state.loading = true;
    try {
      // Sessions first: decision scopes name sessions by id, shown by name.
      const sessions = await api("/api/sessions");
      renderSessions(sessions.sessions);
      const [status, messages] = await Promise.all([
        api("/api/status"),
        api("/api/messages?limit=50"),
        loadDecisions(),
        loadHistory(),
      ]);
      const mode = $("mode");
      mode.textContent = status.mode === "broker" ? "broker running" : "broker down · read-only";
      mode.className = status.mode === "broker" ? "pill" : "pill standalone";
      show(mode, true);
      $("home").textContent = status.home;
      $("home").title = "state folder: " + status.home;
      renderMessages(messages.messages);
      banner("");
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (error) {
      banner(explain(error));
    } finally {
      state.loading = false;
    }
  }

  async function openHistory(topic, scroll) {
    state.topic = topic;
    markSelected();
    const hash = "#topic=" + encodeURIComponent(topic);
    if (location.hash !== hash) history.replaceState(null, "", hash);
    try {
      await loadHistory();
      if (scroll) $("history").scrollIntoView({ behavior: "smooth", block: "nearest" });
    } catch (error) {
      banner(explain(error));
    }
  }

  function closeHistory() {
    state.topic = null;
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
      loadDecisions().catch((error) => banner(explain(error)));
    }, SEARCH_DELAY_MS);
  }

  function schedule() {
    clearInterval(state.timer);
    state.timer = setInterval(() => {
      if (!document.hidden) refresh();
    }, REFRESH_MS);
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
    $("history-close").addEventListener("click", closeHistory);
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) refresh();
    });
    syncScopeInput();
    state.topic = topicFromHash();
    refresh();
    schedule();
  });
})();
