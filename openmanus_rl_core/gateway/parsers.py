"""Tool calls and reasoning in a reply, in the format of the model's family.

A model writes a tool call, and its reasoning, the way its chat template taught it. A :class:`ToolParser` reads one
family's calls back (``parse(text, tools) -> (content, calls)``, calls in OpenAI's shape), writes one
(``write(name, arguments)``: the exact text the family's template renders for an assistant's call), and gives the
text around one call's arguments (``wrapper(name) -> (prefix, suffix)``) so a grammar can make the model produce
the family's format. A :class:`ReasoningParser` splits the reasoning out of a reply (``split(text) -> (reasoning,
content)``). Both are chosen by name (``agent.tool_parser`` / ``agent.reasoning_parser``) or, when unset, found
from the chat template's text (:func:`tool_parser_for`, :func:`reasoning_parser_for`).

Tool parsers (:data:`TOOL_PARSERS`):

- ``hermes``: Hermes, Qwen2.5, Qwen3 (and the embedded default): ``<tool_call>\\n{"name": n, "arguments": {..}}
  \\n</tool_call>``;
- ``qwen3_coder``: ``<tool_call>\\n<function=n>\\n<parameter=p>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>``;
- ``llama3_json``: Llama 3.x: ``{"name": n, "parameters": {..}}``, optionally after ``<|python_tag|>``;
- ``mistral``: ``[TOOL_CALLS][{"name": n, "arguments": {..}}]``; ``mistral_args``: the newer
  ``[TOOL_CALLS]n[ARGS]{..}`` (each reads both);
- ``deepseek_v3``: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>n\\n```json\\n{..}\\n```
  <｜tool▁call▁end｜><｜tool▁calls▁end｜>``; ``deepseek_v31``: ``...<｜tool▁call▁begin｜>n<｜tool▁sep｜>{..}...``
  (each reads both);
- ``harmony``: gpt-oss: ``<|start|>assistant to=functions.n<|channel|>commentary json<|message|>{..}<|call|>``.

Reasoning parsers are in :mod:`openmanus_rl_core.gateway.reasoning`.

Parsers read text decoded WITH its special tokens (``[TOOL_CALLS]``, ``<|python_tag|>`` and harmony's markers are
special tokens): :func:`openmanus_rl_core.gateway.tools.reply_text`. A call the parser cannot read stays in the content: the agent sees what the
model wrote.
"""

from __future__ import annotations

import difflib
import json
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ToolParser", "TOOL_PARSERS", "tool_parser_for", "detect_tool_parser", "openai_call"]


def openai_call(name: str, arguments: Any) -> dict:
    """One call in OpenAI's shape: ``{"id", "type": "function", "function": {"name", "arguments": JSON text}}``."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": args}}


def _call_args(obj: Any) -> tuple[str, Any] | None:
    """``(name, arguments)`` of a JSON call object ``{"name", "arguments" | "parameters"}``; None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI's API carries them
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return (obj["name"], args) if isinstance(args, dict) else None


def _dumps(obj: Any) -> str:
    """JSON as chat templates' ``tojson`` writes it (``", "`` and ``": "`` separators, non-ASCII kept)."""
    return json.dumps(obj, ensure_ascii=False)


class ToolParser:
    """One family's tool-call format (see the module doc).

    - ``parse(text, tools=None) -> (content, calls)``: the reply's text outside its calls (stripped) and the calls
      in OpenAI's shape; ``tools`` (the request's) lets a format whose values are untyped text (``qwen3_coder``)
      give each argument its schema's type.
    - ``write(name, arguments) -> str``: the text of one call as the family writes it; ``parse(write(n, a))`` gives
      back ``[(n, a)]``.
    - ``wrapper(name) -> (prefix, suffix)``: the text around one call's arguments; with ``arguments_json`` the
      arguments between them are one JSON object (what a grammar constrains), else the family's own text.
    - ``tool_prompt(tools) -> str``: the tools and the call format as system-prompt text, for a chat template that
      does not render tools.
    - ``call_format``: for a family whose call is one JSON object ``{"name": n, <arguments_key>: {..}}``, the text
      around it: ``prefix`` / ``suffix`` around each call, ``separator`` between calls, ``opening`` / ``closing``
      around them all (the fields of the grammar's ``ToolCallFormat``); None for a family that writes the name
      outside the JSON (use ``wrapper``).
    """

    name = ""
    arguments_json = True
    separator = "\n"  # between two calls of one reply
    call_format: dict[str, str] | None = None

    def parse(self, text: str, tools: list | None = None) -> tuple[str, list[dict]]:
        raise NotImplementedError

    def wrapper(self, name: str) -> tuple[str, str]:
        raise NotImplementedError

    def write(self, name: str, arguments: dict) -> str:
        prefix, suffix = self.wrapper(name)
        return prefix + _dumps(arguments) + suffix

    def write_calls(self, calls: Sequence[tuple[str, dict]]) -> str:
        return self.separator.join(self.write(n, a) for n, a in calls)

    def tool_prompt(self, tools: list[dict]) -> str:
        lines = "\n".join(_dumps(t) for t in tools)
        first = tools[0].get("function", tools[0]) if tools else {}
        example = self.write(str(first.get("name", "tool")),
                             {p: "..." for p in ((first.get("parameters") or {}).get("properties") or {})})
        return (f"# Tools\n\nYou may call the functions below; their signatures, as JSON, are within <tools></tools>:"
                f"\n<tools>\n{lines}\n</tools>\n\nTo call one, reply in exactly this format:\n{example}")


class HermesParser(ToolParser):
    name = "hermes"
    call_format = {"prefix": "<tool_call>\n", "suffix": "\n</tool_call>", "separator": "\n",
                   "arguments_key": "arguments", "opening": "", "closing": ""}
    _BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)

    def parse(self, text: str, tools: list | None = None) -> tuple[str, list[dict]]:
        calls: list[dict] = []

        def take(match: re.Match) -> str:
            try:
                found = _call_args(json.loads(match.group(1)))
            except json.JSONDecodeError:
                found = None
            if found is None:
                return match.group(0)
            calls.append(openai_call(*found))
            return ""

        rest = self._BLOCK.sub(take, text)
        return rest.strip(), calls

    def wrapper(self, name: str) -> tuple[str, str]:
        return f'<tool_call>\n{{"name": {_dumps(name)}, "arguments": ', "}\n</tool_call>"


class Qwen3CoderParser(ToolParser):
    name = "qwen3_coder"
    arguments_json = False
    _BLOCK = re.compile(r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*(?:</tool_call>|\Z)", re.S)
    _PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)

    def parse(self, text: str, tools: list | None = None) -> tuple[str, list[dict]]:
        types = _parameter_types(tools)
        calls: list[dict] = []

        def take(match: re.Match) -> str:
            name = match.group(1).strip()
            args = {p.strip(): _typed(v, types.get(name, {}).get(p.strip()))
                    for p, v in self._PARAM.findall(match.group(2))}
            calls.append(openai_call(name, args))
            return ""

        rest = self._BLOCK.sub(take, text)
        return rest.strip(), calls

    def wrapper(self, name: str) -> tuple[str, str]:
        return f"<tool_call>\n<function={name}>\n", "</function>\n</tool_call>"

    def write(self, name: str, arguments: dict) -> str:
        prefix, suffix = self.wrapper(name)
        body = "".join(f"<parameter={k}>\n{_plain(v)}\n</parameter>\n" for k, v in arguments.items())
        return prefix + body + suffix


def _plain(value: Any) -> str:
    """An argument's value as Qwen3-Coder's template writes it: objects and lists as JSON, the rest as text."""
    if isinstance(value, (dict, list)):
        return _dumps(value)
    return str(value)


def _parameter_types(tools: list | None) -> dict[str, dict[str, Any]]:
    """``{tool name: {parameter: its JSON-schema type}}`` of a request's tools."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        props = ((fn.get("parameters") or {}).get("properties") or {}) if isinstance(fn, dict) else {}
        if isinstance(fn.get("name"), str) and isinstance(props, dict):
            out[fn["name"]] = {p: (s or {}).get("type") for p, s in props.items() if isinstance(s, dict)}
    return out


_PY_WORDS = {"True": True, "False": False, "None": None}


# How a value read as JSON is taken for its schema's type: a string is the text as written, a number a float; without
# a schema, a JSON string is the text as written. Any other type takes the value as read.
_AS_TYPE = {"string": lambda text, value: text,
            "number": lambda text, value: float(value) if type(value) is int else value,
            None: lambda text, value: text if isinstance(value, str) else value}


def _typed(text: str, kind: Any) -> Any:
    """An untyped argument value as its schema's type; without a schema, JSON if it reads as JSON, else text."""
    if text in _PY_WORDS:  # the template writes non-JSON scalars with Python's str()
        value = _PY_WORDS[text]
    else:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
    return _AS_TYPE.get(kind, lambda text, value: value)(text, value)


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    separator = "; "
    call_format = {"prefix": "", "suffix": "", "separator": "; ", "arguments_key": "parameters", "opening": "",
                   "closing": ""}
    _TAG = "<|python_tag|>"
    _ENDS = ("<|eom_id|>", "<|eot_id|>")

    def parse(self, text: str, tools: list | None = None) -> tuple[str, list[dict]]:
        head, tag, body = text.partition(self._TAG)
        if not tag:
            head, body = "", text
        for end in self._ENDS:  # a call ends the turn with one of these when the reply is decoded with them
            body = body.strip().removesuffix(end)
        calls = _json_objects(body.strip(), separators=";")
        if calls is None:
            return text.strip(), []
        return head.strip(), [openai_call(*c) for c in calls]

    def wrapper(self, name: str) -> tuple[str, str]:
        return f'{{"name": {_dumps(name)}, "parameters": ', "}"


def _json_objects(text: str, separators: str = "") -> list[tuple[str, Any]] | None:
    """Every call in ``text`` when it is nothing but JSON call objects (apart from ``separators`` and spaces)."""
    decoder, i, calls = json.JSONDecoder(), 0, []
    if not text.startswith("{"):
        return None
    while i < len(text):
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return None
        found = _call_args(obj)
        if found is None:
            return None
        calls.append(found)
        while i < len(text) and (text[i].isspace() or text[i] in separators):
            i += 1
    return calls


class MistralParser(ToolParser):
    """Reads both of Mistral's forms; writes the list form (``mistral``) or the ``[ARGS]`` form
    (``mistral_args``)."""

    name = "mistral"
    separator = ""
    call_format = {"prefix": "", "suffix": "", "separator": ", ", "arguments_key": "arguments",
                   "opening": "[TOOL_CALLS][", "closing": "]"}
    _MARK = "[TOOL_CALLS]"
    _ARGS = re.compile(r"\s*([^\[\]\s]+?)(?:\[CALL_ID\][^\[]*)?\[ARGS\]")

    def parse(self, text: str, tools: list | None = None) -> tuple[str, list[dict]]:
        if self._MARK not in text:
            return text.strip(), []
        head, _, body = text.partition(self._MARK)
        calls: list[tuple[str, Any]] = []
        body = body.lstrip()
        decoder = json.JSONDecoder()
        if body.startswith("["):
            try:
                items, end = decoder.raw_decode(body)
            except json.JSONDecodeError:
                return text.strip(), []
            found = [_call_args(x) for x in items] if isinstance(items, list) else [None]
            if not found or None in found:
                return text.strip(), []
            return (head + body[end:]).strip(), [openai_call(*c) for c in found]
        for part in body.split(self._MARK):
            match = self._ARGS.match(part)
            if match is None:
                return text.strip(), []
            try:
                args, end = decoder.raw_decode(part, match.end())
            except json.JSONDecodeError:
                return text.strip(), []
            if not isinstance(args, dict) or part[end:].strip():
                return text.strip(), []
            calls.append((match.group(1), args))
        return head.strip(), [openai_call(*c) for c in calls]

    def wrapper(self, name: str) -> tuple[str, str]:
        return f'[TOOL_CALLS][{{"name": {_dumps(name)}, "arguments": ', "}]"

    def write_calls(self, calls: Sequence[tuple[str, dict]]) -> str:
        return self._MARK + _dumps([{"name": n, "arguments": a} for n, a in calls])


class MistralArgsParser(MistralParser):
    name = "mistral_args"
    call_format = None

    def wrapper(self, name: str) -> tuple[str, str]:
        return f"[TOOL_CALLS]{name}[ARGS]", ""

    def write_calls(self, calls: Sequence[tuple[str, dict]]) -> str:
        return "".join(self.write(n, a) for n, a in calls)


_DS_CALLS_BEGIN, _DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL_BEGIN, _DS_CALL_END, _DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


class DeepSeekV3Parser(ToolParser):
    """Reads DeepSeek-V3/R1's form (``function<sep>name`` and a json code block) and V3.1's (``name<sep>{..}``);
    writes V3's (``deepseek_v3``) or V3.1's (``deepseek_v31``)."""

    name = "deepseek_v3"
    _CALL = re.compile(re.escape(_DS_CALL_BEGIN) + r"(.*?)" + re.escape(_DS_CALL_END), re.S)
    _V3 = re.compile(r"(?:function)?" + re.escape(_DS_SEP) + r"(.+?)\n```(?:json)?\n(.*?)\n```\s*\Z", re.S)

    def parse(self, text: str, tools: list | None = None) -> tuple[str, list[dict]]:
        if _DS_CALLS_BEGIN not in text:
            return text.strip(), []
        head, _, body = text.partition(_DS_CALLS_BEGIN)
        body, _, tail = body.partition(_DS_CALLS_END)
        calls = []
        for inner in self._CALL.findall(body):
            v3 = self._V3.match(inner)
            name, args = (v3.group(1), v3.group(2)) if v3 else inner.partition(_DS_SEP)[::2]
            try:
                value = json.loads(args)
            except json.JSONDecodeError:
                return text.strip(), []
            if not isinstance(value, dict) or not name.strip():
                return text.strip(), []
            calls.append(openai_call(name.strip(), value))
        if not calls:
            return text.strip(), []
        return (head + tail).strip(), calls

    def wrapper(self, name: str) -> tuple[str, str]:
        return f"{_DS_CALL_BEGIN}function{_DS_SEP}{name}\n```json\n", f"\n```{_DS_CALL_END}"

    def write_calls(self, calls: Sequence[tuple[str, dict]]) -> str:
        return _DS_CALLS_BEGIN + "\n".join(self.write(n, a) for n, a in calls) + _DS_CALLS_END

class DeepSeekV31Parser(DeepSeekV3Parser):
    name = "deepseek_v31"

    def wrapper(self, name: str) -> tuple[str, str]:
        return f"{_DS_CALL_BEGIN}{name}{_DS_SEP}", _DS_CALL_END

    def write_calls(self, calls: Sequence[tuple[str, dict]]) -> str:
        return _DS_CALLS_BEGIN + "".join(self.write(n, a) for n, a in calls) + _DS_CALLS_END


_HARMONY_MSG = re.compile(r"(?:<\|start\|>assistant)?([^<]*(?:<\|channel\|>[^<]*)?(?:<\|constrain\|>[^<]*)?)"
                          r"<\|message\|>(.*?)(?:<\|end\|>|<\|call\|>|<\|return\|>|\Z)", re.S)


def _harmony_messages(text: str) -> list[tuple[str, str, str | None, str]] | None:
    """``[(channel, body, recipient, raw)]`` of a harmony reply, or None when it is not one."""
    out, i = [], 0
    while i < len(text):
        match = _HARMONY_MSG.match(text, i)
        if match is None or match.end() == i:
            return None
        header = match.group(1)
        channel = re.search(r"<\|channel\|>\s*(\w+)", header)
        recipient = re.search(r"to=([\w.\-]+)", header)
        out.append((channel.group(1) if channel else "final", match.group(2),
                    recipient.group(1) if recipient else None, match.group(0)))
        i = match.end()
    return out


class HarmonyParser(ToolParser):
    """gpt-oss: a reply is a list of messages, each ``[to=functions.n]<|channel|>c[ json]<|message|>body``; a
    message to ``functions.n`` is a call, the ``final`` (or an un-addressed ``commentary``) message the content."""

    name = "harmony"
    separator = "<|start|>assistant"

    def parse(self, text: str, tools: list | None = None) -> tuple[str, list[dict]]:
        messages = _harmony_messages(text)
        if messages is None:
            return text.strip(), []
        content, calls = [], []
        for channel, body, recipient, _ in messages:
            if recipient and recipient.startswith("functions."):
                try:
                    args = json.loads(body)
                except json.JSONDecodeError:
                    return text.strip(), []
                calls.append(openai_call(recipient[len("functions."):], args))
            elif channel != "analysis":
                content.append(body)
        return "\n".join(content).strip(), calls

    def wrapper(self, name: str) -> tuple[str, str]:
        return f" to=functions.{name}<|channel|>commentary json<|message|>", "<|call|>"


TOOL_PARSERS: dict[str, Callable[[], ToolParser]] = {
    p.name: p for p in (HermesParser, Qwen3CoderParser, Llama3JsonParser, MistralParser, MistralArgsParser,
                        DeepSeekV3Parser, DeepSeekV31Parser, HarmonyParser)}
"""Tool parsers by name (``agent.tool_parser``)."""

# What in a chat template's text tells its tool-call family; the first that matches wins (Qwen3-Coder's and
# DeepSeek's templates also name <tool_call>/<think>, so their own marks come first).
_TOOL_MARKS: list[tuple[Callable[[str], bool], str]] = [
    (lambda t: "<|channel|>" in t, "harmony"),
    (lambda t: "<function=" in t, "qwen3_coder"),
    (lambda t: _DS_SEP in t and "```json" in t, "deepseek_v3"),
    (lambda t: _DS_SEP in t, "deepseek_v31"),
    (lambda t: "[TOOL_CALLS]" in t and "[ARGS]" in t, "mistral_args"),
    (lambda t: "[TOOL_CALLS]" in t, "mistral"),
    (lambda t: "<tool_call>" in t, "hermes"),
    (lambda t: "<|start_header_id|>" in t and "parameters" in t, "llama3_json"),
]
_DEFAULT_TOOL_PARSER = "hermes"  # the embedded default's format, and the most common one


def _template(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one renders chats
        template = template.get("default") or next(iter(template.values()), "")
    return template if isinstance(template, str) else ""


def detect_tool_parser(tokenizer: Any) -> str:
    """The tool parser a tokenizer's chat template calls for (``hermes`` when it names no family)."""
    text = _template(tokenizer)
    return next((name for test, name in _TOOL_MARKS if test(text)), _DEFAULT_TOOL_PARSER)


def _choose(kind: str, name: str | None, table: dict, detect: Callable[[Any], str], tokenizer: Any) -> Any:
    chosen = detect(tokenizer) if name is None else name
    if chosen not in table:
        close = difflib.get_close_matches(str(chosen), list(table), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"agent.{kind}={chosen!r} is not a known {kind.replace('_', ' ')}; the known ones are "
                         f"{', '.join(table)} (null: found from the chat template){hint}")
    return table[chosen]()


def tool_parser_for(name: str | None, tokenizer: Any = None) -> ToolParser:
    """The tool parser ``name`` names (``agent.tool_parser``), or, for None, the one the tokenizer's chat template
    calls for. An unknown name is a ``ValueError`` listing the known ones."""
    return _choose("tool_parser", name, TOOL_PARSERS, detect_tool_parser, tokenizer)
