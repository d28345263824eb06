package jetstream

import (
	"context"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
)

type stuckHook chan pubsub.StuckEvent

func (h stuckHook) OnStuck(e pubsub.StuckEvent) { h <- e }

// TestStuckHandlerReportedOnce runs a handler past the WithStuckAfter
// threshold: it is reported once, with how long it has run, the Snapshot
// shows it Stuck, and when it returns that is reported too.
func TestStuckHandlerReportedOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const after = 100 * time.Millisecond
	h := make(stuckHook, 8)
	b := newBroker(t, pubsub.WithHooks(h), pubsub.WithStuckAfter(after))
	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	if _, err := orders.Subscribe("billing", "b1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
		if m.Value == "slow" {
			<-release
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"fast", "slow"} {
		if _, err := orders.Publish(ctx, "k", v); err != nil {
			t.Fatal(err)
		}
	}
	next := func() pubsub.StuckEvent {
		t.Helper()
		select {
		case e := <-h:
			return e
		case <-ctx.Done():
			t.Fatal("no stuck event")
			return pubsub.StuckEvent{}
		}
	}
	e := next()
	d := e.Delivery
	if e.Returned || e.Running < after || d.Group != "billing" || d.Consumer != "b1" || d.Partition != 0 || d.Offset != 1 || d.Attempt != 1 {
		t.Errorf("stuck event %+v, want billing's b1 on partition 0 at offset 1, attempt 1, running at least %v", e, after)
	}
	p := b.Snapshot().Topics[0].Groups[0].Partitions[0]
	if !p.InFlight || !p.Stuck || p.RunningFor < after {
		t.Errorf("snapshot %+v, want in flight, Stuck, RunningFor at least %v", p, after)
	}
	close(release)
	// The next event is the return: a second report of the same delivery
	// would come first.
	if e := next(); !e.Returned || e.Delivery.Offset != 1 || e.Running < after {
		t.Errorf("event after the handler returned: %+v, want Returned for offset 1", e)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if p := b.Snapshot().Topics[0].Groups[0].Partitions[0]; p.InFlight || p.Stuck || p.RunningFor != 0 {
		t.Errorf("snapshot after the drain %+v, want nothing in flight", p)
	}
}

// TestNoWatchdogWithoutStuckAfter: the watchdog's goroutine runs only
// when StuckAfter is set.
func TestNoWatchdogWithoutStuckAfter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, after := range []time.Duration{0, time.Second} {
		ee, err := testServer.Engine(testOptions()...).Open(engine.Config{StuckAfter: after})
		if err != nil {
			t.Fatal(err)
		}
		if got := ee.(*eng).stuck != nil; got != (after > 0) {
			t.Errorf("StuckAfter %v: watchdog %t, want %t", after, got, after > 0)
		}
		if err := ee.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
