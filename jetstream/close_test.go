package jetstream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// TestCloseIsBoundedWhenTheServerIsGone closes a broker whose server has
// shut down under it: Close returns soon after its context ends (the
// requests it makes afterwards share a tail of 100ms), with an error.
func TestCloseIsBoundedWhenTheServerIsGone(t *testing.T) {
	srv, err := StartServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := pubsub.NewBroker(pubsub.WithEngine(srv.Engine(testOptions()...)))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topic.Subscribe("g", "c1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := topic.PublishValue(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	const bound = 300 * time.Millisecond
	cctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	start := time.Now()
	err = b.Close(cctx)
	if took := time.Since(start); took > bound+time.Second {
		t.Errorf("Close took %v with a context of %v, want it back soon after", took, bound)
	}
	if err == nil {
		t.Errorf("Close with the server gone: got nil, want an error")
	}
	if b.State() != pubsub.Stopped {
		t.Errorf("state after Close: %v, want stopped", b.State())
	}
	if _, err := topic.PublishValue(ctx, "late"); !errors.Is(err, pubsub.ErrClosed) {
		t.Errorf("Publish after Close: got %v, want ErrClosed", err)
	}
}
