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

// The instruments Observe registers that are not counters of
// TopicStats or GroupStats: name, unit, description below.
const (
	lagName    = "logbus.consumer.lag"
	lagAgeName = "logbus.consumer.lag.age"
	stuckName  = "logbus.consumer.stuck"
)

// stat is one counter of [pubsub.TopicStats] or GroupStats (S) and the
// instrument Observe exports it as: an observable counter, or a gauge
// when the value is a level rather than a running count. One whose name
// is "" is not exported, since the hooks already measure it, as
// measuredBy says.
type stat[S any] struct {
	name, unit, desc string
	gauge            bool
	measuredBy       string
	value            func(S) int64
}

// topicStats and groupStats are the tables of the counters Observe reads
// from the snapshot: one line per field of [pubsub.TopicStats] and
// GroupStats (a test checks it, by reflection, so a new counter fails it
// until it has a line here, and the line's name is in Observe's doc).
var (
	topicStats = []stat[pubsub.TopicStats]{
		{measuredBy: "messaging.client.sent.messages, a record sent when it has no error.type",
			value: func(s pubsub.TopicStats) int64 { return s.Published }},
		{name: "logbus.records.retained", unit: "{message}", gauge: true, desc: "Records a topic holds now.",
			value: func(s pubsub.TopicStats) int64 { return int64(s.Retained) }},
		{name: "logbus.records.retained.size", unit: "By", gauge: true, desc: "Bytes of the records a topic holds now (keys, values and headers).",
			value: func(s pubsub.TopicStats) int64 { return s.RetainedBytes }},
		{name: "logbus.records.reclaimed", unit: "{message}", desc: "Records freed after every group had committed past them.",
			value: func(s pubsub.TopicStats) int64 { return s.Reclaimed }},
		{name: "logbus.records.dropped", unit: "{message}", desc: "Records shed by DropOldest or trimmed unread from a full partition.",
			value: func(s pubsub.TopicStats) int64 { return s.Dropped }},
		{name: "logbus.records.expired", unit: "{message}", desc: "Records trimmed for being older than the topic's MaxAge.",
			value: func(s pubsub.TopicStats) int64 { return s.Expired }},
		{name: "logbus.producer.blocked", unit: "{publish}", desc: "Publishes that had to wait for room in a full partition.",
			value: func(s pubsub.TopicStats) int64 { return s.Blocked }},
		{name: "logbus.producer.timed_out", unit: "{publish}", desc: "Publishes that gave up on a full partition with ErrBackpressure.",
			value: func(s pubsub.TopicStats) int64 { return s.TimedOut }},
	}
	groupStats = []stat[pubsub.GroupStats]{
		{measuredBy: "messaging.client.consumed.messages, an attempt acked when it has no error.type",
			value: func(s pubsub.GroupStats) int64 { return s.Delivered }},
		{name: "logbus.consumer.retries", unit: "{attempt}", desc: "Failed delivery attempts that were retried.",
			value: func(s pubsub.GroupStats) int64 { return s.Retried }},
		{name: "logbus.consumer.dead_letters", unit: "{message}", desc: "Records a consumer group gave up on and dead-lettered.",
			value: func(s pubsub.GroupStats) int64 { return s.DeadLettered }},
		{name: "logbus.consumer.skipped", unit: "{message}", desc: "Records trimmed by retention before the group read them.",
			value: func(s pubsub.GroupStats) int64 { return s.Skipped }},
		{name: "logbus.consumer.dead_letters.evicted", unit: "{message}", desc: "Dead letters pushed out of a group's bounded queue, or not kept.",
			value: func(s pubsub.GroupStats) int64 { return s.DeadLettersEvicted }},
		{name: "logbus.consumer.redriven", unit: "{message}", desc: "Dead letters sent back to the group by Redrive.",
			value: func(s pubsub.GroupStats) int64 { return s.Redriven }},
	}
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
//     running past the broker's [pubsub.WithStuckAfter] threshold.
//   - Counters per group, from [pubsub.GroupStats]:
//     logbus.consumer.retries {attempt} (Retried),
//     logbus.consumer.dead_letters {message} (DeadLettered),
//     logbus.consumer.skipped {message} (Skipped),
//     logbus.consumer.dead_letters.evicted {message} (DeadLettersEvicted)
//     and logbus.consumer.redriven {message} (Redriven).
//   - Per topic, from [pubsub.TopicStats]: the gauges
//     logbus.records.retained {message} (Retained) and
//     logbus.records.retained.size (By) (RetainedBytes), and the counters
//     logbus.records.reclaimed {message} (Reclaimed),
//     logbus.records.dropped {message} (Dropped),
//     logbus.records.expired {message} (Expired),
//     logbus.producer.blocked {publish} (Blocked) and
//     logbus.producer.timed_out {publish} (TimedOut).
//
// GroupStats.Delivered and TopicStats.Published are not exported again:
// the hooks count them as messaging.client.consumed.messages and
// messaging.client.sent.messages (the attempts and sends without
// error.type), per partition.
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
	lag := igauge(lagName, "{message}", "Records a consumer group has not committed yet.")
	lagAge := gauge(lagAgeName, "s", "How long the oldest record a consumer group has not committed has waited.")
	stuck := igauge(stuckName, "{delivery}", "Deliveries running longer than the broker's stuck-handler threshold.")
	all := []metric.Observable{lag, lagAge, stuck}
	topicInst, topicObs, err := instruments(h.meter, topicStats)
	errs = append(errs, err)
	groupInst, groupObs, err := instruments(h.meter, groupStats)
	errs = append(errs, err)
	all = append(append(all, topicObs...), groupObs...)
	if err := errors.Join(append(errs, h.err)...); err != nil {
		return nil, err
	}

	reg, err := h.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		snap := b.Snapshot()
		for _, t := range snap.Topics {
			topic := []attribute.KeyValue{semconv.MessagingSystemKey.String(System), semconv.MessagingDestinationName(t.Name)}
			observe(o, topicInst, topicStats, t.Stats, metric.WithAttributes(topic...))
			for _, g := range t.Groups {
				group := append(topic[:len(topic):len(topic)], semconv.MessagingConsumerGroupName(g.Name))
				groupOpt := metric.WithAttributes(group...)
				observe(o, groupInst, groupStats, g.Stats, groupOpt)
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
	}, all...)
	if err != nil {
		return nil, err
	}
	return reg, nil
}

// instruments makes the instrument of each line of table that has a name:
// inst[i] is line i's, nil for a line not exported; obs lists them for
// RegisterCallback.
func instruments[S any](m metric.Meter, table []stat[S]) (inst []metric.Int64Observable, obs []metric.Observable, err error) {
	var errs []error
	inst = make([]metric.Int64Observable, len(table))
	for i, st := range table {
		if st.name == "" {
			continue
		}
		unit, desc := metric.WithUnit(st.unit), metric.WithDescription(st.desc)
		var o metric.Int64Observable
		var err error
		if st.gauge {
			o, err = m.Int64ObservableGauge(st.name, unit, desc)
		} else {
			o, err = m.Int64ObservableCounter(st.name, unit, desc)
		}
		errs = append(errs, err)
		inst[i] = o
		obs = append(obs, o)
	}
	return inst, obs, errors.Join(errs...)
}

// observe reports the counters of s that table exports.
func observe[S any](o metric.Observer, inst []metric.Int64Observable, table []stat[S], s S, opt metric.ObserveOption) {
	for i, st := range table {
		if inst[i] != nil {
			o.ObserveInt64(inst[i], st.value(s), opt)
		}
	}
}
