"""One model call, end to end: session → parent → prompt ids → engine → reply → store.

Shared by every client API (chat completions, responses, messages): each turns
its request into a `ChatRequest`, then `prepare` finds the session and the parent
turn and builds token-exact prompt ids, `choices` streams each choice's text as
the engine samples it, and `record` commits every choice's row (group commit)
before the caller sends the end of its answer. Nothing the client saw is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from array import array
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from sqlalchemy import Connection

from proxy.chat_request import ChatRequest
from proxy.conversation import extend_hash, parent_candidates, prefix_hashes
from proxy.engines.base import (
    Engine,
    EngineRequestError,
    EngineUnavailable,
    GenerationResult,
    InvalidSampling,
    SamplingParams,
    StreamDelta,
)
from proxy.engines.grammar import lark_error, schema_error
from proxy.errors import APIError, conflict, context_length, engine_unavailable, invalid_request, store_unavailable
from proxy.parsers import Parsers
from proxy.parsers.stream import Delta
from proxy.render import ParentTokens, Prompt, Renderer
from proxy.reply import Reply, ReplyBuilder
from proxy.seeds import derive_seed
from proxy.sessions import Caller, SessionInfo, SessionService, new_session_id
from proxy.store.db import Database, StoreUnavailable
from proxy.store.online import episode_key_hash, join_episode, supersede_resends
from proxy.store.tokens import pack_floats, pack_ints
from proxy.store.tree import Node, NodeCache, find_parent
from proxy.store.turns import record_turn, turn_recorded

if TYPE_CHECKING:
    from proxy.config import OnlineConfig

log = logging.getLogger(__name__)

OFF_LOOP_CHARS = 32_768
"""Requests with more text than this are rendered and tokenized on a worker thread."""


@dataclass
class Turn:
    """A prepared model call."""

    request: ChatRequest
    api: str
    response_id: str
    session_id: str
    new_auto_session: bool
    parent: Node | None
    prompt: Prompt
    hashes: list[str]
    params: SamplingParams
    created: int = field(default_factory=lambda: int(time.time()))
    segment: bool = False  # linked to `parent`, but its prompt ids are whole (proxy.store.tree.starts_segment)
    raw_prompt: str | list[int] | None = None  # a legacy Completions prompt as given (its messages are [])
    episode_key: str | None = None  # starts the automatic session of an X-Areal-Episode header (its key hash)


@dataclass
class ChoiceDelta:
    """Text, reasoning and finished tool calls (and the tokens behind them) a choice may stream now."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    first_call: int = 0  # the index of tool_calls[0] among the choice's calls


@dataclass
class ChoiceResult:
    index: int
    reply: Reply
    generation: GenerationResult
    completion_id: str = ""
    segment: bool = False  # the turn started a new token sequence under its parent


class CompletionService:
    def __init__(
        self,
        engine: Engine,
        renderer: Renderer,
        db: Database,
        sessions_: SessionService,
        default_max_tokens: int,
        call_grammars: bool = True,
        online: OnlineConfig | None = None,
    ) -> None:
        self.engine = engine
        self.call_grammars = call_grammars and getattr(engine, "call_grammars", False)
        self.renderer = renderer
        self.db = db
        self.sessions = sessions_
        self.default_max_tokens = default_max_tokens
        self.nodes = NodeCache()
        self.eos_ids = set(engine.info.eos_token_ids)
        self.online = online if online is not None and online.enabled else None
        self.calls_in_flight: dict[str, int] = {}  # session id → calls being generated (this replica)

    async def _open(self, session_id: str) -> bool:
        try:
            return (await self.sessions.get(session_id)).status == "open"
        except APIError:  # gone from the store: nothing to continue
            return False

    # -- prepare --------------------------------------------------------------------
    async def prepare(self, caller: Caller, request: ChatRequest, api: str, id_prefix: str) -> Turn:
        session: SessionInfo | None = await self.sessions.for_model_call(caller)
        episode_key = episode_key_hash(caller.episode) if session is None and caller.episode else None
        if episode_key is not None:
            session = await self.sessions.episode(episode_key)  # None: the episode starts with this call
        hashes = prefix_hashes(request.messages)
        candidates = parent_candidates(request.messages, hashes)
        if episode_key is not None and session is None:
            parent = None  # a new episode is a new tree, even when it goes on from an older conversation
        else:
            parent = await find_parent(self.db, self.nodes, candidates, session.id if session else None, self.eos_ids)
        if parent is not None and parent.auto and self.online is not None and not await self._open(parent.session_id):
            # Online, an automatic episode that ended (idle, rewarded or dropped) takes no more turns: the
            # conversation goes on as the root of a new episode, its prompt rendered whole.
            parent = None
        parent_tokens = None
        if parent is not None:
            parent_tokens = ParentTokens(
                full_ids=list(parent.full_ids),
                num_messages=parent.num_messages,
                ended_with_eos=parent.ended_with_eos,
                reasoning=parent.reasoning,
            )
        forced, call_grammar = self._required_call(request)
        render = partial(
            self.renderer.prompt, request.messages, request.tools, parent_tokens, forced, request.reasoning
        )
        # Rendering and tokenizing a long conversation takes milliseconds per 10 KB: off the event
        # loop, which meanwhile streams every other client's tokens.
        prompt = await asyncio.to_thread(render) if request.text_size() > OFF_LOOP_CHARS else render()
        # A parent whose ids the new prompt does not extend (the template re-rendered the history)
        # stays linked in the tree: the turn starts a new token sequence under it.
        segment = parent is not None and not prompt.parent_used
        if session is not None:
            session_id, new_auto = session.id, False
        elif parent is not None:
            session_id, new_auto = parent.session_id, False
        else:
            session_id, new_auto = new_session_id(), True
        return Turn(
            request=request,
            api=api,
            response_id=id_prefix + secrets.token_hex(12),
            session_id=session_id,
            new_auto_session=new_auto,
            episode_key=episode_key if new_auto else None,
            parent=parent,
            prompt=prompt,
            segment=segment,
            hashes=hashes,
            params=self._sampling(request, prompt.ids, session, call_grammar),
        )

    async def prepare_raw(
        self, caller: Caller, request: ChatRequest, prompt: str | list[int], add_special_tokens: bool, id_prefix: str
    ) -> Turn:
        """A legacy Completions turn: `prompt` is text, tokenized as is (no chat template), or token ids
        used as given. It is a root of its session's tree, under a chain hash of its ids that no chat
        conversation reaches, so no later chat turn continues it."""
        session: SessionInfo | None = await self.sessions.for_model_call(caller)
        if isinstance(prompt, str):
            encode = partial(self.renderer.tokenizer.encode, prompt, add_special_tokens=add_special_tokens)
            ids = await asyncio.to_thread(encode) if len(prompt) > OFF_LOOP_CHARS else encode()
        else:
            ids = list(prompt)
            vocab = len(self.renderer.tokenizer)
            if ids and max(ids) >= vocab:
                raise invalid_request(f"prompt token id {max(ids)} is outside the vocabulary of {vocab}", "prompt")
        if not ids:
            raise invalid_request("the prompt is empty", "prompt")
        try:
            params = self._sampling(request, ids, session)
        except APIError as exc:  # the context check names chat's messages: here it is the prompt or max_tokens
            exc.param = "prompt" if len(ids) >= self.engine.info.max_context else "max_tokens"
            raise
        digest = hashlib.blake2b(array("i", ids).tobytes(), digest_size=16).hexdigest()
        return Turn(
            request=request,
            api="completions",
            response_id=id_prefix + secrets.token_hex(12),
            session_id=session.id if session else new_session_id(),
            new_auto_session=session is None,
            parent=None,
            prompt=Prompt(ids=ids, new_ids=ids, parent_used=False),
            hashes=[f"prompt:{digest}"],
            params=params,
            raw_prompt=prompt,
        )

    async def count_prompt_tokens(self, caller: Caller, request: ChatRequest) -> int:
        """The length of the prompt `prepare` builds for `request` as a new root (no continuation of a
        parent): a client's token count. The caller is checked as for a model call; nothing is stored."""
        await self.sessions.for_model_call(caller)
        forced, _ = self._required_call(request)
        render = partial(self.renderer.prompt, request.messages, request.tools, None, forced, request.reasoning)
        prompt = await asyncio.to_thread(render) if request.text_size() > OFF_LOOP_CHARS else render()
        return len(prompt.ids)

    def _required_call(self, request: ChatRequest) -> tuple[str, str | None]:
        """The reply's forced opening and grammar for `tool_choice` required or named. A tool whose
        parameters schema llguidance cannot enforce (or an engine that takes no grammar, or
        `[engine] tool_call_grammar = false`) gets the call's opening only: the model writes the
        rest itself."""
        fmt = self.renderer.parsers.tool_format
        forced, call_grammar = request.required_call(fmt, self.call_grammars)
        if call_grammar is not None and lark_error(call_grammar) is not None:
            log.info("tool_choice not enforced by a grammar: %s", lark_error(call_grammar))
            forced, call_grammar = request.required_call(fmt, False)
        return forced, call_grammar

    def _sampling(
        self, request: ChatRequest, prompt_ids: list[int], session: SessionInfo | None, call_grammar: str | None = None
    ) -> SamplingParams:
        session_seed = session.seed if session else None
        prompt_len = len(prompt_ids)
        room = self.engine.info.max_context - prompt_len
        if room < 1:
            raise context_length(
                f"the prompt is {prompt_len} tokens, which fills the model's context of "
                f"{self.engine.info.max_context} tokens"
            )
        max_tokens = request.max_tokens
        if max_tokens is not None and max_tokens > room and request.clamp_max_tokens:
            max_tokens = room  # the reply ends at the context, finish reason length
        elif max_tokens is not None and max_tokens > room:
            raise context_length(
                f"max_tokens {request.max_tokens} + prompt {prompt_len} tokens exceeds the model's context "
                f"of {self.engine.info.max_context} tokens"
            )
        reply_schema = request.reply_schema()
        if request.json_schema is not None:
            error = schema_error(request.json_schema)  # compiled now: a refused schema is a 400, not a failed choice
            if error is not None:
                raise invalid_request(f"the JSON schema is not supported: {error}", "response_format")
        return SamplingParams(
            max_new_tokens=max_tokens or min(self.default_max_tokens, room),
            temperature=request.temperature if session is None or session.temperature is None else session.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            seed=request.seed
            if request.seed is not None or session_seed is None
            else derive_seed(session_seed, prompt_ids),
            stop=tuple(request.stop),
            ignore_eos=request.ignore_eos,
            top_logprobs=request.top_logprobs if request.logprobs else 0,
            json_schema=reply_schema,
            grammar=call_grammar,
        )

    # -- generate -------------------------------------------------------------------
    async def _choice(self, turn: Turn, index: int, out: asyncio.Queue) -> ChoiceResult:
        params = turn.params
        if params.seed is not None and index:
            seed = params.seed + index  # choice i of a seeded request: seed + i, wrapped into a generator's range
            params = SamplingParams(**{**params.__dict__, "seed": seed - 2**64 if seed >= 2**64 else seed})
        request = turn.request
        builder = ReplyBuilder(
            self.renderer.tokenizer,
            request.stop,
            request.tool_names,
            turn.prompt.forced_prefix,
            # a legacy completion's text is the model's raw continuation: no reasoning or call parsing
            self.renderer.parsers if turn.raw_prompt is None else Parsers.default(),
            turn.prompt.reasoning_open,
        )
        result = GenerationResult()
        try:
            stream = self.engine.stream(
                turn.prompt.ids,
                params,
                request_id=f"{turn.response_id}-{index}",
                affinity=turn.session_id,
                incremental=out is not None,
            )
            async for delta in stream:
                result.extend(delta)
                calls_before = len(builder.out.calls)
                piece = builder.feed(delta.token_ids) if delta.token_ids else None
                if out is not None and (piece or request.logprobs):
                    await out.put(_choice_delta(index, piece, calls_before, delta))
        except EngineUnavailable as exc:
            raise engine_unavailable(f"the inference engine is unavailable: {exc}") from None
        except InvalidSampling as exc:
            raise invalid_request(str(exc), exc.param) from None
        except EngineRequestError as exc:
            raise context_length(str(exc)) from None
        if result.finish_reason == "abort":
            raise engine_unavailable(f"the engine aborted the request: {result.abort_message or 'no reason given'}")
        calls_before = len(builder.out.calls)
        rest, reply = builder.finish(result.finish_reason)
        if rest and out is not None:
            await out.put(_choice_delta(index, rest, calls_before, None))
        return ChoiceResult(index=index, reply=reply, generation=result, segment=turn.segment)

    async def run(self, turn: Turn) -> list[ChoiceResult]:
        """Generate every choice (batched together by the engine) and record them.

        Cancelled (the client hung up) while generating, nothing is recorded; once every choice
        is generated, the turn is recorded even if the caller is cancelled meanwhile (the shield):
        a turn is stored if and only if its generation finished.
        """
        with self._in_flight(turn.session_id):
            if turn.request.n == 1:  # most calls: no task of its own
                results = [await self._choice(turn, 0, None)]
            else:
                results = await asyncio.gather(*(self._choice(turn, i, None) for i in range(turn.request.n)))
            await asyncio.shield(self.record(turn, list(results)))
        return list(results)

    @contextlib.contextmanager
    def _in_flight(self, session_id: str) -> Iterator[None]:
        """Count the session's calls being generated: the online sweeper never ends an episode under one."""
        self.calls_in_flight[session_id] = self.calls_in_flight.get(session_id, 0) + 1
        try:
            yield
        finally:
            left = self.calls_in_flight.pop(session_id) - 1
            if left:
                self.calls_in_flight[session_id] = left

    def busy(self, session_id: str) -> bool:
        return session_id in self.calls_in_flight

    async def stream(self, turn: Turn) -> AsyncIterator[ChoiceDelta | list[ChoiceResult]]:
        """Yield choice deltas as produced; the last item is the recorded results."""
        with self._in_flight(turn.session_id):
            async for item in self._stream(turn):
                yield item

    async def _stream(self, turn: Turn) -> AsyncIterator[ChoiceDelta | list[ChoiceResult]]:
        queue: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.create_task(self._choice(turn, i, queue)) for i in range(turn.request.n)]
        waiter = asyncio.gather(*tasks)

        def finished(done: asyncio.Future) -> None:
            if not done.cancelled():
                done.exception()  # seen here, so a hang-up's cancellation is not logged as never retrieved
            queue.put_nowait(None)

        waiter.add_done_callback(finished)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                yield item
            results = waiter.result()  # raises the first choice's error
        finally:
            for task in tasks:
                task.cancel()
        await asyncio.shield(self.record(turn, list(results)))  # as in `run`
        yield list(results)

    # -- record ---------------------------------------------------------------------
    async def record(self, turn: Turn, results: list[ChoiceResult]) -> None:
        now = time.time()
        rows = []
        nodes = []
        depth = turn.parent.depth + 1 if turn.parent else 0
        num_messages = len(turn.request.messages)
        new_messages = turn.request.messages[turn.parent.num_messages :] if turn.parent else turn.request.messages
        request_json = {
            "messages": new_messages,
            "num_messages": num_messages,
            "tools": turn.request.tools,
            "sampling": turn.request.sampling(),
            "model": turn.request.model,
        }
        if turn.raw_prompt is not None:
            request_json["prompt"] = turn.raw_prompt
        versions: list[int] = []
        for r in results:
            r.completion_id = turn.response_id if r.index == 0 else f"{turn.response_id}-{r.index}"
            message = r.reply.message()
            chain_hash = extend_hash(turn.hashes[-1], message)
            g = r.generation
            versions.extend(g.versions)
            rows.append(
                {
                    "id": r.completion_id,
                    "session_id": turn.session_id,
                    "parent_id": turn.parent.id if turn.parent else None,
                    "response_id": turn.response_id,
                    "choice_index": r.index,
                    "api": turn.api,
                    "depth": depth,
                    "chain_hash": chain_hash,
                    "request": request_json,
                    "response": message,
                    "prompt_ids": pack_ints(turn.prompt.new_ids),
                    "prompt_len": len(turn.prompt.ids),
                    "output_ids": pack_ints(g.output_ids),
                    "output_logprobs": pack_floats(g.logprobs),
                    "output_versions": pack_ints(g.versions),
                    "finish_reason": r.reply.finish_reason,
                    "temperature": turn.params.temperature,
                    "created_at": now,
                    "request_hash": turn.hashes[-1],
                }
            )
            full = array("i", turn.prompt.ids)
            full.extend(g.output_ids)
            nodes.append(
                (
                    chain_hash,
                    Node(
                        id=r.completion_id,
                        session_id=turn.session_id,
                        auto=turn.new_auto_session or (turn.parent.auto if turn.parent else False),
                        depth=depth,
                        num_messages=num_messages + 1,
                        full_ids=full,
                        ended_with_eos=self.renderer.ends_with_eos(g.output_ids),
                        reasoning=r.reply.reasoning or "",
                    ),
                )
            )
        span = (min(versions), max(versions)) if versions else None
        resend_window = self.online.resend_window_s if self.online is not None else 0.0
        try:
            await self.db.write(
                lambda conn: _insert_turn(conn, turn, rows, now, span, resend_window),
                recorded=lambda conn: turn_recorded(conn, turn.response_id),
            )
        except StoreUnavailable as exc:  # an APIError, so that a stream ends with an error event
            raise store_unavailable(str(exc)) from exc
        except APIError:
            self.sessions.forget(turn.session_id)  # closed elsewhere (another replica): the cache was stale
            raise
        for chain_hash, node in nodes:
            node.session_id = turn.session_id  # an episode another call started meanwhile: that session
            self.nodes.put(chain_hash, node)


def _choice_delta(index: int, piece: Delta | None, first_call: int, tokens: StreamDelta | None) -> ChoiceDelta:
    piece = piece or Delta()
    return ChoiceDelta(
        index,
        piece.content,
        tokens.token_ids if tokens else [],
        tokens.logprobs if tokens else [],
        tokens.top_logprobs if tokens else None,
        piece.reasoning,
        piece.calls,
        first_call,
    )


def _insert_turn(
    conn: Connection, turn: Turn, rows: list[dict], now: float, versions: tuple[int, int] | None, resend_window: float
) -> None:
    new_auto = turn.new_auto_session
    if turn.episode_key is not None:
        # The first call of an episode header creates its session, unless a concurrent one (on any
        # replica) did: then this turn joins that one.
        turn.session_id = join_episode(conn, turn.session_id, turn.episode_key, now)
        for row in rows:
            row["session_id"] = turn.session_id
        new_auto = False
    if resend_window > 0:
        # A client that timed out sent this request again: the answer it never got is superseded.
        named = turn.session_id if (turn.parent is not None or not new_auto) else None
        supersede_resends(
            conn,
            request_hash=turn.hashes[-1],
            parent_id=turn.parent.id if turn.parent else None,
            session_id=named,
            since=now - resend_window,
            by=rows[0]["id"],
        )
    # A named session takes completions only while open, whichever replica closed it meanwhile;
    # raising rolls this turn's rows back.
    if not record_turn(conn, turn.session_id, rows, now, versions, new_auto_session=new_auto):
        raise conflict(f"session {turn.session_id} was closed while this call ran; its answer is not recorded")


__all__ = ["APIError", "ChoiceDelta", "ChoiceResult", "CompletionService", "Turn"]
