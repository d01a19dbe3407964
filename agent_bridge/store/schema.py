"""Schema versions of bridge.db (SPEC §7): the SQL of each step (store.migration applies them).

Versions 1 and 2 are the existing bridge, pinned verbatim; their meaning never changes.
Version 3 adds append-only pinned decisions, their per-host-session deliveries, and the
persisted host-to-session map of SPEC §3.
Version 4 adds the owner's controls: append-only retractions of a topic's decision (with the
notices they queued) and forgotten sessions (a tombstone where history still names them).
Version 5 adds identity without a host session id (SPEC §3): each session's resume secret
(hashed), the sessions each host instance ran, and where a merged record's address now leads.
Version 6 adds owner questions (SPEC §4.6): append-only questions, who asked each, the one answer
or decline each gets, and the active messages that told the askers.
V_WAKES adds what a sender's receipts need (SPEC §3 "Conversations agents can rely on"): the wake
requests, append-only; `receipts.delivered_at` as the time the message was shown (its bytes
reached the host), with `offered_at` beside it for "offered, maybe shown" (repeats); and the
caller's `message_id` of a send, so that a retry returns what it stored.
V_JOBS adds jobs (SPEC §4.7): what was asked, once, and each job's events, appended (a job's
state is its last event's).
V_SEARCH adds the owner's search (SPEC §4.6 "Search"): FTS5 indexes over the text of messages,
decisions and questions, kept in step by triggers (so inside the writer's own transactions) and
built from the rows already there.
V_ASK adds richer owner questions (SPEC §4.6): a question's context and recommended option, the
askers that withdrew it, and its end when nobody asks it any more; all appended.
V_FED adds federation (SPEC §10): sessions and messages of other machines (`machine`), the
outbox of what waits to be published, the remote receipts and marks of messages sent to another
machine, the recording machine of decisions and retractions, and a topic's current revision
chosen by (createdAt, id) instead of arrival, so every machine agrees on it.
V_TEAM_RECEIPTS adds the end-to-end receipts of this machine's decisions and retractions: which
machine of the team said it stored which, so a decision's outbox row ends on those receipts and
not at the hub's PubAck (SPEC §10 "Exactly once or marked").
V_INDEX_LATER indexes messages for search after their commit, in batches, instead of inside every
send's transaction (a search also looks through what the index has not reached yet).
V_LEAN_ACKS indexes a message's recipient and a receipt's session so that an acknowledgement
moves no index entry.
V_REFERENCES indexes the last columns that name a session record or a message without an index,
so that forgetting or merging a record never reads a whole table.
"""

from __future__ import annotations

V1 = """
CREATE TABLE peers (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, agent TEXT NOT NULL, project TEXT NOT NULL,
  kind TEXT NOT NULL DEFAULT 'interactive' CHECK (kind IN ('interactive','job')),
  created_at INTEGER NOT NULL, last_seen_at INTEGER NOT NULL);
CREATE TABLE messages (
  id TEXT PRIMARY KEY, from_peer TEXT REFERENCES peers(id), to_peer TEXT NOT NULL REFERENCES peers(id),
  body TEXT NOT NULL, hop INTEGER NOT NULL DEFAULT 1, reply_to TEXT,
  created_at INTEGER NOT NULL, acked_at INTEGER);
CREATE INDEX messages_to_unacked ON messages(to_peer, acked_at);
PRAGMA user_version = 1;
"""

V2 = """
ALTER TABLE peers ADD COLUMN host_session_id TEXT;
CREATE INDEX peers_host_session ON peers(host_session_id);
CREATE TABLE receipts (
  message_id TEXT NOT NULL REFERENCES messages(id), peer_id TEXT NOT NULL REFERENCES peers(id),
  delivered_at INTEGER, acked_at INTEGER, PRIMARY KEY (message_id, peer_id));
INSERT INTO receipts(message_id, peer_id, acked_at) SELECT id, to_peer, acked_at FROM messages;
PRAGMA user_version = 2;
"""

V3 = """
-- Every revision of every pinned owner decision, in recording order (seq).
CREATE TABLE decisions (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  topic TEXT NOT NULL CHECK (length(topic) BETWEEN 1 AND 200),
  text TEXT NOT NULL CHECK (length(text) BETWEEN 1 AND 4000),
  text_key TEXT NOT NULL,            -- lowercased text, for case-insensitive substring queries
  scope TEXT NOT NULL,               -- canonical JSON: "all" | {"project":…} | {"sessions":[…]}
  scope_kind TEXT NOT NULL CHECK (scope_kind IN ('all','project','sessions')),
  scope_project TEXT,                -- the normalized folder of a project scope
  author_id TEXT NOT NULL REFERENCES peers(id),
  author_name TEXT NOT NULL,
  author_agent TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  source_message_id TEXT REFERENCES messages(id),
  supersedes TEXT REFERENCES decisions(id),
  CHECK ((scope_kind = 'project') = (scope_project IS NOT NULL)));
CREATE INDEX decisions_topic ON decisions(topic, seq);
CREATE INDEX decisions_project ON decisions(scope_project) WHERE scope_project IS NOT NULL;
CREATE TRIGGER decisions_no_update BEFORE UPDATE ON decisions
  BEGIN SELECT RAISE(ABORT, 'decisions are append-only: UPDATE is not allowed'); END;
CREATE TRIGGER decisions_no_delete BEFORE DELETE ON decisions
  BEGIN SELECT RAISE(ABORT, 'decisions are append-only: DELETE is not allowed'); END;

-- The current revision of each topic, kept by the schema itself (derived from decisions).
CREATE TABLE decision_heads (topic TEXT PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID;
CREATE TRIGGER decisions_head AFTER INSERT ON decisions
  BEGIN INSERT OR REPLACE INTO decision_heads(topic, seq) VALUES (NEW.topic, NEW.seq); END;

-- One row per (revision, host session) that was sent that revision: a host session never gets
-- the same revision twice. host_key is the host session id, or 'peer:<id>' while it is unknown.
CREATE TABLE decision_deliveries (
  decision_id TEXT NOT NULL REFERENCES decisions(id),
  host_key TEXT NOT NULL,
  peer_id TEXT NOT NULL REFERENCES peers(id),
  message_id TEXT REFERENCES messages(id),
  created_at INTEGER NOT NULL,
  PRIMARY KEY (decision_id, host_key));
CREATE INDEX decision_deliveries_message ON decision_deliveries(message_id);
CREATE INDEX decision_deliveries_peer ON decision_deliveries(peer_id);
CREATE TRIGGER decision_deliveries_no_update BEFORE UPDATE ON decision_deliveries
  BEGIN SELECT RAISE(ABORT, 'decision_deliveries are append-only: UPDATE is not allowed'); END;
CREATE TRIGGER decision_deliveries_no_delete BEFORE DELETE ON decision_deliveries
  BEGIN SELECT RAISE(ABORT, 'decision_deliveries are append-only: DELETE is not allowed'); END;

-- The persisted host-to-session map (SPEC §3): which host session ids a host process
-- instance (pid + start time) has reported, so a reloaded MCP server or a restarted broker
-- recovers its identity without waiting for a hook.
CREATE TABLE host_instances (
  pid INTEGER NOT NULL, start_time INTEGER NOT NULL, host_session_id TEXT NOT NULL,
  agent TEXT, seen_at INTEGER NOT NULL,
  PRIMARY KEY (pid, start_time, host_session_id));

CREATE INDEX receipts_peer_unacked ON receipts(peer_id, acked_at);
CREATE INDEX peers_name ON peers(name);
PRAGMA user_version = 3;
"""

V4 = """
-- A topic's decision withdrawn by the owner: appended, never updated or deleted. The topic
-- has no current revision until a later decide starts it again (decision_heads loses it).
CREATE TABLE decision_retractions (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  topic TEXT NOT NULL,
  retracts TEXT NOT NULL REFERENCES decisions(id),   -- the revision that was current
  reason TEXT CHECK (reason IS NULL OR length(reason) BETWEEN 1 AND 4000),
  author_id TEXT NOT NULL REFERENCES peers(id),
  author_name TEXT NOT NULL,
  author_agent TEXT NOT NULL,
  created_at INTEGER NOT NULL);
CREATE INDEX decision_retractions_topic ON decision_retractions(topic, seq);
CREATE TRIGGER decision_retractions_no_update BEFORE UPDATE ON decision_retractions
  BEGIN SELECT RAISE(ABORT, 'decision_retractions are append-only: UPDATE is not allowed'); END;
CREATE TRIGGER decision_retractions_no_delete BEFORE DELETE ON decision_retractions
  BEGIN SELECT RAISE(ABORT, 'decision_retractions are append-only: DELETE is not allowed'); END;
CREATE TRIGGER decision_retractions_head AFTER INSERT ON decision_retractions
  BEGIN DELETE FROM decision_heads WHERE topic = NEW.topic; END;

-- The passive notice a retraction queued for one session (its message and receipt).
CREATE TABLE retraction_notices (
  message_id TEXT PRIMARY KEY REFERENCES messages(id),
  retraction_id TEXT NOT NULL REFERENCES decision_retractions(id),
  peer_id TEXT NOT NULL REFERENCES peers(id));
CREATE INDEX retraction_notices_peer ON retraction_notices(peer_id);

-- A forgotten session whose row history still references (messages it sent, decisions it
-- recorded, deliveries it got) stays as a tombstone: never listed, never addressed.
ALTER TABLE peers ADD COLUMN forgotten_at INTEGER;
PRAGMA user_version = 4;
"""


V5 = """
-- A session's resume secret (SPEC §3): only its hash is kept, so nobody who can read the
-- database can claim the session; the MCP server that was given the secret presents it.
CREATE TABLE session_secrets (
  peer_id TEXT PRIMARY KEY REFERENCES peers(id),
  secret_hash TEXT NOT NULL);

-- For hosts that never give a host session id: the sessions a host instance (pid + start
-- time of the nearest agent host, else of the MCP server's parent) ran, so an MCP server it
-- restarts resumes the same session.
CREATE TABLE instance_sessions (
  pid INTEGER NOT NULL, start_time INTEGER NOT NULL,
  peer_id TEXT NOT NULL REFERENCES peers(id),
  seen_at INTEGER NOT NULL,
  PRIMARY KEY (pid, start_time, peer_id));
CREATE INDEX instance_sessions_peer ON instance_sessions(peer_id);

-- A record merged into another when a connection learned it was an earlier session: an
-- address resolved to the old id before the merge still reaches the session.
CREATE TABLE peer_merges (
  old_id TEXT PRIMARY KEY,
  into_id TEXT NOT NULL REFERENCES peers(id),
  merged_at INTEGER NOT NULL);
PRAGMA user_version = 5;
"""

V6 = """
-- A question for the human owner (ask_owner). Its id is the id of the bridge message (kind
-- question, from the first asker to the owner `cli`) that carries it: an answer's decision
-- names it as its sourceMessageId. Appended, never updated or deleted.
CREATE TABLE questions (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE REFERENCES messages(id),
  question TEXT NOT NULL CHECK (length(question) BETWEEN 1 AND 1000),
  topic TEXT CHECK (topic IS NULL OR length(topic) BETWEEN 1 AND 200),
  options TEXT NOT NULL,             -- a JSON array of at most 10 strings
  scope TEXT NOT NULL,               -- canonical JSON, as decisions.scope
  created_at INTEGER NOT NULL);
CREATE INDEX questions_topic ON questions(topic, scope) WHERE topic IS NOT NULL;
CREATE TRIGGER questions_no_update BEFORE UPDATE ON questions
  BEGIN SELECT RAISE(ABORT, 'questions are append-only: UPDATE is not allowed'); END;
CREATE TRIGGER questions_no_delete BEFORE DELETE ON questions
  BEGIN SELECT RAISE(ABORT, 'questions are append-only: DELETE is not allowed'); END;

-- Every session that asked a question (the first asker, then each that joined it), under the
-- name it had then. Appended, never updated or deleted.
CREATE TABLE question_askers (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  question_id TEXT NOT NULL REFERENCES questions(id),
  peer_id TEXT NOT NULL REFERENCES peers(id),
  name TEXT NOT NULL,
  agent TEXT NOT NULL,
  asked_at INTEGER NOT NULL,
  UNIQUE (question_id, peer_id));
CREATE INDEX question_askers_peer ON question_askers(peer_id);
CREATE TRIGGER question_askers_no_update BEFORE UPDATE ON question_askers
  BEGIN SELECT RAISE(ABORT, 'question_askers are append-only: UPDATE is not allowed'); END;
CREATE TRIGGER question_askers_no_delete BEFORE DELETE ON question_askers
  BEGIN SELECT RAISE(ABORT, 'question_askers are append-only: DELETE is not allowed'); END;

-- What became of a question: answered (with the pinned decision that answer recorded) or
-- declined (with the owner's reason). At most one per question; appended, never changed.
CREATE TABLE question_outcomes (
  question_id TEXT PRIMARY KEY REFERENCES questions(id),
  state TEXT NOT NULL CHECK (state IN ('answered','declined')),
  decision_id TEXT REFERENCES decisions(id),
  reason TEXT CHECK (reason IS NULL OR length(reason) BETWEEN 1 AND 4000),
  created_at INTEGER NOT NULL,
  CHECK ((state = 'answered') = (decision_id IS NOT NULL)),
  CHECK ((state = 'declined') = (reason IS NOT NULL)));
CREATE TRIGGER question_outcomes_no_update BEFORE UPDATE ON question_outcomes
  BEGIN SELECT RAISE(ABORT, 'question_outcomes are append-only: UPDATE is not allowed'); END;
CREATE TRIGGER question_outcomes_no_delete BEFORE DELETE ON question_outcomes
  BEGIN SELECT RAISE(ABORT, 'question_outcomes are append-only: DELETE is not allowed'); END;

-- The active message (kind answer) an outcome queued for one asker.
CREATE TABLE question_notices (
  message_id TEXT PRIMARY KEY REFERENCES messages(id),
  question_id TEXT NOT NULL REFERENCES questions(id),
  peer_id TEXT NOT NULL REFERENCES peers(id));
CREATE INDEX question_notices_peer ON question_notices(peer_id);
PRAGMA user_version = 6;
"""

V_WAKES = """
-- A wake request: the bridge set out to wake a message's recipient (an idle session's waiter
-- handing it over, or a write that wakes the host without showing the message). Only the
-- time is stored; whether the wake was confirmed (the message shown within 20 s) or not is
-- read from the message's receipt (domain.wake_state). Appended, never updated or deleted.
-- No reference to messages: forgetting a session drops its messages, never this history.
CREATE TABLE wakes (
  message_id TEXT NOT NULL,
  requested_at INTEGER NOT NULL);
CREATE INDEX wakes_message ON wakes(message_id);
CREATE TRIGGER wakes_no_update BEFORE UPDATE ON wakes
  BEGIN SELECT RAISE(ABORT, 'wakes are append-only: UPDATE is not allowed'); END;
CREATE TRIGGER wakes_no_delete BEFORE DELETE ON wakes
  BEGIN SELECT RAISE(ABORT, 'wakes are append-only: DELETE is not allowed'); END;

-- receipts.delivered_at: when the message was shown, i.e. the bytes that carry it reached the
-- host (SPEC §3, the acknowledgement rule's write); offered_at: when it was first handed to a
-- path that may have shown it (a Stop hook's fetch, a connection that ended before its write
-- was confirmed), so that shown again it is marked a repeat. Until now delivered_at held the
-- offer: it moves to offered_at, and an acknowledged receipt counts as shown by its
-- acknowledgement (never earlier than it is known to be true).
ALTER TABLE receipts ADD COLUMN offered_at INTEGER;
UPDATE receipts SET offered_at = delivered_at, delivered_at = acked_at;

-- The caller's message_id of a send (`send_id`) and the address it gave (`send_to`), on every
-- message that send stored: sending with the same id again returns them (SPEC §3 "Safe retry").
ALTER TABLE messages ADD COLUMN send_id TEXT;
ALTER TABLE messages ADD COLUMN send_to TEXT;
CREATE INDEX messages_send ON messages(send_id) WHERE send_id IS NOT NULL;
-- A session's own messages, newest first (`sent`), and the replies to a message.
CREATE INDEX messages_from ON messages(from_peer);
CREATE INDEX messages_reply ON messages(reply_to) WHERE reply_to IS NOT NULL;
PRAGMA user_version = 7;
"""

V_JOBS = """
-- A job (SPEC §4.7): a headless run of another host on a task, handed over by a session (its
-- parent). Its own bridge session is `peer_id` (kind job, named as the job). What was asked is
-- recorded once, never changed. No references to peers: forgetting a session keeps its jobs.
CREATE TABLE jobs (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  peer_id TEXT NOT NULL,
  parent_id TEXT NOT NULL,
  agent TEXT NOT NULL,
  title TEXT NOT NULL,
  task TEXT NOT NULL,
  access TEXT NOT NULL CHECK (access IN ('read','edit')),
  project TEXT NOT NULL,
  cwd TEXT NOT NULL,
  worktree TEXT,
  branch TEXT,
  model TEXT,
  depth INTEGER NOT NULL CHECK (depth >= 1),
  timeout_ms INTEGER NOT NULL CHECK (timeout_ms > 0),
  created_at INTEGER NOT NULL);
CREATE INDEX jobs_parent ON jobs(parent_id);
CREATE TRIGGER jobs_no_update BEFORE UPDATE ON jobs
  BEGIN SELECT RAISE(ABORT, 'jobs are append-only: UPDATE is not allowed'); END;

-- What happened to a job, in order: queued (a new job, or `continue` with its message in
-- `prompt`), running (its process started: pid and start time, to adopt it after a broker
-- restart; again as it goes, with the host thread and its last step), and how each run ended
-- (with the answer, at most 8,000 characters, and the answer message sent to the parent). The
-- job's state is its last row's. Appended, never updated or deleted.
CREATE TABLE job_events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL REFERENCES jobs(id),
  run INTEGER NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('queued','running','finished','failed','cancelled','interrupted')),
  at INTEGER NOT NULL,
  pid INTEGER,
  pid_start INTEGER,
  thread TEXT,
  last_step TEXT,
  answer TEXT CHECK (answer IS NULL OR length(answer) <= 8000),
  prompt TEXT,
  message_id TEXT);
CREATE INDEX job_events_job ON job_events(job_id, seq);
CREATE INDEX job_events_message ON job_events(message_id) WHERE message_id IS NOT NULL;
CREATE TRIGGER job_events_no_update BEFORE UPDATE ON job_events
  BEGIN SELECT RAISE(ABORT, 'job_events are append-only: UPDATE is not allowed'); END;
CREATE TRIGGER job_events_no_delete BEFORE DELETE ON job_events
  BEGIN SELECT RAISE(ABORT, 'job_events are append-only: DELETE is not allowed'); END;
PRAGMA user_version = 8;
"""

V_SEARCH = """
-- Full-text indexes (FTS5) over what the owner searches: the messages sessions and the owner
-- wrote, every decision revision's topic and text, every question's text and topic. A row's
-- index entry is its rowid (messages) or seq (decisions, questions), so results come newest first
-- without a sort. Triggers keep them in step, inside the transaction that writes the row.
-- Words: unicode61, case and diacritics folded ("Café" finds "cafe").
--
-- Messages: the index keeps its own copy of the text (an FTS5 table with content), so that an
-- entry can be dropped by rowid alone. Every message is indexed as it is written; the ones the
-- bridge made from a decision, a retraction or a question (the notices, the message carrying a
-- question, the answers its askers got) leave the index as the row that makes them so is written
-- (they are found as the decision or question); a deleted message (forgetting a session drops
-- what was queued to it) leaves it too.
CREATE VIRTUAL TABLE messages_fts USING fts5(body, tokenize='unicode61 remove_diacritics 2');
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages
  BEGIN INSERT INTO messages_fts(rowid, body) VALUES (NEW.rowid, NEW.body); END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages
  BEGIN DELETE FROM messages_fts WHERE rowid = OLD.rowid; END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF body ON messages
  BEGIN UPDATE messages_fts SET body = NEW.body WHERE rowid = NEW.rowid; END;
CREATE TRIGGER decision_deliveries_fts AFTER INSERT ON decision_deliveries WHEN NEW.message_id IS NOT NULL
  BEGIN DELETE FROM messages_fts WHERE rowid = (SELECT rowid FROM messages WHERE id = NEW.message_id); END;
CREATE TRIGGER retraction_notices_fts AFTER INSERT ON retraction_notices
  BEGIN DELETE FROM messages_fts WHERE rowid = (SELECT rowid FROM messages WHERE id = NEW.message_id); END;
CREATE TRIGGER question_notices_fts AFTER INSERT ON question_notices
  BEGIN DELETE FROM messages_fts WHERE rowid = (SELECT rowid FROM messages WHERE id = NEW.message_id); END;
CREATE TRIGGER questions_message_fts AFTER INSERT ON questions
  BEGIN DELETE FROM messages_fts WHERE rowid = (SELECT rowid FROM messages WHERE id = NEW.id); END;
INSERT INTO messages_fts(rowid, body) SELECT m.rowid, m.body FROM messages m
  WHERE NOT EXISTS (SELECT 1 FROM decision_deliveries dd WHERE dd.message_id = m.id)
    AND NOT EXISTS (SELECT 1 FROM retraction_notices rn WHERE rn.message_id = m.id)
    AND NOT EXISTS (SELECT 1 FROM question_notices qn WHERE qn.message_id = m.id)
    AND NOT EXISTS (SELECT 1 FROM questions q WHERE q.id = m.id);

-- Decisions and questions are append-only: external-content indexes (the text stays only in its
-- own table), fed on insert.
CREATE VIRTUAL TABLE decisions_fts USING fts5(
  topic, text, content='decisions', content_rowid='seq', tokenize='unicode61 remove_diacritics 2');
CREATE TRIGGER decisions_fts_insert AFTER INSERT ON decisions
  BEGIN INSERT INTO decisions_fts(rowid, topic, text) VALUES (NEW.seq, NEW.topic, NEW.text); END;
INSERT INTO decisions_fts(decisions_fts) VALUES ('rebuild');
-- Whether a found revision was retracted.
CREATE INDEX decision_retractions_retracts ON decision_retractions(retracts);

CREATE VIRTUAL TABLE questions_fts USING fts5(
  question, topic, content='questions', content_rowid='seq', tokenize='unicode61 remove_diacritics 2');
CREATE TRIGGER questions_fts_insert AFTER INSERT ON questions
  BEGIN INSERT INTO questions_fts(rowid, question, topic) VALUES (NEW.seq, NEW.question, NEW.topic); END;
INSERT INTO questions_fts(questions_fts) VALUES ('rebuild');
PRAGMA user_version = 9;
"""

V_ASK = """
-- Richer owner questions (SPEC §4.6): what the first asker already knew (`context`) and the
-- option it recommended, recorded once with the question. Appended, never changed.
CREATE TABLE question_details (
  question_id TEXT PRIMARY KEY REFERENCES questions(id),
  context TEXT CHECK (context IS NULL OR length(context) BETWEEN 1 AND 2000),
  recommended INTEGER CHECK (recommended IS NULL OR recommended BETWEEN 0 AND 9));
CREATE TRIGGER question_details_no_update BEFORE UPDATE ON question_details
  BEGIN SELECT RAISE(ABORT, 'question_details are append-only: UPDATE is not allowed'); END;
CREATE TRIGGER question_details_no_delete BEFORE DELETE ON question_details
  BEGIN SELECT RAISE(ABORT, 'question_details are append-only: DELETE is not allowed'); END;

-- An asker that withdrew its question: it leaves `askedBy`. Appended, never changed. No
-- reference to peers: forgetting a session keeps what it withdrew.
CREATE TABLE question_withdrawals (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  question_id TEXT NOT NULL REFERENCES questions(id),
  peer_id TEXT NOT NULL,
  withdrawn_at INTEGER NOT NULL,
  UNIQUE (question_id, peer_id));
CREATE TRIGGER question_withdrawals_no_update BEFORE UPDATE ON question_withdrawals
  BEGIN SELECT RAISE(ABORT, 'question_withdrawals are append-only: UPDATE is not allowed'); END;
CREATE TRIGGER question_withdrawals_no_delete BEFORE DELETE ON question_withdrawals
  BEGIN SELECT RAISE(ABORT, 'question_withdrawals are append-only: DELETE is not allowed'); END;

-- A question nobody asks any more (its last asker withdrew it): closed without an outcome.
CREATE TABLE question_ends (
  question_id TEXT PRIMARY KEY REFERENCES questions(id),
  state TEXT NOT NULL CHECK (state = 'withdrawn'),
  created_at INTEGER NOT NULL);
CREATE TRIGGER question_ends_no_update BEFORE UPDATE ON question_ends
  BEGIN SELECT RAISE(ABORT, 'question_ends are append-only: UPDATE is not allowed'); END;
CREATE TRIGGER question_ends_no_delete BEFORE DELETE ON question_ends
  BEGIN SELECT RAISE(ABORT, 'question_ends are append-only: DELETE is not allowed'); END;
PRAGMA user_version = 10;
"""

V_FED = """
-- Sessions of other machines, known from their presence (SPEC §10), are session records too, so
-- messages and decisions can name them: `machine` is theirs (NULL: this machine), `id` is
-- `<their id>@<machine>` (ids never collide, `cli` included), `remote_id` their id there, and
-- `remote_state` what their machine last said (busy, idle, offline). Never listed or addressed as
-- local sessions; `project_key` is their folder's git origin (projectkey.py), for showing.
ALTER TABLE peers ADD COLUMN machine TEXT;
ALTER TABLE peers ADD COLUMN remote_id TEXT;
ALTER TABLE peers ADD COLUMN remote_state TEXT
  CHECK (remote_state IS NULL OR remote_state IN ('busy','idle','offline'));
ALTER TABLE peers ADD COLUMN project_key TEXT;
CREATE UNIQUE INDEX peers_remote ON peers(machine, remote_id) WHERE machine IS NOT NULL;

-- The team's machines this one heard from: when last (any body), and the presence last applied.
CREATE TABLE machines (
  name TEXT PRIMARY KEY,
  heard_at INTEGER NOT NULL,
  presence_at INTEGER);

-- A message from another machine names it (`machine`, NULL: sent here); `reported` is the highest
-- receipt queued back to it (1 stored, 2 shown, 3 acknowledged). A message to another machine's
-- session: `relayed_at` when the hub acknowledged it (relayed, not delivered), `stored_at` when its
-- machine said it stored it, `unconfirmed_at` when no receipt came within the bound (cleared by a
-- late one). Shown and acknowledged arrive as the recipient's receipt row, as for a local one.
ALTER TABLE messages ADD COLUMN machine TEXT;
ALTER TABLE messages ADD COLUMN reported INTEGER;
ALTER TABLE messages ADD COLUMN relayed_at INTEGER;
ALTER TABLE messages ADD COLUMN stored_at INTEGER;
ALTER TABLE messages ADD COLUMN unconfirmed_at INTEGER;
CREATE INDEX messages_reporting ON messages(machine) WHERE machine IS NOT NULL AND reported < 3;

-- What waits to be published (core/federation.py decides when): a message to a remote session
-- (committed with it), a receipt going back (`<message id>/<state>`, committed with what made it),
-- a decision or retraction going to the team. `machine`: the destination (NULL: the team).
-- The body is the encoded envelope (core/envelopes.py). A row is deleted when it is done.
CREATE TABLE outbox (
  kind TEXT NOT NULL CHECK (kind IN ('msg','rcpt','dec')),
  id TEXT NOT NULL,
  machine TEXT CHECK ((kind = 'dec') = (machine IS NULL)),
  body BLOB NOT NULL,
  queued_at INTEGER NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  relayed_at INTEGER,
  unconfirmed_at INTEGER,
  PRIMARY KEY (kind, id)) WITHOUT ROWID;

-- How far this machine's own decisions and retractions were put in the outbox for the team
-- (the last seq queued), moved in the transaction that queues them.
CREATE TABLE federation_cursors (
  name TEXT PRIMARY KEY CHECK (name IN ('decisions','retractions')),
  seq INTEGER NOT NULL);

-- The machine that recorded a decision or a retraction (NULL: this one).
ALTER TABLE decisions ADD COLUMN machine TEXT;
ALTER TABLE decision_retractions ADD COLUMN machine TEXT;
CREATE INDEX decisions_topic_order ON decisions(topic, created_at, id);
CREATE INDEX decision_retractions_topic_order ON decision_retractions(topic, created_at, id);

-- A topic's current revision is its latest by (createdAt, id) among its decisions and
-- retractions, whatever order they arrived in; a retraction latest means none. Locally recorded
-- revisions are always latest (store.decisions gives them a createdAt past the topic's newest).
DROP TRIGGER decisions_head;
CREATE TRIGGER decisions_head AFTER INSERT ON decisions
  WHEN NOT EXISTS (SELECT 1 FROM decisions d WHERE d.topic = NEW.topic AND d.seq != NEW.seq
                     AND (d.created_at, d.id) > (NEW.created_at, NEW.id))
   AND NOT EXISTS (SELECT 1 FROM decision_retractions r WHERE r.topic = NEW.topic
                     AND (r.created_at, r.id) > (NEW.created_at, NEW.id))
  BEGIN INSERT OR REPLACE INTO decision_heads(topic, seq) VALUES (NEW.topic, NEW.seq); END;
DROP TRIGGER decision_retractions_head;
CREATE TRIGGER decision_retractions_head AFTER INSERT ON decision_retractions
  WHEN NOT EXISTS (SELECT 1 FROM decisions d WHERE d.topic = NEW.topic
                     AND (d.created_at, d.id) > (NEW.created_at, NEW.id))
   AND NOT EXISTS (SELECT 1 FROM decision_retractions r WHERE r.topic = NEW.topic AND r.seq != NEW.seq
                     AND (r.created_at, r.id) > (NEW.created_at, NEW.id))
  BEGIN DELETE FROM decision_heads WHERE topic = NEW.topic; END;
PRAGMA user_version = 11;
"""

V_TEAM_RECEIPTS = """
-- A decision or retraction recorded here, said stored by another machine of the team (its
-- receipt, `<team>.rcpt.<that machine>.<this one>` with `decisionId`). The outbox row of the
-- record ends when every machine in `machines` has said so; these rows go with it.
CREATE TABLE team_receipts (
  record_id TEXT NOT NULL,
  machine TEXT NOT NULL,
  at INTEGER NOT NULL,
  PRIMARY KEY (record_id, machine)) WITHOUT ROWID;
PRAGMA user_version = 12;
"""

V_INDEX_LATER = """
-- A message is indexed for search after its commit, in batches (Store.index_messages, run by the
-- broker's indexer a moment after commits), no longer by a trigger inside every send: the index's
-- segment written at each send's commit doubled a send's transaction. A search looks through what
-- the index has not reached yet as well (store.search.UNINDEXED), so it still finds every
-- committed message. The notices' triggers stay: a notice already indexed leaves the index, and
-- one not yet indexed never enters it (the same rules pick what is indexed).
DROP TRIGGER messages_fts_insert;
PRAGMA user_version = 13;
"""

V_LEAN_ACKS = """
-- An acknowledgement moves no index entry. Both indexes on acked_at moved one at every
-- acknowledgement (out of the NULLs, to its time), on pages apart from the new rows': the
-- messages' (to_peer, acked_at) and the receipts' (peer_id, acked_at). Now a message's recipient
-- is indexed alone, and a receipt is in receipts_unacked only until it is acknowledged (the
-- delivery queue's range: a session's unacknowledged receipts in order) and in receipts_peer
-- always. messages.acked_at stays and is kept as versions 1 and 2 define it (SPEC §7); the
-- receipt is what the bridge reads. A commit of a few sends and acknowledgements writes 9 pages
-- to the WAL instead of 16 (docs/performance.md).
DROP INDEX messages_to_unacked;
CREATE INDEX messages_to ON messages(to_peer);
DROP INDEX receipts_peer_unacked;
CREATE INDEX receipts_unacked ON receipts(peer_id) WHERE acked_at IS NULL;
CREATE INDEX receipts_peer ON receipts(peer_id);
PRAGMA user_version = 14;
"""

# How a read of sessions' unacknowledged receipts names their index (V_LEAN_ACKS on). Without
# statistics SQLite's planner weighs receipts_peer (every receipt a session ever had) the same as
# receipts_unacked (the few it has not acknowledged) for `peer_id = ? AND acked_at IS NULL`, and
# took receipts_peer: such a read (the post box's pass, the wake waiters', the PostToolUse hook's)
# grew with the session's history instead of its queue.
UNACKED_RECEIPTS = "INDEXED BY receipts_unacked"

V_REFERENCES = """
-- Every column that names a session record or a message, the two kinds of rows the store deletes
-- (forgetting a session, merging records), is indexed. SQLite checks each foreign key on such a
-- delete by looking up the rows that name the deleted one, and the store asks the same before it
-- deletes (Peers._referenced, Forgetting.forget_peers); these four columns had no index, so each
-- look read its whole table: with 100,000 decisions a health check's record took 23 ms to
-- forget, and a session with 200 queued messages 4.3 s, all of it on the store's thread.
CREATE INDEX decisions_author ON decisions(author_id);
CREATE INDEX decisions_source ON decisions(source_message_id) WHERE source_message_id IS NOT NULL;
CREATE INDEX decision_retractions_author ON decision_retractions(author_id);
CREATE INDEX peer_merges_into ON peer_merges(into_id);
PRAGMA user_version = 15;
"""

STEPS: tuple[str, ...] = (
    V1, V2, V3, V4, V5, V6, V_WAKES, V_JOBS, V_SEARCH, V_ASK, V_FED, V_TEAM_RECEIPTS, V_INDEX_LATER,
    V_LEAN_ACKS, V_REFERENCES,
)
CURRENT_VERSION = len(STEPS)

