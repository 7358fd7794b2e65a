"""The OpenAI wire format of `rltbench serve`: request validation and response bodies.

Accepted fields are listed per endpoint; anything else is refused with 400 naming the field, so a
client never silently gets something other than what it asked for. Decoding is greedy only:
`temperature` must be 0 or absent (absent means greedy here, unlike OpenAI's default of 1), and the
sampling knobs that greedy decoding ignores are accepted only at their neutral values. vLLM's
extensions that rltbench's own clients and peer benchmark clients send are accepted: `ignore_eos`,
`return_token_ids`, `stop_token_ids`, `stream_options.continuous_usage_stats`.

Chat template (documented in docs/serve.md): ChatML, which Ouro's checkpoints use,
    <|im_start|>{role}\n{content}<|im_end|>\n  for each message, then  <|im_start|>assistant\n
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_TURN = "<|im_start|>{role}\n{content}<|im_end|>\n"
CHAT_REPLY = "<|im_start|>assistant\n"
CHAT_END = "<|im_end|>"
CHAT_ROLES = ("system", "developer", "user", "assistant")

COMMON_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "n",
        "stream",
        "stream_options",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "return_token_ids",
        "seed",
        "user",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logprobs",
        "logit_bias",
        "min_tokens",
        "best_of",
    }
)
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "echo", "suffix"}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "top_logprobs"}
# field -> values that mean "as greedy decoding does anyway"
NEUTRAL = {
    "top_p": (1, 1.0),
    "top_k": (-1, 0),
    "n": (1,),
    "best_of": (1,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "min_tokens": (0,),
    "echo": (False,),
    "suffix": ("",),
}


class ApiError(Exception):
    """A request the server refuses; rendered as {"error": {message, type, code, param}}."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    @property
    def type(self) -> str:
        if self.status == 404:
            return "not_found_error"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, code, param)


@dataclass(frozen=True)
class ServedModel:
    """What requests are checked against."""

    name: str
    max_model_len: int
    vocab_size: int
    codec: Any = None  # rltbench.textcodec.TextCodec or None (token-id prompts only)
    tokenizer_hint: str = "start the server with --tokenizer PATH (or fallback, or ids)"


@dataclass(frozen=True)
class GenRequest:
    """A validated generation request."""

    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_fields(body: Mapping[str, Any], allowed: frozenset[str], endpoint: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(
            f"unsupported parameter(s) for {endpoint}: {', '.join(unknown)} "
            f"(accepted: {', '.join(sorted(allowed))})",
            unknown[0],
            "unsupported_parameter",
        )
    temp = body.get("temperature")
    if temp is not None and (isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp != 0):
        raise bad(
            f"greedy decoding only: temperature must be 0 or absent, got {temp!r}",
            "temperature",
            "unsupported_value",
        )
    for name, ok in NEUTRAL.items():
        v = body.get(name)
        if v is not None and (
            isinstance(v, bool) and not any(isinstance(o, bool) for o in ok) or v not in ok
        ):
            raise bad(
                f"unsupported {name}={v!r}: greedy decoding only supports {name} in "
                f"{', '.join(map(repr, ok))} or absent",
                name,
                "unsupported_value",
            )
    if body.get("logit_bias"):
        raise bad("logit_bias is not supported (greedy decoding only)", "logit_bias", "unsupported_value")


def _check_model(body: Mapping[str, Any], served: ServedModel) -> None:
    model = body.get("model")
    if model is not None and model != served.name:
        raise ApiError(
            404,
            f"model {model!r} does not exist; this server serves {served.name!r} "
            "(one model and arm per server)",
            "model_not_found",
            "model",
        )


def _need_codec(served: ServedModel, what: str) -> Any:
    if served.codec is None:
        raise bad(
            f"{what} need a tokenizer and this server has none; send token ids "
            f"(prompt: [int, ...]) or {served.tokenizer_hint}",
            None,
            "tokenizer_required",
        )
    return served.codec


def _prompt_ids(prompt: Any, served: ServedModel) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt is empty", "prompt")
        return list(_need_codec(served, "text prompts").encode(prompt))
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        lo, hi = min(prompt), max(prompt)
        if lo < 0 or hi >= served.vocab_size:
            raise bad(
                f"prompt token id {lo if lo < 0 else hi} outside the vocabulary [0, {served.vocab_size})",
                "prompt",
            )
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad(f"one prompt per request, got a batch of {len(prompt)}", "prompt")
    raise bad("prompt must be a non-empty string or a non-empty list of token ids", "prompt")


def _chat_text(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {role, content}", "messages")
    parts = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in CHAT_ROLES:
            raise bad(f"messages[{i}]: role must be one of {', '.join(CHAT_ROLES)}", "messages")
        content = msg.get("content")
        if isinstance(content, list):
            if not all(
                isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str)
                for c in content
            ):
                raise bad(f"messages[{i}]: only text content parts are supported", "messages")
            content = "".join(c["text"] for c in content)
        if not isinstance(content, str):
            raise bad(f"messages[{i}]: content must be a string or a list of text parts", "messages")
        parts.append(CHAT_TURN.format(role=msg["role"], content=content))
    return "".join(parts) + CHAT_REPLY


def parse_request(body: Any, served: ServedModel, chat: bool) -> GenRequest:
    """Validate a /v1/completions (chat=False) or /v1/chat/completions body; ApiError if refused."""
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_json")
    _check_fields(body, CHAT_FIELDS if chat else COMPLETION_FIELDS, endpoint)
    _check_model(body, served)
    if chat:
        if "messages" not in body:
            raise bad("messages is required", "messages")
        text = _chat_text(body["messages"])
        prompt = list(_need_codec(served, "chat completions").encode(text))
    else:
        if "prompt" not in body:
            raise bad("prompt is required", "prompt")
        prompt = _prompt_ids(body["prompt"], served)
    ctx = served.max_model_len
    if len(prompt) >= ctx:
        raise bad(
            f"prompt of {len(prompt)} tokens is too long: the context is {ctx} tokens (prompt + "
            "max_tokens must fit)",
            "prompt",
            "context_length_exceeded",
        )
    max_key = (
        "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    )
    max_tokens = body.get(max_key)
    if max_tokens is None:
        max_tokens = ctx - len(prompt) if chat else COMPLETION_DEFAULT_MAX_TOKENS
    elif not _is_int(max_tokens) or max_tokens < 1:
        raise bad(f"{max_key} must be an integer >= 1, got {max_tokens!r}", max_key)
    if len(prompt) + max_tokens > ctx:
        raise bad(
            f"prompt of {len(prompt)} tokens + {max_key} {max_tokens} = {len(prompt) + max_tokens} "
            f"exceeds the context of {ctx} tokens",
            max_key,
            "context_length_exceeded",
        )
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad("stop must be a non-empty string or a list of them", "stop")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(_is_int(t) and 0 <= t < served.vocab_size for t in stop_ids):
        raise bad(f"stop_token_ids must be a list of token ids in [0, {served.vocab_size})", "stop_token_ids")
    if stop:
        codec = _need_codec(served, "stop strings")
        stop_ids = stop_ids + [t for t in (codec.token_id(s) for s in stop) if t is not None]
    if chat and served.codec is not None and served.codec.token_id(CHAT_END) is not None:
        stop_ids.append(served.codec.token_id(CHAT_END))
    flags = {}
    for name in ("stream", "ignore_eos", "return_token_ids"):
        v = body.get(name)
        if v is not None and not isinstance(v, bool):
            raise bad(f"{name} must be true or false, got {v!r}", name)
        flags[name] = bool(v)
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"}:
        raise bad("stream_options accepts include_usage and continuous_usage_stats", "stream_options")
    if opts and not flags["stream"]:
        raise bad("stream_options needs stream: true", "stream_options")
    if body.get("seed") is not None and not _is_int(body["seed"]):
        raise bad("seed must be an integer (greedy decoding ignores it)", "seed")
    return GenRequest(
        chat=chat,
        prompt_ids=prompt,
        max_tokens=int(max_tokens),
        stop=tuple(stop),
        stop_token_ids=tuple(sorted(set(stop_ids))),
        ignore_eos=flags["ignore_eos"],
        stream=flags["stream"],
        include_usage=bool(opts.get("include_usage")),
        continuous_usage=bool(opts.get("continuous_usage_stats")),
        return_token_ids=flags["return_token_ids"],
    )


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI usage; `prompt_tokens_details.cached_tokens` = prompt tokens served by the prefix cache."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class ResponseShape:
    """Bodies and stream chunks of one request, completion or chat, in OpenAI's format."""

    def __init__(self, request_id: str, model: str, req: GenRequest) -> None:
        self.id = request_id
        self.model = model
        self.req = req
        self.created = int(time.time())
        self.sent_role = False  # chat streams name the role in their first delta only

    def _choice(
        self, text: str, token_ids: list[int] | None, finish_reason: str | None, stream: bool
    ) -> dict[str, Any]:
        if self.req.chat:
            key = "delta" if stream else "message"
            choice: dict[str, Any] = {"index": 0, key: {"role": "assistant", "content": text}}
            if stream and self.sent_role:
                choice[key] = {"content": text}
            choice.update(logprobs=None, finish_reason=finish_reason)
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if token_ids is not None and self.req.return_token_ids:
            choice["token_ids"] = token_ids
        return choice

    def _body(
        self, choices: list[dict[str, Any]], stream: bool, usage_now: dict[str, int] | None
    ) -> dict[str, Any]:
        kind = (
            ("chat.completion.chunk" if stream else "chat.completion") if self.req.chat else "text_completion"
        )
        body: dict[str, Any] = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage_now is not None:
            body["usage"] = usage_now
        return body

    def chunk(
        self,
        text: str,
        token_ids: list[int] | None,
        finish_reason: str | None,
        usage_now: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One streamed event; `usage_now` with stream_options.continuous_usage_stats."""
        body = self._body([self._choice(text, token_ids, finish_reason, True)], True, usage_now)
        self.sent_role = True
        return body

    def usage_chunk(self, usage_now: dict[str, Any]) -> dict[str, Any]:
        """The last event before [DONE] with stream_options.include_usage (no choices, as OpenAI)."""
        return self._body([], True, usage_now)

    def full(
        self, text: str, token_ids: list[int], finish_reason: str | None, usage_now: dict[str, Any]
    ) -> dict[str, Any]:
        """The non-streamed answer."""
        choice = self._choice(text, token_ids, finish_reason, False)
        body = self._body([choice], False, usage_now)
        if self.req.return_token_ids:
            body["prompt_token_ids"] = self.req.prompt_ids
        return body
