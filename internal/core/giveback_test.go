package core

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

// TestAGivenBackDeliveryWaitsForTheNextOwner: a handler gives a delivery
// back (ErrNotDelivered, as a closing Stream does with one nobody had
// received; ErrAbandoned, with one somebody held) before the group took
// the partition from its member. The worker used to exit at once, and the
// group, whose member had not left yet, started a successor for that very
// member, which read the same record and was given it back again: a loop
// that lasted until the member's Leave took the group's lock, hundreds of
// passes in one Stream.Close, each raising the delivery hooks. Now the
// record is handed over once and waits, uncommitted, until the member
// leaves; then it goes to the next owner, with the same attempt when it
// never reached the consumer and the next one when it did.
func TestAGivenBackDeliveryWaitsForTheNextOwner(t *testing.T) {
	for _, tc := range []struct {
		giveBack    error
		nextAttempt int
	}{{ErrNotDelivered, 1}, {ErrAbandoned, 2}} {
		t.Run(tc.giveBack.Error(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t, Config{})
				orders := mustTopic(t, b, "orders", TopicSpec{})
				var calls atomic.Int32
				leaving := func(_ context.Context, d *Delivery) error {
					if calls.Add(1) > 1 {
						// A second call is the loop: let it end when the
						// partition is revoked, so the test can report it.
						<-d.Revoked
					}
					return tc.giveBack
				}
				g := subscribe(t, b, "orders", "billing", "leaving", leaving)
				publish(t, orders, "k", "1")
				synctest.Wait() // the delivery was given back; the member has not left
				if n := calls.Load(); n != 1 {
					t.Errorf("the handler was called %d times before its member left, want 1", n)
				}
				if got := g.DeliveryState(0); got != Pending {
					t.Errorf("while the given-back record waits, the partition shows %v, want %v", got, Pending)
				}
				if err := g.Leave(context.Background(), "leaving"); err != nil {
					t.Fatalf("Leave: %v", err)
				}
				var next recorder
				subscribe(t, b, "orders", "billing", "next", next.handler("next"))
				drain(t, b)
				got := next.snapshot()
				if len(got) != 1 || string(got[0].rec.Value) != "1" || got[0].attempt != tc.nextAttempt {
					t.Fatalf("the next owner got %+v, want record 1 once, attempt %d", got, tc.nextAttempt)
				}
				if n := calls.Load(); n != 1 {
					t.Errorf("the leaving member's handler was called %d times, want 1", n)
				}
			})
		})
	}
}
