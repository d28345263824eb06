package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// recv returns the stream's next delivery, failing the test if C is closed
// or nothing comes within a minute (of virtual time inside a bubble).
func recv[V any](t *testing.T, s *pubsub.Stream[V]) *pubsub.Delivery[V] {
	t.Helper()
	select {
	case d, ok := <-s.C():
		if !ok {
			t.Fatal("C(): got closed, want a delivery")
		}
		return d
	case <-time.After(time.Minute):
		t.Fatal("C(): got nothing within a minute, want a delivery")
	}
	return nil
}

// noDelivery asserts that nothing is waiting on C once every goroutine of
// the bubble has settled.
func noDelivery[V any](t *testing.T, s *pubsub.Stream[V]) {
	t.Helper()
	synctest.Wait()
	select {
	case d, ok := <-s.C():
		if ok {
			t.Fatalf("C(): got %v at partition %d offset %d, want nothing", d.Value, d.Partition, d.Offset)
		}
		t.Fatal("C(): got closed, want open and empty")
	default:
	}
}

// wantClosed asserts that C is closed (now, without waiting).
func wantClosed[V any](t *testing.T, s *pubsub.Stream[V]) {
	t.Helper()
	select {
	case d, ok := <-s.C():
		if ok {
			t.Fatalf("C(): got a delivery (%v), want closed", d.Value)
		}
	default:
		t.Fatal("C(): got open, want closed")
	}
}

// twoTasks returns a stream of group "workers" on a one-partition topic
// "tasks" to which "wash" and "dry" were published, in that order.
func twoTasks(t *testing.T) (*pubsub.Broker, *pubsub.Stream[string], *pubsub.Group[string]) {
	t.Helper()
	b, topic := newTopic(t, "tasks")
	s := mustStream(t, topic, "workers", "w1")
	mustPublishValue(t, topic, "wash")
	mustPublishValue(t, topic, "dry")
	return b, s, s.Group()
}

// Until a delivery is acked its partition delivers nothing further and its
// offset stays uncommitted; Ack commits and lets the next one come.
func TestStreamDeliversOneAtATimeUntilAcked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, s, g := twoTasks(t)

		d1 := recv(t, s)
		if d1.Value != "wash" || d1.Offset != 0 || d1.Attempt != 1 || d1.Topic != "tasks" {
			t.Errorf("first delivery: got %q offset %d attempt %d topic %q, want \"wash\" offset 0 attempt 1 topic \"tasks\"",
				d1.Value, d1.Offset, d1.Attempt, d1.Topic)
		}
		noDelivery(t, s)
		if c := g.Committed(0); c != 0 {
			t.Errorf("Committed(0) with the delivery unacked: got %d, want 0", c)
		}
		if lag := g.Lag(); lag != 2 {
			t.Errorf("Lag with the delivery unacked: got %d, want 2", lag)
		}

		d1.Ack()
		d2 := recv(t, s)
		if d2.Value != "dry" || d2.Offset != 1 {
			t.Errorf("second delivery: got %q at offset %d, want \"dry\" at offset 1", d2.Value, d2.Offset)
		}
		if c := g.Committed(0); c != 1 {
			t.Errorf("Committed(0) after the first Ack: got %d, want 1", c)
		}
		noDelivery(t, s)
		d2.Ack()
		d2.Ack()         // later calls do nothing
		d2.Nack(errBoom) // nor does a Nack after the Ack
		pubsubtest.Drain(t, b)
		if c := g.Committed(0); c != 2 {
			t.Errorf("Committed(0) after both Acks: got %d, want 2", c)
		}
		if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 2}); got != want {
			t.Errorf("stats: got %+v, want %+v", got, want)
		}
		noDelivery(t, s)
	})
}

// A partition's deliveries share one outcome channel, one after the other:
// settling a delivery again after the next one arrived must not settle the
// next one.
func TestStreamLateSettleLeavesTheNextDeliveryAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, s, g := twoTasks(t)
		d1 := recv(t, s)
		d1.Ack()
		d2 := recv(t, s)
		d1.Nack(errBoom) // late: d1 is settled, so nothing may happen
		d1.Ack()
		synctest.Wait()
		if c := g.Committed(0); c != 1 {
			t.Fatalf("Committed(0) after late calls on the first delivery: got %d, want 1 (the second still open)", c)
		}
		noDelivery(t, s)
		d2.Ack()
		pubsubtest.Drain(t, b)
		if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 2}); got != want {
			t.Errorf("stats: got %+v, want %+v (no retry, no dead letter)", got, want)
		}
	})
}

// Deliveries of different partitions can be outstanding at once; each
// partition still waits for its own Ack.
func TestStreamPartitionsAreIndependent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "tasks",
			pubsub.WithPartitions(2), pubsub.WithPartitioner(pubsub.RoundRobin()))
		s := mustStream(t, topic, "workers", "w1")
		for _, v := range []string{"p0-a", "p1-a", "p0-b", "p1-b"} {
			mustPublishValue(t, topic, v)
		}
		byPart := map[int]*pubsub.Delivery[string]{}
		for range 2 {
			d := recv(t, s)
			byPart[d.Partition] = d
		}
		if byPart[0] == nil || byPart[1] == nil || byPart[0].Value != "p0-a" || byPart[1].Value != "p1-a" {
			t.Fatalf("first two deliveries: got %v, want p0-a and p1-a, one per partition", byPart)
		}
		noDelivery(t, s)
		byPart[1].Ack()
		d := recv(t, s)
		if d.Value != "p1-b" {
			t.Errorf("after acking partition 1: got %q, want \"p1-b\"", d.Value)
		}
		noDelivery(t, s) // partition 0 still waits for p0-a
		if c := s.Group().Committed(0); c != 0 {
			t.Errorf("Committed(0): got %d, want 0", c)
		}
		d.Ack()
		byPart[0].Ack()
		d = recv(t, s)
		if d.Value != "p0-b" {
			t.Errorf("after acking partition 0: got %q, want \"p0-b\"", d.Value)
		}
		d.Ack()
		pubsubtest.Drain(t, b)
		if lag := s.Group().Lag(); lag != 0 {
			t.Errorf("lag: got %d, want 0", lag)
		}
	})
}

// Nack counts as a failed attempt: the same message comes again with
// Attempt 2 after the backoff, and is dead-lettered after MaxAttempts.
func TestStreamNackRetriesThenDeadLetters(t *testing.T) {
	tests := []struct {
		name    string
		nackErr error // what Nack is given
		wantIs  error // what the dead letter's Err must wrap
	}{
		{"with an error", errBoom, errBoom},
		{"with nil", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, topic := newTopic(t, "tasks")
				s := mustStream(t, topic, "workers", "w1",
					pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Second}))
				g := s.Group()
				mustPublishValue(t, topic, "job")
				mustPublishValue(t, topic, "next")

				d1 := recv(t, s)
				start := time.Now()
				d1.Nack(tt.nackErr)
				d2 := recv(t, s)
				if waited := time.Since(start); waited != time.Second {
					t.Errorf("redelivery after %v, want the 1s backoff", waited)
				}
				if d2.ID != d1.ID || d2.Offset != 0 || d2.Value != "job" || d2.Attempt != 2 {
					t.Errorf("redelivery: got ID %q offset %d value %q attempt %d, want ID %q offset 0 value \"job\" attempt 2",
						d2.ID, d2.Offset, d2.Value, d2.Attempt, d1.ID)
				}
				if c := g.Committed(0); c != 0 {
					t.Errorf("Committed(0) during the retry: got %d, want 0", c)
				}
				d2.Nack(tt.nackErr)
				d3 := recv(t, s)
				if d3.Value != "next" || d3.Attempt != 1 {
					t.Errorf("after the dead letter: got %q attempt %d, want \"next\" attempt 1", d3.Value, d3.Attempt)
				}
				if c := g.Committed(0); c != 1 {
					t.Errorf("Committed(0) after the dead letter: got %d, want 1", c)
				}
				d3.Ack()
				pubsubtest.Drain(t, b)
				letters := g.DeadLetters()
				if len(letters) != 1 {
					t.Fatalf("got %d dead letters, want 1", len(letters))
				}
				if dl := letters[0]; dl.Attempts != 2 || dl.Message.Value != "job" || dl.Err == nil {
					t.Errorf("dead letter: got value %q after %d attempts, err %v; want \"job\" after 2, non-nil err", dl.Message.Value, dl.Attempts, dl.Err)
				}
				if tt.wantIs != nil {
					wantErrIs(t, "dead letter Err", letters[0].Err, tt.wantIs)
				}
				if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 1, Retried: 1, DeadLettered: 1}); got != want {
					t.Errorf("stats: got %+v, want %+v", got, want)
				}
				if err := s.Close(); err != nil {
					t.Errorf("Stream.Close: got %v, want nil", err)
				}
			})
		})
	}
}

// Nack with an error wrapping ErrPermanent dead-letters at once.
func TestStreamNackPermanentDeadLettersAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "tasks")
		s := mustStream(t, topic, "workers", "w1", pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 5}))
		g := s.Group()
		mustPublishValue(t, topic, "job")
		mustPublishValue(t, topic, "next")
		start := time.Now()
		recv(t, s).Nack(fmt.Errorf("job: %w", pubsub.ErrPermanent))
		d := recv(t, s)
		if d.Value != "next" || d.Attempt != 1 {
			t.Errorf("after a permanent Nack: got %q attempt %d, want \"next\" attempt 1", d.Value, d.Attempt)
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("waited %v before the next message, want 0 (no backoff)", waited)
		}
		d.Ack()
		pubsubtest.Drain(t, b)
		letters := g.DeadLetters()
		if len(letters) != 1 || letters[0].Attempts != 1 || letters[0].Message.Value != "job" {
			t.Fatalf("dead letters: got %+v, want \"job\" after 1 attempt", letters)
		}
		wantErrIs(t, "dead letter Err", letters[0].Err, pubsub.ErrPermanent)
		if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 1, DeadLettered: 1}); got != want {
			t.Errorf("stats: got %+v, want %+v", got, want)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Stream.Close: got %v, want nil", err)
		}
	})
}

// Stream.Close with a delivery outstanding gives it back without counting
// a failure: another consumer of the group gets the message, and C closes.
func TestStreamCloseGivesBackAnUnackedDelivery(t *testing.T) {
	// takeOver joins the group (before or after the close, as the case says)
	// and returns the message it was handed, acked.
	type takeOver func(t *testing.T, b *pubsub.Broker, topic *pubsub.Topic[string, string]) (join func(), receive func() pubsub.Message[string])
	viaHandler := func(t *testing.T, b *pubsub.Broker, topic *pubsub.Topic[string, string]) (func(), func() pubsub.Message[string]) {
		var rec recorder[string]
		join := func() { mustSubscribe(t, topic, "workers", "w2", &rec) }
		receive := func() pubsub.Message[string] {
			pubsubtest.Drain(t, b)
			calls := rec.calls()
			if len(calls) != 1 {
				t.Fatalf("the other consumer got %d deliveries, want 1", len(calls))
			}
			return calls[0]
		}
		return join, receive
	}
	viaStream := func(t *testing.T, _ *pubsub.Broker, topic *pubsub.Topic[string, string]) (func(), func() pubsub.Message[string]) {
		var s2 *pubsub.Stream[string]
		join := func() { s2 = mustStream(t, topic, "workers", "w2") }
		receive := func() pubsub.Message[string] {
			d := recv(t, s2)
			d.Ack()
			return d.Message
		}
		return join, receive
	}
	tests := []struct {
		name      string
		other     takeOver
		joinFirst bool // the other consumer is in the group before the close
	}{
		{"to a handler already in the group", viaHandler, true},
		{"to a stream already in the group", viaStream, true},
		{"to the next handler to join", viaHandler, false},
		{"to the next stream to join", viaStream, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, topic := newTopic(t, "tasks")
				s1 := mustStream(t, topic, "workers", "w1")
				g := s1.Group()
				join, receive := tt.other(t, b, topic)
				if tt.joinFirst {
					join()
					if asg := g.Assignment(); !slices.Equal(asg["w1"], []int{0}) || len(asg["w2"]) != 0 {
						t.Fatalf("assignment: got %v, want w1 owning partition 0 and w2 none", asg)
					}
				}
				mustPublishValue(t, topic, "job")
				d := recv(t, s1)
				if err := s1.Close(); err != nil {
					t.Fatalf("Stream.Close: got %v, want nil", err)
				}
				wantClosed(t, s1)
				d.Ack() // too late: the delivery was given back
				if !tt.joinFirst {
					synctest.Wait()
					if c := g.Committed(0); c != 0 {
						t.Errorf("Committed(0) after the give-back: got %d, want 0", c)
					}
					join()
				}
				if asg := g.Assignment(); !slices.Equal(asg["w2"], []int{0}) || len(asg) != 1 {
					t.Errorf("assignment after w1 left: got %v, want only w2, owning partition 0", asg)
				}
				msg := receive()
				pubsubtest.Drain(t, b)
				if msg.ID != d.ID || msg.Offset != 0 || msg.Value != "job" {
					t.Errorf("redelivery: got ID %q offset %d value %q, want ID %q offset 0 value \"job\"", msg.ID, msg.Offset, msg.Value, d.ID)
				}
				if msg.Attempt != 2 {
					t.Errorf("redelivery Attempt: got %d, want 2 (it counts up on redelivery)", msg.Attempt)
				}
				if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 1}); got != want {
					t.Errorf("stats: got %+v, want %+v (a give-back is no failure)", got, want)
				}
				if c := g.Committed(0); c != 1 {
					t.Errorf("Committed(0): got %d, want 1", c)
				}
			})
		})
	}
}

// Broker.Close closes every Stream's channel; Stream.Close afterwards does
// nothing.
func TestBrokerCloseClosesStreams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "tasks")
		s1 := mustStream(t, topic, "workers", "w1")
		s2 := mustStream(t, topic, "audit", "a1")
		idle := mustStream(t, topic, "workers", "w-idle") // owns no partition
		mustPublishValue(t, topic, "job")
		recv(t, s1).Ack()
		recv(t, s2).Ack()
		if err := b.Close(context.Background()); err != nil {
			t.Fatalf("Broker.Close: got %v, want nil", err)
		}
		for name, s := range map[string]*pubsub.Stream[string]{"w1": s1, "a1": s2, "w-idle": idle} {
			wantClosed(t, s)
			if err := s.Close(); err != nil {
				t.Errorf("%s: Stream.Close after Broker.Close: got %v, want nil", name, err)
			}
		}
	})
}

// Broker.Close whose ctx ends while a delivery is unacked reports it in a
// ShutdownError and still closes C.
func TestBrokerCloseWithAnUnackedDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "tasks")
		s := mustStream(t, topic, "workers", "w1")
		mustPublishValue(t, topic, "job")
		d := recv(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := b.Close(ctx)
		se, ok := errors.AsType[*pubsub.ShutdownError](err)
		if !ok {
			t.Fatalf("Broker.Close: got %v, want a *pubsub.ShutdownError", err)
		}
		want := []pubsub.Unfinished{{Group: "workers", Topic: "tasks", Partition: 0, Committed: 0, End: 1}}
		if !slices.Equal(se.Unfinished, want) {
			t.Errorf("Unfinished: got %+v, want %+v", se.Unfinished, want)
		}
		wantClosed(t, s)
		d.Ack() // after Close: does nothing, does not block
		if c := s.Group().Committed(0); c != 0 {
			t.Errorf("Committed(0) after a late Ack: got %d, want 0", c)
		}
		if got := s.Group().Stats(); got != (pubsub.GroupStats{}) {
			t.Errorf("stats: got %+v, want all zero", got)
		}
	})
}

// All yields the deliveries and ends when C closes.
func TestStreamAllEndsWhenCCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "tasks")
		s := mustStream(t, topic, "workers", "w1")
		done := make(chan []string)
		go func() {
			var got []string
			for d := range s.All() {
				got = append(got, d.Value)
				d.Ack()
			}
			done <- got
		}()
		for _, v := range []string{"wash", "dry", "fold"} {
			mustPublishValue(t, topic, v)
		}
		pubsubtest.Drain(t, b)
		synctest.Wait()
		select {
		case got := <-done:
			t.Fatalf("All: got it ended (after %q) while C was open, want it still ranging", got)
		default:
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Stream.Close: got %v, want nil", err)
		}
		if got, want := <-done, []string{"wash", "dry", "fold"}; !slices.Equal(got, want) {
			t.Errorf("All yielded %q, want %q", got, want)
		}
	})
}

// Breaking out of All leaves the stream usable.
func TestStreamAllBreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "tasks")
		s := mustStream(t, topic, "workers", "w1")
		mustPublishValue(t, topic, "first")
		mustPublishValue(t, topic, "second")
		var got []string
		for d := range s.All() {
			got = append(got, d.Value)
			d.Ack()
			break
		}
		if want := []string{"first"}; !slices.Equal(got, want) {
			t.Errorf("All before break yielded %q, want %q", got, want)
		}
		d := recv(t, s)
		if d.Value != "second" {
			t.Errorf("after breaking out of All: got %q, want \"second\"", d.Value)
		}
		d.Ack()
		pubsubtest.Drain(t, b)
		if err := s.Close(); err != nil {
			t.Errorf("Stream.Close: got %v, want nil", err)
		}
	})
}

// Stream.Close is idempotent: the consumer leaves once, C stays closed.
func TestStreamCloseIsIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "tasks")
		s := mustStream(t, topic, "workers", "w1")
		keep := mustStream(t, topic, "workers", "w2")
		for i := range 3 {
			if err := s.Close(); err != nil {
				t.Errorf("Stream.Close #%d: got %v, want nil", i+1, err)
			}
		}
		wantClosed(t, s)
		if asg := s.Group().Assignment(); len(asg) != 1 || !slices.Equal(asg["w2"], []int{0}) {
			t.Errorf("assignment: got %v, want only w2, owning partition 0", asg)
		}
		err := s.Group().Leave(context.Background(), "w1")
		wantErrIs(t, "Leave of a closed stream's consumer", err, pubsub.ErrSubscription)
		mustPublishValue(t, topic, "job")
		recv(t, keep).Ack()
		pubsubtest.Drain(t, b)
		if err := keep.Close(); err != nil {
			t.Errorf("Stream.Close of w2: got %v, want nil", err)
		}
	})
}

// A delivery that no one received when its Stream closed was never
// attempted: the consumer it goes to next sees Attempt 1, and no failure is
// counted. The interleaving: the worker is blocked handing the message to
// the stream's channel when Close gives it back.
func TestStreamCloseBeforeReceiveKeepsTheAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "tasks")
		s := mustStream(t, topic, "workers", "w1")
		mustPublishValue(t, topic, "job")
		synctest.Wait() // the worker waits for someone to receive from s.C()
		var rec recorder[string]
		mustSubscribe(t, topic, "workers", "w2", &rec)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
		calls := rec.calls()
		if len(calls) != 1 || calls[0].Value != "job" || calls[0].Attempt != 1 {
			t.Fatalf("w2 got %+v, want \"job\" once with Attempt 1", calls)
		}
		if st := s.Group().Stats(); st.Retried != 0 || st.Delivered != 1 {
			t.Errorf("stats %+v, want 1 delivered and no retry", st)
		}
	})
}

// With codec.RawBytes a Stream delivery's Value is the log's memory, valid
// until the delivery is settled: while a delivery is held, the producers
// cannot reuse its record (retention 2 makes them wait), and every value
// reads right however long it is held, nacked ones included.
func TestStreamRawBytesValuesLastUntilSettled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}))
		topic := mustTopic(t, b, "tasks", codec.String(), codec.RawBytes(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, BlockTimeout: time.Hour}))
		s, err := topic.Stream("workers", "w1")
		if err != nil {
			t.Fatal(err)
		}
		const n = 20
		want := func(offset int64) string { return fmt.Sprintf("task-%03d", offset) }
		go func() {
			for i := range int64(n) {
				if _, err := topic.PublishValue(context.Background(), []byte(want(i))); err != nil {
					t.Errorf("publish %d: %v", i, err)
				}
			}
		}()
		for i := int64(0); i < n; {
			d := recv(t, s)
			synctest.Wait() // hold it while the producer fills the partition and waits
			if got := string(d.Value); got != want(d.Offset) {
				t.Fatalf("offset %d reads %q while held, want %q", d.Offset, got, want(d.Offset))
			}
			if d.Offset%5 == 0 && d.Attempt == 1 {
				d.Nack(errBoom) // comes back, the same record
				continue
			}
			d.Ack()
			i++
		}
		pubsubtest.Drain(t, b)
		if got := topic.Stats().Reclaimed; got < n-2 {
			t.Fatalf("reclaimed %d records, want at least %d: the test needs reuse", got, n-2)
		}
		if got, want := s.Group().Stats(), (pubsub.GroupStats{Delivered: n, Retried: 4}); got != want {
			t.Errorf("stats: got %+v, want %+v", got, want)
		}
	})
}

// A Stream whose consumer Group.Leave removed leaves nothing on Close: a
// consumer that took its name since stays (the property suite's
// TestStreamCloseAfterItsNameIsReused, here at the package's level).
func TestStreamCloseLeavesOnlyAsItself(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "tasks")
		first := mustStream(t, topic, "workers", "w1")
		g := first.Group()
		if err := g.Leave(context.Background(), "w1"); err != nil {
			t.Fatal(err)
		}
		second := mustStream(t, topic, "workers", "w1")
		if err := first.Close(); err != nil {
			t.Fatalf("Close of the stream that left: %v", err)
		}
		if a := g.Assignment(); len(a) != 1 || len(a["w1"]) != 1 {
			t.Errorf("assignment %v after the first stream's Close, want the second w1 to own the partition", a)
		}
		mustPublishValue(t, topic, "t1")
		if d := recv(t, second); d.Value != "t1" {
			t.Errorf("the second stream got %q, want t1", d.Value)
		} else {
			d.Ack()
		}
		pubsubtest.Drain(t, b)
		if err := second.Close(); err != nil {
			t.Error(err)
		}
	})
}
