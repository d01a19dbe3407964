"""The opencode plugin `install` writes (`plugin/agent-bridge.js`): opencode runs no command
hooks, only JS/TS plugins inside its own process, so this small plugin runs the standard-library
hook commands (`agent-bridge hook … --agent opencode`) and hands their answers to opencode.

What it does, with the opencode 1.18.33 plugin hooks it uses (read from its bundled source and
seen with the real CLI, tests/hosts/test_opencode.py):
- `experimental.chat.system.transform` (input `{sessionID, model}`, output `{system: string[]}`,
  called before every model request): the first time a session asks, the SessionStart hook runs
  with the `ses_…` id; its note (identity and decisions, SPEC §4.5) is pushed onto `system` for
  every request of the session. The hook reports the session id to the broker with the hook's
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

No npm dependency: `node:child_process` only (opencode runs plugins on Bun, which has it). A hook
that fails, times out or prints nothing changes nothing: a plugin never breaks its host.
"""

from __future__ import annotations

import json

MARK = "// agent-bridge plugin for opencode"  # the first line: how install and uninstall know it is ours

TEMPLATE = """\
// agent-bridge plugin for opencode: written by `agent-bridge install --opencode`, removed by
// `agent-bridge uninstall --opencode`. It runs the agent-bridge hook commands and hands their
// answers to opencode (see agent_bridge/hosts/opencode_plugin.py). Edits here are overwritten.
import { spawn } from "node:child_process"

const HOOKS = __HOOKS__
const ENV = __ENV__
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

export const AgentBridge = async ({ directory }) => {
  const notes = new Map() // session id -> the SessionStart note (a promise), asked once per session
  const pending = new Map() // tool call id -> what was handed over with its result, not yet acknowledged
  const hookInput = (sessionID, event, extra) =>
    ({ session_id: sessionID, cwd: directory, hook_event_name: event, ...extra })
  return {
    "experimental.chat.system.transform": async (input, output) => {
      const id = input && input.sessionID
      if (!id || !output || !Array.isArray(output.system)) return
      if (!notes.has(id)) {
        const input = hookInput(id, "SessionStart", { source: "startup" })
        notes.set(id, run(HOOKS["session-start"], input, directory).then(context))
      }
      const note = await notes.get(id)
      if (note) output.system.push(note)
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
      if (!event || event.type !== "message.part.updated") return
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


def plugin_text(hooks: dict[str, list[str]], env: dict[str, str]) -> str:
    """The plugin, running the hook commands `hooks` (event -> argv) with `env` added."""
    return (TEMPLATE.replace("__HOOKS__", json.dumps(hooks, ensure_ascii=False))
            .replace("__ENV__", json.dumps(env, ensure_ascii=False)))


def is_ours(text: str) -> bool:
    return text.startswith(MARK)
