"""``chat()``: one turn of a conversation, condensed, retrieved, answered and stored."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from django.db import transaction

from ..agent import Agent
from ..agent.loop import Loop
from ..answers import AnswerStream, ask
from ..answers.prompts import with_history
from ..answers.service import answer_messages
from ..conf import get_setting
from ..exceptions import ConversationNotFound, InvalidInput, InvalidOption
from ..llm import collect_usage
from ..models import Conversation, Message
from ..results import Answer, Usage
from ..retrieval.options import SearchOptions
from ..signals import span
from ..validation import INVISIBLE, clean_collection_names, clean_query, clean_title
from .condense import Condensed, condense, get_condenser
from .memory import estimate_tokens, recent_turns

ENGINES = ("ask", "agent", "loop")
# The options of engine="agent" that go to its answer step (the others go to Agent).
AGENT_ANSWER_OPTIONS = ("answerer", "self_correct", "max_corrections", "judge_prompt")
TITLE_CHARS = 80
# A title made from the first message: a prefix short enough for a list of conversations.
AUTO_TITLE_CHARS = 60
_NOT_TITLE = re.compile(rf"[\x00-\x1f\x7f-\x9f{INVISIBLE}]")


class ChatOptions(SearchOptions, total=False):
    """What :func:`chat` takes beyond its own arguments: the search options and each engine's
    own (tests/test_search_options.py keeps these equal to what ``ask``, the agent's answer
    step and ``Loop`` take). An engine refuses the options that are not its own."""

    prompt: Any  # every engine: replaces the answer prompt
    ground: Any  # "ask", "loop"
    global_search: bool  # "ask"
    deadline: float | None  # "agent", "loop"
    # engine="agent": AGENT_ANSWER_OPTIONS, for its answer step
    answerer: Any
    self_correct: bool
    max_corrections: int
    judge_prompt: Any
    # engine="loop" (Loop)
    answer_llm: Any
    tools: Sequence[Any]
    max_iterations: int
    max_limit: int
    max_chunks: int
    max_tool_calls: int
    max_tool_result_chars: int
    system_prompt: Any
    synthesizer: Any
    fallback_synthesis: bool
    keep_sources: str
    temperature: float | None
    controller_temperature: float | None
    answer_temperature: float | None
    fallback_temperature: float | None


def title_from_message(message: str, *, limit: int = AUTO_TITLE_CHARS) -> str:
    """A conversation's title from its first message: control and invisible characters
    dropped, whitespace runs (line breaks included) folded to one space, and at most ``limit``
    characters, cut at a word boundary with an ellipsis when it is longer."""
    text = " ".join(_NOT_TITLE.sub(" ", message or "").split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:  # a word boundary not too far back; else cut inside the word
        cut = cut[:space]
    return cut.rstrip(" ,;:.-–—") + "…"


@dataclass
class ChatReply:
    """One stored turn: the conversation, both messages and the :class:`Answer`."""

    conversation: Conversation
    user_message: Message
    message: Message  # the assistant's
    answer: Answer
    query: str  # what retrieval searched
    condensed: bool

    @property
    def text(self) -> str:
        return self.answer.text


class ChatStream:
    """What ``chat(..., stream=True)`` returns: iterate for the answer's text as it is written.

    Both messages are stored when the iteration ends normally; then :attr:`reply` holds the
    :class:`ChatReply`. When the LLM's stream breaks (an
    :class:`~django_rag.exceptions.LLMStreamError` is raised from the iteration) or the
    consumer stops early, **nothing is stored**: the conversation stays as it was, and the
    question can be sent again.
    """

    def __init__(self, turn: _Turn, stream: AnswerStream):
        self._turn = turn
        self._stream = stream
        self.reply: ChatReply | None = None

    @property
    def query(self) -> str:
        return self._turn.condensed.query

    @property
    def condensed(self) -> bool:
        return self._turn.condensed.condensed

    @property
    def chunks(self):
        return self._stream.chunks

    def __iter__(self) -> Iterator[str]:
        yield from self._stream
        self.reply = self._turn.store(self._stream.answer)

    def close(self) -> None:
        """Stop the turn where it is (the consumer went away): nothing is stored, and the
        LLM's stream is closed (:meth:`AnswerStream.close`)."""
        self._stream.close()


def _scope(collection: Any) -> list[str] | None:
    # Checked as search checks names (blank, too long, NUL, unpaired surrogate) before the
    # scope is stored: a name PostgreSQL cannot store would fail the insert, not the caller.
    names = clean_collection_names(collection)
    if names is not None and not names:
        raise InvalidOption("collection must be a name or a non-empty list of names")
    return names


def get_conversation(conversation: Any, *, user=None, session_key: str | None = None):
    """The conversation ``conversation`` (an instance or an id) if the caller owns it.

    With ``user`` (authenticated) it must be that user's; with only ``session_key`` it must be
    an anonymous conversation of that session; with neither the caller is trusted (server
    code). Anything else raises :class:`ConversationNotFound`, the same as a missing id."""
    if isinstance(conversation, Conversation):
        conv = conversation
    else:
        try:
            pk = int(conversation)
        except (TypeError, ValueError):
            raise ConversationNotFound("No such conversation.") from None
        conv = Conversation.objects.filter(pk=pk).first() if 1 <= pk < 2**63 else None
        if conv is None:
            raise ConversationNotFound("No such conversation.")
    if not owns(conv, user=user, session_key=session_key):
        raise ConversationNotFound("No such conversation.")
    return conv


def start_conversation(
    *, user=None, session_key: str | None = None, collection: Any = None, title: str = ""
) -> Conversation:
    """A new, empty conversation owned by ``user`` (or, anonymous, by ``session_key``), whose
    turns search ``collection`` (None: every collection the caller may read)."""
    authenticated = user is not None and getattr(user, "is_authenticated", False)
    if not authenticated and not session_key:
        raise InvalidOption("a conversation needs an authenticated user or a session key")
    return Conversation.objects.create(
        owner=user if authenticated else None,
        session_key="" if authenticated else session_key,
        collections=_scope(collection),
        title=clean_title(title)[:TITLE_CHARS],
    )


def rename_conversation(
    conversation: Any, title: str, *, user=None, session_key: str | None = None
) -> Conversation:
    """Set a conversation's title (``user``/``session_key`` must own it, as for
    :func:`get_conversation`). An empty title goes back to the one made from the first
    message (still empty before any turn, and then made from the first message)."""
    conv = get_conversation(conversation, user=user, session_key=session_key)
    title = clean_title(title).strip()[:TITLE_CHARS]
    if not title:
        first = conv.messages.filter(role=Message.Role.USER).order_by("pk").first()
        title = title_from_message(first.text) if first is not None else ""
    conv.title = title
    conv.save(update_fields=["title", "updated_at"])
    return conv


def owns(conv: Conversation, *, user=None, session_key: str | None = None) -> bool:
    authenticated = user is not None and getattr(user, "is_authenticated", False)
    if authenticated:
        return conv.owner_id == user.pk
    if session_key is not None:
        return conv.owner_id is None and bool(conv.session_key) and conv.session_key == session_key
    return user is None  # trusted server code passes neither


class _Turn:
    """What one turn knows before it answers; stores both messages when the answer is done."""

    def __init__(self, message, conv, user, session_key, scope, title, condensed, usage, engine):
        self.message = message
        self.conv = conv
        self.user = user
        self.session_key = session_key
        self.scope = scope
        self.title = title
        self.condensed: Condensed = condensed
        self.condense_usage: Usage = usage
        self.engine = engine

    def store(self, answer: Answer) -> ChatReply:
        usage = Usage()
        usage.add(answer.usage)
        usage.add(self.condense_usage)
        answer.usage = usage
        with transaction.atomic():
            conv = self.conv
            if conv is None:
                authenticated = self.user is not None and self.user.is_authenticated
                conv = Conversation.objects.create(
                    owner=self.user if authenticated else None,
                    session_key="" if authenticated else (self.session_key or ""),
                    collections=self.scope,
                    title=(self.title or title_from_message(self.message))[:TITLE_CHARS],
                )
            elif not conv.title:
                # A conversation started without a title takes one from its first message;
                # only while it has none (a title set meanwhile, by its owner, stays).
                title = (self.title or title_from_message(self.message))[:TITLE_CHARS]
                if Conversation.objects.filter(pk=conv.pk, title="").update(title=title):
                    conv.title = title
            user_message = Message.objects.create(
                conversation=conv,
                role=Message.Role.USER,
                text=self.message,
                token_count=estimate_tokens(self.message),
            )
            assistant = Message.objects.create(
                conversation=conv,
                role=Message.Role.ASSISTANT,
                text=answer.text,
                query=self.condensed.query,
                citations=[citation_dict(c) for c in answer.citations],
                chunk_ids=[chunk.chunk_id for chunk in answer.chunks],
                usage=usage.to_dict(),
                retrieval={
                    "engine": self.engine,
                    "condensed": self.condensed.condensed,
                    "fallback": self.condensed.fallback,
                    "collections": self.scope,
                },
                token_count=estimate_tokens(answer.text),
            )
            conv.save(update_fields=["updated_at"])
        return ChatReply(
            conv, user_message, assistant, answer, self.condensed.query, self.condensed.condensed
        )


def citation_dict(citation) -> dict[str, Any]:
    """A citation as stored and sent: the chunk reference and what a link needs."""
    chunk = citation.chunk
    return {
        "number": citation.number,
        "chunk_id": chunk.chunk_id,
        "document_id": chunk.document_id,
        "collection": chunk.collection,
        "source_id": chunk.source_id,
        "title": chunk.title,
        "filename": chunk.filename,
        "page_start": chunk.page_start,
        "page_end": chunk.page_end,
    }


def _history_prompt(turns, custom):
    """The agent's answer prompt with the conversation's recent turns in front of the question
    (``ask`` takes them as ``history=``)."""

    def prompt(question, chunks):
        system, user = answer_messages(question, chunks, prompt=custom)
        return with_history(system, user, turns)

    return prompt


def chat(
    message: str,
    *,
    conversation: Any = None,
    user: Any = None,
    session_key: str | None = None,
    llm: Any = None,
    engine: str = "ask",
    condenser: Any = "setting",
    condense_llm: Any = None,
    history_tokens: int | None = None,
    title: str | None = None,
    stream: bool = False,
    **chat_options: Unpack[ChatOptions],
) -> ChatReply | ChatStream:
    """Answer ``message`` as the next turn of ``conversation`` and store both messages.

    ``conversation`` is a :class:`~django_rag.models.Conversation` or its id (None starts one,
    owned by ``user`` or, for an anonymous visitor, by ``session_key``); a conversation the
    given ``user``/``session_key`` does not own raises
    :class:`~django_rag.exceptions.ConversationNotFound`.

    A follow-up is first condensed into a standalone query from the recent turns (``condenser``:
    ``CHAT["CONDENSER"]`` by default, with ``condense_llm`` or ``CHAT["LLM"]``; the first turn
    is not condensed, and a failing condenser falls back to the message). Retrieval and the
    answer then run as ``engine``: ``"ask"`` (:func:`~django_rag.ask`, with every option it
    takes: ``mode``, ``limit``, ``reranker``, ``ground``, ``graph``, ``prompt``, ``stream``...),
    ``"agent"`` (an :class:`~django_rag.Agent` that searches and answers) or ``"loop"`` (the
    tool-calling :class:`~django_rag.agent.loop.Loop`). The recent turns that fit
    ``history_tokens`` (``CHAT["HISTORY_TOKENS"]``; older turns are dropped) reach the answering
    model in every engine.

    Returns a :class:`ChatReply`, or with ``stream=True`` (``"ask"`` only) a
    :class:`ChatStream`. Both messages are written in one transaction once the answer is
    complete; an error before that (the LLM failing, a stream cut) stores nothing.

    ``chat_options`` are :class:`ChatOptions`: every search option (``collection``, ``mode``,
    ``limit``, ``reranker``...) and the engine's own; an option the engine does not take
    raises :class:`~django_rag.exceptions.InvalidOption` naming it.
    """
    options: dict[str, Any] = dict(chat_options)
    collection = options.pop("collection", None)
    if not isinstance(message, str) or not message.strip():
        raise InvalidInput("chat() needs a non-empty message string.")
    message = clean_query(message).strip()
    if not message:  # only NUL or invisible characters: nothing to search or answer
        raise InvalidInput("chat() needs a message with something visible in it.")
    title = clean_title(title) or None
    if engine not in ENGINES:
        raise InvalidOption(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if stream and engine != "ask":
        raise InvalidOption("stream=True works with engine='ask' only")
    if history_tokens is None:
        history_tokens = get_setting("CHAT")["HISTORY_TOKENS"]
    if (
        isinstance(history_tokens, bool)
        or not isinstance(history_tokens, int)
        or history_tokens < 0
    ):
        raise InvalidOption(f"history_tokens must be an integer >= 0, got {history_tokens!r}")
    conv = None
    if conversation is not None:
        conv = get_conversation(conversation, user=user, session_key=session_key)
    scope = _scope(collection) if collection is not None else (conv.collections if conv else None)
    turns: list[tuple[str, str]] = []
    if conv is not None and history_tokens:
        # Only the newest rows can fit the budget; a turn costs at least one token.
        rows = list(
            conv.messages.order_by("-pk").values_list("role", "text", "token_count")[
                : history_tokens + 1
            ]
        )
        turns = recent_turns(reversed(rows), history_tokens)
    cond = get_condenser(condenser, llm=condense_llm)
    with span("chat", engine=engine, turns=len(turns), stream=stream) as s:
        with collect_usage() as condense_usage:
            condensed = condense(message, turns, cond)
        s.set(condensed=condensed.condensed, fallback=condensed.fallback)
        turn = _Turn(
            message, conv, user, session_key, scope, title, condensed, condense_usage, engine
        )
        custom_prompt = options.pop("prompt", None)
        if engine == "ask":
            result = ask(
                condensed.query,
                llm=llm,
                collection=scope,
                prompt=custom_prompt,
                history=turns,
                stream=stream,
                **options,
            )
            if stream:
                return ChatStream(turn, result)
            return turn.store(result)
        if engine == "agent":
            answer_options = {k: options.pop(k) for k in AGENT_ANSWER_OPTIONS if k in options}
            agent = Agent(condensed.query, llm=llm, collection=scope, **options)
            agent.search().answer(prompt=_history_prompt(turns, custom_prompt), **answer_options)
            if agent.context.error is not None:
                raise agent.context.error
            return turn.store(agent.result)
        history = [{"role": role, "content": text} for role, text in turns]
        result = Loop(condensed.query, llm=llm, collection=scope, history=history, **options).run()
        if result.error is not None:
            raise result.error
        return turn.store(result)
