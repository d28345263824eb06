package pubsub_test

// Edges that hold for hostile or unlucky callers (issue 22): every error
// wraps a sentinel, nothing loops, hangs or grows without bound.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// Close's drain waits for a group whose only consumer then leaves (by
// Leave, or by closing its Stream) with a record still to deliver: the
// group stalls during the drain, which skips it, and Close leaves the
// record behind while its ctx is still alive. Its ShutdownError must say
// why, wrapping ErrStalled; it wrapped nothing, because Close looked for
// stalled groups only before the drain.
func TestCloseSaysStalledWhenTheLastConsumerLeavesDuringTheDrain(t *testing.T) {
	// Leave waits for the delivery in flight, which commits; a closed
	// Stream gives back the one it held, which commits nothing.
	for how, committed := range map[string]int64{"Leave": 1, "Stream.Close": 0} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, topic := newTopic(t, "orders")
				release := make(chan struct{})
				var leave func() error
				switch how {
				case "Leave":
					rec := recorder[string]{fail: func(context.Context, pubsub.Message[string]) error {
						<-release // "1" is in flight while Close drains
						return nil
					}}
					g := mustSubscribe(t, topic, "billing", "b1", &rec)
					leave = func() error { return g.Leave(context.Background(), "b1") }
				case "Stream.Close":
					s := mustStream(t, topic, "billing", "b1")
					go func() {
						d := <-s.C() // "1" is held while Close drains
						<-release
						d.Ack()
					}()
					leave = s.Close
				}
				mustPublishValue(t, topic, "1")
				mustPublishValue(t, topic, "2")
				synctest.Wait()
				closed := make(chan error, 1)
				go func() { closed <- b.Close(context.Background()) }()
				synctest.Wait() // Close drains, waiting for billing
				left := make(chan error, 1)
				go func() { left <- leave() }()
				synctest.Wait() // the consumer left; its delivery is still in flight
				close(release)
				if err := <-left; err != nil {
					t.Fatalf("%s: %v", how, err)
				}
				err := <-closed
				wantErrIs(t, "Close after the last consumer left mid-drain", err, pubsub.ErrStalled)
				se, ok := errors.AsType[*pubsub.ShutdownError](err)
				want := pubsub.Unfinished{Group: "billing", Topic: "orders", Partition: 0, Committed: committed, End: 2}
				if !ok || len(se.Unfinished) != 1 || se.Unfinished[0] != want {
					t.Fatalf("Close: got %v, want a ShutdownError leaving %+v", err, want)
				}
			})
		})
	}
}

// Seek and Replay refuse once Close began, not only once it finished: a
// drain that found a group caught up must not see its offset move back
// (Close would then leave records behind without a reason to give).
func TestSeekAndReplayWhileCloseDrainsFailWithErrClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		release := make(chan struct{})
		rec := recorder[string]{fail: func(_ context.Context, m pubsub.Message[string]) error {
			if m.Value == "2" {
				<-release // keeps Close draining
			}
			return nil
		}}
		g := mustSubscribe(t, topic, "billing", "b1", &rec)
		mustPublishValue(t, topic, "1")
		mustPublishValue(t, topic, "2")
		synctest.Wait()
		closed := make(chan error, 1)
		go func() { closed <- b.Close(context.Background()) }()
		synctest.Wait() // Close drains, waiting for "2"
		wantErrIs(t, "Seek while Close drains", g.Seek(context.Background(), 0, 0), pubsub.ErrClosed)
		wantErrIs(t, "Replay while Close drains", g.Replay(context.Background(), pubsub.Earliest()), pubsub.ErrClosed)
		close(release)
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v, want nil: the group finished", err)
		}
		if got := rec.values(); len(got) != 2 {
			t.Errorf("delivered %q, want each record once", got)
		}
	})
}

// Drain after Close: a group Close left behind can never move again, so
// Drain says the broker is closed (it said the group was stalled); with
// nothing left behind it is nil, as a barrier should be.
func TestDrainAfterCloseSaysClosedForWhatWasLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		g := mustSubscribe(t, topic, "billing", "b1", nopHandler())
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustPublishValue(t, topic, "1")
		wantErrIs(t, "Close with a paused group", b.Close(context.Background()), pubsub.ErrStalled)
		err := b.Drain(context.Background())
		wantErrIs(t, "Drain after Close", err, pubsub.ErrClosed)
		if errors.Is(err, pubsub.ErrStalled) {
			t.Errorf("Drain after Close: %v, want ErrClosed alone", err)
		}

		clean := pubsubtest.NewBroker(t)
		mustTopic(t, clean, "orders", codec.String(), codec.String())
		if err := clean.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := clean.Drain(context.Background()); err != nil {
			t.Errorf("Drain after a Close that left nothing: %v, want nil", err)
		}
	})
}

// A nil option, which an option list built by code can hold, is
// ErrInvalid from the call that got it, never a panic; and so is an
// option given a zero that means nothing (a nil Clock, a batch of no
// messages). Nothing is created or published.
func TestNilAndMeaninglessOptionsAreErrInvalid(t *testing.T) {
	type fixture struct {
		b     *pubsub.Broker
		topic *pubsub.Topic[string, string]
	}
	batch := pubsub.BatchHandlerFunc[string](func(context.Context, []pubsub.Message[string]) error { return nil })
	tests := []struct {
		name string
		call func(f fixture) error
	}{
		{"NewBroker(nil)", func(fixture) error { return pubsub.NewBroker(nil).Err() }},
		{"NewTopic on NewBroker(nil)", func(fixture) error {
			_, err := pubsub.NewTopic(pubsub.NewBroker(pubsub.WithRetry(pubsub.RetryPolicy{}), nil), "t", codec.String(), codec.String())
			return err
		}},
		{"WithClock(nil)", func(fixture) error { return pubsub.NewBroker(pubsub.WithClock(nil)).Err() }},
		{"WithIDs(nil)", func(fixture) error { return pubsub.NewBroker(pubsub.WithIDs(nil)).Err() }},
		{"WithEngine(nil)", func(fixture) error { return pubsub.NewBroker(pubsub.WithEngine(nil)).Err() }},
		{"NewTopic(..., nil)", func(f fixture) error {
			_, err := pubsub.NewTopic(f.b, "more", codec.String(), codec.String(), pubsub.WithPartitions(2), nil)
			return err
		}},
		{"WithPartitioner(nil)", func(f fixture) error {
			_, err := pubsub.NewTopic(f.b, "more", codec.String(), codec.String(), pubsub.WithPartitioner(nil))
			return err
		}},
		{"Subscribe(..., nil)", func(f fixture) error {
			_, err := f.topic.Subscribe("billing", "b1", nopHandler(), nil)
			return err
		}},
		{"Stream(..., nil)", func(f fixture) error {
			_, err := f.topic.Stream("billing", "b1", nil)
			return err
		}},
		{"SubscribeBatch(..., nil)", func(f fixture) error {
			_, err := f.topic.SubscribeBatch("billing", "b1", batch, pubsub.WithBatchSize(8), nil)
			return err
		}},
		{"WithBatchSize(0)", func(f fixture) error {
			_, err := f.topic.SubscribeBatch("billing", "b1", batch, pubsub.WithBatchSize(0))
			return err
		}},
		{"WithBatchSize(-1)", func(f fixture) error {
			_, err := f.topic.SubscribeBatch("billing", "b1", batch, pubsub.WithBatchSize(-1))
			return err
		}},
		{"WithDeadLetterLimit(-1)", func(f fixture) error {
			_, err := f.topic.Subscribe("billing", "b1", nopHandler(), pubsub.WithDeadLetterLimit(-1))
			return err
		}},
		{"Publish(..., nil)", func(f fixture) error {
			pos, err := f.topic.Publish(context.Background(), "k", "v", pubsub.WithHeaders(map[string]string{"a": "b"}), nil)
			if want := (pubsub.Position{Partition: -1, Offset: -1}); pos != want {
				t.Errorf("position of the failed publish: got %+v, want %+v", pos, want)
			}
			return err
		}},
		{"PublishValue(..., nil)", func(f fixture) error {
			_, err := f.topic.PublishValue(context.Background(), "v", nil)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, topic := newTopic(t, "orders")
				err := func() (err error) {
					defer func() {
						if v := recover(); v != nil {
							err = fmt.Errorf("panicked: %v", v)
						}
					}()
					return tt.call(fixture{b, topic})
				}()
				wantErrIs(t, tt.name, err, pubsub.ErrInvalid)
				if err != nil && !strings.HasPrefix(err.Error(), "logbus: ") {
					t.Errorf("%s: %q does not say it is logbus's", tt.name, err)
				}
				snap := b.Snapshot()
				if len(snap.Topics) != 1 || len(snap.Topics[0].Groups) != 0 || topic.Stats().Published != 0 {
					t.Errorf("after a failed %s: snapshot %+v, want the one topic, no group, nothing published", tt.name, snap)
				}
			})
		})
	}
}

// WithDeadLetterLimit(0) keeps no dead letters: a record given up on is
// still counted as dead-lettered and as evicted, and raises the hook, but
// DeadLetters stays empty. (0 used to mean the default, 1024.)
func TestDeadLetterLimitZeroKeepsNone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := &events{}
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(ev))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		fail := pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
			return fmt.Errorf("no: %w", pubsub.ErrPermanent)
		})
		g := mustSubscribe(t, topic, "billing", "b1", fail, pubsub.WithDeadLetterLimit(0))
		mustPublishValue(t, topic, "1")
		mustPublishValue(t, topic, "2")
		pubsubtest.Drain(t, b)
		if st := g.Stats(); st.DeadLettered != 2 || st.DeadLettersEvicted != 2 {
			t.Errorf("stats %+v, want 2 dead-lettered and 2 evicted", st)
		}
		if letters := g.DeadLetters(); len(letters) != 0 {
			t.Errorf("DeadLetters: %d kept, want none", len(letters))
		}
		if got := ev.with("dead letter"); len(got) != 2 || !strings.Contains(got[0], "evicted=true") {
			t.Errorf("dead-letter hooks: %q, want two, each evicted", got)
		}
		// A group that joins with another limit is told it differs.
		_, err := topic.Subscribe("billing", "b2", fail, pubsub.WithDeadLetterLimit(1024))
		wantErrIs(t, "joining with WithDeadLetterLimit(1024)", err, pubsub.ErrSubscription)
	})
}

// Headers count toward MaxBytes, as RetainedBytes shows: a partition
// bounded by bytes evicts (DropOldest), waits for room and gives up
// (Block), or refuses at once (a record that alone is too large) by the
// bytes of its headers too. Uncounted, a 64 KiB partition held 255 MiB of
// headers.
func TestHeadersCountTowardMaxBytes(t *testing.T) {
	trace := pubsub.WithHeaders(map[string]string{"trace": "0123456789"}) // 15 bytes
	// Each record is "k" + "v" + 15 bytes of headers: 17 bytes; two do
	// not fit in 20, where two without headers (4 bytes) would.
	t.Run("DropOldest evicts by header bytes", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, topic := newTopic(t, "t",
				pubsub.WithRetention(pubsub.Retention{MaxBytes: 20, OnFull: pubsub.DropOldest}))
			// A paused group reads nothing, so the first record is still
			// unread when the second needs its room: evicted, never
			// reclaimed after a commit (which a running group could make
			// first, or not).
			g := mustSubscribe(t, topic, "g", "c", nopHandler())
			if err := g.Pause(t.Context()); err != nil {
				t.Fatal(err)
			}
			mustPublish(t, topic, "k", "v", trace)
			if s := topic.Stats(); s.RetainedBytes != 17 {
				t.Errorf("after one record: RetainedBytes %d, want 17 (key 1 + value 1 + headers 15)", s.RetainedBytes)
			}
			mustPublish(t, topic, "k", "v", trace)
			if s := topic.Stats(); s.Retained != 1 || s.RetainedBytes != 17 || s.Dropped != 1 {
				t.Errorf("after two records: stats %+v, want 1 retained (17 bytes) and 1 dropped", s)
			}
			if err := g.Resume(t.Context()); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("Block waits for room by header bytes", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, topic := newTopic(t, "t",
				pubsub.WithRetention(pubsub.Retention{MaxBytes: 20, BlockTimeout: time.Second}))
			release := make(chan struct{})
			rec := recorder[string]{fail: func(context.Context, pubsub.Message[string]) error {
				<-release // the group commits nothing until the test lets go
				return nil
			}}
			mustSubscribe(t, topic, "g", "c", &rec)
			mustPublish(t, topic, "k", "v", trace)
			_, err := topic.Publish(context.Background(), "k", "v", trace)
			wantErrIs(t, "a second 17-byte record into MaxBytes 20", err, pubsub.ErrBackpressure)
			if err != nil && !strings.Contains(err.Error(), "full at 17 of 20 bytes (MaxBytes) with 17 more to store") {
				t.Errorf("the error %q does not count the headers", err)
			}
			close(release)
		})
	})
	t.Run("a record whose headers alone exceed MaxBytes is refused", func(t *testing.T) {
		_, topic := newTopic(t, "t",
			pubsub.WithRetention(pubsub.Retention{MaxBytes: 16}))
		pos, err := topic.Publish(context.Background(), "k", "v", trace)
		wantErrIs(t, "a 17-byte record into MaxBytes 16", err, pubsub.ErrInvalid)
		if want := "a record of 17 bytes (key 1 + value 1 + headers 15) can never fit in MaxBytes 16"; err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("got %q, want it to say %q", err, want)
		}
		if pos != (pubsub.Position{Partition: -1, Offset: -1}) || topic.Stats().Published != 0 {
			t.Errorf("position %+v, stats %+v: want nothing published", pos, topic.Stats())
		}
	})
}

// A batch consumer's memory follows what it reads: SubscribeBatch with
// WithBatchSize(4096) on 1,024 partitions allocated 4096 slots per
// partition at once (96 MiB here; 1.56 GiB on 16,384 partitions); now a
// partition's room grows with the batches it delivers. The bound allows
// each partition a few KiB for its worker and bookkeeping.
func TestBatchConsumerMemoryFollowsWhatItReads(t *testing.T) {
	const partitions = 1024
	_, topic := newTopic(t, "t", pubsub.WithPartitions(partitions))
	batch := pubsub.BatchHandlerFunc[string](func(context.Context, []pubsub.Message[string]) error { return nil })
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := topic.SubscribeBatch("g", "c", batch, pubsub.WithBatchSize(4096)); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	const bound = partitions * 4 << 10
	got := after.TotalAlloc - before.TotalAlloc
	t.Logf("SubscribeBatch allocated %d KiB (%d bytes a partition)", got>>10, got/partitions)
	if got > bound {
		t.Errorf("SubscribeBatch(WithBatchSize(4096)) on %d partitions allocated %d KiB, want at most %d KiB", partitions, got>>10, bound>>10)
	}
}

// traceKey stands for what tracing puts in a handler's context.
type traceKey struct{}

// A handler that publishes into the partition its own group keeps full
// would wait for itself: its record is committed only once it returns.
// When that is certain (the handler's ctx, its partition, its group holding
// the oldest record, no MaxAge) Publish fails at once with ErrBackpressure
// naming the group; it waited out the whole BlockTimeout. When it is not
// (another ctx, another group holding the oldest record, a MaxAge that can
// make room) it still waits BlockTimeout.
func TestAHandlerPublishingIntoItsOwnFullPartition(t *testing.T) {
	const timeout = time.Hour
	type result struct {
		err    error
		waited time.Duration
	}
	tests := []struct {
		name string
		ret  pubsub.Retention
		// ctxOf is the context the handler publishes with.
		ctxOf func(handler context.Context) context.Context
		// other, when set, is a second group that holds record 0 unread.
		other     bool
		batch     bool
		wantFast  bool
		wantGroup string
	}{
		{name: "with the handler's ctx", ctxOf: func(h context.Context) context.Context { return h }, wantFast: true, wantGroup: "billing"},
		{name: "with a ctx derived from the handler's", ctxOf: func(h context.Context) context.Context {
			return context.WithValue(context.WithValue(h, traceKey{}, "a span"), traceKey{}, "its child")
		}, wantFast: true, wantGroup: "billing"},
		{name: "from a batch handler", batch: true, ctxOf: func(h context.Context) context.Context { return h }, wantFast: true, wantGroup: "billing"},
		{name: "with a context of another origin", ctxOf: func(context.Context) context.Context { return context.Background() }, wantGroup: "billing"},
		{name: "while another group holds the oldest record", other: true, ctxOf: func(h context.Context) context.Context { return h }, wantGroup: "audit"},
		{name: "with a MaxAge that can make room", ret: pubsub.Retention{MaxAge: 100 * timeout},
			ctxOf: func(h context.Context) context.Context { return h }, wantGroup: "billing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := pubsubtest.NewBroker(t)
				ret := tt.ret
				ret.MaxMessages, ret.BlockTimeout = 2, timeout
				topic := mustTopic(t, b, "orders", codec.String(), codec.String(), pubsub.WithRetention(ret))
				// The partition is full with "0" and "1" before any group
				// reads it; the handler publishes while it handles
				// trigger, so that its group holds the oldest record ("0")
				// unless another group holds it too.
				if _, err := topic.PublishValues(context.Background(), []string{"0", "1"}); err != nil {
					t.Fatal(err)
				}
				trigger := "0"
				release := make(chan struct{})
				if tt.other {
					// audit holds "0" until the end; billing publishes
					// from the handler of "1", having committed "0".
					trigger = "1"
					mustSubscribe(t, topic, "audit", "a1", &recorder[string]{fail: func(context.Context, pubsub.Message[string]) error {
						<-release
						return nil
					}})
				}
				results := make(chan result, 1)
				publishFrom := func(ctx context.Context, value string) {
					if value != trigger {
						return
					}
					start := time.Now()
					_, err := topic.Publish(tt.ctxOf(ctx), "k", "from the handler")
					results <- result{err, time.Since(start)}
				}
				if tt.batch {
					_, err := topic.SubscribeBatch("billing", "b1", pubsub.BatchHandlerFunc[string](func(ctx context.Context, msgs []pubsub.Message[string]) error {
						for _, m := range msgs {
							publishFrom(ctx, m.Value)
						}
						return nil
					}))
					if err != nil {
						t.Fatal(err)
					}
				} else {
					mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(ctx context.Context, m pubsub.Message[string]) error {
						publishFrom(ctx, m.Value)
						return nil
					}))
				}
				r := <-results
				close(release)
				wantErrIs(t, "the handler's publish", r.err, pubsub.ErrBackpressure)
				if r.err != nil && !strings.Contains(r.err.Error(), fmt.Sprintf("group %q", tt.wantGroup)) {
					t.Errorf("the error %q does not name group %q", r.err, tt.wantGroup)
				}
				switch {
				case tt.wantFast && r.waited != 0:
					t.Errorf("the handler's publish failed after %v, want at once", r.waited)
				case !tt.wantFast && r.waited != timeout:
					t.Errorf("the publish failed after %v, want the BlockTimeout, %v", r.waited, timeout)
				}
				pubsubtest.Drain(t, b)
				if st := topic.Stats(); st.TimedOut != 1 || st.Published != 2 {
					t.Errorf("stats %+v, want 2 published and 1 timed out", st)
				}
			})
		})
	}
}
