package pubsubtest_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// The synctest pattern of the package doc, verbatim, so the doc cannot
// drift from what works.
func TestBillingRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
		rec := pubsubtest.NewRecorder[string]()
		rec.FailWith(func(msg pubsub.Message[string]) error {
			if msg.Attempt < 3 {
				return errors.New("warehouse busy")
			}
			return nil
		})
		orders.Subscribe("billing", "billing-1", rec)

		start := time.Now()
		orders.Publish(t.Context(), "alice", "alice:paid")
		pubsubtest.Drain(t, b)
		// The default backoff: 10ms, then 20ms, of virtual time.
		if got := time.Since(start); got != 30*time.Millisecond {
			t.Errorf("acked after %v, want 30ms", got)
		}
		if rec.Calls() != 3 || rec.Len() != 1 {
			t.Errorf("calls %d, acked %d; want 3 and 1", rec.Calls(), rec.Len())
		}
	})
}
