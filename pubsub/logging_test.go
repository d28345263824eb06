package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// logRecorder is a slog.Handler that keeps every record, its attributes
// flattened to strings.
type logRecorder struct {
	mu      sync.Mutex
	records []logRecord
	level   slog.Level
}

type logRecord struct {
	level string
	msg   string
	attrs map[string]string
}

func (l *logRecorder) logger() *slog.Logger { return slog.New(l) }

func (l *logRecorder) Enabled(_ context.Context, level slog.Level) bool { return level >= l.level }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level.String(), msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, rec)
	return nil
}

func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) find(msg string) []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logRecord
	for _, r := range l.records {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

func (l *logRecorder) messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.records {
		out = append(out, r.level+" "+r.msg)
	}
	return out
}

// Without WithLogger nothing is logged, and with one at Info the per-record
// events (retries, drops) stay out: they are at Debug.
func TestLoggerLevels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecorder{level: slog.LevelInfo}
		b := pubsubtest.NewBroker(t, pubsub.WithLogger(logs.logger()), pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 2}))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		g := mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
			switch m.Value {
			case "boom":
				panic("boom")
			case "bad":
				return errors.New("bad")
			}
			return nil
		}))
		mustPublish(t, topic, "k", "ok")
		mustPublish(t, topic, "k", "bad")
		mustPublish(t, topic, "k", "boom")
		pubsubtest.Drain(t, b)
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := g.Seek(context.Background(), 0, 1); err != nil {
			t.Fatal(err)
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
		if err := b.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := logs.messages()
		// Everything after the first dead letter and the first panic comes
		// within a second, on the same partition: the limiter holds back
		// the second dead letter, the panic's retry, and the replay's
		// panics and dead letters.
		want := []string{
			"INFO logbus: rebalanced",
			"WARN logbus: dead-lettered",
			"ERROR logbus: handler panicked",
			"INFO logbus: paused",
			"INFO logbus: seeked",
			"INFO logbus: resumed",
			"INFO logbus: closing",
			"INFO logbus: broker closed",
		}
		if !slices.Equal(got, want) {
			t.Errorf("log:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(want, "\n      "))
		}
		dl := logs.find("logbus: dead-lettered")[0]
		for k, v := range map[string]string{
			"messaging.destination.name":         "orders",
			"messaging.consumer.group.name":      "billing",
			"messaging.destination.partition.id": "0",
			"offset":                             "1",
			"attempt":                            "2",
			"error":                              "bad",
			"kind":                               "exhausted",
			"consumer":                           "b1",
		} {
			if dl.attrs[k] != v {
				t.Errorf("dead letter record: %s = %q, want %q (all: %v)", k, dl.attrs[k], v, dl.attrs)
			}
		}
		if dl.attrs["messaging.message.id"] == "" {
			t.Errorf("dead letter record has no messaging.message.id: %v", dl.attrs)
		}
		p := logs.find("logbus: handler panicked")[0]
		if p.attrs["panic"] != "boom" || !strings.Contains(p.attrs["stack"], "logging_test.go") {
			t.Errorf("panic record %v, want the value and a stack through the handler", p.attrs)
		}
	})
}

// At Debug the retries and drops are logged too; a flood of dead letters
// is one Warn line a second, the next one saying how many it left out.
func TestLoggerDebugAndRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecorder{level: slog.LevelDebug}
		b := pubsubtest.NewBroker(t, pubsub.WithLogger(logs.logger()), pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 2}))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
			return errors.New("always")
		}))
		for i := range 10 {
			mustPublish(t, topic, "k", fmt.Sprint(i))
		}
		pubsubtest.Drain(t, b)
		if n := len(logs.find("logbus: delivery failed, retrying")); n != 10 {
			t.Errorf("%d retries logged at Debug, want 10", n)
		}
		if n := len(logs.find("logbus: dead-lettered")); n != 1 {
			t.Errorf("%d dead letters logged within the first second, want 1", n)
		}
		time.Sleep(2 * time.Second)
		mustPublish(t, topic, "k", "later")
		pubsubtest.Drain(t, b)
		dl := logs.find("logbus: dead-lettered")
		if len(dl) != 2 || dl[1].attrs["not_logged"] != "9" {
			t.Errorf("dead-letter records %v, want a second one saying 9 were not logged", dl)
		}
	})
}

// A handler running past WithStuckAfter is reported to HookStuck, logged
// at Warn, and shown Stuck in the Snapshot with how long it has run; when
// it returns, that is reported too.
func TestStuckHandlerIsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := &events{}
		logs := &logRecorder{level: slog.LevelInfo}
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(ev), pubsub.WithLogger(logs.logger()), pubsub.WithStuckAfter(2*time.Second))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
		release := make(chan struct{})
		mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
			if m.Value == "slow" {
				<-release
			}
			return nil
		}))
		pos := mustPublish(t, topic, "k", "slow")
		time.Sleep(time.Second) // less than the threshold: nothing yet
		synctest.Wait()
		if got := ev.with("stuck"); len(got) != 0 {
			t.Errorf("after 1s: %q, want no stuck event", got)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		want := fmt.Sprintf("stuck billing/%d@0 consumer=b1 attempt=1 running=2s returned=false", pos.Partition)
		if got := ev.with("stuck"); !slices.Equal(got, []string{want}) {
			t.Errorf("after 3s: %q, want [%s]", got, want)
		}
		p := b.Snapshot().Topics[0].Groups[0].Partitions[pos.Partition]
		if !p.Stuck || !p.InFlight || p.RunningFor < 2*time.Second || p.RunningFor > 3*time.Second {
			t.Errorf("snapshot %+v, want stuck, in flight, running 2s to 3s", p)
		}
		if other := b.Snapshot().Topics[0].Groups[0].Partitions[1-pos.Partition]; other.Stuck || other.RunningFor != 0 {
			t.Errorf("idle partition: %+v, want not stuck", other)
		}
		if got := logs.find("logbus: handler stuck"); len(got) != 1 || got[0].level != "WARN" {
			t.Errorf("stuck log %v, want one Warn", got)
		}
		close(release)
		pubsubtest.Drain(t, b)
		time.Sleep(time.Second)
		synctest.Wait()
		if got := ev.with("stuck"); len(got) != 2 || !strings.HasSuffix(got[1], "returned=true") ||
			!strings.HasPrefix(got[1], fmt.Sprintf("stuck billing/%d@0 ", pos.Partition)) {
			t.Errorf("after release: %q, want a returned event for offset 0", got)
		}
		if got := logs.find("logbus: stuck handler returned"); len(got) != 1 || got[0].level != "INFO" {
			t.Errorf("returned log %v, want one Info", got)
		}
	})
}

// WithStuckAfter needs an engine that can watch its handlers; a negative
// threshold is ErrInvalid.
func TestWithStuckAfterValidation(t *testing.T) {
	for name, opts := range map[string][]pubsub.BrokerOption{
		"negative":          {pubsub.WithStuckAfter(-time.Second)},
		"engine without it": {pubsub.WithEngine(lesser{}), pubsub.WithStuckAfter(time.Second)},
	} {
		t.Run(name, func(t *testing.T) {
			b := pubsub.NewBroker(opts...)
			t.Cleanup(func() { _ = b.Close(context.Background()) })
			wantErrIs(t, "Err", b.Err(), pubsub.ErrInvalid)
		})
	}
}

// The stuck-handler watchdog is the only goroutine WithStuckAfter adds, and
// there is none without it; Close stops it (goleak checks that at the end
// of the package's tests). Inside a bubble, where nothing else of other
// tests runs.
func TestStuckWatchdogRunsOnlyWhenAsked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		count := func(opts ...pubsub.BrokerOption) int {
			before := runtime.NumGoroutine()
			b := pubsub.NewBroker(opts...)
			n := runtime.NumGoroutine() - before
			if err := b.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			return n
		}
		if n := count(pubsub.WithLogger(slog.New(&logRecorder{}))); n != 0 {
			t.Errorf("a broker without WithStuckAfter started %d goroutines, want 0", n)
		}
		if n := count(pubsub.WithStuckAfter(time.Second)); n != 1 {
			t.Errorf("a broker with WithStuckAfter started %d goroutines, want 1 (the watchdog)", n)
		}
	})
}

// stuckSignal closes its channel at the first stuck event.
type stuckSignal struct {
	once sync.Once
	ch   chan pubsub.StuckEvent
}

func (s *stuckSignal) OnStuck(e pubsub.StuckEvent) {
	s.once.Do(func() { s.ch <- e })
}

// The watchdog in real time, outside a bubble: a handler that waits for
// the stuck report is reported, and Close stops the watchdog (goleak, in
// TestMain, finds any goroutine left).
func TestStuckWatchdogInRealTime(t *testing.T) {
	sig := &stuckSignal{ch: make(chan pubsub.StuckEvent, 1)}
	b := pubsub.NewBroker(pubsub.WithHooks(sig), pubsub.WithStuckAfter(10*time.Millisecond))
	topic := mustTopic(t, b, "orders", codec.String(), codec.String())
	reported := make(chan pubsub.StuckEvent, 1)
	mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[string](func(ctx context.Context, _ pubsub.Message[string]) error {
		select {
		case e := <-sig.ch:
			reported <- e
		case <-ctx.Done(): // Close gave up: bounds a failure only
		}
		return nil
	}))
	mustPublish(t, topic, "k", "v")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-reported:
		if e.Delivery.Group != "g" || e.Running < 10*time.Millisecond || e.Returned {
			t.Errorf("stuck event %+v, want group g running at least 10ms", e)
		}
	default:
		t.Error("the handler was never reported stuck")
	}
}

// A publish that waits for room is logged at Debug, and only one that
// gives up is a Warn.
func TestBackpressureIsLoggedAtDebugUntilItGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecorder{level: slog.LevelDebug}
		b := pubsubtest.NewBroker(t, pubsub.WithLogger(logs.logger()))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: time.Second}))
		release := make(chan struct{})
		g := mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
			<-release
			return nil
		}))
		mustPublish(t, topic, "k", "1") // in the handler: the partition is full
		go func() {
			time.Sleep(time.Second / 2)
			close(release)
		}()
		mustPublish(t, topic, "k", "2") // waits half a second, then fits
		pubsubtest.Drain(t, b)
		if waits := logs.find("logbus: partition full, publish waiting"); len(waits) != 1 || waits[0].level != "DEBUG" {
			t.Errorf("waiting publishes logged %v, want one at Debug", waits)
		}
		if gaveUp := logs.find("logbus: publish gave up on a full partition"); len(gaveUp) != 0 {
			t.Fatalf("a publish that fitted was logged as giving up: %v", gaveUp)
		}
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, topic, "k", "3") // fits once 2 is committed
		if _, err := topic.Publish(context.Background(), "k", "4"); !errors.Is(err, pubsub.ErrBackpressure) {
			t.Fatalf("publish to a full partition of a paused group: %v, want ErrBackpressure", err)
		}
		if gaveUp := logs.find("logbus: publish gave up on a full partition"); len(gaveUp) != 1 || gaveUp[0].level != "WARN" {
			t.Errorf("publishes that gave up logged %v, want one at Warn", gaveUp)
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
