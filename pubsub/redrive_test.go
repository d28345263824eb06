package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// Redrive sends the chosen dead letters back to the group that failed
// them, and to no other: they are delivered again with attempts from 1,
// counted, and gone from DeadLetters; Drain waits for them.
func TestRedriveSendsDeadLettersBackToTheGroupOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 2}))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
		var fixed atomic.Bool
		var billing, audit recorder[string]
		billing.fail = func(_ context.Context, m pubsub.Message[string]) error {
			if m.Value != "ok" && !fixed.Load() {
				return errors.New("not yet")
			}
			return nil
		}
		g := mustSubscribe(t, topic, "billing", "b1", &billing)
		mustSubscribe(t, topic, "audit", "a1", &audit)
		mustPublish(t, topic, "alice", "ok")
		mustPublish(t, topic, "bob", "bad-1")
		mustPublish(t, topic, "carol", "bad-2")
		pubsubtest.Drain(t, b)
		letters := g.DeadLetters()
		if len(letters) != 2 {
			t.Fatalf("%d dead letters, want 2", len(letters))
		}
		fixed.Store(true)
		before := len(billing.calls())

		// By ID: only bad-2.
		i := slices.IndexFunc(letters, func(l pubsub.DeadLetter[string]) bool { return l.Message.Value == "bad-2" })
		id := letters[i].Message.ID
		n, err := g.Redrive(context.Background(), func(l pubsub.DeadLetter[string]) bool { return l.Message.ID == id })
		if err != nil || n != 1 {
			t.Fatalf("Redrive by ID: %d, %v; want 1, nil", n, err)
		}
		pubsubtest.Drain(t, b)
		again := billing.calls()[before:]
		if len(again) != 1 || again[0].Value != "bad-2" || again[0].Attempt != 1 || again[0].ID != id || again[0].Offset != letters[i].Message.Offset {
			t.Errorf("redelivered %+v, want bad-2 once, attempt 1, with its ID and offset", again)
		}
		if left := g.DeadLetters(); len(left) != 1 || left[0].Message.Value != "bad-1" {
			t.Errorf("dead letters left: %v, want bad-1 only", left)
		}

		// All the rest.
		if n, err := g.Redrive(context.Background(), nil); err != nil || n != 1 {
			t.Fatalf("Redrive(nil): %d, %v; want 1, nil", n, err)
		}
		pubsubtest.Drain(t, b)
		if left := g.DeadLetters(); len(left) != 0 {
			t.Errorf("dead letters left: %v, want none", left)
		}
		if s := g.Stats(); s.Redriven != 2 || s.Delivered != 3 || s.DeadLettered != 2 {
			t.Errorf("stats %+v, want 2 redriven, 3 delivered, 2 dead-lettered", s)
		}
		if got := audit.values(); len(got) != 3 {
			t.Errorf("audit saw %v, want each record once: redrive is the failing group's only", got)
		}
		if n, err := g.Redrive(context.Background(), nil); err != nil || n != 0 {
			t.Errorf("Redrive with no letters: %d, %v; want 0, nil", n, err)
		}
	})
}

// A redriven letter that fails again is retried and dead-lettered again,
// its attempts counted from 1.
func TestRedrivenLetterThatFailsAgainIsDeadLetteredAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 3}))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		var rec recorder[string]
		rec.fail = func(context.Context, pubsub.Message[string]) error { return errors.New("still broken") }
		g := mustSubscribe(t, topic, "billing", "b1", &rec)
		mustPublish(t, topic, "k", "v")
		pubsubtest.Drain(t, b)
		if _, err := g.Redrive(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
		var attempts []int
		for _, m := range rec.calls() {
			attempts = append(attempts, m.Attempt)
		}
		if !slices.Equal(attempts, []int{1, 2, 3, 1, 2, 3}) {
			t.Errorf("attempts %v, want 1 2 3 then 1 2 3 again", attempts)
		}
		if l := g.DeadLetters(); len(l) != 1 || l[0].Attempts != 3 {
			t.Errorf("dead letters %v, want the one letter again after 3 attempts", l)
		}
	})
}

// A redriven letter waits while its group is paused, holds Drain up as a
// stalled group does, and is put back in the dead letters by a Close that
// could not deliver it.
func TestRedriveOfAPausedGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsub.NewBroker()
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		var rec recorder[string]
		rec.fail = func(_ context.Context, m pubsub.Message[string]) error { return pubsub.ErrPermanent }
		g := mustSubscribe(t, topic, "billing", "b1", &rec)
		mustPublish(t, topic, "k", "v")
		pubsubtest.Drain(t, b)
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := g.Redrive(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		if p := b.Snapshot().Topics[0].Groups[0].Partitions[0]; p.Redriving != 1 {
			t.Errorf("snapshot: %d redriving, want 1", p.Redriving)
		}
		wantErrIs(t, "Drain with a redriven letter in a paused group", b.Drain(context.Background()), pubsub.ErrStalled)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = b.Close(ctx)
		if l := g.DeadLetters(); len(l) != 1 {
			t.Errorf("after Close: %d dead letters, want the undelivered one back", len(l))
		}
		_, err := g.Redrive(context.Background(), nil)
		wantErrIs(t, "Redrive after Close", err, pubsub.ErrClosed)
	})
}

// A worker stopped while a record waited out its backoff leaves the
// record's attempt count to its successor; redriven letters delivered
// first do not reset it. Interleaving: "x" is dead-lettered, "a" fails its
// first attempt, Pause stops the worker during the backoff, Redrive sends
// "x" back, Resume starts a worker that delivers "x" and then "a" at
// attempt 2.
func TestRedriveKeepsTheAttemptsOfARecordMidRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Minute}))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		var redriven atomic.Bool
		var rec recorder[string]
		rec.fail = func(_ context.Context, m pubsub.Message[string]) error {
			switch {
			case m.Value == "x" && !redriven.Load():
				return pubsub.ErrPermanent
			case m.Value == "a" && m.Attempt == 1:
				return errors.New("once")
			}
			return nil
		}
		g := mustSubscribe(t, topic, "billing", "b1", &rec)
		mustPublish(t, topic, "k", "x")
		mustPublish(t, topic, "k", "a")
		synctest.Wait() // "a" waits out its backoff
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		redriven.Store(true)
		if n, err := g.Redrive(context.Background(), nil); n != 1 || err != nil {
			t.Fatalf("Redrive: %d, %v; want 1, nil", n, err)
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
		var got []string
		for _, m := range rec.calls() {
			got = append(got, fmt.Sprintf("%s#%d", m.Value, m.Attempt))
		}
		if want := []string{"x#1", "a#1", "x#1", "a#2"}; !slices.Equal(got, want) {
			t.Errorf("deliveries %v, want %v", got, want)
		}
	})
}

// A tool that holds only the Broker redrives through Broker.Group: the
// untyped view reads the dead letters as bytes and redrives them.
func TestRedriveThroughTheUntypedView(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		var fixed atomic.Bool
		var rec recorder[string]
		rec.fail = func(context.Context, pubsub.Message[string]) error {
			if !fixed.Load() {
				return fmt.Errorf("no: %w", pubsub.ErrPermanent)
			}
			return nil
		}
		mustSubscribe(t, topic, "billing", "b1", &rec)
		mustPublish(t, topic, "alice", "paid", pubsub.WithHeaders(map[string]string{"h": "1"}))
		pubsubtest.Drain(t, b)

		raw, err := b.Group("billing", "orders")
		if err != nil {
			t.Fatal(err)
		}
		letters := raw.DeadLetters()
		if len(letters) != 1 {
			t.Fatalf("DeadLetters: %v; want one", letters)
		}
		l := letters[0]
		if string(l.Message.Key) != "alice" || string(l.Message.Value) != "paid" || l.Message.Headers["h"] != "1" ||
			l.Attempts != 1 || !errors.Is(l.Err, pubsub.ErrPermanent) || l.Message.ID == "" || l.Message.Offset != 0 {
			t.Errorf("raw dead letter %+v, want alice/paid with its header, 1 attempt, ErrPermanent", l)
		}
		fixed.Store(true)
		if n, err := raw.Redrive(context.Background(), func(l pubsub.DeadLetter[[]byte]) bool { return string(l.Message.Key) == "alice" }); n != 1 || err != nil {
			t.Fatalf("Redrive: %d, %v; want 1, nil", n, err)
		}
		pubsubtest.Drain(t, b)
		if n := len(rec.calls()); n != 2 {
			t.Errorf("%d deliveries, want 2 (the first and the redriven one)", n)
		}
		if n := len(raw.DeadLetters()); n != 0 {
			t.Errorf("%d dead letters left after the redrive, want 0", n)
		}
	})
}

// A redriven letter waits for a consumer: the group's only consumer left,
// so the letter stalls Drain; the next consumer to join delivers it.
func TestRedrivenLetterWaitsForAConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		var first recorder[string]
		first.fail = func(context.Context, pubsub.Message[string]) error { return pubsub.ErrPermanent }
		g := mustSubscribe(t, topic, "billing", "b1", &first)
		mustPublish(t, topic, "k", "v")
		pubsubtest.Drain(t, b)
		if err := g.Leave(context.Background(), "b1"); err != nil {
			t.Fatal(err)
		}
		if n, err := g.Redrive(context.Background(), nil); n != 1 || err != nil {
			t.Fatalf("Redrive: %d, %v; want 1, nil", n, err)
		}
		wantErrIs(t, "Drain with a redriven letter and no consumer", b.Drain(context.Background()), pubsub.ErrStalled)
		var second recorder[string]
		mustSubscribe(t, topic, "billing", "b2", &second)
		pubsubtest.Drain(t, b)
		if got := second.calls(); len(got) != 1 || got[0].Value != "v" || got[0].Attempt != 1 {
			t.Errorf("the new consumer got %+v, want the redriven record at attempt 1", got)
		}
	})
}

// A batch consumer takes a redriven letter too, alone, with its ID.
func TestRedriveToABatchConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		var fixed atomic.Bool
		var mu sync.Mutex
		var batches [][]string
		g, err := topic.SubscribeBatch("billing", "b1", pubsub.BatchHandlerFunc[string](func(_ context.Context, msgs []pubsub.Message[string]) error {
			mu.Lock()
			var got []string
			for _, m := range msgs {
				got = append(got, fmt.Sprintf("%s#%d", m.Value, m.Attempt))
			}
			batches = append(batches, got)
			mu.Unlock()
			for i, m := range msgs {
				if m.Value == "bad" && !fixed.Load() {
					return &pubsub.BatchError{Index: i, Err: fmt.Errorf("no: %w", pubsub.ErrPermanent)}
				}
			}
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Pause(context.Background()); err != nil { // so the three arrive as one batch
			t.Fatal(err)
		}
		for _, v := range []string{"a", "bad", "c"} {
			mustPublish(t, topic, "k", v)
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
		letters := g.DeadLetters()
		if len(letters) != 1 || letters[0].Message.Value != "bad" {
			t.Fatalf("dead letters %v, want bad", letters)
		}
		fixed.Store(true)
		if n, err := g.Redrive(context.Background(), nil); n != 1 || err != nil {
			t.Fatalf("Redrive: %d, %v; want 1, nil", n, err)
		}
		pubsubtest.Drain(t, b)
		mu.Lock()
		defer mu.Unlock()
		want := [][]string{{"a#1", "bad#1", "c#1"}, {"c#1"}, {"bad#1"}}
		if !slices.EqualFunc(batches, want, slices.Equal) {
			t.Errorf("batches %v, want %v", batches, want)
		}
		if n := len(g.DeadLetters()); n != 0 || g.Stats().Redriven != 1 {
			t.Errorf("%d dead letters and %d redriven after the redrive, want 0 and 1", n, g.Stats().Redriven)
		}
	})
}
