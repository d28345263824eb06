package core

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// TestNoLostWakeUpUnderBlock publishes through a partition of one record,
// so that nearly every publish waits for the commit of the record before
// it, with the producer and the worker racing on real threads. A producer
// that missed the commit it waits for (see notifyCommit) would wait while
// the worker, with nothing left to deliver, waits too: in the bubble, that
// moves the clock to the producer's BlockTimeout. With no lost wake-up the
// clock never moves.
func TestNoLostWakeUpUnderBlock(t *testing.T) {
	publishes := 100_000
	if testing.Short() {
		publishes = 10_000
	}
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{Retention: Retention{MaxMessages: 1, BlockTimeout: time.Minute}})
		subscribe(t, b, "t", "g", "c", func(context.Context, *Delivery) error { return nil })
		start := time.Now()
		for i := range publishes {
			if _, err := topic.Publish(context.Background(), nil, []byte{1}, nil); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("a producer waited out its BlockTimeout: the clock moved %v", waited)
		}
	})
}
