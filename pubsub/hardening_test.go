package pubsub_test

// Edges that hold for hostile or unlucky callers (issue 22): every error
// wraps a sentinel, nothing loops, hangs or grows without bound.

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// Close's drain waits for a group whose only consumer then leaves (by
// Leave, or by closing its Stream) with a record still to deliver: the
// group stalls during the drain, which skips it, and Close leaves the
// record behind while its ctx is still alive. Its ShutdownError must say
// why, wrapping ErrStalled; it wrapped nothing, because Close looked for
// stalled groups only before the drain.
func TestCloseSaysStalledWhenTheLastConsumerLeavesDuringTheDrain(t *testing.T) {
	// Leave waits for the delivery in flight, which commits; a closed
	// Stream gives back the one it held, which commits nothing.
	for how, committed := range map[string]int64{"Leave": 1, "Stream.Close": 0} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t)
				topic := mustTopic(t, b, "orders", codec.String(), codec.String())
				release := make(chan struct{})
				var leave func() error
				switch how {
				case "Leave":
					rec := recorder[string]{fail: func(context.Context, pubsub.Message[string]) error {
						<-release // "1" is in flight while Close drains
						return nil
					}}
					g := mustSubscribe(t, topic, "billing", "b1", &rec)
					leave = func() error { return g.Leave(context.Background(), "b1") }
				case "Stream.Close":
					s := mustStream(t, topic, "billing", "b1")
					go func() {
						d := <-s.C() // "1" is held while Close drains
						<-release
						d.Ack()
					}()
					leave = s.Close
				}
				mustPublishValue(t, topic, "1")
				mustPublishValue(t, topic, "2")
				synctest.Wait()
				closed := make(chan error, 1)
				go func() { closed <- b.Close(context.Background()) }()
				synctest.Wait() // Close drains, waiting for billing
				left := make(chan error, 1)
				go func() { left <- leave() }()
				synctest.Wait() // the consumer left; its delivery is still in flight
				close(release)
				if err := <-left; err != nil {
					t.Fatalf("%s: %v", how, err)
				}
				err := <-closed
				wantErrIs(t, "Close after the last consumer left mid-drain", err, pubsub.ErrStalled)
				se, ok := errors.AsType[*pubsub.ShutdownError](err)
				want := pubsub.Unfinished{Group: "billing", Topic: "orders", Partition: 0, Committed: committed, End: 2}
				if !ok || len(se.Unfinished) != 1 || se.Unfinished[0] != want {
					t.Fatalf("Close: got %v, want a ShutdownError leaving %+v", err, want)
				}
			})
		})
	}
}

// Seek and Replay refuse once Close began, not only once it finished: a
// drain that found a group caught up must not see its offset move back
// (Close would then leave records behind without a reason to give).
func TestSeekAndReplayWhileCloseDrainsFailWithErrClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		release := make(chan struct{})
		rec := recorder[string]{fail: func(_ context.Context, m pubsub.Message[string]) error {
			if m.Value == "2" {
				<-release // keeps Close draining
			}
			return nil
		}}
		g := mustSubscribe(t, topic, "billing", "b1", &rec)
		mustPublishValue(t, topic, "1")
		mustPublishValue(t, topic, "2")
		synctest.Wait()
		closed := make(chan error, 1)
		go func() { closed <- b.Close(context.Background()) }()
		synctest.Wait() // Close drains, waiting for "2"
		wantErrIs(t, "Seek while Close drains", g.Seek(context.Background(), 0, 0), pubsub.ErrClosed)
		wantErrIs(t, "Replay while Close drains", g.Replay(context.Background(), pubsub.Earliest()), pubsub.ErrClosed)
		close(release)
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v, want nil: the group finished", err)
		}
		if got := rec.values(); len(got) != 2 {
			t.Errorf("delivered %q, want each record once", got)
		}
	})
}

// Drain after Close: a group Close left behind can never move again, so
// Drain says the broker is closed (it said the group was stalled); with
// nothing left behind it is nil, as a barrier should be.
func TestDrainAfterCloseSaysClosedForWhatWasLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		g := mustSubscribe(t, topic, "billing", "b1", nopHandler())
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustPublishValue(t, topic, "1")
		wantErrIs(t, "Close with a paused group", b.Close(context.Background()), pubsub.ErrStalled)
		err := b.Drain(context.Background())
		wantErrIs(t, "Drain after Close", err, pubsub.ErrClosed)
		if errors.Is(err, pubsub.ErrStalled) {
			t.Errorf("Drain after Close: %v, want ErrClosed alone", err)
		}

		clean := newBroker(t)
		mustTopic(t, clean, "orders", codec.String(), codec.String())
		if err := clean.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := clean.Drain(context.Background()); err != nil {
			t.Errorf("Drain after a Close that left nothing: %v, want nil", err)
		}
	})
}
