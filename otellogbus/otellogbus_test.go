package otellogbus_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/otellogbus"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// telemetry is an SDK that keeps what it is given, for a test to read.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	hooks  *otellogbus.Hooks
}

func newTelemetry(t *testing.T) *telemetry {
	t.Helper()
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	tel.hooks = otellogbus.New(otellogbus.WithTracerProvider(tel.tp), otellogbus.WithMeterProvider(mp),
		otellogbus.WithPropagator(propagation.TraceContext{}))
	return tel
}

// collect reads every metric: by name, then by its attributes written as
// "k=v,k=v" (sorted), the value (a histogram's count).
func (tel *telemetry) collect(t *testing.T) map[string]map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otellogbus.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, otellogbus.ScopeName)
		}
		for _, m := range sm.Metrics {
			points := map[string]float64{}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					points[attrs(p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					points[attrs(p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					points[attrs(p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					points[attrs(p.Attributes)] = float64(p.Count)
				}
			default:
				t.Errorf("metric %s has data of type %T", m.Name, m.Data)
			}
			out[m.Name+" "+m.Unit] = points
		}
	}
	return out
}

func attrs(s attribute.Set) string {
	var kv []string
	for _, a := range s.ToSlice() {
		kv = append(kv, string(a.Key)+"="+a.Value.String())
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}

func spanAttrs(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, a := range s.Attributes() {
		m[string(a.Key)] = a.Value.String()
	}
	return m
}

// A record published inside a request's span gets a PRODUCER "send" span,
// child of the request, whose context rides in the record's headers; its
// delivery gets a CONSUMER "process" span that links to it, with the
// handler's own spans nested inside. Each span and each measurement
// carries the conventions' attributes; a failure sets error.type.
func TestSpansAndMetricsOfPublishAndDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tel := newTelemetry(t)
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(tel.hooks))
		orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
		if err != nil {
			t.Fatal(err)
		}
		tracer := tel.tp.Tracer("test")
		seen := map[string]string{} // value → the traceparent the handler was given
		_, err = orders.Subscribe("billing", "billing-1", pubsub.HandlerFunc[string](func(ctx context.Context, m pubsub.Message[string]) error {
			_, charge := tracer.Start(ctx, "charge card")
			charge.End()
			seen[m.Value] = m.Headers["traceparent"]
			if m.Value == "poison" {
				return fmt.Errorf("unknown currency: %w", pubsub.ErrPermanent)
			}
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}

		ctx, request := tracer.Start(context.Background(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
		for i, v := range []string{"order-1", "poison", "order-3"} {
			if _, err := orders.Publish(ctx, fmt.Sprintf("customer-%d", i), v); err != nil {
				t.Fatal(err)
			}
		}
		request.End()
		synctest.Wait()

		var sends, processes, charges []sdktrace.ReadOnlySpan
		for _, s := range tel.spans.Ended() {
			switch s.Name() {
			case "send orders":
				sends = append(sends, s)
			case "process orders":
				processes = append(processes, s)
			case "charge card":
				charges = append(charges, s)
			}
		}
		if len(sends) != 3 || len(processes) != 3 || len(charges) != 3 {
			t.Fatalf("%d send, %d process and %d charge spans, want 3 each", len(sends), len(processes), len(charges))
		}
		sendBy := map[string]sdktrace.ReadOnlySpan{} // by partition/offset
		for _, s := range sends {
			a := spanAttrs(s)
			if s.SpanKind() != trace.SpanKindProducer || s.Parent().SpanID() != request.SpanContext().SpanID() {
				t.Errorf("send span: kind %v parent %v, want PRODUCER, child of the request", s.SpanKind(), s.Parent().SpanID())
			}
			for k, want := range map[string]string{"messaging.system": "logbus", "messaging.operation.name": "send",
				"messaging.operation.type": "send", "messaging.destination.name": "orders"} {
				if a[k] != want {
					t.Errorf("send span %s = %q, want %q", k, a[k], want)
				}
			}
			if a["messaging.destination.partition.id"] == "" || a["logbus.message.offset"] == "" || a["messaging.message.id"] == "" {
				t.Errorf("send span lacks its partition, offset or message ID: %v", a)
			}
			sendBy[a["messaging.destination.partition.id"]+"/"+a["logbus.message.offset"]] = s
		}
		for v, tp := range seen {
			if !strings.HasPrefix(tp, "00-"+request.SpanContext().TraceID().String()+"-") {
				t.Errorf("the handler got %s with traceparent %q, want one of the request's trace", v, tp)
			}
		}
		processIDs := map[trace.SpanID]bool{}
		for _, p := range processes {
			a := spanAttrs(p)
			processIDs[p.SpanContext().SpanID()] = true
			send := sendBy[a["messaging.destination.partition.id"]+"/"+a["logbus.message.offset"]]
			if send == nil {
				t.Fatalf("process span %v matches no send span", a)
			}
			if p.SpanKind() != trace.SpanKindConsumer || p.Parent().IsValid() {
				t.Errorf("process span: kind %v, parent %v: want CONSUMER, a root", p.SpanKind(), p.Parent().SpanID())
			}
			if len(p.Links()) != 1 || p.Links()[0].SpanContext.SpanID() != send.SpanContext().SpanID() {
				t.Errorf("process span links %v, want its send span %v", p.Links(), send.SpanContext().SpanID())
			}
			for k, want := range map[string]string{"messaging.system": "logbus", "messaging.operation.name": "process",
				"messaging.operation.type": "process", "messaging.destination.name": "orders",
				"messaging.consumer.group.name": "billing", "logbus.delivery.attempt": "1", "messaging.client.id": "billing-1"} {
				if a[k] != want {
					t.Errorf("process span %s = %q, want %q", k, a[k], want)
				}
			}
			if a["messaging.message.id"] == "" || a["messaging.message.id"] != spanAttrs(send)["messaging.message.id"] {
				t.Errorf("process span messaging.message.id %q, want its send span's %q", a["messaging.message.id"], spanAttrs(send)["messaging.message.id"])
			}
			failed := a["error.type"] != ""
			if failed != (p.Status().Code == codes.Error) || failed && a["error.type"] != "permanent" {
				t.Errorf("process span: error.type %q, status %v", a["error.type"], p.Status())
			}
		}
		for _, c := range charges {
			if !processIDs[c.Parent().SpanID()] {
				t.Error("the handler's span is not a child of its process span")
			}
		}

		m := tel.collect(t)
		const sendAttrs = "messaging.destination.name=orders,messaging.destination.partition.id=%d,messaging.operation.name=send,messaging.system=logbus"
		sent := m["messaging.client.sent.messages {message}"]
		if total := sent[fmt.Sprintf(sendAttrs, 0)] + sent[fmt.Sprintf(sendAttrs, 1)]; total != 3 || len(sent) > 2 {
			t.Errorf("messaging.client.sent.messages = %v, want 3 over partitions 0 and 1", sent)
		}
		var ops float64
		for k, n := range m["messaging.client.operation.duration s"] {
			if !strings.Contains(k, "messaging.operation.type=send") || !strings.Contains(k, "messaging.system=logbus") {
				t.Errorf("operation.duration point %s", k)
			}
			ops += n
		}
		if ops != 3 {
			t.Errorf("messaging.client.operation.duration counts %v, want 3", ops)
		}
		for _, name := range []string{"messaging.client.consumed.messages {message}", "messaging.process.duration s"} {
			var ok, failed float64
			for k, n := range m[name] {
				if !strings.Contains(k, "messaging.consumer.group.name=billing") || !strings.Contains(k, "messaging.operation.name=process") {
					t.Errorf("%s point %s lacks the group or the operation", name, k)
				}
				if strings.Contains(k, "error.type=permanent") {
					failed += n
				} else {
					ok += n
				}
			}
			if ok != 2 || failed != 1 {
				t.Errorf("%s: %v ok and %v failed, want 2 and 1: %v", name, ok, failed, m[name])
			}
		}
	})
}

// The gauges and counters read from the Snapshot at collection time: lag
// and its age per partition, stuck deliveries, dead letters, retries and
// skipped records per group, dropped records per topic.
func TestObservedFromTheSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tel := newTelemetry(t)
		start := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
		clock := pubsubtest.NewClock(start)
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(tel.hooks), pubsub.WithClock(clock), pubsub.WithStuckAfter(time.Second))
		reg, err := tel.hooks.Observe(b)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = reg.Unregister() })

		orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
		if err != nil {
			t.Fatal(err)
		}
		tries := 0
		_, err = orders.Subscribe("billing", "billing-1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
			switch m.Value {
			case "poison":
				return pubsub.ErrPermanent
			case "flaky":
				if tries++; tries == 1 {
					return fmt.Errorf("try again")
				}
			}
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		audit, err := orders.Subscribe("audit", "audit-1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
		if err != nil {
			t.Fatal(err)
		}
		if err := audit.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		// A group whose handler hangs on its record until released.
		release := make(chan struct{})
		if _, err := orders.Subscribe("mailer", "mailer-1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
			<-release
			return nil
		})); err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"poison", "flaky", "fine"} {
			if _, err := orders.Publish(context.Background(), "k", v); err != nil {
				t.Fatal(err)
			}
		}
		// A topic no group reads trims its oldest records when full.
		events, err := pubsub.NewTopic(b, "events", codec.String(), codec.String(), pubsub.WithRetention(pubsub.Retention{MaxMessages: 2}))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			if _, err := events.PublishValue(context.Background(), fmt.Sprint(i)); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(5 * time.Second) // the records' age
		time.Sleep(3 * time.Second)    // virtual time: mailer's handler runs past WithStuckAfter
		synctest.Wait()

		m := tel.collect(t)
		const (
			topic = "messaging.destination.name=orders"
			sys   = "messaging.system=logbus"
		)
		group := func(g string) string { return "messaging.consumer.group.name=" + g + "," + topic }
		part := func(g string) string { return group(g) + ",messaging.destination.partition.id=0," + sys }
		for _, c := range []struct {
			metric, point string
			want          float64
		}{
			{"logbus.consumer.lag {message}", part("audit"), 3},
			{"logbus.consumer.lag {message}", part("billing"), 0},
			{"logbus.consumer.lag {message}", part("mailer"), 3},
			{"logbus.consumer.lag.age s", part("audit"), 5},
			{"logbus.consumer.lag.age s", part("billing"), 0},
			{"logbus.consumer.stuck {delivery}", group("mailer") + "," + sys, 1},
			{"logbus.consumer.stuck {delivery}", group("billing") + "," + sys, 0},
			{"logbus.consumer.dead_letters {message}", group("billing") + "," + sys, 1},
			{"logbus.consumer.retries {attempt}", group("billing") + "," + sys, 1},
			{"logbus.consumer.skipped {message}", group("billing") + "," + sys, 0},
			{"logbus.records.dropped {message}", "messaging.destination.name=events," + sys, 3},
			{"logbus.records.dropped {message}", topic + "," + sys, 0},
			{"logbus.consumer.dead_letters.evicted {message}", group("billing") + "," + sys, 0},
			{"logbus.consumer.redriven {message}", group("billing") + "," + sys, 0},
			{"logbus.records.retained {message}", topic + "," + sys, 3},
			{"logbus.records.retained {message}", "messaging.destination.name=events," + sys, 2},
			// Keys and values (18 bytes), and each record's traceparent
			// header (66 bytes) the propagator wrote.
			{"logbus.records.retained.size By", topic + "," + sys, 18 + 3*66},
			{"logbus.records.reclaimed {message}", topic + "," + sys, 0},
			{"logbus.records.expired {message}", topic + "," + sys, 0},
			{"logbus.producer.blocked {publish}", topic + "," + sys, 0},
			{"logbus.producer.timed_out {publish}", topic + "," + sys, 0},
		} {
			points, ok := m[c.metric]
			if !ok {
				t.Errorf("no metric %q; have %v", c.metric, slices.Sorted(func(yield func(string) bool) {
					for k := range m {
						if !yield(k) {
							return
						}
					}
				}))
				continue
			}
			if got, ok := points[c.point]; !ok || got != c.want {
				t.Errorf("%s{%s} = %v (present %v), want %v; points: %v", c.metric, c.point, got, ok, c.want, points)
			}
		}
		close(release)
		if err := audit.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// Observe refuses a nil broker.
func TestObserveNilBroker(t *testing.T) {
	if _, err := otellogbus.New().Observe(nil); err == nil {
		t.Error("Observe(nil) returned no error")
	}
}
