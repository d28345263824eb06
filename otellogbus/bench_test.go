package otellogbus_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/otellogbus"
	"github.com/logbus/logbus/pubsub"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
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

// BenchmarkCollect is one collection of the metrics Observe registers,
// over the SDK: a Snapshot of 100 topics of 4 partitions, each read by a
// group, and every instrument observed for each.
func BenchmarkCollect(b *testing.B) {
	reader := sdkmetric.NewManualReader()
	h := otellogbus.New(otellogbus.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	br := pubsub.NewBroker()
	b.Cleanup(func() { _ = br.Close(context.Background()) })
	for i := range 100 {
		topic, err := pubsub.NewTopic(br, fmt.Sprintf("topic-%03d", i), codec.String(), codec.String(), pubsub.WithPartitions(4))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := topic.Subscribe("billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })); err != nil {
			b.Fatal(err)
		}
	}
	reg, err := h.Observe(br)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = reg.Unregister() })
	ctx := context.Background()
	var rm metricdata.ResourceMetrics
	b.ReportAllocs()
	for b.Loop() {
		if err := reader.Collect(ctx, &rm); err != nil {
			b.Fatal(err)
		}
	}
}
