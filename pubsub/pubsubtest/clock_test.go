package pubsubtest_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

var epoch = time.Date(2024, 5, 1, 9, 30, 0, 0, time.UTC)

func TestClockAdvanceAndSet(t *testing.T) {
	c := pubsubtest.NewClock(epoch)
	if got := c.Now(); !got.Equal(epoch) {
		t.Fatalf("Now() = %v, want the start %v", got, epoch)
	}
	if got := c.Now(); !got.Equal(epoch) {
		t.Fatalf("Now() moved by itself: %v, want %v", got, epoch)
	}
	c.Advance(90 * time.Second)
	if got, want := c.Now(), epoch.Add(90*time.Second); !got.Equal(want) {
		t.Fatalf("after Advance(90s): %v, want %v", got, want)
	}
	c.Advance(-30 * time.Second)
	if got, want := c.Now(), epoch.Add(time.Minute); !got.Equal(want) {
		t.Fatalf("after Advance(-30s): %v, want %v", got, want)
	}
	later := epoch.Add(48 * time.Hour)
	c.Set(later)
	if got := c.Now(); !got.Equal(later) {
		t.Fatalf("after Set(%v): %v", later, got)
	}
	c.Set(epoch) // back in time too
	if got := c.Now(); !got.Equal(epoch) {
		t.Fatalf("after Set back to %v: %v", epoch, got)
	}
}

func TestClockZeroValueReadsZeroTime(t *testing.T) {
	var c pubsubtest.Clock
	if got := c.Now(); !got.IsZero() {
		t.Fatalf("zero Clock reads %v, want the zero time", got)
	}
	c.Advance(time.Second)
	if got, want := c.Now(), (time.Time{}).Add(time.Second); !got.Equal(want) {
		t.Fatalf("after Advance(1s): %v, want %v", got, want)
	}
}

// Concurrent Advances must add up, and a reader must never see time go
// back while only positive Advances happen (run with -race).
func TestClockConcurrentAdvance(t *testing.T) {
	const writers, steps = 8, 200
	c := pubsubtest.NewClock(epoch)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range steps {
				c.Advance(time.Millisecond)
			}
		})
	}
	stop := make(chan struct{})
	var backwards error
	var readers sync.WaitGroup
	readers.Go(func() {
		last := c.Now()
		for {
			select {
			case <-stop:
				return
			default:
			}
			now := c.Now()
			if now.Before(last) && backwards == nil {
				backwards = errors.New("Now went back from " + last.String() + " to " + now.String())
			}
			last = now
		}
	})
	wg.Wait()
	close(stop)
	readers.Wait()
	if backwards != nil {
		t.Fatal(backwards)
	}
	if got, want := c.Now(), epoch.Add(writers*steps*time.Millisecond); !got.Equal(want) {
		t.Fatalf("after %d concurrent Advances of 1ms: %v, want %v", writers*steps, got, want)
	}
}

// The broker stamps Message.Created with its Clock and trims by MaxAge
// against it, on the next publish.
func TestClockDrivesCreatedAndMaxAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := pubsubtest.NewClock(epoch)
		b := pubsubtest.NewBroker(t, pubsub.WithClock(clock))
		topic := mustTopic(t, b, "events", pubsub.WithRetention(pubsub.Retention{MaxAge: time.Hour}))

		mustPublish(t, topic, "k", "old")
		clock.Advance(time.Hour + time.Second)
		if got := topic.Stats().Expired; got != 0 {
			t.Fatalf("Expired = %d before any publish or read; Advance is documented to wake nothing", got)
		}
		mustPublish(t, topic, "k", "new")
		st := topic.Stats()
		if st.Expired != 1 || st.Retained != 1 {
			t.Fatalf("after advancing past MaxAge and publishing: Expired %d Retained %d, want 1 and 1", st.Expired, st.Retained)
		}

		rec := pubsubtest.NewRecorder[string]()
		mustSubscribe(t, topic, "audit", rec)
		pubsubtest.Drain(t, b)
		msgs := rec.Messages()
		if len(msgs) != 1 {
			t.Fatalf("recorded %d messages, want only the unexpired one", len(msgs))
		}
		if m := msgs[0]; m.Value != "new" || m.Offset != 1 || !m.Created.Equal(epoch.Add(time.Hour+time.Second)) {
			t.Fatalf("got %q at offset %d created %v; want \"new\" at offset 1 created %v",
				m.Value, m.Offset, m.Created, epoch.Add(time.Hour+time.Second))
		}
	})
}

// A dead letter is dated by the Clock when the last attempt fails, not when
// the record was published.
func TestClockDatesDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := pubsubtest.NewClock(epoch)
		b := pubsubtest.NewBroker(t, pubsub.WithClock(clock))
		topic := mustTopic(t, b, "orders")
		rec := pubsubtest.NewRecorder[string]()
		rec.FailWith(func(pubsub.Message[string]) error { return pubsub.ErrPermanent })
		g := mustSubscribe(t, topic, "billing", rec)

		if err := g.Pause(context.Background()); err != nil {

			t.Fatal(err)

		}
		mustPublish(t, topic, "alice", "alice:paid")
		clock.Advance(5 * time.Minute)
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)

		dls := g.DeadLetters()
		if len(dls) != 1 {
			t.Fatalf("%d dead letters, want 1", len(dls))
		}
		if got := dls[0].Message.Created; !got.Equal(epoch) {
			t.Errorf("Created = %v, want the publish time %v", got, epoch)
		}
		if got, want := dls[0].FailedAt, epoch.Add(5*time.Minute); !got.Equal(want) {
			t.Errorf("FailedAt = %v, want %v", got, want)
		}
	})
}
