package hyserve_test

// Request building, without a server.

import (
	"testing"

	"google.golang.org/protobuf/proto"

	hyservev1 "hyserve/clients/go/gen/hyserve/v1"
	"hyserve/clients/go/hyserve"
)

func TestConstraintOptions(t *testing.T) {
	req := hyserve.TextRequest("x", 8, hyserve.WithJSONSchema(`{"type": "object"}`))
	if got := req.GetSampling().GetConstraint().GetJsonSchema(); got != `{"type": "object"}` {
		t.Fatalf("json_schema %q", got)
	}
	if req.GetSampling().Temperature != nil {
		t.Fatal("a constraint must leave the other sampling settings unset")
	}
	req.Sampling.Temperature = proto.Float32(0.5)
	hyserve.Apply(req, hyserve.WithJSONObject()) // replaces the schema, keeps the temperature
	if !req.GetSampling().GetConstraint().GetJsonObject() || req.GetSampling().GetTemperature() != 0.5 {
		t.Fatalf("sampling %v", req.GetSampling())
	}
	if got := hyserve.TextRequest("x", 8, hyserve.WithRegex("[0-9]+")).GetSampling().GetConstraint().GetRegex(); got != "[0-9]+" {
		t.Fatalf("regex %q", got)
	}
	chat := hyserve.Apply(hyserve.ChatRequest(8, hyserve.Message("user", "x")), hyserve.WithGrammar(`start: "yes" | "no"`))
	if got := chat.GetSampling().GetConstraint().GetGrammar(); got != `start: "yes" | "no"` {
		t.Fatalf("grammar %q", got)
	}
	if hyserve.TextRequest("x", 8).Sampling != nil {
		t.Fatal("no option: sampling unset")
	}
}

func TestToolOptionsAndMessages(t *testing.T) {
	weather := hyserve.Tool("get_weather", "Weather of a city", `{"type": "object", "properties": {"city": {"type": "string"}}}`)
	call := &hyservev1.ToolCall{Id: "call_1", Name: "get_weather", ArgumentsJson: `{"city": "Paris"}`}
	req := hyserve.Apply(
		hyserve.ChatRequest(64,
			hyserve.Message("user", "Weather in Paris?"),
			hyserve.AssistantToolCalls(call),
			hyserve.ToolResult("call_1", `{"temp_c": 21}`),
		),
		hyserve.WithTools(weather, hyserve.Tool("get_time", "", "")),
		hyserve.WithToolChoiceFunction("get_weather"),
		hyserve.WithParallelToolCalls(false),
		hyserve.WithParseOutput(true),
	)
	chat := req.GetChat()
	if len(chat.Tools) != 2 || chat.Tools[0].Name != "get_weather" || chat.Tools[1].ParametersJson != "" {
		t.Fatalf("tools %v", chat.Tools)
	}
	if chat.GetToolChoice().GetFunction() != "get_weather" {
		t.Fatalf("tool choice %v", chat.GetToolChoice())
	}
	if chat.ParallelToolCalls == nil || *chat.ParallelToolCalls || !chat.GetParseOutput() {
		t.Fatalf("parallel %v parse %v", chat.ParallelToolCalls, chat.ParseOutput)
	}
	m := chat.Messages
	if m[1].Role != "assistant" || !proto.Equal(m[1].ToolCalls[0], call) || m[1].ToolCallId != nil {
		t.Fatalf("assistant message %v", m[1])
	}
	if m[2].Role != "tool" || m[2].GetToolCallId() != "call_1" || m[2].Content != `{"temp_c": 21}` {
		t.Fatalf("tool message %v", m[2])
	}
	hyserve.Apply(req, hyserve.WithToolChoice(hyservev1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED))
	if chat.GetToolChoice().GetMode() != hyservev1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED {
		t.Fatalf("tool choice %v", chat.GetToolChoice())
	}
	plain := hyserve.ChatRequest(8, hyserve.Message("user", "x")).GetChat()
	if plain.ToolChoice != nil || plain.ParallelToolCalls != nil || plain.ParseOutput != nil {
		t.Fatal("no option: server defaults")
	}
}

func TestChatOptionOnTextRequestPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("WithTools on a text request did not panic")
		}
	}()
	hyserve.TextRequest("x", 8, hyserve.WithTools(hyserve.Tool("f", "", "")))
}
