package jetstream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// retryHook tells, on a channel, that a retry was scheduled.
type retryHook chan pubsub.RetryEvent

func (h retryHook) OnRetry(e pubsub.RetryEvent) { h <- e }

// TestSnapshotShowsARetryAndAnswersAfterClose: a record waiting out its
// backoff is Retrying at the attempt that failed, with its lag in time;
// after Close the snapshot answers from what Close saw.
func TestSnapshotShowsARetryAndAnswersAfterClose(t *testing.T) {
	retries := make(retryHook, 1)
	b := newBroker(t, pubsub.WithHooks(retries))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	_, err = topic.Subscribe("billing", "b1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
		if m.Attempt == 1 {
			return errors.New("not yet")
		}
		return nil
	}), pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: 300 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := topic.PublishValue(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-retries:
		if e.Delivery.Attempt != 1 || e.Delay != 300*time.Millisecond || e.Delivery.Consumer != "b1" {
			t.Errorf("retry event %+v, want attempt 1 of b1, 300ms", e)
		}
	case <-ctx.Done():
		t.Fatal("no retry")
	}
	s := b.Snapshot()
	if s.Partial || len(s.Topics) != 1 || len(s.Topics[0].Groups) != 1 {
		t.Fatalf("snapshot %+v, want one topic with one group, not partial", s)
	}
	g := s.Topics[0].Groups[0]
	p := g.Partitions[0]
	if !p.Retrying || p.InFlight || p.Attempt != 1 || p.Lag != 1 || p.Committed != 0 || p.Owner != "b1" || p.Oldest.IsZero() || p.LagAge < 0 {
		t.Errorf("partition %+v, want retrying attempt 1, lag 1 with its age, owned by b1", p)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	s = b.Snapshot()
	if len(s.Topics) != 1 || len(s.Topics[0].Groups) != 1 {
		t.Fatalf("after Close: %+v, want the topic and its group", s)
	}
	p = s.Topics[0].Groups[0].Partitions[0]
	if p.Committed != 1 || p.Lag != 0 || p.Retrying || p.InFlight || s.Topics[0].Stats.Published != 1 {
		t.Errorf("after Close: partition %+v, topic %+v; want committed 1, no lag, idle", p, s.Topics[0].Stats)
	}
}
