"""The rules of a question an agent asks the owner (SPEC §4.6): the question, what the asker
already knows, the options it offers and the one it recommends, the owner's answer by option
number or a declining reason, and the topic of the decision an answer records.

Pure, synchronous functions, as the rest of the domain rules (common.domain, whose InputError
they raise): the broker checks `ask_owner` and an answer with them, the MCP tools' schema takes
their limits. Standard library only.
"""

from __future__ import annotations

from agent_bridge.common.domain import TEXT_MAX, InputError, check_unicode, type_name

QUESTION_MAX = 1000  # characters of a question for the owner (SPEC §4.6)
OPTIONS_MAX = 10  # options a question offers
CONTEXT_MAX = 2000  # characters of what an asker already knows (SPEC §4.6)
OPTION_MAX = 200  # characters of one option
QUESTION_TOPIC_WORDS = 80  # characters of a topic made from a question that had none


def normalize_question(question: object) -> str:
    """A question for the owner: trimmed; 1..1000 characters."""
    if not isinstance(question, str):
        raise InputError(f"question: expected a string, got {type_name(question)}")
    check_unicode(question, "question")
    normalized = question.strip()
    if not normalized:
        raise InputError("question: must not be empty")
    if len(normalized) > QUESTION_MAX:
        raise InputError(f"question: at most {QUESTION_MAX} characters, got {len(normalized)}")
    return normalized


def normalize_context(context: object) -> str | None:
    """What the asker already knows, for the owner: trimmed; 1..2000 characters; None for none."""
    if context is None:
        return None
    if not isinstance(context, str):
        raise InputError(f"context: expected a string, got {type_name(context)}")
    check_unicode(context, "context")
    normalized = context.strip()
    if len(normalized) > CONTEXT_MAX:
        raise InputError(f"context: at most {CONTEXT_MAX} characters, got {len(normalized)}")
    return normalized or None


def recommended_option(value: object, options: tuple[str, ...]) -> int | None:
    """The index (from 0) of the option the asker recommends, among `options`; None for none."""
    if value is None:
        return None
    if not options:
        raise InputError("recommended: the question offers no options to recommend one of")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(options):
        raise InputError(f"recommended: expected an option's index from 0 to {len(options) - 1}")
    return value


def normalize_options(options: object) -> tuple[str, ...]:
    """The answers a question offers: at most 10 strings of 1..200 characters (trimmed, each
    once); None or [] for none."""
    if options is None:
        return ()
    if not isinstance(options, list):
        raise InputError(f"options: expected a list of strings, got {type_name(options)}")
    if len(options) > OPTIONS_MAX:
        raise InputError(f"options: at most {OPTIONS_MAX}, got {len(options)}")
    out: list[str] = []
    for i, item in enumerate(options):
        if not isinstance(item, str):
            raise InputError(f"options[{i}]: expected a string, got {type_name(item)}")
        check_unicode(item, f"options[{i}]")
        item = " ".join(item.split())
        if not item:
            raise InputError(f"options[{i}]: must not be empty")
        if len(item) > OPTION_MAX:
            raise InputError(f"options[{i}]: at most {OPTION_MAX} characters, got {len(item)}")
        if item not in out:
            out.append(item)
    return tuple(out)


def topic_from_question(question: str) -> str:
    """The topic of the decision that answers a question asked without one: its first words,
    lowercased, on one line, cut at a word within QUESTION_TOPIC_WORDS characters."""
    words = " ".join(question.split()).lower().rstrip("?").strip() or "question"
    if len(words) > QUESTION_TOPIC_WORDS:
        cut = (
            words[: QUESTION_TOPIC_WORDS + 1].rsplit(" ", 1)[0] if " " in words[:QUESTION_TOPIC_WORDS] else ""
        )
        words = (cut or words[:QUESTION_TOPIC_WORDS]).rstrip(" ,;:.") + "…"
    return words


def option_number(option: object, options: tuple[str, ...]) -> str:
    """The text of option N (numbered from 1, as `agent-bridge questions` shows them)."""
    if isinstance(option, bool) or not isinstance(option, int):
        raise InputError(f"option: expected a number from 1 to {len(options)}, got {option!r:.40}")
    if not options:
        raise InputError("option: this question offers no options; answer it with a text")
    if not 1 <= option <= len(options):
        raise InputError(f"option: expected a number from 1 to {len(options)}, got {option}")
    return options[option - 1]


def normalize_reason(reason: object, what: str = "reason") -> str:
    """A reason the owner gives (declining a question): trimmed; 1..4000 characters."""
    if not isinstance(reason, str):
        raise InputError(f"{what}: expected a string, got {type_name(reason)}")
    normalized = reason.strip()
    if not normalized:
        raise InputError(f"{what}: must not be empty")
    if len(normalized) > TEXT_MAX:
        raise InputError(f"{what}: at most {TEXT_MAX} characters, got {len(normalized)}")
    return normalized
