package otellogbus

import (
	"context"
	"errors"
	"strconv"

	"github.com/logbus/logbus/pubsub"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// The instruments Observe registers: name, unit, description.
const (
	lagName         = "logbus.consumer.lag"
	lagAgeName      = "logbus.consumer.lag.age"
	stuckName       = "logbus.consumer.stuck"
	deadLettersName = "logbus.consumer.dead_letters"
	retriesName     = "logbus.consumer.retries"
	skippedName     = "logbus.consumer.skipped"
	droppedName     = "logbus.records.dropped"
)

// Observe registers the instruments read from b.Snapshot each time the
// metrics are collected (one Snapshot per collection, whatever the number
// of instruments), so they cost the broker nothing in between:
//
//   - logbus.consumer.lag {message}, a gauge per group and partition: the
//     records the group has not committed.
//   - logbus.consumer.lag.age (s), a gauge per group and partition: how
//     long the oldest of them has waited (0 without lag).
//   - logbus.consumer.stuck {delivery}, a gauge per group: deliveries
//     running past the broker's WithStuckAfter threshold.
//   - logbus.consumer.dead_letters {message}, logbus.consumer.retries
//     {attempt} and logbus.consumer.skipped {message}, counters per group:
//     GroupStats.DeadLettered, Retried and Skipped.
//   - logbus.records.dropped {message}, a counter per topic:
//     TopicStats.Dropped.
//
// Each has messaging.system, messaging.destination.name and, per group,
// messaging.consumer.group.name; per partition
// messaging.destination.partition.id. Observe also reports an error New
// met creating its own instruments. Unregister the returned Registration
// to stop reading b (before or after Close: a closed broker's Snapshot
// still works).
func (h *Hooks) Observe(b *pubsub.Broker) (metric.Registration, error) {
	if b == nil {
		return nil, errors.New("otellogbus: Observe of a nil *pubsub.Broker")
	}
	var errs []error
	gauge := func(name, unit, desc string) metric.Float64ObservableGauge {
		g, err := h.meter.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	igauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := h.meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := h.meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	lag := igauge(lagName, "{message}", "Records a consumer group has not committed yet.")
	lagAge := gauge(lagAgeName, "s", "How long the oldest record a consumer group has not committed has waited.")
	stuck := igauge(stuckName, "{delivery}", "Deliveries running longer than the broker's stuck-handler threshold.")
	dead := counter(deadLettersName, "{message}", "Records a consumer group gave up on and dead-lettered.")
	retries := counter(retriesName, "{attempt}", "Failed delivery attempts that were retried.")
	skipped := counter(skippedName, "{message}", "Records trimmed by retention before the group read them.")
	dropped := counter(droppedName, "{message}", "Records shed by DropOldest or trimmed unread from a full partition.")
	if err := errors.Join(append(errs, h.err)...); err != nil {
		return nil, err
	}

	reg, err := h.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		snap := b.Snapshot()
		for _, t := range snap.Topics {
			topic := []attribute.KeyValue{semconv.MessagingSystemKey.String(System), semconv.MessagingDestinationName(t.Name)}
			o.ObserveInt64(dropped, t.Stats.Dropped, metric.WithAttributes(topic...))
			for _, g := range t.Groups {
				group := append(topic[:len(topic):len(topic)], semconv.MessagingConsumerGroupName(g.Name))
				groupOpt := metric.WithAttributes(group...)
				o.ObserveInt64(dead, g.Stats.DeadLettered, groupOpt)
				o.ObserveInt64(retries, g.Stats.Retried, groupOpt)
				o.ObserveInt64(skipped, g.Stats.Skipped, groupOpt)
				var stuckNow int64
				for _, p := range g.Partitions {
					part := metric.WithAttributes(append(group[:len(group):len(group)],
						semconv.MessagingDestinationPartitionID(strconv.Itoa(p.Partition)))...)
					o.ObserveInt64(lag, p.Lag, part)
					o.ObserveFloat64(lagAge, p.LagAge.Seconds(), part)
					if p.Stuck {
						stuckNow++
					}
				}
				o.ObserveInt64(stuck, stuckNow, groupOpt)
			}
		}
		return nil
	}, lag, lagAge, stuck, dead, retries, skipped, dropped)
	if err != nil {
		return nil, err
	}
	return reg, nil
}
