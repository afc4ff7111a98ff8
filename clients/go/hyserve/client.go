// Package hyserve is a thin typed client for the hyserve.v1 gRPC API (generated code in
// hyserve/clients/go/gen/hyserve/v1).
//
//	c, err := hyserve.Dial("localhost:50051")
//	for ev, err := range c.Generate(ctx, hyserve.TextRequest("Once upon a time", 32)) {
//		if err != nil { ... }
//		if d := ev.GetDelta(); d != nil { fmt.Print(d.Text) }
//	}
//
// Cancelling ctx, or leaving the range loop early, cancels the stream; the server then cancels
// that task and only that one. Every gRPC failure is returned as *Error carrying the status code.
package hyserve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	hyservev1 "hyserve/clients/go/gen/hyserve/v1"
)

// ServiceName is the health-checked name of the service (grpc.health.v1).
const ServiceName = "hyserve.v1.HyserveService"

// SessionHeader is the metadata key a balancer may hash on to keep a conversation on one replica
// (and so on its prompt cache). The server itself ignores it.
const SessionHeader = "x-session-id"

// maxMessageBytes matches the server's 64 MiB limits (long token prompts, many slots' stats).
const maxMessageBytes = 64 << 20

// Error is a failed call: the gRPC status code and the server's message.
type Error struct {
	Code    codes.Code
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("hyserve: %s: %s", e.Code, e.Message) }

// Retryable tells whether the same request may succeed later (queue full, server loading/draining).
func (e *Error) Retryable() bool {
	return e.Code == codes.ResourceExhausted || e.Code == codes.Unavailable
}

// Code returns the status code of err when it is (or wraps) an *Error, else codes.Unknown.
func Code(err error) codes.Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return codes.Unknown
}

func wrap(err error) error {
	if err == nil {
		return nil
	}
	s, _ := status.FromError(err)
	return &Error{Code: s.Code(), Message: s.Message()}
}

// WithSession returns ctx carrying the session header for every call made with it.
func WithSession(ctx context.Context, sessionID string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, SessionHeader, sessionID)
}

// Client talks to one hyserve server. Safe for concurrent use.
type Client struct {
	conn   *grpc.ClientConn
	stub   hyservev1.HyserveServiceClient
	health healthpb.HealthClient
}

// Dial creates a client for target ("host:port"); plaintext unless opts say otherwise. The
// connection is made lazily, on the first call.
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	defaults := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageBytes), grpc.MaxCallSendMsgSize(maxMessageBytes)),
		// A long prompt evaluation keeps a stream silent: ping once a minute (the server allows 10 s).
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: time.Minute, Timeout: 20 * time.Second}),
	}
	conn, err := grpc.NewClient(target, append(defaults, opts...)...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, stub: hyservev1.NewHyserveServiceClient(conn), health: healthpb.NewHealthClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Stub is the generated client, for what this wrapper does not cover.
func (c *Client) Stub() hyservev1.HyserveServiceClient { return c.stub }

// Generate runs one task and yields its events: one Accepted, Deltas, one Finished. A failure is
// yielded once as a non-nil *Error and ends the sequence.
func (c *Client) Generate(ctx context.Context, req *hyservev1.GenerateRequest) iter.Seq2[*hyservev1.GenerateResponse, error] {
	return func(yield func(*hyservev1.GenerateResponse, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // leaving the loop early cancels the call, and so the task
		stream, err := c.stub.Generate(ctx, req)
		if err != nil {
			yield(nil, wrap(err))
			return
		}
		for {
			ev, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) { // the server closed the stream with status OK
					return
				}
				yield(nil, wrap(err))
				return
			}
			if !yield(ev, nil) {
				return
			}
			if ev.GetFinished() != nil {
				return
			}
		}
	}
}

// GenerateText runs a task to the end and returns its text and Finished event.
func (c *Client) GenerateText(ctx context.Context, req *hyservev1.GenerateRequest) (string, *hyservev1.Finished, error) {
	a, err := c.GenerateAnswer(ctx, req)
	return a.Text, a.Finished, err
}

// Answer is a task's whole answer: its text (the content, with chat parse_output), its reasoning,
// its tool calls, and its Finished event.
type Answer struct {
	Text      string
	Reasoning string
	ToolCalls []*hyservev1.ToolCall // Finished.ToolCalls: complete calls, arguments in JSON text
	Finished  *hyservev1.Finished
}

// GenerateAnswer runs a task to the end and collects its text, reasoning and tool calls.
func (c *Client) GenerateAnswer(ctx context.Context, req *hyservev1.GenerateRequest) (*Answer, error) {
	var text, reasoning []byte
	for ev, err := range c.Generate(ctx, req) {
		if err != nil {
			return &Answer{Text: string(text), Reasoning: string(reasoning)}, err
		}
		if d := ev.GetDelta(); d != nil {
			text = append(text, d.Text...)
			reasoning = append(reasoning, d.Reasoning...)
		}
		if f := ev.GetFinished(); f != nil {
			return &Answer{Text: string(text), Reasoning: string(reasoning), ToolCalls: f.ToolCalls, Finished: f}, nil
		}
	}
	return &Answer{Text: string(text), Reasoning: string(reasoning)},
		&Error{Code: codes.Internal, Message: "the stream ended without a Finished event"}
}

// Cancel stops a queued or running task by id. CANCEL_STATUS_PENDING: no task has this id yet; the
// server cancels it if one registers within 10 s. *Error with codes.NotFound for an id no task can
// have (malformed, or unknown while the server drains).
func (c *Client) Cancel(ctx context.Context, taskID string) (hyservev1.CancelStatus, error) {
	resp, err := c.stub.Cancel(ctx, &hyservev1.CancelRequest{TaskId: taskID})
	if err != nil {
		return hyservev1.CancelStatus_CANCEL_STATUS_UNSPECIFIED, wrap(err)
	}
	return resp.GetStatus(), nil
}

// CacheStats reports the slots, the prefix store and the cache counters.
func (c *Client) CacheStats(ctx context.Context) (*hyservev1.CacheStatsResponse, error) {
	resp, err := c.stub.CacheStats(ctx, &hyservev1.CacheStatsRequest{})
	return resp, wrap(err)
}

// ModelInfo describes the loaded model and the server.
func (c *Client) ModelInfo(ctx context.Context) (*hyservev1.ModelInfoResponse, error) {
	resp, err := c.stub.ModelInfo(ctx, &hyservev1.ModelInfoRequest{})
	return resp, wrap(err)
}

// Health is the grpc.health.v1 status of service (ServiceName: ready to generate; "": process).
func (c *Client) Health(ctx context.Context, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	resp, err := c.health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN, wrap(err)
	}
	return resp.GetStatus(), nil
}
