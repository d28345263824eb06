package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// A batch consumer gets what was published since it last looked, up to its
// batch size, and the group commits once per batch.
func ExampleTopic_SubscribeBatch() {
	ctx := context.Background()
	b := pubsub.NewBroker()
	events, _ := pubsub.NewTopic(b, "events", codec.String(), codec.RawBytes())
	// Published before the consumer joins, so its first look finds all five.
	events.PublishValues(ctx, [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("d"), []byte("e")})

	g, err := events.SubscribeBatch("archive", "archive-1", pubsub.BatchHandlerFunc[[]byte](
		func(ctx context.Context, msgs []pubsub.Message[[]byte]) error {
			// With RawBytes the values are the log's own bytes: read them
			// here, copy what must outlive the call.
			fmt.Printf("batch of %d:", len(msgs))
			for _, m := range msgs {
				fmt.Printf(" %s@%d", m.Value, m.Offset)
			}
			fmt.Println()
			return nil // acks the whole batch
		}), pubsub.WithBatchSize(3))
	if err != nil {
		panic(err)
	}
	b.Close(ctx) // drains first
	fmt.Println("committed:", g.Committed(0), "delivered:", g.Stats().Delivered)
	// Output:
	// batch of 3: a@0 b@1 c@2
	// batch of 2: d@3 e@4
	// committed: 5 delivered: 5
}

// A BatchError names the message that failed: the ones before it are
// committed, it is retried alone (then dead-lettered if it keeps failing),
// and the ones after it come again once it is settled.
func ExampleBatchError() {
	ctx := context.Background()
	b := pubsub.NewBroker()
	orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	orders.PublishValues(ctx, []string{"o1", "o2", "bad", "o3"})

	errDown := errors.New("payment service down")
	_, err := orders.SubscribeBatch("billing", "billing-1", pubsub.BatchHandlerFunc[string](
		func(ctx context.Context, msgs []pubsub.Message[string]) error {
			for i, m := range msgs {
				if m.Value == "bad" && m.Attempt == 1 {
					fmt.Printf("%s fails on attempt %d\n", m.Value, m.Attempt)
					return &pubsub.BatchError{Index: i, Err: errDown}
				}
				fmt.Printf("%s done on attempt %d\n", m.Value, m.Attempt)
			}
			return nil
		}), pubsub.WithGroupRetry(pubsub.RetryPolicy{BaseDelay: time.Millisecond}))
	if err != nil {
		panic(err)
	}
	b.Close(ctx)
	// Output:
	// o1 done on attempt 1
	// o2 done on attempt 1
	// bad fails on attempt 1
	// bad done on attempt 2
	// o3 done on attempt 1
}
