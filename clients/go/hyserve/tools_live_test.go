package hyserve_test

// A live tool call through Generate, against a `hyserve serve` whose chat template renders tools
// (tests/test_generated_clients.py starts one on the tiny hybrid model with a Qwen3.5-style template):
//   HYSERVE_TOOLS_TARGET  host:port of that server
// Without HYSERVE_TOOLS_TARGET this test is skipped.

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	hyservev1 "hyserve/clients/go/gen/hyserve/v1"
	"hyserve/clients/go/hyserve"
)

var weatherCities = []string{"Oslo", "Lima"}

const weatherParameters = `{"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima"]}},
 "required": ["city"]}`

// weatherRequest asks for one required call of get_weather, thinking off.
func weatherRequest(t *testing.T, messages ...*hyservev1.ChatMessage) *hyservev1.GenerateRequest {
	t.Helper()
	kwargs, err := structpb.NewStruct(map[string]any{"enable_thinking": false})
	if err != nil {
		t.Fatal(err)
	}
	req := hyserve.Apply(hyserve.ChatRequest(96, messages...),
		hyserve.WithTools(hyserve.Tool("get_weather", "Current weather of a city", weatherParameters)),
		hyserve.WithToolChoice(hyservev1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED),
		hyserve.WithParallelToolCalls(false))
	req.GetChat().ChatTemplateKwargs = kwargs
	return req
}

// requireWeatherCall runs req and checks that it answers with exactly one valid get_weather call,
// whose streamed argument fragments concatenate to the complete call's arguments.
func requireWeatherCall(t *testing.T, c *hyserve.Client, req *hyservev1.GenerateRequest) *hyservev1.ToolCall {
	t.Helper()
	var fin *hyservev1.Finished
	var pieces []*hyservev1.ToolCallDelta
	for ev, err := range c.Generate(hyserve.WithSession(testCtx(t), "go-tools-test"), req) {
		if err != nil {
			t.Fatal(err)
		}
		if d := ev.GetDelta(); d != nil {
			pieces = append(pieces, d.ToolCalls...)
		}
		if f := ev.GetFinished(); f != nil {
			fin = f
		}
	}
	if fin == nil {
		t.Fatal("no Finished event")
	}
	if fin.Reason != hyservev1.FinishReason_FINISH_REASON_TOOL_CALLS || len(fin.ToolCalls) != 1 {
		t.Fatalf("finished %v, want FINISH_REASON_TOOL_CALLS with one call", fin)
	}
	call := fin.ToolCalls[0]
	if call.Name != "get_weather" || call.Id == "" {
		t.Fatalf("call %v, want get_weather with an id", call)
	}
	var args struct {
		City *string `json:"city"`
	}
	if err := json.Unmarshal([]byte(call.ArgumentsJson), &args); err != nil {
		t.Fatalf("arguments %q are not JSON: %v", call.ArgumentsJson, err)
	}
	if args.City == nil || !slices.Contains(weatherCities, *args.City) {
		t.Fatalf("arguments %q: city not in %v", call.ArgumentsJson, weatherCities)
	}
	if len(pieces) == 0 {
		t.Fatal("no ToolCallDelta was streamed")
	}
	if pieces[0].Id != call.Id || pieces[0].Name != call.Name {
		t.Fatalf("first piece %v, call %v", pieces[0], call)
	}
	var streamed string
	for _, p := range pieces {
		if p.Index != 0 {
			t.Fatalf("piece %v of a second call", p)
		}
		streamed += p.ArgumentsFragment
	}
	if streamed != call.ArgumentsJson {
		t.Fatalf("streamed arguments %q, Finished has %q", streamed, call.ArgumentsJson)
	}
	return call
}

func TestToolCallRoundTrip(t *testing.T) {
	target := os.Getenv("HYSERVE_TOOLS_TARGET")
	if target == "" {
		t.Skip("HYSERVE_TOOLS_TARGET not set (tests/test_generated_clients.py runs this against a real server)")
	}
	c, err := hyserve.Dial(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	user := hyserve.Message("user", "What is the weather in Oslo?")
	call := requireWeatherCall(t, c, weatherRequest(t, user))
	// the second turn: the call as the assistant's message, and its result
	result := hyserve.ToolResult(call.Id, `{"temp_c": 21, "sky": "clear"}`)
	requireWeatherCall(t, c, weatherRequest(t, user, hyserve.AssistantToolCalls(call), result))
}
