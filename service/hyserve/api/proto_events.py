"""Engine events -> the GenerateResponse messages of a Generate stream. For chat input the answer's
text goes through the task's `ChatOutput`, so Delta.text carries only content and the reasoning
and tool calls travel in their own fields."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from hyserve.api.chat_output import ChatOutput, ChatPiece, ParsedCall
from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.engine.task import (
    AcceptedEvent,
    DeltaEvent,
    Event,
    FinishedEvent,
    FinishReason,
    ReuseSource,
)

__all__ = ["ProtoEvents", "ended_with_calls"]

_REUSE = {
    ReuseSource.NONE: pb.REUSE_SOURCE_NONE,
    ReuseSource.SLOT_LIVE: pb.REUSE_SOURCE_SLOT_LIVE,
    ReuseSource.CHECKPOINT: pb.REUSE_SOURCE_CHECKPOINT,
    ReuseSource.PREFIX_STORE: pb.REUSE_SOURCE_PREFIX_STORE,
}
_TIER = {
    "memory": pb.STORE_TIER_MEMORY,
    "disk": pb.STORE_TIER_DISK,
    "shared": pb.STORE_TIER_SHARED,
}
_FINISH = {
    FinishReason.EOS: pb.FINISH_REASON_EOS,
    FinishReason.STOP_STRING: pb.FINISH_REASON_STOP_STRING,
    FinishReason.STOP_TOKEN: pb.FINISH_REASON_STOP_TOKEN,
    FinishReason.MAX_TOKENS: pb.FINISH_REASON_MAX_TOKENS,
    FinishReason.CONTEXT_FULL: pb.FINISH_REASON_CONTEXT_FULL,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
}
# an answer that ended by itself after calls ended *with* them; one cut short did not
_NATURAL_ENDS = frozenset({FinishReason.EOS, FinishReason.STOP_STRING, FinishReason.STOP_TOKEN})


def ended_with_calls(reason: FinishReason, calls: tuple[ParsedCall, ...]) -> bool:
    return bool(calls) and reason in _NATURAL_ENDS


def _tool_call_deltas(piece: ChatPiece) -> list[pb.ToolCallDelta]:
    return [
        pb.ToolCallDelta(index=c.index, id=c.id, name=c.name, arguments_fragment=c.arguments) for c in piece.tool_calls
    ]


class ProtoEvents:
    """One Generate stream's conversion; `output` is None for text and token input (text as is)."""

    def __init__(self, token_bytes: Callable[[int], bytes], output: ChatOutput | None) -> None:
        self.token_bytes = token_bytes
        self.output = output

    def responses(self, event: Event) -> Iterator[pb.GenerateResponse]:
        if isinstance(event, AcceptedEvent):
            yield pb.GenerateResponse(
                accepted=pb.Accepted(
                    task_id=event.task_id,
                    slot_index=event.slot_index,
                    prompt_tokens=event.prompt_tokens,
                    reused_tokens=event.reused_tokens,
                    reuse_source=_REUSE[event.reuse_source],
                    matched_tokens=event.matched_tokens,
                    reprocess_reason=event.reprocess_reason,
                    store_tier=_TIER.get(event.store_tier, pb.STORE_TIER_UNSPECIFIED),
                )
            )
        elif isinstance(event, DeltaEvent):
            yield pb.GenerateResponse(delta=self._delta(event))
        elif isinstance(event, FinishedEvent):
            calls: tuple[ParsedCall, ...] = ()
            if self.output is not None:
                tail, calls = self.output.finish()
                if tail:
                    yield pb.GenerateResponse(delta=self._piece(pb.Delta(), tail))
            yield pb.GenerateResponse(finished=self._finished(event, calls))
        else:
            raise TypeError(f"unexpected event {event!r}")

    def _piece(self, delta: pb.Delta, piece: ChatPiece) -> pb.Delta:
        delta.text, delta.reasoning = piece.content, piece.reasoning
        delta.tool_calls.extend(_tool_call_deltas(piece))
        return delta

    def _delta(self, event: DeltaEvent) -> pb.Delta:
        piece = self.token_bytes
        logprobs = [
            pb.TokenLogprob(
                token_id=lp.token_id,
                logprob=lp.logprob,
                piece=piece(lp.token_id),
                top_logprobs=[pb.TopLogprob(token_id=t, logprob=v, piece=piece(t)) for t, v in lp.top],
            )
            for lp in event.logprobs
        ]
        delta = pb.Delta(token_ids=event.token_ids, logprobs=logprobs)
        if self.output is None:
            delta.text = event.text
            return delta
        return self._piece(delta, self.output.push(event.text))

    @staticmethod
    def _finished(event: FinishedEvent, calls: tuple[ParsedCall, ...]) -> pb.Finished:
        u, t = event.usage, event.timings
        reason = pb.FINISH_REASON_TOOL_CALLS if ended_with_calls(event.reason, calls) else _FINISH[event.reason]
        finished = pb.Finished(
            reason=reason,
            stop_string=event.stop_string,
            usage=pb.Usage(
                prompt_tokens=u.prompt_tokens,
                cached_prompt_tokens=u.cached_prompt_tokens,
                processed_prompt_tokens=u.processed_prompt_tokens,
                completion_tokens=u.completion_tokens,
                draft_tokens=u.draft_tokens,
                accepted_draft_tokens=u.accepted_draft_tokens,
            ),
            timings=pb.Timings(
                queue_ms=t.queue_ms,
                prompt_ms=t.prompt_ms,
                generation_ms=t.generation_ms,
                time_to_first_token_ms=t.time_to_first_token_ms,
            ),
            tool_calls=[pb.ToolCall(id=c.id, name=c.name, arguments_json=c.arguments_json) for c in calls],
        )
        if event.stop_token_id is not None:
            finished.stop_token_id = event.stop_token_id
        return finished
