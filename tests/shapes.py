"""JSON shapes SPEC.md fixes, written out once for the tests that check them."""

# SPEC §6: "Decision objects have exactly the fields id, topic, text, scope, author{id,name,agent},
# createdAt, sourceMessageId, supersedes, current".
DECISION_FIELDS = {
    "id", "topic", "text", "scope", "author", "createdAt", "sourceMessageId", "supersedes", "current",
}
