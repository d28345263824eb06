package pubsubtest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// The bubble runs t's cleanups before synctest.Test returns, so the broker
// is Stopped by then, and Close has drained what the test never waited for.
func TestNewBrokerClosesAtCleanup(t *testing.T) {
	var (
		b   *pubsub.Broker
		rec = pubsubtest.NewRecorder[string]()
	)
	synctest.Test(t, func(t *testing.T) {
		b = pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders")
		mustSubscribe(t, topic, "billing", rec)
		for _, v := range []string{"a", "b", "c"} {
			mustPublish(t, topic, "k", v)
		}
		if got := b.State(); got != pubsub.Running {
			t.Fatalf("State() = %v during the test, want running", got)
		}
	})
	if got := b.State(); got != pubsub.Stopped {
		t.Fatalf("State() = %v after the test's cleanups, want stopped", got)
	}
	if rec.Len() != 3 {
		t.Fatalf("recorded %d messages, want the 3 that Close drained", rec.Len())
	}
}

// Cleanups run last-registered first: one registered before NewBroker runs
// after NewBroker's and must find the broker stopped.
func TestNewBrokerClosesBeforeEarlierCleanups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var b *pubsub.Broker
		t.Cleanup(func() {
			if got := b.State(); got != pubsub.Stopped {
				t.Errorf("State() = %v in a cleanup registered before NewBroker, want stopped", got)
			}
		})
		b = pubsubtest.NewBroker(t)
		mustTopic(t, b, "orders")
	})
}

func TestNewBrokerPassesOptions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: -1}))
		if _, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String()); !errors.Is(err, pubsub.ErrInvalid) {
			t.Fatalf("NewTopic on a broker with an invalid option = %v, want ErrInvalid", err)
		}
	})
}

// A paused group left records behind: the cleanup must say so.
func TestNewBrokerReportsUndelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := newFakeTB(t)
		b := pubsubtest.NewBroker(tb)
		topic := mustTopic(t, b, "orders")
		g := mustSubscribe(t, topic, "billing", pubsubtest.NewRecorder[string]())
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, topic, "k", "stuck")

		tb.runCleanups()
		if got := b.State(); got != pubsub.Stopped {
			t.Fatalf("State() = %v after cleanup, want stopped", got)
		}
		errs := tb.errors()
		if len(errs) != 1 {
			t.Fatalf("cleanup reported %d errors %q, want 1", len(errs), errs)
		}
		if !strings.Contains(errs[0], `group "billing"`) || !strings.Contains(errs[0], "undelivered") {
			t.Fatalf("cleanup reported %q; want it to name the group and say records were undelivered", errs[0])
		}
	})
}

func TestNewBrokerQuietWhenEverythingDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := newFakeTB(t)
		b := pubsubtest.NewBroker(tb)
		topic := mustTopic(t, b, "orders")
		mustSubscribe(t, topic, "billing", pubsubtest.NewRecorder[string]())
		mustPublish(t, topic, "k", "v")

		tb.runCleanups()
		if got := b.State(); got != pubsub.Stopped {
			t.Fatalf("State() = %v after cleanup, want stopped", got)
		}
		if errs := tb.errors(); len(errs) != 0 {
			t.Fatalf("cleanup reported %q for a broker that delivered everything", errs)
		}
	})
}

// A test that closed the broker itself has handled Close's error; the
// cleanup must not report it a second time.
func TestNewBrokerQuietWhenTestClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := newFakeTB(t)
		b := pubsubtest.NewBroker(tb)
		topic := mustTopic(t, b, "orders")
		g := mustSubscribe(t, topic, "billing", pubsubtest.NewRecorder[string]())
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, topic, "k", "stuck")

		var shutdown *pubsub.ShutdownError
		if err := b.Close(t.Context()); !errors.As(err, &shutdown) {
			t.Fatalf("Close = %v, want a *ShutdownError for the paused group", err)
		}
		tb.runCleanups()
		if errs := tb.errors(); len(errs) != 0 {
			t.Fatalf("cleanup reported %q after the test closed the broker itself", errs)
		}
	})
}

// A handler that never finishes: the cleanup gives up after its timeout
// (virtual here), which cancels the handler's context, and reports it.
func TestNewBrokerReportsCloseTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := newFakeTB(t)
		b := pubsubtest.NewBroker(tb)
		topic := mustTopic(t, b, "orders")
		mustSubscribe(t, topic, "billing", pubsub.HandlerFunc[string](
			func(ctx context.Context, _ pubsub.Message[string]) error {
				<-ctx.Done()
				return ctx.Err()
			}))
		mustPublish(t, topic, "k", "forever")

		start := time.Now()
		tb.runCleanups()
		if got := time.Since(start); got != time.Minute {
			t.Errorf("cleanup gave up after %v of virtual time, want its 1m timeout", got)
		}
		errs := tb.errors()
		if len(errs) != 1 || !strings.Contains(errs[0], context.DeadlineExceeded.Error()) {
			t.Fatalf("cleanup reported %q, want one error saying the deadline passed", errs)
		}
		if got := b.State(); got != pubsub.Stopped {
			t.Fatalf("State() = %v after cleanup, want stopped", got)
		}
	})
}

func TestDrainWaitsForDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders")
		rec := pubsubtest.NewRecorder[string]()
		slow := pubsub.HandlerFunc[string](func(ctx context.Context, m pubsub.Message[string]) error {
			time.Sleep(time.Second) // virtual: work that takes a while
			return rec.Handle(ctx, m)
		})
		mustSubscribe(t, topic, "billing", slow)
		start := time.Now()
		for _, v := range []string{"a", "b", "c"} {
			mustPublish(t, topic, "k", v)
		}
		pubsubtest.Drain(t, b)
		if rec.Len() != 3 {
			t.Fatalf("Drain returned with %d of 3 messages handled", rec.Len())
		}
		if got := time.Since(start); got != 3*time.Second {
			t.Errorf("Drain returned after %v of virtual time, want 3s", got)
		}
	})
}

// Drain must fail the test, not hang it, when a group cannot catch up.
func TestDrainFailsWhenStuck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders")
		release := make(chan struct{})
		mustSubscribe(t, topic, "billing", pubsub.HandlerFunc[string](
			func(context.Context, pubsub.Message[string]) error {
				<-release
				return nil
			}))
		mustPublish(t, topic, "k", "held")

		tb := newFakeTB(t)
		start := time.Now()
		pubsubtest.Drain(tb, b)
		if got := time.Since(start); got != time.Minute {
			t.Errorf("Drain gave up after %v of virtual time, want its 1m timeout", got)
		}
		fatals := tb.fatalErrors()
		if len(fatals) != 1 || !strings.Contains(fatals[0], context.DeadlineExceeded.Error()) {
			t.Fatalf("Drain reported %q, want one Fatalf saying the deadline passed", fatals)
		}
		close(release) // let the real cleanup close the broker cleanly
	})
}
