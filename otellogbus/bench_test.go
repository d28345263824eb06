package otellogbus_test

import (
	"context"
	"testing"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/otellogbus"
	"github.com/logbus/logbus/pubsub"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkPublish is the cost the hooks add to one Publish (a topic no
// group reads): none; the hooks over otel's no-op providers; over the SDK,
// sampling every span (no exporter) and aggregating every measurement.
func BenchmarkPublish(b *testing.B) {
	sdk := func() []otellogbus.Option {
		return []otellogbus.Option{
			otellogbus.WithTracerProvider(sdktrace.NewTracerProvider()),
			otellogbus.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))),
			otellogbus.WithPropagator(propagation.TraceContext{}),
		}
	}
	for _, c := range []struct {
		name string
		opts func() []pubsub.BrokerOption
	}{
		{"none", func() []pubsub.BrokerOption { return nil }},
		{"noop", func() []pubsub.BrokerOption { return []pubsub.BrokerOption{pubsub.WithHooks(otellogbus.New())} }},
		{"sdk", func() []pubsub.BrokerOption { return []pubsub.BrokerOption{pubsub.WithHooks(otellogbus.New(sdk()...))} }},
	} {
		b.Run("hooks="+c.name, func(b *testing.B) {
			br := pubsub.NewBroker(c.opts()...)
			b.Cleanup(func() { _ = br.Close(context.Background()) })
			topic, err := pubsub.NewTopic(br, "orders", codec.String(), codec.String())
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := topic.Publish(ctx, "alice", "order"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
