package jetstream

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// TestRetryBackoffIsTheServers checks, in real time, that a failing
// record is retried after BaseDelay·Multiplier^(n−1) (the engine's
// NakWithDelay: the server's own BackOff does not apply to naks), that it
// holds back the record behind it, and that after MaxAttempts it is a
// dead letter. Only lower bounds are checked: real time runs late, never
// early.
func TestRetryBackoffIsTheServers(t *testing.T) {
	const base = 80 * time.Millisecond
	b := newBroker(t, pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: base, Multiplier: 2}))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var at []time.Time
	var order []string
	g, err := topic.Subscribe("g", "c1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, m.Value)
		if m.Value == "bad" {
			at = append(at, time.Now())
			return errors.New("always fails")
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, v := range []string{"bad", "next"} {
		if _, err := topic.PublishValue(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(at) != 3 {
		t.Fatalf("bad was tried %d times, want 3", len(at))
	}
	for i, want := range []time.Duration{base, 2 * base} {
		if gap := at[i+1].Sub(at[i]); gap < want {
			t.Errorf("attempt %d came %v after attempt %d, want at least %v", i+2, gap, i+1, want)
		}
	}
	if want := []string{"bad", "bad", "bad", "next"}; len(order) != 4 || order[3] != "next" {
		t.Errorf("handled %q, want %q: a retry holds back the record behind it", order, want)
	}
	if dl := g.DeadLetters(); len(dl) != 1 || dl[0].Attempts != 3 || dl[0].Message.Value != "bad" {
		t.Errorf("dead letters %+v, want bad after 3 attempts", dl)
	}
	if st := g.Stats(); st.Retried != 2 || st.DeadLettered != 1 || st.Delivered != 1 {
		t.Errorf("stats %+v, want 2 retried, 1 dead-lettered, 1 delivered", st)
	}
}
