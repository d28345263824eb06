package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// Snapshot lists a broker's topics and groups, and how far behind each
// group is.
func ExampleBroker_Snapshot() {
	ctx := context.Background()
	b := pubsub.NewBroker()
	orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	billing, _ := orders.Subscribe("billing", "billing-1", pubsub.HandlerFunc[string](
		func(context.Context, pubsub.Message[string]) error { return nil }))
	billing.Pause(ctx)
	orders.Publish(ctx, "alice", "alice:paid")
	orders.Publish(ctx, "bob", "bob:paid")

	for _, t := range b.Snapshot().Topics {
		fmt.Printf("topic %s: %d published\n", t.Name, t.Stats.Published)
		for _, g := range t.Groups {
			fmt.Printf("  group %s: paused %t, lag %d, consumers %v\n", g.Name, g.Paused, g.Lag, g.Consumers)
		}
	}
	billing.Resume(ctx)
	b.Close(ctx)
	// Output:
	// topic orders: 2 published
	//   group billing: paused true, lag 2, consumers [billing-1]
}

// dlqAlert is a hook: it implements HookDeadLetter, and nothing else.
type dlqAlert struct{}

func (dlqAlert) OnDeadLetter(e pubsub.DeadLetterEvent) {
	fmt.Printf("alert: %s gave up on offset %d after %d attempts: %v\n",
		e.Delivery.Group, e.Delivery.Offset, e.Delivery.Attempt, e.Err)
}

// A hook implements only the events it cares about.
func ExampleWithHooks() {
	ctx := context.Background()
	b := pubsub.NewBroker(pubsub.WithHooks(dlqAlert{}))
	orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	orders.Subscribe("shipping", "shipping-1", pubsub.HandlerFunc[string](
		func(context.Context, pubsub.Message[string]) error {
			return fmt.Errorf("cannot ship: %w", pubsub.ErrPermanent)
		}))
	orders.Publish(ctx, "bob", "bob:cancelled")
	b.Close(ctx)
	// Output:
	// alert: shipping gave up on offset 0 after 1 attempts: cannot ship: permanent failure
}

// Once what made a record fail is fixed, Redrive sends its dead letter back
// to the group that failed it, and to no other.
func ExampleGroup_Redrive() {
	ctx := context.Background()
	b := pubsub.NewBroker()
	orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	var fixed atomic.Bool
	g, _ := orders.Subscribe("shipping", "shipping-1", pubsub.HandlerFunc[string](
		func(_ context.Context, msg pubsub.Message[string]) error {
			if !fixed.Load() {
				return fmt.Errorf("no address: %w", pubsub.ErrPermanent)
			}
			fmt.Printf("shipped %s, attempt %d\n", msg.Value, msg.Attempt)
			return nil
		}))
	orders.Publish(ctx, "bob", "bob:paid")
	b.Drain(ctx)
	fmt.Println("dead letters:", len(g.DeadLetters()))

	fixed.Store(true)
	g.Pause(ctx) // only so that the output below comes in a fixed order
	n, err := g.Redrive(ctx, func(l pubsub.DeadLetter[string]) bool {
		return errors.Is(l.Err, pubsub.ErrPermanent)
	})
	fmt.Println("redriven:", n, err)
	g.Resume(ctx)
	b.Drain(ctx)
	fmt.Println("dead letters:", len(g.DeadLetters()), "redriven in all:", g.Stats().Redriven)
	b.Close(ctx)
	// Output:
	// dead letters: 1
	// redriven: 1 <nil>
	// shipped bob:paid, attempt 1
	// dead letters: 0 redriven in all: 1
}
