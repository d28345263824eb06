package pubsub_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// An engine that cannot deliver batches refuses a batch consumer with
// ErrInvalid rather than delivering one record at a time behind its back;
// so does one that claims the capability without the interface.
func TestSubscribeBatchNeedsAnEngineWithBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		all := engine.InjectedClock | engine.CustomIDs | engine.ExactBlock | engine.ReclaimOnCommit | engine.GiveBack | engine.VirtualTime
		for name, caps := range map[string]engine.Capabilities{
			"without Batches":                 all,
			"with Batches, no SubscribeBatch": all | engine.Batches,
		} {
			b := pubsubtest.NewBroker(t, pubsub.WithEngine(lesser{caps}))
			topic := mustTopic(t, b, "orders-"+name, codec.String(), codec.String())
			_, err := topic.SubscribeBatch("g", "c", pubsub.BatchHandlerFunc[string](func(context.Context, []pubsub.Message[string]) error { return nil }))
			wantErrIs(t, "SubscribeBatch on an engine "+name, err, pubsub.ErrInvalid)
			if _, err := topic.Subscribe("g", "c", &recorder[string]{}); err != nil {
				t.Errorf("engine %s: Subscribe after the refused SubscribeBatch: got %v, want nil", name, err)
			}
		}
	})
}

// A consumer waiting out WithBatchWait for more records has delivered
// nothing yet: Pause stops it at once, without waiting for the wait to end,
// and nothing is committed; after Resume the wait starts again.
func TestPauseDoesNotWaitForABatchWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		var (
			mu sync.Mutex
			at []time.Duration
		)
		start := time.Now()
		g, err := topic.SubscribeBatch("g", "c", pubsub.BatchHandlerFunc[string](func(_ context.Context, msgs []pubsub.Message[string]) error {
			mu.Lock()
			defer mu.Unlock()
			at = append(at, time.Since(start))
			return nil
		}), pubsub.WithBatchWait(10*time.Minute)) // less than drainHour's hour: no tie of timers
		if err != nil {
			t.Fatal(err)
		}
		mustPublishValue(t, topic, "a")
		synctest.Wait()
		pauseCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := g.Pause(pauseCtx); err != nil {
			t.Fatalf("Pause while the consumer waits for a fuller batch: got %v, want nil at once", err)
		}
		if got := time.Since(start); got != 0 {
			t.Errorf("Pause returned after %v of virtual time, want 0", got)
		}
		if got := g.Committed(0); got != 0 {
			t.Errorf("Committed(0) after Pause: got %d, want 0", got)
		}
		time.Sleep(time.Minute)
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		drainHour(t, b)
		mu.Lock()
		defer mu.Unlock()
		if want := []time.Duration{time.Minute + 10*time.Minute}; !slices.Equal(at, want) {
			t.Errorf("batch delivered at %v of virtual time, want %v: the wait starts again on Resume", at, want)
		}
	})
}

// The typed handler's BatchError may be wrapped; one naming an index
// outside the batch fails the first message, with ErrInvalid in its dead
// letter.
func TestBatchErrorOutsideTheBatchFailsTheFirstMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		mustPublishValue(t, topic, "a")
		mustPublishValue(t, topic, "b")
		g, err := topic.SubscribeBatch("g", "c", pubsub.BatchHandlerFunc[string](func(_ context.Context, msgs []pubsub.Message[string]) error {
			return &pubsub.BatchError{Index: len(msgs), Err: errBoom}
		}), pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 1}))
		if err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
		dl := g.DeadLetters()
		if len(dl) != 2 || dl[0].Message.Value != "a" || dl[1].Message.Value != "b" {
			t.Fatalf("dead letters: got %+v, want a then b, each failing alone", dl)
		}
		wantErrIs(t, "the dead letter's error", dl[0].Err, pubsub.ErrInvalid, errBoom)
	})
}

// An undecodable record at the head of a batch is dead-lettered without a
// call: the handler never gets an empty batch.
func TestUndecodableHeadOfABatchCallsNoHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders", codec.String(), pickyStrings())
		var sizes []int
		g, err := topic.SubscribeBatch("g", "c", pubsub.BatchHandlerFunc[string](func(_ context.Context, msgs []pubsub.Message[string]) error {
			sizes = append(sizes, len(msgs))
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"poison", "ok"} {
			mustPublish(t, topic, "k", v)
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
		if !slices.Equal(sizes, []int{1}) || len(g.DeadLetters()) != 1 {
			t.Errorf("batch sizes %v and %d dead letters; want one batch of 1 (ok) and poison dead-lettered", sizes, len(g.DeadLetters()))
		}
	})
}
