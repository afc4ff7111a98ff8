"""answer_format: which constraint a request gets and how its answer splits, decided from the
request, the rendered prompt and the chat template; and that the composed grammars accept what a
model following the template would write, on the fixture vocabulary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest
from chat_templates import QWEN35_TEMPLATE
from fixtures import make_models

from hyserve.api.answer_format import AnswerFormatError, answer_format, template_traits
from hyserve.api.chat_input import ChatRequest, ToolChoiceSpec
from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.chat import ToolCallFormat
from hyserve.engine.constraints import ConstraintSpec, GrammarCompiler
from hyserve.model.loader import LoadedModel, load_model

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima"]}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
QWEN = template_traits(QWEN35_TEMPLATE)
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_models.write_model(tmp_path_factory.mktemp("answer") / "qwen35.gguf", "qwen35", qtype="q8_0")
    return load_model(Path(path))


@pytest.fixture(scope="module")
def compiler(model: LoadedModel) -> GrammarCompiler:
    return GrammarCompiler(model.tokenizer, model.arch.n_vocab)


def chat(mode: str = "auto", tools: list[dict[str, Any]] | None = TOOLS, function: str = "") -> ChatRequest:
    return ChatRequest([{"role": "user", "content": "hi"}], tools, ToolChoiceSpec(mode, function, False), True)  # type: ignore[arg-type]


def accepts(model: LoadedModel, compiler: GrammarCompiler, spec: ConstraintSpec, text: str) -> bool:
    """Whether the grammar takes `text` as tokenized by the model, to its end."""
    matcher: llguidance.LLMatcher = compiler.compile(spec).new_matcher()
    tokens = model.tokenizer.encode(text, add_special=False, parse_special=True)
    return matcher.consume_tokens(tokens) and matcher.is_accepting()


def test_the_qwen_template_traits() -> None:
    assert QWEN.tool_format is ToolCallFormat.QWEN_XML and QWEN.reasoning_markers == ("<think>", "</think>")


def test_required_call_grammar_after_the_reasoning(model: LoadedModel, compiler: GrammarCompiler) -> None:
    spec, output = answer_format(pb.SamplingParams(), chat("required"), "<|im_start|>assistant\n<think>\n", QWEN)
    assert spec is not None and output is not None and output.starts_in_reasoning
    assert accepts(model, compiler, spec, f"Let me look it up.\n</think>\n\n{CALL}")
    assert not accepts(model, compiler, spec, "Let me look it up.\n</think>\n\nIt is sunny.")
    # a call written inside the reasoning is only reasoning: the answer still has to be a call
    assert not accepts(model, compiler, spec, f"{CALL}\n</think>\n\nIt is sunny.")


def test_required_call_without_reasoning(model: LoadedModel, compiler: GrammarCompiler) -> None:
    spec, output = answer_format(pb.SamplingParams(), chat("required"), "<think>\n\n</think>\n\n", QWEN)
    assert spec is not None and output is not None and not output.starts_in_reasoning
    assert accepts(model, compiler, spec, CALL)
    assert not accepts(model, compiler, spec, CALL.replace("Oslo", "Rome"))


def test_auto_holds_a_call_once_begun(model: LoadedModel, compiler: GrammarCompiler) -> None:
    spec, _ = answer_format(pb.SamplingParams(), chat("auto"), "", QWEN)
    assert spec is not None
    assert accepts(model, compiler, spec, "It is sunny in Oslo.")
    assert accepts(model, compiler, spec, f"Checking.\n{CALL}")
    assert not accepts(model, compiler, spec, "Checking.\n<tool_call>\n<function=launch>\n")


def test_json_schema_after_the_reasoning(model: LoadedModel, compiler: GrammarCompiler) -> None:
    sampling = pb.SamplingParams(constraint=pb.Constraint(json_schema=json.dumps(SCHEMA)))
    spec, _ = answer_format(sampling, chat("auto", tools=None), "<think>\n", QWEN)
    assert spec is not None and spec.field == "sampling.constraint.json_schema"
    assert accepts(model, compiler, spec, 'Hmm.</think>\n\n{"city": "Lima"}')
    assert not accepts(model, compiler, spec, 'Hmm.</think>\n\n{"city": "Rome"}')


def test_plain_input_keeps_its_own_constraint_and_no_split() -> None:
    sampling = pb.SamplingParams(constraint=pb.Constraint(regex="[0-9]+"))
    spec, output = answer_format(sampling, None, "", QWEN)
    assert spec == ConstraintSpec("regex", "[0-9]+", "sampling.constraint.regex") and output is None


def test_none_and_no_tools_leave_calls_as_text() -> None:
    for request in (chat("none"), chat("auto", tools=None)):
        spec, output = answer_format(pb.SamplingParams(), request, "", QWEN)
        assert spec is None and output is not None and output.tool_format is None


@pytest.mark.parametrize(
    ("sampling", "request_", "traits", "field"),
    [
        (pb.SamplingParams(constraint=pb.Constraint()), None, QWEN, "sampling.constraint"),
        (pb.SamplingParams(constraint=pb.Constraint(json_object=False)), None, QWEN, "sampling.constraint.json_object"),
        (pb.SamplingParams(constraint=pb.Constraint(json_object=True)), chat("required"), QWEN, "sampling.constraint"),
        (pb.SamplingParams(), chat("required"), template_traits("{{ messages }}"), "chat.tool_choice"),
    ],
)
def test_what_cannot_be_honoured_names_the_field(
    sampling: pb.SamplingParams, request_: ChatRequest | None, traits: Any, field: str
) -> None:
    with pytest.raises(AnswerFormatError, match=f"^{field}"):
        answer_format(sampling, request_, "", traits)


def test_a_schema_after_the_reasoning_keeps_the_nesting_bound() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(100):
        deep = {"type": "object", "properties": {"x": deep}}
    sampling = pb.SamplingParams(constraint=pb.Constraint(json_schema=json.dumps(deep)))
    with pytest.raises(AnswerFormatError, match="^sampling.constraint.json_schema: nested deeper"):
        answer_format(sampling, chat("auto", tools=None), "<think>\n", QWEN)
