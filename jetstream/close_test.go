package jetstream

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// TestCloseIsBoundedWhenTheServerIsGone closes a broker whose server has
// shut down under it: Close returns within its context and a small grace
// (it asks the server nothing more once ctx ended or while the connection
// is down; it used to spend another 100ms), with an error saying the
// server could not be reached.
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
	const grace = 60 * time.Millisecond // closeGrace, and scheduling on a loaded machine
	took := time.Since(start)
	if took > bound+grace {
		t.Errorf("Close took %v with a context of %v, want it back within %v more", took, bound, grace)
	}
	t.Logf("Close took %v with a context of %v", took, bound)
	if !errors.Is(err, pubsub.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close with the server gone: got %v, want ErrUnavailable and the context's error", err)
	}
	if b.State() != pubsub.Stopped {
		t.Errorf("state after Close: %v, want stopped", b.State())
	}
	if _, err := topic.PublishValue(ctx, "late"); !errors.Is(err, pubsub.ErrClosed) {
		t.Errorf("Publish after Close: got %v, want ErrClosed", err)
	}
}

// TestCloseLeavesAnotherBrokersPartitionsToIt closes broker A while
// broker B, in the same group, is stuck on its own partitions: A drains
// only what its members own, and returns nil (nothing is left
// undelivered: B carries on with the group), instead of waiting for B's
// partitions until its context ends and reporting them in the text of a
// ShutdownError whose Unfinished list was empty.
func TestCloseLeavesAnotherBrokersPartitionsToIt(t *testing.T) {
	opts := testOptions()
	a := pubsub.NewBroker(pubsub.WithEngine(testServer.Engine(opts...)))
	b := brokerOn(t, testServer.Engine(opts...))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ta, err := pubsub.NewTopic(a, "orders", codec.String(), codec.String(), pubsub.WithPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	tb, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	ga, err := ta.Subscribe("workers", "a", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{}, 16)
	if _, err := tb.Subscribe("workers", "b", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
		entered <- struct{}{}
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the group dealt between a and b", 10*time.Second, func() bool {
		as := ga.Assignment()
		return len(as["a"]) == 2 && len(as["b"]) == 2
	})
	for i := range 16 {
		if _, err := ta.Publish(ctx, fmt.Sprint("k", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-entered: // b is stuck, with lag on its partitions
	case <-ctx.Done():
		t.Fatal("b's handler never ran")
	}
	cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
	defer ccancel()
	start := time.Now()
	if err := a.Close(cctx); err != nil {
		t.Errorf("Close of a while b carries on: %v, want nil", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Close of a took %v: it waited for b's partitions", took)
	}
}

// TestShutdownErrorNamesOnlyWhatWasLeft closes a broker whose handler is
// stuck: the ShutdownError's text says why (the context's error) and then
// lists exactly its Unfinished partitions, nothing else (no list of its
// own from the drain, no raw slice).
func TestShutdownErrorNamesOnlyWhatWasLeft(t *testing.T) {
	b := newBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{}, 16)
	if _, err := topic.Subscribe("workers", "w", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
		entered <- struct{}{}
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		if _, err := topic.Publish(ctx, fmt.Sprint("k", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	<-entered
	cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer ccancel()
	err = b.Close(cctx)
	se, ok := errors.AsType[*pubsub.ShutdownError](err)
	if !ok || len(se.Unfinished) == 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a stuck handler: %v, want a ShutdownError listing what was left, wrapping the context's error", err)
	}
	want := "logbus: close left records undelivered (context deadline exceeded): "
	for i, u := range se.Unfinished {
		if i > 0 {
			want += ", "
		}
		want += fmt.Sprintf("group %q topic %q partition %d committed %d end %d", u.Group, u.Topic, u.Partition, u.Committed, u.End)
		if u.Running {
			want += " (handler still running)"
		}
	}
	if err.Error() != want {
		t.Errorf("ShutdownError text:\n got %s\nwant %s", err, want)
	}
}
