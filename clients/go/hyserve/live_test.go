package hyserve_test

// Live tests against a running `hyserve serve`; tests/test_go_client.py starts the server, computes
// the Python client's greedy reference and runs `go test` with:
//   HYSERVE_TARGET       host:port of the server
//   HYSERVE_PROMPT       prompt of the reference request (text input, greedy)
//   HYSERVE_MAX_TOKENS   its max_tokens
//   HYSERVE_EXPECT_TEXT  the Python client's completion text
//   HYSERVE_EXPECT_IDS   its token ids, comma-separated
// Without HYSERVE_TARGET these tests are skipped.

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	hyservev1 "hyserve/clients/go/gen/hyserve/v1"
	"hyserve/clients/go/hyserve"
)

type reference struct {
	prompt    string
	maxTokens uint32
	text      string
	ids       []uint32
}

func live(t *testing.T) (*hyserve.Client, reference) {
	t.Helper()
	target := os.Getenv("HYSERVE_TARGET")
	if target == "" {
		t.Skip("HYSERVE_TARGET not set (tests/test_go_client.py runs these against a real server)")
	}
	n, err := strconv.ParseUint(os.Getenv("HYSERVE_MAX_TOKENS"), 10, 32)
	if err != nil {
		t.Fatalf("HYSERVE_MAX_TOKENS: %v", err)
	}
	ref := reference{prompt: os.Getenv("HYSERVE_PROMPT"), maxTokens: uint32(n), text: os.Getenv("HYSERVE_EXPECT_TEXT")}
	for _, s := range strings.Split(os.Getenv("HYSERVE_EXPECT_IDS"), ",") {
		id, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			t.Fatalf("HYSERVE_EXPECT_IDS: %v", err)
		}
		ref.ids = append(ref.ids, uint32(id))
	}
	c, err := hyserve.Dial(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, ref
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// collect runs a request to its end: accepted task id, text, token ids, Finished.
func collect(ctx context.Context, c *hyserve.Client, req *hyservev1.GenerateRequest) (string, string, []uint32, *hyservev1.Finished, error) {
	var id, text string
	var ids []uint32
	for ev, err := range c.Generate(ctx, req) {
		if err != nil {
			return id, text, ids, nil, err
		}
		if a := ev.GetAccepted(); a != nil {
			id = a.TaskId
		}
		if d := ev.GetDelta(); d != nil {
			text += d.Text
			ids = append(ids, d.TokenIds...)
		}
		if f := ev.GetFinished(); f != nil {
			return id, text, ids, f, nil
		}
	}
	return id, text, ids, nil, nil
}

func TestHealthAndModelInfo(t *testing.T) {
	c, _ := live(t)
	ctx := testCtx(t)
	st, err := c.Health(ctx, hyserve.ServiceName)
	if err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", st, err)
	}
	info, err := c.ModelInfo(ctx)
	if err != nil || info.VocabSize == 0 || info.ParallelSlots < 2 {
		t.Fatalf("model info: %v %v", info, err)
	}
}

func TestStreamedGenerationEqualsPythonClient(t *testing.T) {
	c, ref := live(t)
	ctx := hyserve.WithSession(testCtx(t), "go-live-test")
	_, text, ids, fin, err := collect(ctx, c, hyserve.TextRequest(ref.prompt, ref.maxTokens))
	if err != nil {
		t.Fatal(err)
	}
	if text != ref.text {
		t.Fatalf("text %q, Python client got %q", text, ref.text)
	}
	if len(ids) != len(ref.ids) {
		t.Fatalf("ids %v, Python client got %v", ids, ref.ids)
	}
	for i := range ids {
		if ids[i] != ref.ids[i] {
			t.Fatalf("ids %v, Python client got %v", ids, ref.ids)
		}
	}
	if fin.Usage.GetCompletionTokens() != uint32(len(ids)) {
		t.Fatalf("usage %v for %d tokens", fin.Usage, len(ids))
	}
}

// capitalSchema admits one short JSON object, so that the answer ends well before max_tokens.
const capitalSchema = `{"type": "object", "properties": {"capital": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]}},
 "required": ["capital"], "additionalProperties": false}`

func TestJSONSchemaConstraint(t *testing.T) {
	c, _ := live(t)
	req := hyserve.TextRequest("The capital of France, as JSON:", 48, hyserve.WithJSONSchema(capitalSchema))
	_, text, _, fin, err := collect(testCtx(t), c, req)
	if err != nil {
		t.Fatal(err)
	}
	var answer struct {
		Capital string `json:"capital"`
	}
	if err := json.Unmarshal([]byte(text), &answer); err != nil {
		t.Fatalf("output %q (%v) is not JSON: %v", text, fin.GetReason(), err)
	}
	if answer.Capital != "Paris" && answer.Capital != "Rome" && answer.Capital != "Berlin" {
		t.Fatalf("output %q does not match the schema", text)
	}
}

func longRequest(taskID string) *hyservev1.GenerateRequest {
	req := hyserve.TextRequest("Count slowly: one, two, three,", 400)
	req.TaskId = taskID
	req.Stopping.IgnoreEos = true
	return req
}

func TestCancelRunningTask(t *testing.T) {
	c, _ := live(t)
	ctx := testCtx(t)
	taskID := "go-cancel-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var fin *hyservev1.Finished
	deltas := 0
	for ev, err := range c.Generate(ctx, longRequest(taskID)) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetDelta() != nil {
			deltas++
			if deltas == 1 {
				st, err := c.Cancel(ctx, taskID)
				if err != nil || st != hyservev1.CancelStatus_CANCEL_STATUS_CANCELLED {
					t.Fatalf("cancel: %v %v", st, err)
				}
			}
		}
		fin = ev.GetFinished()
	}
	if fin == nil || fin.Reason != hyservev1.FinishReason_FINISH_REASON_CANCELLED {
		t.Fatalf("finished %v, want FINISH_REASON_CANCELLED", fin)
	}
	if fin.Usage.GetCompletionTokens() >= 400 {
		t.Fatalf("the cancelled task ran to its end: %v", fin.Usage)
	}
	st, err := c.Cancel(ctx, taskID)
	if err != nil || st != hyservev1.CancelStatus_CANCEL_STATUS_ALREADY_FINISHED {
		t.Fatalf("second cancel: %v %v", st, err)
	}
}

// A Cancel sent before its Generate answers PENDING, and the task ends CANCELLED once it registers.
func TestCancelBeforeGenerateIsPending(t *testing.T) {
	c, _ := live(t)
	ctx := testCtx(t)
	taskID := "go-early-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	st, err := c.Cancel(ctx, taskID)
	if err != nil || st != hyservev1.CancelStatus_CANCEL_STATUS_PENDING {
		t.Fatalf("cancel before generate: %v %v, want CANCEL_STATUS_PENDING", st, err)
	}
	_, _, ids, fin, err := collect(ctx, c, longRequest(taskID))
	if err != nil {
		t.Fatal(err)
	}
	if fin == nil || fin.Reason != hyservev1.FinishReason_FINISH_REASON_CANCELLED || len(ids) != 0 {
		t.Fatalf("finished %v after %d tokens, want FINISH_REASON_CANCELLED before any", fin, len(ids))
	}
	st, err = c.Cancel(ctx, taskID)
	if err != nil || st != hyservev1.CancelStatus_CANCEL_STATUS_ALREADY_FINISHED {
		t.Fatalf("second cancel: %v %v", st, err)
	}
}

// An id no Generate could use (a space is not allowed in a task id) is NOT_FOUND.
func TestCancelMalformedIdIsNotFound(t *testing.T) {
	c, _ := live(t)
	_, err := c.Cancel(testCtx(t), "go no such task")
	if hyserve.Code(err) != codes.NotFound {
		t.Fatalf("got %v, want NOT_FOUND", err)
	}
}

func TestCacheStats(t *testing.T) {
	c, _ := live(t)
	ctx := testCtx(t)
	info, err := c.ModelInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stats, err := c.CacheStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if uint32(len(stats.Slots)) != info.ParallelSlots || stats.Counters.GetPromptTokensReceived() == 0 {
		t.Fatalf("cache stats %v", stats)
	}
}

func TestInvalidArgumentIsTypedError(t *testing.T) {
	c, ref := live(t)
	req := hyserve.TextRequest(ref.prompt, 4)
	req.Sampling = &hyservev1.SamplingParams{Temperature: proto.Float32(-1)}
	_, _, _, _, err := collect(testCtx(t), c, req)
	var herr *hyserve.Error
	if !asError(err, &herr) || herr.Code != codes.InvalidArgument || !strings.Contains(herr.Message, "temperature") {
		t.Fatalf("got %v, want INVALID_ARGUMENT naming temperature", err)
	}
	if herr.Retryable() {
		t.Fatal("INVALID_ARGUMENT must not be retryable")
	}
}

// The aborted stream's task id is logged as cancelled by client_gone; tests/test_go_client.py checks it.
const AbortedTaskID = "go-abort-task"

func TestClientAbortLeavesOtherStreamsRunning(t *testing.T) {
	c, ref := live(t)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	var text string
	var ids []uint32
	var survivorErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, text, ids, _, survivorErr = collect(ctx, c, hyserve.TextRequest(ref.prompt, ref.maxTokens))
	}()
	abortCtx, abort := context.WithCancel(ctx)
	for ev, err := range c.Generate(abortCtx, longRequest(AbortedTaskID)) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetDelta() != nil {
			abort() // the client goes away mid-stream
			break
		}
	}
	abort()
	wg.Wait()
	if survivorErr != nil || text != ref.text || len(ids) != len(ref.ids) {
		t.Fatalf("the other stream was disturbed: %q %v %v", text, ids, survivorErr)
	}
	// the aborted task leaves its slot (the server log shows it cancelled as client_gone, checked by
	// tests/test_go_client.py); polling CacheStats does not touch it, unlike a Cancel would
	for {
		stats, err := c.CacheStats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		busy := false
		for _, s := range stats.Slots {
			busy = busy || s.TaskId == AbortedTaskID
		}
		if !busy {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func asError(err error, target **hyserve.Error) bool {
	e, ok := err.(*hyserve.Error)
	if ok {
		*target = e
	}
	return ok
}
