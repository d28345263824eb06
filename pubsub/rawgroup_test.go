package pubsub_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// Broker.Group finds a group by name and shows its records as the bytes
// they were published as: a tool that does not know the group's types
// reads its dead letters and pauses and resumes it.
func TestBrokerGroupIsAnUntypedViewOfAGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		type order struct{ ID string }
		orders := mustTopic(t, b, "orders", codec.String(), codec.JSON[order]())
		typed := mustSubscribe(t, orders, "billing", "b1", pubsub.HandlerFunc[order](func(_ context.Context, m pubsub.Message[order]) error {
			return fmt.Errorf("order %s: %w", m.Value.ID, pubsub.ErrPermanent)
		}))
		mustPublish(t, orders, "alice", order{ID: "A-1"})
		synctest.Wait()

		raw, err := b.Group("billing", "orders")
		if err != nil {
			t.Fatal(err)
		}
		letters := raw.DeadLetters()
		if len(letters) != 1 {
			t.Fatalf("%d dead letters, want 1", len(letters))
		}
		if got, want := letters[0].Message.Value, []byte(`{"ID":"A-1"}`); !bytes.Equal(got, want) {
			t.Errorf("dead letter's value = %q, want the published bytes %q", got, want)
		}
		if got := letters[0].Err.Error(); got != "order A-1: "+pubsub.ErrPermanent.Error() {
			t.Errorf("dead letter's error = %q", got)
		}
		if raw.Name() != "billing" || raw.Stats() != typed.Stats() || raw.Committed(0) != typed.Committed(0) {
			t.Errorf("the view disagrees with the group: %q %+v %d, want billing %+v %d",
				raw.Name(), raw.Stats(), raw.Committed(0), typed.Stats(), typed.Committed(0))
		}
		if err := raw.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		if g := b.Snapshot().Topics[0].Groups[0]; !g.Paused {
			t.Error("Pause through the view did not pause the group")
		}
		if err := raw.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}

		if _, err := b.Group("shipping", "orders"); !errors.Is(err, pubsub.ErrSubscription) {
			t.Errorf("unknown group: %v, want ErrSubscription", err)
		}
		if _, err := b.Group("billing", "payments"); !errors.Is(err, pubsub.ErrTopicNotFound) {
			t.Errorf("unknown topic: %v, want ErrTopicNotFound", err)
		}
	})
}
