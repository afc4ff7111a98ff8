// Command hyserve-example streams one completion from a hyserve server:
//
//	go run ./cmd/hyserve-example -target localhost:50051 -max-tokens 32 "Once upon a time"
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"

	"hyserve/clients/go/hyserve"
)

func main() {
	target := flag.String("target", "localhost:50051", "server address")
	maxTokens := flag.Uint("max-tokens", 32, "tokens to generate")
	session := flag.String("session", "", "x-session-id sent for balancer affinity")
	flag.Parse()
	prompt := strings.Join(flag.Args(), " ")
	if prompt == "" {
		prompt = "Once upon a time"
	}
	// Ctrl-C cancels the context: the server cancels this task.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *session != "" {
		ctx = hyserve.WithSession(ctx, *session)
	}
	client, err := hyserve.Dial(*target)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer client.Close()
	for ev, err := range client.Generate(ctx, hyserve.TextRequest(prompt, uint32(*maxTokens))) {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		switch {
		case ev.GetAccepted() != nil:
			a := ev.GetAccepted()
			fmt.Fprintf(os.Stderr, "[task %s, %d prompt tokens, %d from cache]\n", a.TaskId, a.PromptTokens, a.ReusedTokens)
		case ev.GetDelta() != nil:
			fmt.Print(ev.GetDelta().Text)
		case ev.GetFinished() != nil:
			f := ev.GetFinished()
			fmt.Fprintf(os.Stderr, "\n[%s, %d tokens]\n", f.Reason, f.Usage.GetCompletionTokens())
		}
	}
}
