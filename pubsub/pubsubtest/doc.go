// Package pubsubtest provides utilities for testing code that uses
// logbus's pubsub package, as net/http/httptest does for net/http.
//
// Each piece can be used alone:
//
//   - [NewBroker] ties a broker to a test: it is closed when the test ends,
//     and a test that leaves records undelivered is told so. [Drain] is the
//     barrier a test waits on instead of sleeping.
//   - [Recorder] is a [pubsub.Handler] that remembers what it acked, lets a
//     test wait for it ([Recorder.WaitFor]), and fails on demand
//     ([Recorder.FailWith]).
//   - [Clock] is a clock the test moves by hand, for what the broker stamps
//     and trims by time.
//   - [History] logs publishes and every delivery's start and end
//     ([Observe] wraps a handler), and [History.Check] verifies
//     at-least-once, per-key order, exclusive ownership and that every
//     redelivery is explained: for the failover tests of a distributed
//     engine.
//
// Engine authors have two more packages, kept apart so that a user's test
// binary does not carry them:
// [github.com/logbus/logbus/pubsub/pubsubtest/conformance] checks an engine
// against every documented guarantee, and
// [github.com/logbus/logbus/pubsub/pubsubtest/properties] drives a
// model-based property suite (built on pgregory.net/rapid) against an
// engine that keeps every promise, as the in-memory one does.
//
// # Time
//
// The broker reads its [pubsub.Clock] for the times it records
// ([pubsub.Message.Created], [pubsub.DeadLetter.FailedAt]) and for age
// retention ([pubsub.Retention.MaxAge]). It waits (retry backoff,
// [pubsub.Retention.BlockTimeout]) on the runtime's timers, which a Clock
// does not drive. For those, run the test in a testing/synctest
// bubble, where timers use a virtual clock that jumps ahead whenever every
// goroutine of the bubble is blocked, so backoff takes no real time and
// its length can be asserted exactly. Build the broker inside the bubble
// and close it there too: NewBroker called with the bubble's t does both,
// because the bubble runs t's cleanups before it ends.
//
//	func TestBillingRetries(t *testing.T) {
//		synctest.Test(t, func(t *testing.T) {
//			b := pubsubtest.NewBroker(t)
//			orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
//			rec := pubsubtest.NewRecorder[string]()
//			rec.FailWith(func(msg pubsub.Message[string]) error {
//				if msg.Attempt < 3 {
//					return errors.New("warehouse busy")
//				}
//				return nil
//			})
//			orders.Subscribe("billing", "billing-1", rec)
//
//			start := time.Now()
//			orders.Publish(t.Context(), "alice", "alice:paid")
//			pubsubtest.Drain(t, b)
//			// The default backoff: 10ms, then 20ms, of virtual time.
//			if got := time.Since(start); got != 30*time.Millisecond {
//				t.Errorf("acked after %v, want 30ms", got)
//			}
//			if rec.Calls() != 3 || rec.Len() != 1 {
//				t.Errorf("calls %d, acked %d; want 3 and 1", rec.Calls(), rec.Len())
//			}
//		})
//	}
//
// [Recorder.WaitFor] and Drain wait on channels, which a bubble sees as
// durably blocked, so both work there, and a context timeout given to them
// expires in virtual time, at once, when nothing else can happen.
//
// A broker, and a Recorder that is waited on, belong to the bubble that
// made them: the channels they make inside it cannot be used outside it
// (the runtime aborts the test binary). So each bubble builds its own, and
// none uses pubsub.Default, which the whole process shares.
package pubsubtest
