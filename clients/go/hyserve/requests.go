package hyserve

import (
	"google.golang.org/protobuf/proto"

	hyservev1 "hyserve/clients/go/gen/hyserve/v1"
)

// TextRequest asks for up to maxTokens tokens after prompt (greedy unless Sampling is set).
func TextRequest(prompt string, maxTokens uint32) *hyservev1.GenerateRequest {
	return &hyservev1.GenerateRequest{
		Input:    &hyservev1.GenerateRequest_Text{Text: &hyservev1.TextInput{Text: prompt}},
		Stopping: &hyservev1.StoppingCriteria{MaxTokens: proto.Uint32(maxTokens)},
	}
}

// Message is one chat turn.
func Message(role, content string) *hyservev1.ChatMessage {
	return &hyservev1.ChatMessage{Role: role, Content: content}
}

// ChatRequest asks for a reply to messages, rendered with the model's chat template.
func ChatRequest(maxTokens uint32, messages ...*hyservev1.ChatMessage) *hyservev1.GenerateRequest {
	return &hyservev1.GenerateRequest{
		Input:    &hyservev1.GenerateRequest_Chat{Chat: &hyservev1.ChatInput{Messages: messages}},
		Stopping: &hyservev1.StoppingCriteria{MaxTokens: proto.Uint32(maxTokens)},
	}
}
