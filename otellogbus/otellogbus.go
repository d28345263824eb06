// Package otellogbus traces and measures a logbus broker with
// OpenTelemetry, following the messaging semantic conventions (semconv
// v1.43.0). It depends on the OpenTelemetry API only: the application
// chooses the SDK and the exporters.
//
//	h := otellogbus.New() // the global TracerProvider, MeterProvider and propagator
//	b := pubsub.NewBroker(pubsub.WithHooks(h))
//	reg, err := h.Observe(b) // the gauges and counters read from b.Snapshot
//	defer reg.Unregister()
//
// # Spans
//
// Publishing a record makes a PRODUCER span "send <topic>" whose context is
// the record's creation context: the propagator writes it into the
// record's headers, so it travels with the record. (The default propagator
// is otel's global one, which does nothing until the application sets it;
// WithPropagator(propagation.TraceContext{}) writes W3C traceparent.) Each
// delivery attempt makes a CONSUMER span "process <topic>", in a trace of
// its own, that links to the creation context found in the headers (the
// conventions' default); the handler's own spans nest under it, since the
// handler is given its context. Both carry messaging.system "logbus",
// messaging.operation.name and .type, messaging.destination.name and
// messaging.destination.partition.id. Process spans also carry
// messaging.consumer.group.name, messaging.message.id, messaging.client.id
// (the consumer), logbus.message.offset and logbus.delivery.attempt; a send
// span gets logbus.message.offset once the record is stored (its ID is not
// known to the hooks, so it has no messaging.message.id). A failure sets
// the span's status to Error and error.type to one of "panic", "decode",
// "permanent", "backpressure", "closed", "context_canceled",
// "context_deadline_exceeded" or "_OTHER".
//
// # Metrics
//
// Measured on each event: messaging.client.sent.messages and
// messaging.client.operation.duration (for send),
// messaging.client.consumed.messages and messaging.process.duration (per
// delivery attempt), with messaging.system, messaging.operation.name,
// messaging.destination.name, messaging.destination.partition.id,
// messaging.consumer.group.name (consumers) and error.type (failures).
// messaging.message.id, unique per record, is a span attribute only: as a
// metric attribute it would make a time series per record.
//
// Read from [pubsub.Broker.Snapshot] when the metrics are collected, so
// they cost the broker nothing between collections: each group's lag (in
// records and in time) and stuck deliveries, and every counter of
// [pubsub.GroupStats] and [pubsub.TopicStats] (logbus.consumer.*,
// logbus.records.*, logbus.producer.*); [Hooks.Observe] lists them.
//
// A Hooks value is safe for concurrent use. Its methods are the broker's
// to call.
package otellogbus

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/logbus/logbus/pubsub"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/logbus/logbus/otellogbus"

// System is the messaging.system of every span and metric: not one of the
// conventions' well-known values, which they allow for other systems.
const System = "logbus"

const system = messagingconv.SystemAttr(System)

// buckets are the conventions' advice for the duration histograms, in
// seconds.
var buckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// The attributes logbus adds under its own namespace.
const (
	attrOffset  = attribute.Key("logbus.message.offset")
	attrAttempt = attribute.Key("logbus.delivery.attempt")
)

// Option configures New.
type Option interface{ apply(*config) }

type config struct {
	tp   trace.TracerProvider
	mp   metric.MeterProvider
	prop propagation.TextMapPropagator
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithTracerProvider sets where spans go; the default is otel's global
// TracerProvider, as it is when New is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithMeterProvider sets where measurements go; the default is otel's
// global MeterProvider, as it is when New is called.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp = mp })
}

// WithPropagator sets how a record's creation context is written into its
// headers and read back; the default is otel's global TextMapPropagator,
// as it is when New is called (set it to propagation.TraceContext{} for
// W3C traceparent).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) { c.prop = p })
}

// Hooks traces and measures the brokers it is registered with
// ([pubsub.WithHooks]). Make one with New.
type Hooks struct {
	tracer trace.Tracer
	meter  metric.Meter
	prop   propagation.TextMapPropagator

	sent     messagingconv.ClientSentMessages
	consumed messagingconv.ClientConsumedMessages
	opDur    messagingconv.ClientOperationDuration
	procDur  messagingconv.ProcessDuration
	err      error // from creating the instruments, reported by Observe
}

// The hook interfaces Hooks implements.
var (
	_ pubsub.HookPublish   = (*Hooks)(nil)
	_ pubsub.HookPublished = (*Hooks)(nil)
	_ pubsub.HookDeliver   = (*Hooks)(nil)
	_ pubsub.HookDelivered = (*Hooks)(nil)
)

// New returns hooks that trace and measure a broker. Register them with
// [pubsub.WithHooks], then call Observe for the metrics read from the
// broker's Snapshot.
func New(opts ...Option) *Hooks {
	cfg := config{tp: otel.GetTracerProvider(), mp: otel.GetMeterProvider(), prop: otel.GetTextMapPropagator()}
	for _, o := range opts {
		o.apply(&cfg)
	}
	h := &Hooks{
		tracer: cfg.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		meter:  cfg.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL)),
		prop:   cfg.prop,
	}
	var errs [4]error
	// On an error each instrument is a no-op, so the hooks still run;
	// Observe reports it.
	h.sent, errs[0] = messagingconv.NewClientSentMessages(h.meter)
	h.consumed, errs[1] = messagingconv.NewClientConsumedMessages(h.meter)
	h.opDur, errs[2] = messagingconv.NewClientOperationDuration(h.meter, metric.WithExplicitBucketBoundaries(buckets...))
	h.procDur, errs[3] = messagingconv.NewProcessDuration(h.meter, metric.WithExplicitBucketBoundaries(buckets...))
	h.err = errors.Join(errs[:]...)
	return h
}

// spanAttrs are the attributes of a span of operation op (of type
// opType) on a partition of topic, then more.
func spanAttrs(op string, opType attribute.KeyValue, topic string, partition int, more ...attribute.KeyValue) trace.SpanStartEventOption {
	attrs := make([]attribute.KeyValue, 0, 5+len(more))
	attrs = append(attrs,
		semconv.MessagingSystemKey.String(System),
		semconv.MessagingOperationName(op),
		opType,
		semconv.MessagingDestinationName(topic),
		semconv.MessagingDestinationPartitionID(strconv.Itoa(partition)),
	)
	return trace.WithAttributes(append(attrs, more...)...)
}

// sendStart is kept in a publish's context from OnPublish to OnPublished.
type sendStart struct{}

// OnPublish starts the "send" span and writes its context into the
// record's headers.
func (h *Hooks) OnPublish(ctx context.Context, p *pubsub.PublishInfo) context.Context {
	ctx, _ = h.tracer.Start(ctx, "send "+p.Topic, trace.WithSpanKind(trace.SpanKindProducer),
		spanAttrs("send", semconv.MessagingOperationTypeSend, p.Topic, p.Partition))
	h.prop.Inject(ctx, headers{p})
	if !h.opDur.Float64Histogram.Enabled(ctx) {
		return ctx // no clock read for a duration nobody records
	}
	return context.WithValue(ctx, sendStart{}, time.Now())
}

// headers carries a creation context into a record's headers, making the
// map only when the propagator writes something (otel's default global
// propagator writes nothing).
type headers struct{ p *pubsub.PublishInfo }

func (c headers) Get(key string) string { return c.p.Headers[key] }

func (c headers) Set(key, value string) {
	if c.p.Headers == nil {
		c.p.Headers = make(map[string]string, 2)
	}
	c.p.Headers[key] = value
}

func (c headers) Keys() []string { return propagation.MapCarrier(c.p.Headers).Keys() }

// OnPublished ends the "send" span and counts the record sent, or failed.
func (h *Hooks) OnPublished(ctx context.Context, p *pubsub.PublishInfo, pos pubsub.Position, err error) {
	span := trace.SpanFromContext(ctx)
	attrs := make([]attribute.KeyValue, 0, 3)
	attrs = append(attrs, semconv.MessagingDestinationName(p.Topic), semconv.MessagingDestinationPartitionID(strconv.Itoa(p.Partition)))
	if err != nil {
		kind := errorType(err)
		span.SetAttributes(semconv.ErrorTypeKey.String(kind))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		attrs = append(attrs, semconv.ErrorTypeKey.String(kind))
	} else {
		span.SetAttributes(attrOffset.Int64(pos.Offset))
		if p.ID != "" {
			span.SetAttributes(semconv.MessagingMessageID(p.ID))
		}
	}
	span.End()
	h.sent.Add(ctx, 1, "send", system, attrs...)
	if start, ok := ctx.Value(sendStart{}).(time.Time); ok {
		h.opDur.Record(ctx, time.Since(start).Seconds(), "send", system,
			append(attrs, h.opDur.AttrOperationType(messagingconv.OperationTypeSend))...)
	}
}

// OnDeliver starts the "process" span of a delivery attempt, linked to the
// record's creation context.
func (h *Hooks) OnDeliver(ctx context.Context, d *pubsub.DeliveryInfo) context.Context {
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		spanAttrs("process", semconv.MessagingOperationTypeProcess, d.Topic, d.Partition,
			semconv.MessagingConsumerGroupName(d.Group),
			semconv.MessagingMessageID(d.ID),
			attrOffset.Int64(d.Offset),
			attrAttempt.Int(d.Attempt),
		),
	}
	if len(d.Headers) > 0 {
		// The headers are the log's, shared: a MapCarrier only reads them
		// here.
		created := trace.SpanContextFromContext(h.prop.Extract(context.Background(), propagation.MapCarrier(d.Headers)))
		if created.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: created}))
		}
	}
	if d.Consumer != "" {
		opts = append(opts, trace.WithAttributes(semconv.MessagingClientID(d.Consumer)))
	}
	ctx, _ = h.tracer.Start(ctx, "process "+d.Topic, opts...)
	return ctx
}

// OnDelivered ends the "process" span and counts the attempt.
func (h *Hooks) OnDelivered(ctx context.Context, d *pubsub.DeliveryInfo, r pubsub.DeliveryResult) {
	span := trace.SpanFromContext(ctx)
	attrs := make([]attribute.KeyValue, 0, 4)
	attrs = append(attrs, semconv.MessagingDestinationName(d.Topic), semconv.MessagingDestinationPartitionID(strconv.Itoa(d.Partition)),
		semconv.MessagingConsumerGroupName(d.Group))
	if r.Err != nil && r.Outcome != pubsub.OutcomeAcked {
		kind := errorType(r.Err)
		span.SetAttributes(semconv.ErrorTypeKey.String(kind))
		span.RecordError(r.Err)
		span.SetStatus(codes.Error, r.Err.Error())
		attrs = append(attrs, semconv.ErrorTypeKey.String(kind))
	}
	span.End()
	h.consumed.Add(ctx, 1, "process", system, attrs...)
	h.procDur.Record(ctx, r.Took.Seconds(), "process", system, attrs...)
}

// errorType names the kind of err for error.type, from a short fixed list.
func errorType(err error) string {
	var (
		panicked *pubsub.PanicError
		decode   *pubsub.DecodeError
	)
	switch {
	case errors.As(err, &panicked):
		return "panic"
	case errors.As(err, &decode):
		return "decode"
	case errors.Is(err, pubsub.ErrPermanent):
		return "permanent"
	case errors.Is(err, pubsub.ErrBackpressure):
		return "backpressure"
	case errors.Is(err, pubsub.ErrClosed):
		return "closed"
	case errors.Is(err, context.Canceled):
		return "context_canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "context_deadline_exceeded"
	}
	return string(messagingconv.ErrorTypeOther)
}
