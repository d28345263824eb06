package otellogbus_test

import (
	"context"
	"log"

	"github.com/logbus/logbus/otellogbus"
	"github.com/logbus/logbus/pubsub"
	"go.opentelemetry.io/otel/propagation"
)

// Register the hooks when the broker is built, then Observe it for the
// metrics read from its Snapshot. With no provider given, spans and
// metrics go to otel's global providers.
func ExampleNew() {
	h := otellogbus.New(otellogbus.WithPropagator(propagation.TraceContext{}))
	b := pubsub.NewBroker(pubsub.WithHooks(h))
	defer b.Close(context.Background())
	reg, err := h.Observe(b)
	if err != nil {
		log.Fatal(err)
	}
	// Topics, groups and publishes as usual: each publish now has a
	// "send" span, each delivery a "process" span linked to it.
	defer reg.Unregister()

	// Output:
}
