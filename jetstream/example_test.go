package jetstream_test

import (
	"context"
	"fmt"
	"os"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/jetstream"
	"github.com/logbus/logbus/pubsub"
)

// An embedded server with file storage, and a broker on it: the typed API
// is the in-memory engine's.
func ExampleStartServer() {
	dir, err := os.MkdirTemp("", "logbus-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	srv, err := jetstream.StartServer(dir)
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()

	ctx := context.Background()
	b := pubsub.NewBroker(pubsub.WithEngine(srv.Engine()))
	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		panic(err)
	}
	_, err = orders.Subscribe("billing", "billing-1", pubsub.HandlerFunc[string](
		func(_ context.Context, m pubsub.Message[string]) error {
			fmt.Printf("bill %s (offset %d, attempt %d)\n", m.Value, m.Offset, m.Attempt)
			return nil
		}))
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"A-1", "A-2", "A-3"} {
		if _, err := orders.Publish(ctx, "alice", id); err != nil {
			panic(err)
		}
	}
	if err := b.Close(ctx); err != nil { // drains first
		panic(err)
	}
	// Output:
	// bill A-1 (offset 0, attempt 1)
	// bill A-2 (offset 1, attempt 1)
	// bill A-3 (offset 2, attempt 1)
}
