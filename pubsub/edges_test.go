package pubsub_test

// Edge values that the mutation run found untested: each test pins the
// boundary of one comparison.

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

func TestOnePartitionAskedForIsValid(t *testing.T) {
	_, topic := newTopic(t, "t", pubsub.WithPartitions(1))
	if n := topic.Partitions(); n != 1 {
		t.Errorf("WithPartitions(1): %d partitions, want 1", n)
	}
}

func TestARecordOfExactlyMaxBytesFits(t *testing.T) {
	_, topic := newTopic(t, "t",
		pubsub.WithRetention(pubsub.Retention{MaxBytes: 8, OnFull: pubsub.DropOldest}))
	mustPublish(t, topic, "key", "value") // 3 + 5 = 8 bytes
	if s := topic.Stats(); s.RetainedBytes != 8 || s.Retained != 1 {
		t.Errorf("stats %+v, want the 8-byte record retained", s)
	}
}

func TestStreamCloseAfterBrokerCloseDoesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "t")
		s := mustStream(t, topic, "g", "c")
		if err := b.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Stream.Close after Broker.Close: %v, want nil", err)
		}
	})
}

// WaitFor(n) with exactly n recorded returns at once, even with its
// context already done.
func TestRecorderWaitForExactlyWhatIsThere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "t")
		rec := pubsubtest.NewRecorder[string]()
		mustSubscribe(t, topic, "g", "c", rec)
		mustPublishValue(t, topic, "a")
		mustPublishValue(t, topic, "b")
		pubsubtest.Drain(t, b)
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // nothing may be waited for: two are there already
		if err := rec.WaitFor(ctx, 2); err != nil {
			t.Errorf("WaitFor(2) with 2 recorded: %v, want nil at once", err)
		}
	})
}
