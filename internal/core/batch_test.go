package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/engine"
)

// batchLog is a BatchHandler that keeps the values of every batch it is
// given, in order, and fails a batch when fail says so.
type batchLog struct {
	mu      sync.Mutex
	batches [][]string
	fail    func(b *Batch) error // nil acks every batch
}

func (l *batchLog) handle(_ context.Context, b *Batch) error {
	vals := make([]string, len(b.Records))
	for i, rec := range b.Records {
		vals[i] = string(rec.Value)
	}
	l.mu.Lock()
	l.batches = append(l.batches, vals)
	l.mu.Unlock()
	if l.fail != nil {
		return l.fail(b)
	}
	return nil
}

// got returns the batches so far, printed as [[a b] [c]].
func (l *batchLog) got() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.batches)
}

func subscribeBatch(t *testing.T, b *Broker, topic, group, consumer string, h BatchHandler, cfg GroupSpec, spec BatchSpec) *Group {
	t.Helper()
	g, err := b.SubscribeBatch(topic, group, consumer, h, nil, cfg, spec)
	if err != nil {
		t.Fatalf("SubscribeBatch(%q, %q, %q): %v", topic, group, consumer, err)
	}
	return g
}

// Only a record that failed is delivered alone. A batch that begins at
// offset 1 (as any other) holds everything the read found, however the
// group came to start there: after a batch of one, at a start offset, after
// a Seek, or after a per-record consumer handed the partition over.
func TestABatchStartingAtOffsetOneIsWhole(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		want string
		run  func(t *testing.T, b *Broker, topic *Topic, log *batchLog)
	}{
		{"after a batch of one record", "[[0] [1 2 3]]", func(t *testing.T, b *Broker, topic *Topic, log *batchLog) {
			publish(t, topic, "", "0")
			g := subscribeBatch(t, b, "t", "g", "c1", log.handle, GroupSpec{}, BatchSpec{})
			drain(t, b)
			mustPause(t, g)
			for _, v := range []string{"1", "2", "3"} {
				publish(t, topic, "", v)
			}
			if err := g.Resume(ctx); err != nil {
				t.Fatal(err)
			}
		}},
		{"starting at offset 1", "[[1 2 3]]", func(t *testing.T, b *Broker, topic *Topic, log *batchLog) {
			for _, v := range []string{"0", "1", "2", "3"} {
				publish(t, topic, "", v)
			}
			subscribeBatch(t, b, "t", "g", "c1", log.handle, GroupSpec{Start: Start{Kind: StartOffset, Offset: 1}}, BatchSpec{})
		}},
		{"after a Seek to offset 1", "[[0 1 2 3] [1 2 3]]", func(t *testing.T, b *Broker, topic *Topic, log *batchLog) {
			for _, v := range []string{"0", "1", "2", "3"} {
				publish(t, topic, "", v)
			}
			g := subscribeBatch(t, b, "t", "g", "c1", log.handle, GroupSpec{}, BatchSpec{})
			drain(t, b)
			if err := g.Seek(ctx, 0, 1); err != nil {
				t.Fatal(err)
			}
		}},
		{"after a per-record consumer acked offset 0 and left", "[[1 2 3]]", func(t *testing.T, b *Broker, topic *Topic, log *batchLog) {
			publish(t, topic, "", "0")
			g := subscribe(t, b, "t", "g", "solo", func(context.Context, *Delivery) error { return nil })
			drain(t, b)
			if err := g.Leave(ctx, "solo"); err != nil {
				t.Fatal(err)
			}
			for _, v := range []string{"1", "2", "3"} {
				publish(t, topic, "", v)
			}
			subscribeBatch(t, b, "t", "g", "batcher", log.handle, GroupSpec{}, BatchSpec{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t, Config{})
				topic := mustTopic(t, b, "t", TopicSpec{})
				var log batchLog
				tc.run(t, b, topic, &log)
				drain(t, b)
				if got := log.got(); got != tc.want {
					t.Errorf("batches %s, want %s", got, tc.want)
				}
			})
		})
	}
}

// A batch is delivered as soon as it holds MaxSize records, whether the
// first read found them all or waiting for more filled it; only a batch
// with room left waits, for MaxWait exactly.
func TestABatchGoesWhenFullAndOtherwiseAfterMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{})
		start := time.Now()
		var mu sync.Mutex
		var at []time.Duration
		log := batchLog{fail: func(*Batch) error {
			mu.Lock()
			defer mu.Unlock()
			at = append(at, time.Since(start))
			return nil
		}}
		publish(t, topic, "", "0")
		publish(t, topic, "", "1")
		subscribeBatch(t, b, "t", "g", "c1", log.handle, GroupSpec{}, BatchSpec{MaxSize: 2, MaxWait: time.Minute})
		drain(t, b) // the first read is full
		publish(t, topic, "", "2")
		synctest.Wait() // the worker holds 2 and waits for more
		publish(t, topic, "", "3")
		drain(t, b) // the wait filled it
		publish(t, topic, "", "4")
		drain(t, b) // nothing more came
		if got, want := log.got(), "[[0 1] [2 3] [4]]"; got != want {
			t.Errorf("batches %s, want %s", got, want)
		}
		mu.Lock()
		defer mu.Unlock()
		if want := []time.Duration{0, 0, time.Minute}; !slices.Equal(at, want) {
			t.Errorf("batches delivered at %v, want %v: the full ones at once, the one of 1 after MaxWait", at, want)
		}
	})
}

// A batch consumer on a DropOldest topic delivers what is retained and
// skips (and counts) what was evicted before its attempt: here the first
// record of a batch, evicted while it waited out a retry backoff.
func TestBatchConsumerSkipsRecordsEvictedDuringItsBackoff(t *testing.T) {
	for _, tc := range []struct {
		later       []string // published during the backoff
		want        string
		skipped, ok int64
	}{
		{[]string{"3", "4"}, "[[0 1 2] [2 3 4]]", 2, 3}, // evicts 0 and 1
		{[]string{"3"}, "[[0 1 2] [1 2 3]]", 1, 3},      // evicts 0: the rest is one batch, not a retry of 1
	} {
		t.Run(fmt.Sprint(tc.later), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t, Config{Retry: RetryPolicy{MaxAttempts: 3, BaseDelay: time.Minute}})
				topic := mustTopic(t, b, "t", TopicSpec{Retention: Retention{MaxMessages: 3, OnFull: DropOldest}})
				log := batchLog{fail: func(b *Batch) error {
					if string(b.Records[0].Value) == "0" {
						return errors.New("transient")
					}
					return nil
				}}
				for _, v := range []string{"0", "1", "2"} {
					publish(t, topic, "", v)
				}
				g := subscribeBatch(t, b, "t", "g", "c1", log.handle, GroupSpec{}, BatchSpec{})
				synctest.Wait() // the batch failed once at 0, which waits out a minute
				for _, v := range tc.later {
					publish(t, topic, "", v)
				}
				drain(t, b)
				if got := log.got(); got != tc.want {
					t.Errorf("batches %s, want %s", got, tc.want)
				}
				if s := g.Stats(); s.Skipped != tc.skipped || s.Delivered != tc.ok || s.Retried != 1 {
					t.Errorf("stats %+v, want %d skipped, %d delivered, 1 retried", s, tc.skipped, tc.ok)
				}
			})
		})
	}
}

// skipHold is an Observer that holds the worker inside its report of a
// skip until resume is closed, telling skipping when it got there.
type skipHold struct {
	skipping chan struct{}
	resume   chan struct{}
}

func (h *skipHold) Observe(e *Event) {
	if e.Kind == engine.EventSkip {
		close(h.skipping)
		<-h.resume
	}
}

// A record that DropOldest evicts while it waits out a backoff leaves no
// retry behind: when the per-record consumer leaves right after skipping
// it, the batch consumer that takes the partition over gets the next
// records as one batch, none of them taken for a retry. (The consumer is
// held in the observer's report of the skip while Leave asks it to stop.)
func TestARecordEvictedDuringItsBackoffLeavesNoRetryForTheNextConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := &skipHold{skipping: make(chan struct{}), resume: make(chan struct{})}
		b := newBroker(t, Config{Observer: hold, Retry: RetryPolicy{MaxAttempts: 3, BaseDelay: time.Minute}})
		topic := mustTopic(t, b, "t", TopicSpec{Retention: Retention{MaxMessages: 2, OnFull: DropOldest}})
		g := subscribe(t, b, "t", "g", "solo", func(_ context.Context, d *Delivery) error {
			if string(d.Record.Value) == "0" {
				return errors.New("transient")
			}
			return nil
		})
		publish(t, topic, "", "0")
		publish(t, topic, "", "1")
		synctest.Wait()            // 0 failed once and waits out a minute
		publish(t, topic, "", "2") // evicts 0
		<-hold.skipping            // a minute later: 0 evicted, the skip to 1 being reported
		left := make(chan error, 1)
		go func() { left <- g.Leave(context.Background(), "solo") }()
		synctest.Wait() // Leave asked solo's worker to stop and waits for it
		close(hold.resume)
		if err := <-left; err != nil {
			t.Fatalf("Leave: %v", err)
		}
		var log batchLog
		subscribeBatch(t, b, "t", "g", "batcher", log.handle, GroupSpec{}, BatchSpec{})
		drain(t, b)
		if got, want := log.got(), "[[1 2]]"; got != want {
			t.Errorf("batches %s, want %s", got, want)
		}
	})
}

// With MaxWait 0 a batch is what one read found: records appended after
// that read wait for the next batch, even when they arrive before the
// handler is called. (The clock, which a read of a MaxAge topic consults,
// holds the worker at its next read while the test appends.)
func TestWithoutMaxWaitABatchIsOneRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := &trapClock{trapped: make(chan struct{}), release: make(chan struct{})}
		b := newBroker(t, Config{Clock: clock})
		topic := mustTopic(t, b, "t", TopicSpec{Retention: Retention{MaxAge: time.Hour}})
		var log batchLog
		g := subscribeBatch(t, b, "t", "g", "c1", log.handle, GroupSpec{}, BatchSpec{})
		mustPause(t, g)
		publish(t, topic, "", "0")
		clock.armAfter(1) // the first read passes; the next one is held
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		<-clock.trapped
		publish(t, topic, "", "1")
		close(clock.release)
		drain(t, b)
		if got, want := log.got(), "[[0] [1]]"; got != want {
			t.Errorf("batches %s, want %s", got, want)
		}
	})
}

// A batch given back before it reached its consumer (ErrNotDelivered)
// counts no attempt: the next worker delivers it as attempt 1 again.
func TestABatchGivenBackCountsNoAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{})
		var mu sync.Mutex
		var attempts []int
		g := subscribeBatch(t, b, "t", "g", "c1", func(_ context.Context, batch *Batch) error {
			mu.Lock()
			defer mu.Unlock()
			attempts = append(attempts, batch.Attempt)
			if len(attempts) == 1 {
				return ErrNotDelivered
			}
			return nil
		}, GroupSpec{}, BatchSpec{})
		publish(t, topic, "", "0")
		synctest.Wait() // given back; the worker stopped
		mustPause(t, g)
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		drain(t, b)
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(attempts) != "[1 1]" {
			t.Errorf("attempts %v, want [1 1]: the give-back was no attempt", attempts)
		}
	})
}

// A batch consumer's slots grow with what it reads, not with MaxSize
// (they were all allocated when its worker started): each batch is still
// everything one read found, up to MaxSize, whether the slots had to grow
// for it from nothing, from a smaller batch, or while MaxWait topped a
// batch up.
func TestBatchSlotsGrowWithWhatIsRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{})
		var sizes []int
		var mu sync.Mutex
		log := batchLog{fail: func(b *Batch) error {
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, len(b.Records))
			return nil
		}}
		for i := range 300 {
			publish(t, topic, "", fmt.Sprint(i))
		}
		g := subscribeBatch(t, b, "t", "g", "c1", log.handle, GroupSpec{}, BatchSpec{MaxSize: 256, MaxWait: time.Minute})
		drain(t, b) // 256 at once, then 44 and a minute's wait for more
		mustPause(t, g)
		for i := range 3 {
			publish(t, topic, "", fmt.Sprint("late", i))
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the worker read the 3 and waits for more
		for i := range 300 {
			publish(t, topic, "", fmt.Sprint("more", i))
		}
		drain(t, b) // the wait fills the batch to 256, then 47 more
		mu.Lock()
		defer mu.Unlock()
		if want := []int{256, 44, 256, 47}; !slices.Equal(sizes, want) {
			t.Errorf("batch sizes %v, want %v", sizes, want)
		}
		if got := log.got(); !strings.HasPrefix(got, "[[0 1 2 ") {
			t.Errorf("batches %.40s..., want them in offset order", got)
		}
	})
}
