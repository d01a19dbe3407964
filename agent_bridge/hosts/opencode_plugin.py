"""The opencode plugin `install` writes (`plugin/agent-bridge.js`): opencode runs no command
hooks, only JS/TS plugins inside its own process, so this small plugin runs the standard-library
hook commands (`agent-bridge hook … --agent opencode`) and hands their answers to opencode.

What it does, with the opencode 1.18.33 plugin hooks it uses (read from its bundled source and
seen with the real CLI, tests/hosts/test_opencode.py):
- `experimental.chat.system.transform` (input `{sessionID, model}`, output `{system: string[]}`,
  called before every model request): the first time a session asks, the SessionStart hook runs
  with the `ses_…` id; its note (identity and decisions, SPEC §4.5) is pushed onto `system` for
  every request of the session, asked again after the session is compacted (`session.compacted`,
  source `compact`). The hook reports the session id to the broker with the hook's
  ancestry, whose nearest agent host is this opencode process, as the MCP server's is: the two
  pair there, as for Claude Code and Codex (SPEC §3 "Host session identity").
- `tool.execute.after` (input `{tool, sessionID, callID, args}`; output an MCP tool's result with
  `content`, or a built-in tool's `{title, output, metadata}`): the PostToolUse hook runs; active
  messages it hands over are added to the tool's result, which is in the model's next request.
- Acknowledgement (SPEC §3, "What shown means"): the hook does not acknowledge what it printed
  for opencode (`Host.defers_ack`); the plugin acknowledges (`agent-bridge hook ack`) only when
  opencode has stored the tool's result holding the text (the `message.part.updated` event whose
  tool part, of that call, is `completed`). A process killed before that acknowledges nothing:
  the message is offered again, marked as a repeat. The session's next tool call waits for that
  acknowledgement before it asks for more (seen with 1.18.33: without the wait, a model that
  answers at once got the message a second time, in the next tool's result).
- Which session calls (`tool.execute.before`, input `{tool, sessionID, callID}`, output
  `{args}`: the very object opencode 1.18.33 then passes to the MCP server's `tools/call`): one
  `opencode serve` runs several sessions over one MCP server, which gets no session id; the
  plugin adds `agent_bridge_session: <ses_… id>` (common.tools.HOST_SESSION_ARGUMENT) to the
  arguments of each agent-bridge tool call, and the relay's router (relay.router) hands the
  call, without it, to that session's own relay: each session has its own identity.
- Busy and idle: each change of `session.status` runs `agent-bridge hook status`, which keeps
  the session's mark as the UserPromptSubmit and Stop hooks do for the other hosts (hooks.status),
  so `peers` and `agent-bridge sessions` show the session busy or idle.
- When idle (`session.idle`, `session.status` idle; an abort ends in idle too): active messages
  waiting start a turn through the plugin's `client.session.promptAsync` (a user message, framed
  as coming from another agent session), acknowledged once opencode accepted the prompt; the
  hook run for it (`hook_event_name` "Stop") records the wake for the senders' receipts. While
  the session stays idle the plugin watches the broker's post box (`<home>/pending/`, one file
  per host session with a message waiting: broker.feeds.postbox) and hands over what comes. Not
  in `opencode run`, which ends at its first idle; the watch ends with the opencode process.

No npm dependency: `node:child_process` only (opencode runs plugins on Bun, which has it). A hook
that fails, times out or prints nothing changes nothing: a plugin never breaks its host.
"""

from __future__ import annotations

import json

from agent_bridge.common import tools

MARK = "// agent-bridge plugin for opencode"  # the first line: how install and uninstall know it is ours

TEMPLATE = """\
// agent-bridge plugin for opencode: written by `agent-bridge install --opencode`, removed by
// `agent-bridge uninstall --opencode`. It runs the agent-bridge hook commands and hands their
// answers to opencode (see agent_bridge/hosts/opencode_plugin.py). Edits here are overwritten.
import { spawn } from "node:child_process"
import { createHash } from "node:crypto"
import { existsSync, watch } from "node:fs"
import { join } from "node:path"

const HOOKS = __HOOKS__
const ENV = __ENV__
const TOOL_PREFIX = __TOOL_PREFIX__ // opencode names an MCP tool `<server>_<tool>`
const SESSION_ARGUMENT = __SESSION_ARGUMENT__
const POST_BOX = __POST_BOX__ // <agent-bridge home>/pending: one file per host session with a message waiting
// `opencode run` ends at its session's first idle: a turn started then would be cut short
const SCRIPTED = process.argv.slice(1, 3).includes("run")
const TIMEOUT_MS = 10000
const ACK_WAIT_MS = 5000 // a tool call waits this long at most for the acknowledgement of the one before

function run(argv, input, cwd) {
  return new Promise((resolve) => {
    let child
    try {
      const env = { ...process.env, ...ENV }
      child = spawn(argv[0], argv.slice(1), { cwd, env, stdio: ["pipe", "pipe", "ignore"] })
    } catch {
      resolve(null)
      return
    }
    const chunks = []
    const timer = setTimeout(() => child.kill("SIGTERM"), TIMEOUT_MS)
    child.stdout.on("data", (chunk) => chunks.push(chunk))
    child.on("error", () => {
      clearTimeout(timer)
      resolve(null)
    })
    child.on("close", (code) => {
      clearTimeout(timer)
      const lines = Buffer.concat(chunks).toString("utf8").trim().split("\\n")
      if (code !== 0 || !lines[lines.length - 1]) return resolve(null)
      try {
        resolve(JSON.parse(lines[lines.length - 1]))
      } catch {
        resolve(null)
      }
    })
    child.stdin.on("error", () => {})
    child.stdin.end(JSON.stringify(input))
  })
}

const context = (answer) => {
  const text = answer && answer.hookSpecificOutput && answer.hookSpecificOutput.additionalContext
  return typeof text === "string" && text ? text : null
}

const digest = (id) => createHash("sha256").update(id, "utf8").digest("hex").slice(0, 32)

export const AgentBridge = async ({ client, directory }) => {
  const notes = new Map() // session id -> the SessionStart note (a promise), asked once per session
  const pending = new Map() // tool call id -> what was handed over with its result, not yet acknowledged
  const hookInput = (sessionID, event, extra) =>
    ({ session_id: sessionID, cwd: directory, hook_event_name: event, ...extra })
  const compacted = new Set() // sessions compacted since their note was asked: asked again
  const idle = new Set() // sessions whose last status was idle
  const waking = new Set() // sessions a wake is being handed to
  let watcher = null
  const marked = new Map() // session id -> the state last marked (busy or idle)
  let marking = Promise.resolve() // the status hooks, one after the other, in the events' order

  // When idle: the messages waiting start a turn (a user message, framed as coming from another
  // agent session), acknowledged once opencode accepted the prompt.
  async function wake(id) {
    if (SCRIPTED || !idle.has(id) || waking.has(id) || !existsSync(join(POST_BOX, digest(id)))) return
    waking.add(id)
    try {
      const answer = await run(HOOKS["post-tool-use"], hookInput(id, "Stop", {}), directory)
      const text = context(answer)
      if (!text || !Array.isArray(answer.ids) || !idle.has(id)) return
      const body = { parts: [{ type: "text", text }] }
      const sent = await client.session.promptAsync({ path: { id }, body })
      if (sent && sent.error) return // not taken: offered again, as a repeat
      idle.delete(id)
      await run(HOOKS.ack, { session_id: id, cwd: directory, ids: answer.ids, peer: answer.peer }, directory)
    } catch {
      // not taken: offered again
    } finally {
      waking.delete(id)
    }
  }

  function watchPostBox() {
    if (watcher || SCRIPTED) return
    try {
      watcher = watch(POST_BOX, () => {
        for (const id of idle) wake(id)
      })
      watcher.on("error", () => {
        watcher = null
      })
    } catch {
      watcher = null // no post box yet (no broker ran): the next idle tries again
    }
  }

  return {
    "experimental.chat.system.transform": async (input, output) => {
      const id = input && input.sessionID
      if (!id || !output || !Array.isArray(output.system)) return
      if (!notes.has(id)) {
        const input = hookInput(id, "SessionStart", { source: compacted.has(id) ? "compact" : "startup" })
        compacted.delete(id)
        notes.set(id, run(HOOKS["session-start"], input, directory).then(context))
      }
      const note = await notes.get(id)
      if (note) output.system.push(note)
    },
    "tool.execute.before": async (input, output) => {
      // One MCP server serves every session of this opencode process: each agent-bridge tool
      // call says which session makes it (the relay's router hands it to that session's relay).
      if (!input || !input.sessionID || !output || !output.args || typeof output.args !== "object") return
      if (typeof input.tool !== "string" || !input.tool.startsWith(TOOL_PREFIX)) return
      output.args[SESSION_ARGUMENT] = input.sessionID
    },
    "tool.execute.after": async (input, output) => {
      const id = input && input.sessionID
      if (!id || !output) return
      // What an earlier tool call of the session handed over is acknowledged first (else it is
      // offered again, as a repeat, to a model that has it already).
      const earlier = [...pending.values()].filter((held) => held.id === id).map((held) => held.done)
      const bound = new Promise((resolve) => setTimeout(resolve, ACK_WAIT_MS))
      if (earlier.length) await Promise.race([Promise.all(earlier), bound])
      const asked = hookInput(id, "PostToolUse", { tool_name: input.tool })
      const answer = await run(HOOKS["post-tool-use"], asked, directory)
      const text = context(answer)
      if (!text || !Array.isArray(answer.ids)) return
      if (Array.isArray(output.content)) output.content.push({ type: "text", text })
      else if (typeof output.output === "string") output.output = output.output + "\\n\\n" + text
      else return // nowhere to put it: not acknowledged, so offered again
      let settle
      const done = new Promise((resolve) => (settle = resolve))
      pending.set(input.callID, { id, ids: answer.ids, peer: answer.peer, done, settle })
    },
    event: async ({ event }) => {
      if (!event) return
      const props = event.properties || {}
      if (event.type === "session.status" && props.sessionID && props.status) {
        const id = props.sessionID
        const state = props.status.type === "idle" ? "idle" : "busy"
        if (state === "idle") idle.add(id)
        else idle.delete(id)
        if (marked.get(id) !== state) {
          marked.set(id, state)
          const input = { session_id: id, cwd: directory, status: state }
          marking = marking.then(() => run(HOOKS.status, input, directory))
        }
      }
      if (event.type === "session.compacted" && props.sessionID) {
        notes.delete(props.sessionID) // the next request asks for the note again (current decisions)
        compacted.add(props.sessionID)
      }
      if (event.type === "session.idle" && props.sessionID) {
        idle.add(props.sessionID)
        watchPostBox()
        await wake(props.sessionID)
        return
      }
      if (event.type !== "message.part.updated") return
      const part = event.properties && event.properties.part
      const held = part && part.type === "tool" ? pending.get(part.callID) : undefined
      if (!held || !part.state || part.state.status !== "completed") return
      await run(HOOKS.ack, { session_id: held.id, cwd: directory, ids: held.ids, peer: held.peer }, directory)
      pending.delete(part.callID)
      held.settle()
    },
  }
}
"""


def plugin_text(hooks: dict[str, list[str]], env: dict[str, str], post_box: str, server: str) -> str:
    """The plugin, running the hook commands `hooks` (event -> argv) with `env` added, watching
    `post_box` (the agent-bridge home's `pending` folder) while a session is idle, marking the
    calls of the tools of the MCP server named `server` with their session."""
    return (TEMPLATE.replace("__HOOKS__", json.dumps(hooks, ensure_ascii=False))
            .replace("__ENV__", json.dumps(env, ensure_ascii=False))
            .replace("__POST_BOX__", json.dumps(post_box, ensure_ascii=False))
            .replace("__TOOL_PREFIX__", json.dumps(server + "_"))
            .replace("__SESSION_ARGUMENT__", json.dumps(tools.HOST_SESSION_ARGUMENT)))


def is_ours(text: str) -> bool:
    return text.startswith(MARK)
