package pubsubtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// Invoicer stands for the code under test: a handler that turns each paid
// order into an invoice on another topic.
type Invoicer struct {
	Invoices *pubsub.Topic[string, string]
}

func (inv Invoicer) Handle(ctx context.Context, msg pubsub.Message[string]) error {
	customer, event, _ := strings.Cut(msg.Value, ":")
	if event != "paid" {
		return nil
	}
	_, err := inv.Invoices.Publish(ctx, customer, "invoice for "+customer)
	return err
}

// A test of Invoicer subscribes a Recorder to the topic Invoicer writes to
// and waits for it instead of sleeping. The Clock makes the timestamps
// predictable. In a real test, pubsubtest.NewBroker(t) would close the
// broker and report what it left undelivered.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	clock := pubsubtest.NewClock(time.Date(2024, 5, 1, 9, 30, 0, 0, time.UTC))
	b := pubsub.NewBroker(pubsub.WithClock(clock))
	defer b.Close(ctx)

	orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	invoices, _ := pubsub.NewTopic(b, "invoices", codec.String(), codec.String())
	orders.Subscribe("invoicer", "invoicer-1", Invoicer{Invoices: invoices})
	rec := pubsubtest.NewRecorder[string]()
	invoices.Subscribe("test", "test-1", rec)

	orders.Publish(ctx, "alice", "alice:created")
	orders.Publish(ctx, "alice", "alice:paid")
	orders.Publish(ctx, "bob", "bob:paid")
	if err := rec.WaitFor(ctx, 2); err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range rec.Messages() {
		fmt.Printf("%s (key %s) at %s\n", m.Value, m.Key, m.Created.Format(time.Kitchen))
	}
	// Output:
	// invoice for alice (key alice) at 9:30AM
	// invoice for bob (key bob) at 9:30AM
}

// FailWith makes a Recorder fail chosen messages, to test what the broker,
// or the code around it, does with them. An error wrapping ErrPermanent is
// dead-lettered without retries.
func ExampleRecorder_FailWith() {
	ctx := context.Background()
	b := pubsub.NewBroker()
	defer b.Close(ctx)
	orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.String())

	rec := pubsubtest.NewRecorder[string]()
	rec.FailWith(func(msg pubsub.Message[string]) error {
		if strings.HasSuffix(msg.Value, ":cancelled") {
			return fmt.Errorf("cannot ship %s: %w", msg.Value, pubsub.ErrPermanent)
		}
		return nil
	})
	g, _ := orders.Subscribe("shipping", "shipping-1", rec)
	for _, v := range []string{"alice:paid", "bob:cancelled", "carol:paid"} {
		orders.PublishValue(ctx, v)
	}
	b.Drain(ctx)

	fmt.Println("acked:", rec.Values(), "calls:", rec.Calls())
	for _, dl := range g.DeadLetters() {
		fmt.Println("dead letter:", dl.Message.Value, errors.Is(dl.Err, pubsub.ErrPermanent))
	}
	// Output:
	// acked: [alice:paid carol:paid] calls: 3
	// dead letter: bob:cancelled true
}
