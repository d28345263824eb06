package core

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A redriven dead letter that its handler now acks counts as delivered,
// as any other ack does.
func TestRedrivenLetterCountsAsDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{})
		var fixed atomic.Bool
		g := subscribe(t, b, "t", "g", "c1", func(_ context.Context, d *Delivery) error {
			if string(d.Record.Value) == "poison" && !fixed.Load() {
				return fmt.Errorf("bad: %w", ErrPermanent)
			}
			return nil
		})
		publish(t, topic, "", "ok")
		publish(t, topic, "", "poison")
		drain(t, b)
		if s := g.Stats(); s.Delivered != 1 || s.DeadLettered != 1 {
			t.Fatalf("stats %+v, want 1 delivered, 1 dead-lettered", s)
		}
		fixed.Store(true)
		if n, err := g.Redrive(context.Background(), nil); n != 1 || err != nil {
			t.Fatalf("Redrive: %d, %v; want 1, nil", n, err)
		}
		drain(t, b)
		if s := g.Stats(); s.Delivered != 2 || s.Redriven != 1 || len(g.DeadLetters()) != 0 {
			t.Errorf("stats %+v with %d dead letters, want 2 delivered, 1 redriven, none left", s, len(g.DeadLetters()))
		}
	})
}

// A redriven letter whose handler ignores ctx and outlives Close is put
// back in the dead letters by Close; whether the handler then acks or
// fails, that late outcome leaves the letter there once and counts
// nothing: no delivery (as a record's late ack, whose commit Close
// refuses), no dead letter, no retry.
func TestRedrivenLetterWhoseHandlerOutlivesClose(t *testing.T) {
	for _, tc := range []struct {
		name string
		late error
	}{{"acked late", nil}, {"failed late", errors.New("still bad")}} {
		late := tc.late
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t, Config{})
				topic := mustTopic(t, b, "t", TopicSpec{})
				release := make(chan struct{})
				var redriven atomic.Bool
				g := subscribe(t, b, "t", "g", "c1", func(context.Context, *Delivery) error {
					if !redriven.Load() {
						return fmt.Errorf("bad: %w", ErrPermanent)
					}
					<-release // ignores ctx
					return late
				})
				publish(t, topic, "", "poison")
				drain(t, b)
				redriven.Store(true)
				if n, err := g.Redrive(context.Background(), nil); n != 1 || err != nil {
					t.Fatalf("Redrive: %d, %v; want 1, nil", n, err)
				}
				synctest.Wait() // the handler holds the redriven letter

				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				if err := b.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Close: %v, want an error wrapping DeadlineExceeded", err)
				}
				if n := len(g.DeadLetters()); n != 1 {
					t.Fatalf("after Close: %d dead letters, want the redriven one back", n)
				}
				close(release)
				synctest.Wait() // the handler returned, and its worker exited
				if s := g.Stats(); len(g.DeadLetters()) != 1 || s.DeadLettered != 1 || s.Retried != 0 {
					t.Errorf("after the late outcome: stats %+v with %d dead letters, want the one letter and nothing counted", s, len(g.DeadLetters()))
				}
				if s := g.Stats(); s.Delivered != 0 {
					t.Errorf("after the late outcome: %d delivered, want 0: the letter is back in the dead letters", s.Delivered)
				}
			})
		})
	}
}
