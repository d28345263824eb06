// Command observe runs a logbus broker you can watch: OpenTelemetry hooks
// exported to Prometheus at /metrics, and the debug page at /debug/logbus/,
// while a producer publishes orders to three groups that each misbehave in
// their own way:
//
//   - billing is flaky: one order in ten fails once and is retried, one in
//     twenty-five fails for good and is dead-lettered;
//   - audit is slow: it takes longer per order than orders arrive, so its
//     lag, and the age of its oldest unread order, keep growing;
//   - mailer hangs now and then for three seconds: a stuck handler.
//
// Run it and open the page; -for bounds the run:
//
//	go run . -addr localhost:8080 -for 2m
//	curl -s localhost:8080/metrics | grep -E '^(messaging|logbus)_'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/debughttp"
	"github.com/logbus/logbus/otellogbus"
	"github.com/logbus/logbus/pubsub"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.addr, "addr", "localhost:8080", "where to serve /metrics and /debug/logbus/")
	flag.DurationVar(&cfg.run, "for", 0, "stop after this long (0: run until interrupted)")
	flag.IntVar(&cfg.rate, "rate", 50, "orders published per second")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if cfg.run > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.run)
		defer cancel()
	}
	err := run(ctx, cfg, func(addr string) {
		fmt.Printf("debug page: http://%s/debug/logbus/\nmetrics:    http://%s/metrics\n", addr, addr)
	})
	if err != nil {
		log.Fatal(err)
	}
}

type config struct {
	addr string
	run  time.Duration
	rate int
}

// run serves the broker's page and metrics on cfg.addr while publishing,
// until ctx ends; then it shuts down and returns. ready is called with the
// address once the server listens and a publish and a delivery were
// measured.
func run(ctx context.Context, cfg config, ready func(addr string)) error {
	// Metrics: the OTel SDK, read by Prometheus through the exporter, into
	// a registry of our own.
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry), otelprom.WithoutScopeInfo())
	if err != nil {
		return err
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer meters.Shutdown(context.Background())

	// The broker, traced and measured (no tracer provider is set here, so
	// spans go to otel's global no-op one; set yours with
	// otellogbus.WithTracerProvider), logging what an operator should know.
	hooks := otellogbus.New(otellogbus.WithMeterProvider(meters), otellogbus.WithPropagator(propagation.TraceContext{}))
	first := &firstMeasured{done: make(chan struct{})}
	b := pubsub.NewBroker(
		pubsub.WithHooks(hooks, first),
		pubsub.WithStuckAfter(time.Second),
		pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: 100 * time.Millisecond}),
		pubsub.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))),
	)
	reg, err := hooks.Observe(b)
	if err != nil {
		return err
	}
	defer reg.Unregister()

	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.JSON[order](), pubsub.WithPartitions(4),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 4096, BlockTimeout: 100 * time.Millisecond}))
	if err != nil {
		return err
	}
	if err := subscribe(orders); err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.Handle("/debug/logbus/", http.StripPrefix("/debug/logbus", debughttp.Handler(b, debughttp.WithActions())))
	mux.Handle("GET /{$}", http.RedirectHandler("/debug/logbus/", http.StatusFound))
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	var producer sync.WaitGroup
	producer.Go(func() { publish(ctx, orders, max(cfg.rate, 1)) })

	select {
	case <-first.done:
		ready(ln.Addr().String())
	case <-ctx.Done():
	}
	<-ctx.Done()

	// Shut down: the producer first, then the server, then the broker,
	// which drains what it can in five seconds (audit cannot: it is
	// behind, and its lag is reported).
	producer.Wait()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdown)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if cerr := b.Close(shutdown); cerr != nil {
		fmt.Printf("closed with records left behind: %v\n", cerr)
	}
	return err
}

type order struct {
	N      int    `json:"n"`
	Amount int    `json:"amount"`
	Note   string `json:"note,omitempty"`
}

// subscribe adds the three groups.
func subscribe(orders *pubsub.Topic[string, order]) error {
	var tries sync.Map // order number → failed attempts so far
	billing := pubsub.HandlerFunc[order](func(_ context.Context, m pubsub.Message[order]) error {
		switch {
		case m.Value.N%25 == 7:
			return fmt.Errorf("order %d: card declined: %w", m.Value.N, pubsub.ErrPermanent)
		case m.Value.N%10 == 3:
			if n, _ := tries.LoadOrStore(m.Value.N, 0); n.(int) == 0 {
				tries.Store(m.Value.N, 1)
				return fmt.Errorf("order %d: payment service timed out", m.Value.N)
			}
			tries.Delete(m.Value.N)
		}
		return nil
	})
	audit := pubsub.HandlerFunc[order](func(ctx context.Context, m pubsub.Message[order]) error {
		return pause(ctx, 100*time.Millisecond) // 10 a second per partition: slower than orders come
	})
	mailer := pubsub.HandlerFunc[order](func(ctx context.Context, m pubsub.Message[order]) error {
		if m.Value.N%150 == 42 {
			return pause(ctx, 3*time.Second) // stuck, as WithStuckAfter(1s) reports
		}
		return nil
	})
	for _, g := range []struct {
		name string
		h    pubsub.Handler[order]
	}{{"billing", billing}, {"audit", audit}, {"mailer", mailer}} {
		for i := range 2 {
			if _, err := orders.Subscribe(g.name, fmt.Sprintf("%s-%d", g.name, i+1), g.h); err != nil {
				return err
			}
		}
	}
	return nil
}

// pause waits d, or until ctx ends (Close gave up on draining).
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// publish sends rate orders a second until ctx ends.
func publish(ctx context.Context, orders *pubsub.Topic[string, order], rate int) {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for n := 0; ; n++ {
		o := order{N: n, Amount: 10 + n%90}
		if n%25 == 7 {
			o.Note = "expired card"
		}
		_, err := orders.Publish(ctx, fmt.Sprintf("customer-%d", n%40), o)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, pubsub.ErrBackpressure):
			// audit is full: counted (blocked, timed out) and shown.
		case err != nil:
			log.Printf("publish: %v", err)
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// firstMeasured is a hook that tells when a publish and a delivery have
// both been measured by the OpenTelemetry hooks (called before it). Both
// are needed: a record can be delivered before its publisher's hook runs.
type firstMeasured struct {
	published, delivered sync.Once
	seen                 atomic.Int32 // how many of the two have happened
	done                 chan struct{}
}

func (f *firstMeasured) OnPublished(context.Context, *pubsub.PublishInfo, pubsub.Position, error) {
	f.published.Do(f.saw)
}

func (f *firstMeasured) OnDelivered(context.Context, *pubsub.DeliveryInfo, pubsub.DeliveryResult) {
	f.delivered.Do(f.saw)
}

func (f *firstMeasured) saw() {
	if f.seen.Add(1) == 2 {
		close(f.done)
	}
}
