"""Which tool-call syntax a model writes, recognised from its chat template's Jinja source.

A template that teaches the model a tool-call syntax contains that syntax's markers: the
instructions it renders into the system prompt and the way it renders earlier calls back into the
conversation both spell them out. The checks go from the most specific marker set to the least
specific one, because the Qwen XML syntax also wraps its calls in ``<tool_call>`` tags.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["ToolCallFormat", "detect_tool_call_format"]


class ToolCallFormat(Enum):
    """The tool-call syntaxes the parser reads and the grammars produce."""

    # <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
    QWEN_XML = "qwen_xml"
    # <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>  (Hermes 2 Pro, Qwen 2.5 / 3)
    HERMES = "hermes"
    # {"name": NAME, "parameters": {...}}, optionally after <|python_tag|>  (Llama 3.1 / 3.2 / 3.3)
    LLAMA3_JSON = "llama3_json"
    # [TOOL_CALLS][{"name": NAME, "arguments": {...}}, ...]  (Mistral 7B v0.3, Nemo, Small 3.1)
    MISTRAL = "mistral"
    # [TOOL_CALLS]NAME[ARGS]{...}  (Mistral Small 3.2, Magistral, Devstral)
    MISTRAL_ARGS = "mistral_args"


def detect_tool_call_format(template_source: str | None) -> ToolCallFormat | None:
    """The syntax the template's model writes tool calls in, or None when the template shows none
    (then generated text is plain content)."""
    if not template_source:
        return None
    src = template_source
    if "<function=" in src and "<parameter=" in src:
        return ToolCallFormat.QWEN_XML
    if "[TOOL_CALLS]" in src:
        return ToolCallFormat.MISTRAL_ARGS if "[ARGS]" in src else ToolCallFormat.MISTRAL
    if "<tool_call>" in src:
        return ToolCallFormat.HERMES
    if "<|start_header_id|>" in src and ("<|python_tag|>" in src or "ipython" in src):
        return ToolCallFormat.LLAMA3_JSON
    return None
