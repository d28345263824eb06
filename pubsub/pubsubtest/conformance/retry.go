package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

func retryCases() []confCase {
	return []confCase{
		{name: "a failed delivery is retried after BaseDelay, then BaseDelay times Multiplier each time, up to MaxDelay", needs: engine.VirtualTime, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			calls := newCallTimes()
			log := &callLog[string]{fail: func(m pubsub.Message[string]) error {
				calls.mark()
				if m.Value == "bad" {
					return errBoom
				}
				return nil
			}}
			g := subscribe(c, topic, "billing", "b1", log,
				pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 5, BaseDelay: 100 * time.Millisecond, Multiplier: 3, MaxDelay: 500 * time.Millisecond}))
			publishValue(c, topic, "bad")
			publishValue(c, topic, "next")
			c.drain(b)
			// Waits of 100ms, 300ms, 500ms (900ms capped) and 500ms; "next"
			// right after the dead letter.
			ms := time.Millisecond
			want := []time.Duration{0, 100 * ms, 400 * ms, 900 * ms, 1400 * ms, 1400 * ms}
			if at := calls.all(); !slices.Equal(at, want) {
				c.Errorf("handler calls at %v of virtual time, want %v", at, want)
			}
			if got, want := attempts(log.all()), []int{1, 2, 3, 4, 5, 1}; !slices.Equal(got, want) {
				c.Errorf("attempts: got %v, want %v", got, want)
			}
			if dl := g.DeadLetters(); len(dl) != 1 || dl[0].Attempts != 5 {
				c.Errorf("dead letters: got %+v, want \"bad\" after 5 attempts", dl)
			}
		}},
		{name: "the default retry policy makes 3 attempts, 10ms then 20ms apart", needs: engine.VirtualTime, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			calls := newCallTimes()
			g := subscribe(c, topic, "billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
				calls.mark()
				return errBoom
			}))
			publishValue(c, topic, "bad")
			c.drain(b)
			if want, at := []time.Duration{0, 10 * time.Millisecond, 30 * time.Millisecond}, calls.all(); !slices.Equal(at, want) {
				c.Errorf("handler calls at %v of virtual time, want %v", at, want)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Retried: 2, DeadLettered: 1})
		}},
		{name: "after MaxAttempts deliveries a record is dead-lettered with its attempts and last error, and the partition moves on", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			log := &callLog[string]{fail: func(m pubsub.Message[string]) error {
				if m.Value == "bad" {
					return fmt.Errorf("attempt %d: %w", m.Attempt, errBoom)
				}
				return nil
			}}
			g := subscribe(c, topic, "billing", "b1", log,
				pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond}))
			publishValue(c, topic, "bad")
			next := publishValue(c, topic, "good")
			c.drain(b)
			if got, want := values(log.all()), []string{"bad", "bad", "bad", "good"}; !slices.Equal(got, want) {
				c.Errorf("handler calls: got %q, want %q", got, want)
			}
			letters := g.DeadLetters()
			if len(letters) != 1 {
				c.Fatalf("got %d dead letters, want 1", len(letters))
			}
			dl := letters[0]
			if dl.Attempts != 3 || dl.Message.Value != "bad" || dl.Message.Offset != 0 || dl.Message.Topic != "orders" {
				c.Errorf("dead letter: got %q at offset %d of %q after %d attempts, want \"bad\" at offset 0 of orders after 3",
					dl.Message.Value, dl.Message.Offset, dl.Message.Topic, dl.Attempts)
			}
			if !errors.Is(dl.Err, errBoom) || !contains(dl.Err, "attempt 3") {
				c.Errorf("dead letter Err: got %v, want the last attempt's error", dl.Err)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: 1, Retried: 2, DeadLettered: 1})
			if got := g.Committed(0); got != next.Offset+1 {
				c.Errorf("Committed(0): got %d, want %d", got, next.Offset+1)
			}
		}},
		{name: "a dead letter is dated by the broker's Clock", needs: engine.InjectedClock, run: func(c *conf) {
			_, b, topic := c.clockedBrokerTopic("orders")
			g := subscribe(c, topic, "billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
				return fmt.Errorf("no: %w", pubsub.ErrPermanent)
			}))
			publishValue(c, topic, "bad")
			c.drain(b)
			if dl := g.DeadLetters(); len(dl) != 1 || !dl[0].FailedAt.Equal(clockStart) || !dl[0].Message.Created.Equal(clockStart) {
				c.Errorf("dead letters: got %+v, want one failed at %v", dl, clockStart)
			}
		}},
		{name: "an error wrapping ErrPermanent is dead-lettered after one attempt", run: func(c *conf) {
			b := c.broker(pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 5, BaseDelay: time.Millisecond}))
			topic := c.topic(b, "orders")
			log := &callLog[string]{fail: func(m pubsub.Message[string]) error {
				if m.Value == "bad" {
					return fmt.Errorf("order %s: unknown currency: %w", m.Value, pubsub.ErrPermanent)
				}
				return nil
			}}
			g := subscribe(c, topic, "billing", "b1", log)
			publishValue(c, topic, "bad")
			publishValue(c, topic, "good")
			c.drain(b)
			if got, want := values(log.all()), []string{"bad", "good"}; !slices.Equal(got, want) {
				c.Errorf("handler calls: got %q, want %q", got, want)
			}
			letters := g.DeadLetters()
			if len(letters) != 1 || letters[0].Attempts != 1 || !errors.Is(letters[0].Err, pubsub.ErrPermanent) {
				c.Errorf("dead letters: got %+v, want \"bad\" after 1 attempt, wrapping ErrPermanent", letters)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: 1, DeadLettered: 1})
		}},
		{name: "a handler panic is recovered, counts as a failed attempt and is dead-lettered as a PanicError", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			log := &callLog[string]{fail: func(m pubsub.Message[string]) error {
				if m.Value == "boom" {
					panic(errBoom)
				}
				return nil
			}}
			g := subscribe(c, topic, "billing", "b1", log,
				pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}))
			publishValue(c, topic, "boom")
			publishValue(c, topic, "after")
			c.drain(b)
			if got, want := values(log.all()), []string{"boom", "boom", "after"}; !slices.Equal(got, want) {
				c.Errorf("handler calls: got %q, want %q (the consumer must survive the panic)", got, want)
			}
			letters := g.DeadLetters()
			if len(letters) != 1 {
				c.Fatalf("got %d dead letters, want 1", len(letters))
			}
			pe, ok := errors.AsType[*pubsub.PanicError](letters[0].Err)
			if !ok {
				c.Fatalf("dead letter Err: got %T (%v), want a *pubsub.PanicError", letters[0].Err, letters[0].Err)
			}
			if pe.Value != errBoom || len(pe.Stack) == 0 || !errors.Is(letters[0].Err, errBoom) {
				c.Errorf("PanicError: got value %v and %d bytes of stack, want %v, a stack, and errors.Is to see it", pe.Value, len(pe.Stack), errBoom)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: 1, Retried: 1, DeadLettered: 1})
		}},
		{name: "a value the codec cannot decode never reaches the handler and is dead-lettered at once as a DecodeError", run: func(c *conf) {
			b := c.broker(pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 5, BaseDelay: time.Millisecond}))
			topic := newTopic(c, b, "orders", codec.String(), pickyStrings())
			rec := pubsubtest.NewRecorder[string]()
			g := subscribe(c, topic, "billing", "b1", rec)
			publishValue(c, topic, "ok-1")
			poison := publishValue(c, topic, "poison")
			publishValue(c, topic, "ok-2")
			c.drain(b)
			if got, want := rec.Values(), []string{"ok-1", "ok-2"}; !slices.Equal(got, want) || rec.Calls() != 2 {
				c.Errorf("handler saw %q in %d calls, want %q in 2", got, rec.Calls(), want)
			}
			letters := g.DeadLetters()
			if len(letters) != 1 {
				c.Fatalf("got %d dead letters, want 1", len(letters))
			}
			dl := letters[0]
			if dl.Attempts != 1 || dl.Message.Offset != poison.Offset || dl.Message.Value != "" {
				c.Errorf("dead letter: got offset %d value %q after %d attempts, want offset %d, the zero value, 1 attempt",
					dl.Message.Offset, dl.Message.Value, dl.Attempts, poison.Offset)
			}
			de, ok := errors.AsType[*pubsub.DecodeError](dl.Err)
			if !ok {
				c.Fatalf("dead letter Err: got %T (%v), want a *pubsub.DecodeError", dl.Err, dl.Err)
			}
			if de.Topic != "orders" || de.Partition != poison.Partition || de.Offset != poison.Offset || !errors.Is(de.Err, errPoison) {
				c.Errorf("DecodeError: got %+v, want topic orders, position %+v, the codec's error", de, poison)
			}
			if !errors.Is(dl.Err, pubsub.ErrPermanent) {
				c.Errorf("dead letter Err %v: want it to wrap ErrPermanent", dl.Err)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: 2, DeadLettered: 1})
		}},
		{name: "a group's retry policy overrides the broker's", run: func(c *conf) {
			b := c.broker(pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 4, BaseDelay: time.Millisecond}))
			topic := c.topic(b, "orders")
			fail := pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return errBoom })
			broker := subscribe(c, topic, "broker-policy", "c1", fail)
			own := subscribe(c, topic, "own-policy", "c1", fail, pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}))
			publishValue(c, topic, "bad")
			c.drain(b)
			for g, want := range map[*pubsub.Group[string]]int{broker: 4, own: 2} {
				if dl := g.DeadLetters(); len(dl) != 1 || dl[0].Attempts != want {
					c.Errorf("group %s: dead letters %+v, want one after %d attempts", g.Name(), dl, want)
				}
			}
		}},
		{name: "the dead-letter queue keeps the newest WithDeadLetterLimit letters and counts those it evicts", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			g := subscribe(c, topic, "billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
				return pubsub.ErrPermanent
			}), pubsub.WithDeadLetterLimit(2))
			publishValues(c, topic, "d0", "d1", "d2")
			c.drain(b)
			var got []string
			for _, dl := range g.DeadLetters() {
				got = append(got, dl.Message.Value)
			}
			if want := []string{"d1", "d2"}; !slices.Equal(got, want) {
				c.Errorf("dead letters: got %q, want %q, oldest first", got, want)
			}
			wantGroupStats(c, g, pubsub.GroupStats{DeadLettered: 3, DeadLettersEvicted: 1})
		}},
		{name: "a record paused while it waits out a retry backoff continues its attempt count", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			failed := make(chan struct{})
			log := &callLog[string]{fail: func(m pubsub.Message[string]) error {
				if m.Attempt == 1 {
					close(failed)
					return errBoom
				}
				return nil
			}}
			g := subscribe(c, topic, "billing", "b1", log,
				pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: 50 * time.Millisecond}))
			publishValue(c, topic, "job")
			c.wait("the first attempt", failed)
			if err := g.Pause(c.ctx()); err != nil {
				c.Fatalf("Pause: %v", err)
			}
			if err := g.Resume(c.ctx()); err != nil {
				c.Fatalf("Resume: %v", err)
			}
			c.drain(b)
			if got, want := attempts(log.all()), []int{1, 2}; !slices.Equal(got, want) {
				c.Errorf("attempts: got %v, want %v (a pause does not start the count again)", got, want)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: 1, Retried: 1})
		}},
	}
}
