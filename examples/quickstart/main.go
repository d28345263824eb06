// Command quickstart is the README's quick start: one topic, one group,
// publish, consume, close. examples/examples_test.go checks that the README
// shows this very code.
package main

import (
	"context"
	"fmt"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

type Order struct {
	ID     string
	Amount int
}

func main() {
	ctx := context.Background()
	b := pubsub.NewBroker()

	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.JSON[Order](),
		pubsub.WithPartitions(4))
	if err != nil {
		panic(err)
	}

	// Every group sees every order; within a group, one consumer per partition.
	_, err = orders.Subscribe("billing", "billing-1", pubsub.HandlerFunc[Order](
		func(ctx context.Context, msg pubsub.Message[Order]) error {
			fmt.Printf("bill %s: %d (partition %d, offset %d)\n",
				msg.Value.ID, msg.Value.Amount, msg.Partition, msg.Offset)
			return nil // ack; an error would retry with backoff, then dead-letter
		}))
	if err != nil {
		panic(err)
	}

	// A key always lands in the same partition, so one customer's orders
	// stay in order.
	for i, amount := range []int{30, 12, 7} {
		id := fmt.Sprintf("A-%d", i+1)
		if _, err := orders.Publish(ctx, "alice", Order{ID: id, Amount: amount}); err != nil {
			panic(err)
		}
	}

	// Close drains first: every published order is handled before it returns.
	if err := b.Close(ctx); err != nil {
		panic(err)
	}
}
