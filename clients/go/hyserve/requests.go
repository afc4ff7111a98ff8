package hyserve

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	hyservev1 "hyserve/clients/go/gen/hyserve/v1"
)

// Option changes a request: an output constraint, tools, or other chat settings. Pass options to
// TextRequest, or to Apply for any request (ChatRequest takes its messages variadically).
type Option func(*hyservev1.GenerateRequest)

// Apply applies opts to req, in order, and returns req.
func Apply(req *hyservev1.GenerateRequest, opts ...Option) *hyservev1.GenerateRequest {
	for _, opt := range opts {
		opt(req)
	}
	return req
}

// TextRequest asks for up to maxTokens tokens after prompt (greedy unless Sampling is set).
func TextRequest(prompt string, maxTokens uint32, opts ...Option) *hyservev1.GenerateRequest {
	return Apply(&hyservev1.GenerateRequest{
		Input:    &hyservev1.GenerateRequest_Text{Text: &hyservev1.TextInput{Text: prompt}},
		Stopping: &hyservev1.StoppingCriteria{MaxTokens: proto.Uint32(maxTokens)},
	}, opts...)
}

// Message is one chat turn.
func Message(role, content string) *hyservev1.ChatMessage {
	return &hyservev1.ChatMessage{Role: role, Content: content}
}

// AssistantToolCalls is an assistant turn that made these calls (an earlier turn of a tool loop;
// e.g. the calls of its Finished event).
func AssistantToolCalls(calls ...*hyservev1.ToolCall) *hyservev1.ChatMessage {
	return &hyservev1.ChatMessage{Role: "assistant", ToolCalls: calls}
}

// ToolResult is the "tool" turn that answers the call with id callID.
func ToolResult(callID, content string) *hyservev1.ChatMessage {
	return &hyservev1.ChatMessage{Role: "tool", Content: content, ToolCallId: proto.String(callID)}
}

// ChatRequest asks for a reply to messages, rendered with the model's chat template.
func ChatRequest(maxTokens uint32, messages ...*hyservev1.ChatMessage) *hyservev1.GenerateRequest {
	return &hyservev1.GenerateRequest{
		Input:    &hyservev1.GenerateRequest_Chat{Chat: &hyservev1.ChatInput{Messages: messages}},
		Stopping: &hyservev1.StoppingCriteria{MaxTokens: proto.Uint32(maxTokens)},
	}
}

// --- output constraints (one per request: a later one replaces an earlier one) -------------------

func withConstraint(c *hyservev1.Constraint) Option {
	return func(req *hyservev1.GenerateRequest) {
		if req.Sampling == nil {
			req.Sampling = &hyservev1.SamplingParams{}
		}
		req.Sampling.Constraint = c
	}
}

// WithJSONSchema restricts the output to one JSON value valid for schema (JSON Schema, JSON text).
func WithJSONSchema(schema string) Option {
	return withConstraint(&hyservev1.Constraint{Kind: &hyservev1.Constraint_JsonSchema{JsonSchema: schema}})
}

// WithJSONObject restricts the output to one JSON object.
func WithJSONObject() Option {
	return withConstraint(&hyservev1.Constraint{Kind: &hyservev1.Constraint_JsonObject{JsonObject: true}})
}

// WithRegex restricts the output to text the regular expression matches as a whole.
func WithRegex(regex string) Option {
	return withConstraint(&hyservev1.Constraint{Kind: &hyservev1.Constraint_Regex{Regex: regex}})
}

// WithGrammar restricts the output to text the Lark grammar (llguidance dialect) derives from `start`.
func WithGrammar(lark string) Option {
	return withConstraint(&hyservev1.Constraint{Kind: &hyservev1.Constraint_Grammar{Grammar: lark}})
}

// --- tools (chat requests only: these options panic on another input) ----------------------------

// Tool is a function the model may call; parametersJSON is its arguments' JSON Schema in JSON text
// ("" for none).
func Tool(name, description, parametersJSON string) *hyservev1.Tool {
	return &hyservev1.Tool{Name: name, Description: description, ParametersJson: parametersJSON}
}

func chatOption(name string, set func(*hyservev1.ChatInput)) Option {
	return func(req *hyservev1.GenerateRequest) {
		chat := req.GetChat()
		if chat == nil {
			panic(fmt.Sprintf("hyserve: %s applies to a ChatRequest only", name))
		}
		set(chat)
	}
}

// WithTools adds functions the model may call; its calls come back in Delta.ToolCalls and
// Finished.ToolCalls.
func WithTools(tools ...*hyservev1.Tool) Option {
	return chatOption("WithTools", func(chat *hyservev1.ChatInput) { chat.Tools = append(chat.Tools, tools...) })
}

// WithToolChoice sets whether the model calls tools: TOOL_CHOICE_MODE_AUTO, _NONE or _REQUIRED.
func WithToolChoice(mode hyservev1.ToolChoiceMode) Option {
	return chatOption("WithToolChoice", func(chat *hyservev1.ChatInput) {
		chat.ToolChoice = &hyservev1.ToolChoice{Choice: &hyservev1.ToolChoice_Mode{Mode: mode}}
	})
}

// WithToolChoiceFunction makes the model call the tool with this name.
func WithToolChoiceFunction(name string) Option {
	return chatOption("WithToolChoiceFunction", func(chat *hyservev1.ChatInput) {
		chat.ToolChoice = &hyservev1.ToolChoice{Choice: &hyservev1.ToolChoice_Function{Function: name}}
	})
}

// WithParallelToolCalls allows (the default) or forbids several calls in one answer.
func WithParallelToolCalls(allow bool) Option {
	return chatOption("WithParallelToolCalls", func(chat *hyservev1.ChatInput) { chat.ParallelToolCalls = proto.Bool(allow) })
}

// WithParseOutput splits reasoning and tool calls out of Delta.Text (true, the default) or leaves
// the raw text (false).
func WithParseOutput(parse bool) Option {
	return chatOption("WithParseOutput", func(chat *hyservev1.ChatInput) { chat.ParseOutput = proto.Bool(parse) })
}
