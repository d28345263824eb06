package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/asyncfake"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// In memory, PublishAsync stores the record before it returns: its Pending
// is resolved, with the position Publish would have given.
func TestPublishAsyncInMemoryIsStoredAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var got []pubsub.Position
		for i := range 6 {
			pd := topic.PublishAsync(ctx, fmt.Sprint("k", i%3), fmt.Sprint("v", i))
			select {
			case <-pd.Done():
			default:
				t.Fatalf("record %d: Done not closed when PublishAsync returned", i)
			}
			pos, err := pd.Wait(ctx)
			if err != nil {
				t.Fatalf("record %d: %v", i, err)
			}
			got = append(got, pos)
		}
		// The same keys published synchronously land where the next
		// offsets say.
		var want []pubsub.Position
		next := map[int]int64{}
		for i := range 6 {
			p := pubsub.KeyHash().Partition([]byte(fmt.Sprint("k", i%3)), 2)
			want = append(want, pubsub.Position{Partition: p, Offset: next[p]})
			next[p]++
		}
		if !slices.Equal(got, want) {
			t.Errorf("positions %v, want %v", got, want)
		}
		if err := topic.Flush(ctx); err != nil {
			t.Errorf("Flush after success: %v", err)
		}
	})
}

// What cannot be published resolves at once with its error, and Flush
// counts it: an unencodable value, a nil context, a publish after Close.
func TestPublishAsyncFailuresResolveAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsub.NewBroker()
		bad := codec.Func(func(v string) ([]byte, error) {
			if v == "bad" {
				return nil, errors.New("cannot encode bad")
			}
			return []byte(v), nil
		}, func(b []byte) (string, error) { return string(b), nil })
		topic, err := pubsub.NewTopic(b, "t", codec.String(), bad)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		enc := topic.PublishAsync(ctx, "k", "bad")
		//lint:ignore SA1012 a nil context is what is tested
		nilCtx := topic.PublishValueAsync(nil, "v")
		for name, pd := range map[string]*pubsub.Pending{"unencodable": enc, "nil ctx": nilCtx} {
			pos, err := pd.Wait(ctx)
			if !errors.Is(err, pubsub.ErrInvalid) || pos != (pubsub.Position{Partition: -1, Offset: -1}) {
				t.Errorf("%s: Wait = %v, %v; want {-1 -1} and ErrInvalid", name, pos, err)
			}
		}
		err = topic.Flush(ctx)
		if !errors.Is(err, pubsub.ErrInvalid) || !strings.Contains(err.Error(), "2 records failed") {
			t.Errorf("Flush: %v; want 2 records failed, wrapping ErrInvalid", err)
		}
		if err := topic.Flush(ctx); err != nil {
			t.Errorf("second Flush: %v; want nil, the failures were reported", err)
		}
		if err := b.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := topic.PublishAsync(ctx, "k", "late").Wait(ctx); !errors.Is(err, pubsub.ErrClosed) {
			t.Errorf("after Close: %v, want ErrClosed", err)
		}
		if err := topic.Flush(ctx); !errors.Is(err, pubsub.ErrClosed) || !strings.Contains(err.Error(), "1 record failed") {
			t.Errorf("Flush after Close: %v; want 1 record failed, wrapping ErrClosed", err)
		}
		//lint:ignore SA1012 a nil context is what is tested
		if _, err := resolved(t).Wait(nil); !errors.Is(err, pubsub.ErrInvalid) {
			t.Errorf("Wait(nil): %v, want ErrInvalid", err)
		}
		//lint:ignore SA1012 a nil context is what is tested
		if err := topic.Flush(nil); !errors.Is(err, pubsub.ErrInvalid) {
			t.Errorf("Flush(nil): %v, want ErrInvalid", err)
		}
	})
}

func resolved(t *testing.T) *pubsub.Pending {
	b := pubsubtest.NewBroker(t)
	topic, err := pubsub.NewTopic(b, "r", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	return topic.PublishValueAsync(context.Background(), "v")
}

// WithMaxInFlight below 1 is refused.
func TestWithMaxInFlightRange(t *testing.T) {
	b := pubsubtest.NewBroker(t)
	for _, n := range []int{0, -1} {
		if _, err := pubsub.NewTopic(b, fmt.Sprint("t", n), codec.String(), codec.String(), pubsub.WithMaxInFlight(n)); !errors.Is(err, pubsub.ErrInvalid) {
			t.Errorf("WithMaxInFlight(%d): %v, want ErrInvalid", n, err)
		}
	}
	if _, err := pubsub.NewTopic(b, "ok", codec.String(), codec.String(), pubsub.WithMaxInFlight(1)); err != nil {
		t.Errorf("WithMaxInFlight(1): %v", err)
	}
}

// In memory, PublishAsync waits for room under Block as Publish does: ctx
// bounds that wait (it is admission), and so does BlockTimeout.
func TestPublishAsyncWaitsForRoomUnderBlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.String(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		g, err := topic.Subscribe("g", "c", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := topic.PublishValueAsync(context.Background(), "first").Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err = topic.PublishValueAsync(ctx, "second").Wait(context.Background())
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(began) != 100*time.Millisecond {
			t.Errorf("with a 100ms ctx: %v after %v; want ctx's error after 100ms", err, time.Since(began))
		}
		began = time.Now()
		_, err = topic.PublishValueAsync(context.Background(), "third").Wait(context.Background())
		if !errors.Is(err, pubsub.ErrBackpressure) || time.Since(began) != time.Second {
			t.Errorf("without a deadline: %v after %v; want ErrBackpressure after BlockTimeout (1s)", err, time.Since(began))
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := topic.Flush(context.Background()); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "2 records failed") {
			t.Errorf("Flush: %v; want 2 records failed, wrapping the first one's cause (ctx's error)", err)
		}
	})
}

// In memory, PublishAsync costs one allocation more than Publish: its
// Pending.
func TestPublishAsyncAllocatesOnePending(t *testing.T) {
	b := pubsubtest.NewBroker(t)
	topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.RawBytes(), pubsub.WithRetention(pubsub.Retention{MaxMessages: 64}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	value := make([]byte, 64)
	for range 128 { // fill the partition, which then trims (no group) and reuses records
		topic.PublishValue(ctx, value)
	}
	sync := testing.AllocsPerRun(1000, func() { topic.PublishValue(ctx, value) })
	async := testing.AllocsPerRun(1000, func() { topic.PublishValueAsync(ctx, value) })
	if async > sync+1 {
		t.Errorf("PublishValueAsync: %v allocations, PublishValue %v; want at most one more", async, sync)
	}
}

// asyncBroker returns a broker on the in-memory engine made to confirm
// records later, as a remote engine does (internal/asyncfake).
func asyncBroker(t *testing.T, d *asyncfake.Driver, opts ...pubsub.BrokerOption) *pubsub.Broker {
	t.Helper()
	return pubsubtest.NewBroker(t, append(opts, pubsub.WithEngine(d))...)
}

// On an engine that confirms later, records stay in flight until it does:
// Flush waits for them, then reports nil, and the positions are the ones
// of the order of the calls.
func TestPublishAsyncInFlightUntilConfirmed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		b := asyncBroker(t, &asyncfake.Driver{Hold: hold})
		topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.String(), pubsub.WithPartitions(2))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var pds []*pubsub.Pending
		for i := range 10 {
			pds = append(pds, topic.PublishAsync(ctx, fmt.Sprint("k", i%2), fmt.Sprint(i)))
		}
		synctest.Wait()
		for i, pd := range pds {
			select {
			case <-pd.Done():
				t.Fatalf("record %d resolved before the engine confirmed it", i)
			default:
			}
		}
		flushed := make(chan error, 1)
		go func() { flushed <- topic.Flush(ctx) }()
		synctest.Wait()
		select {
		case err := <-flushed:
			t.Fatalf("Flush returned %v with records in flight", err)
		default:
		}
		close(hold)
		if err := <-flushed; err != nil {
			t.Fatalf("Flush: %v", err)
		}
		next := map[int]int64{}
		for i, pd := range pds {
			select {
			case <-pd.Done():
			default:
				t.Fatalf("record %d unresolved after Flush", i)
			}
			pos, err := pd.Wait(ctx)
			p := pubsub.KeyHash().Partition([]byte(fmt.Sprint("k", i%2)), 2)
			if err != nil || pos != (pubsub.Position{Partition: p, Offset: next[p]}) {
				t.Errorf("record %d: %v, %v; want partition %d offset %d", i, pos, err, p, next[p])
			}
			next[p]++
		}
	})
}

// At the topic's in-flight bound, PublishAsync waits for a record to
// resolve, as Block waits for room: bounded by ctx (admission) and by
// BlockTimeout, and woken by Close.
func TestPublishAsyncWaitsAtTheInFlightBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		b := asyncBroker(t, &asyncfake.Driver{Hold: hold})
		topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.String(), pubsub.WithMaxInFlight(2),
			pubsub.WithRetention(pubsub.Retention{BlockTimeout: time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		first := topic.PublishValueAsync(ctx, "1")
		topic.PublishValueAsync(ctx, "2")
		began := time.Now()
		short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		if _, err := topic.PublishValueAsync(short, "3").Wait(ctx); !errors.Is(err, context.DeadlineExceeded) || time.Since(began) != 10*time.Millisecond {
			t.Errorf("with a 10ms ctx: %v after %v; want ctx's error after 10ms", err, time.Since(began))
		}
		began = time.Now()
		if _, err := topic.PublishValueAsync(ctx, "4").Wait(ctx); !errors.Is(err, pubsub.ErrBackpressure) || !strings.Contains(err.Error(), "MaxInFlight") ||
			time.Since(began) != time.Second {
			t.Errorf("without a deadline: %v after %v; want ErrBackpressure naming MaxInFlight after BlockTimeout", err, time.Since(began))
		}
		// A slot frees when a record resolves: the waiter goes on.
		fifth := make(chan *pubsub.Pending)
		go func() { fifth <- topic.PublishValueAsync(ctx, "5") }()
		synctest.Wait()
		close(hold)
		pd := <-fifth
		if pos, err := pd.Wait(ctx); err != nil || pos.Offset != 2 {
			t.Errorf("the record admitted once a slot freed: %v, %v; want offset 2", pos, err)
		}
		if pos, _ := first.Wait(ctx); pos.Offset != 0 {
			t.Errorf("first record at %v, want offset 0", pos)
		}
	})
}

// Close wakes a PublishAsync waiting at the in-flight bound with ErrClosed,
// and waits for the records in flight to be stored before the engine
// closes: none of them is refused.
func TestCloseWaitsForRecordsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		b := pubsub.NewBroker(pubsub.WithEngine(&asyncfake.Driver{Hold: hold}))
		topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.String(), pubsub.WithMaxInFlight(2))
		if err != nil {
			t.Fatal(err)
		}
		rec := pubsubtest.NewRecorder[string]()
		if _, err := topic.Subscribe("g", "c", rec); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		a, c := topic.PublishValueAsync(ctx, "a"), topic.PublishValueAsync(ctx, "c")
		waiting := make(chan *pubsub.Pending)
		go func() { waiting <- topic.PublishValueAsync(ctx, "waits") }()
		closed := make(chan error)
		go func() { closed <- b.Close(ctx) }()
		synctest.Wait()
		if _, err := (<-waiting).Wait(ctx); !errors.Is(err, pubsub.ErrClosed) {
			t.Errorf("the PublishAsync waiting for a slot: %v, want ErrClosed", err)
		}
		if got := b.State(); got != pubsub.Draining {
			t.Errorf("State while Close waits for records in flight: %v, want Draining", got)
		}
		if _, err := topic.Publish(ctx, "k", "late"); !errors.Is(err, pubsub.ErrClosed) {
			t.Errorf("Publish while Close waits: %v, want ErrClosed", err)
		}
		select {
		case err := <-closed:
			t.Fatalf("Close returned %v with records in flight", err)
		default:
		}
		close(hold)
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		for name, pd := range map[string]*pubsub.Pending{"a": a, "c": c} {
			if _, err := pd.Wait(ctx); err != nil {
				t.Errorf("record %s: %v, want stored", name, err)
			}
		}
		if got := rec.Values(); !slices.Equal(got, []string{"a", "c"}) {
			t.Errorf("delivered %q, want [a c]: Close drained what was in flight", got)
		}
	})
}

// Drain waits for the records in flight before it waits for the groups,
// so a record PublishAsync returned before Drain was called is delivered
// when Drain returns.
func TestDrainWaitsForRecordsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		b := asyncBroker(t, &asyncfake.Driver{Hold: hold})
		topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.String())
		if err != nil {
			t.Fatal(err)
		}
		rec := pubsubtest.NewRecorder[string]()
		if _, err := topic.Subscribe("g", "c", rec); err != nil {
			t.Fatal(err)
		}
		topic.PublishValueAsync(context.Background(), "a")
		drained := make(chan error)
		go func() { drained <- b.Drain(context.Background()) }()
		synctest.Wait()
		select {
		case err := <-drained:
			t.Fatalf("Drain returned %v with a record in flight", err)
		default:
		}
		close(hold)
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		if got := rec.Values(); !slices.Equal(got, []string{"a"}) {
			t.Errorf("delivered %q when Drain returned, want [a]", got)
		}
	})
}

// When a record fails, the records of its partition behind it that were
// in flight fail with ErrAborted and its cause; the first carries its own
// cause; Flush counts them all and wraps the first; a record issued after
// the failure resolved is tried afresh; HookPublished sees every record
// resolve, before its Pending does.
func TestPublishAsyncAbortsTheRecordsBehindAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		errBoom := errors.New("boom")
		d := &asyncfake.Driver{Hold: hold, Fail: func(_ int, rec *engine.Record) error {
			if string(rec.Value) == "fails" {
				return errBoom
			}
			return nil
		}}
		hooks := &publishedLog{}
		b := asyncBroker(t, d, pubsub.WithHooks(hooks))
		topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.String())
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var pds []*pubsub.Pending
		for _, v := range []string{"ok", "fails", "behind1", "behind2"} {
			pds = append(pds, topic.PublishValueAsync(ctx, v))
		}
		close(hold)
		err = topic.Flush(ctx)
		if !errors.Is(err, errBoom) || errors.Is(err, pubsub.ErrAborted) || !strings.Contains(err.Error(), "3 records failed") {
			t.Errorf("Flush: %v; want 3 records failed, wrapping the first's cause and not ErrAborted", err)
		}
		if pos, err := pds[0].Wait(ctx); err != nil || pos.Offset != 0 {
			t.Errorf("the record before: %v, %v; want stored at 0", pos, err)
		}
		if _, err := pds[1].Wait(ctx); !errors.Is(err, errBoom) || errors.Is(err, pubsub.ErrAborted) {
			t.Errorf("the record that failed: %v; want its own cause, not ErrAborted", err)
		}
		for i, pd := range pds[2:] {
			if _, err := pd.Wait(ctx); !errors.Is(err, pubsub.ErrAborted) || !errors.Is(err, errBoom) {
				t.Errorf("record %d behind it: %v; want ErrAborted wrapping the cause", i+2, err)
			}
		}
		after := topic.PublishValueAsync(ctx, "afresh")
		if pos, err := after.Wait(ctx); err != nil || pos.Offset != 1 {
			t.Errorf("a record issued after the failure resolved: %v, %v; want stored at 1", pos, err)
		}
		want := []string{"0@0 <nil>", "-1@-1 boom", "-1@-1 aborted", "-1@-1 aborted", "0@1 <nil>"}
		if got := hooks.all(); !slices.Equal(got, want) {
			t.Errorf("HookPublished saw %q, want %q", got, want)
		}
	})
}

// publishedLog is a HookPublished that writes each outcome down.
type publishedLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *publishedLog) OnPublished(_ context.Context, _ *pubsub.PublishInfo, pos pubsub.Position, err error) {
	what := "<nil>"
	switch {
	case errors.Is(err, pubsub.ErrAborted):
		what = "aborted"
	case err != nil:
		what = "boom"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf("%d@%d %s", pos.Partition, pos.Offset, what))
}

func (l *publishedLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

// Flush counts only the failures of records issued before it was called,
// and each failure once.
func TestFlushCountsOnlyWhatCameBefore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.String())
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		//lint:ignore SA1012 a nil context is a failure that is easy to make
		topic.PublishValueAsync(nil, "x")
		if err := topic.Flush(ctx); err == nil || !strings.Contains(err.Error(), "1 record failed") {
			t.Errorf("first Flush: %v; want 1 record failed", err)
		}
		topic.PublishValueAsync(ctx, "fine")
		if err := topic.Flush(ctx); err != nil {
			t.Errorf("second Flush: %v; want nil, its records were stored", err)
		}
		//lint:ignore SA1012 as above
		topic.PublishValueAsync(nil, "y")
		//lint:ignore SA1012 as above
		topic.PublishValueAsync(nil, "z")
		if err := topic.Flush(ctx); err == nil || !strings.Contains(err.Error(), "2 records failed") {
			t.Errorf("third Flush: %v; want 2 records failed", err)
		}
	})
}

// Wait's ctx bounds only the wait: a record whose Wait gave up is stored
// all the same.
func TestWaitContextDoesNotChangeTheOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		b := asyncBroker(t, &asyncfake.Driver{Hold: hold})
		topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.String())
		if err != nil {
			t.Fatal(err)
		}
		pd := topic.PublishValueAsync(context.Background(), "v")
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := pd.Wait(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("Wait with a cancelled ctx: %v, want ctx's error", err)
		}
		close(hold)
		if pos, err := pd.Wait(context.Background()); err != nil || pos.Offset != 0 {
			t.Errorf("Wait again: %v, %v; want stored at 0", pos, err)
		}
	})
}

// A failed Pending's error lives as long as the Pending: once nobody holds
// it, the garbage collector's cleanup drops the error too.
func TestAFailedPendingsErrorGoesWithIt(t *testing.T) {
	b := pubsubtest.NewBroker(t)
	topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	before := pubsub.FailuresKept()
	kept := topic.PublishValueAsync(nil, "kept") //lint:ignore SA1012 a nil context is a failure that is easy to make
	for range 100 {
		topic.PublishValueAsync(nil, "dropped") //lint:ignore SA1012 as above
	}
	// Cleanups run on a goroutine of the runtime's after a collection; no
	// call waits for them, so collect until they ran, a bounded number of
	// times.
	for range 100 {
		runtime.GC()
		if pubsub.FailuresKept() <= before+1 {
			break
		}
		runtime.Gosched()
	}
	if got := pubsub.FailuresKept() - before; got > 1 {
		t.Errorf("%d errors kept more than before, want at most 1: the kept Pending's", got)
	}
	if _, err := kept.Wait(context.Background()); !errors.Is(err, pubsub.ErrInvalid) {
		t.Errorf("the kept Pending: %v, want its error", err)
	}
	if err := topic.Flush(context.Background()); err == nil || !strings.Contains(err.Error(), "101 records failed") {
		t.Errorf("Flush: %v; want 101 records failed", err)
	}
}
