package pubsubtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// A busy run of the in-memory engine: two groups, consumers joining and
// leaving while records flow, retries, a permanent failure, exhausted
// retries and a seek. Its history must pass, with its redeliveries
// explained by attempt and by the seek, and none by a change of owner (a
// rebalance redelivers nothing).
func TestHistoryOfTheInMemoryEnginePasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const partitions, keys, perRound = 4, 12, 48
		b := pubsubtest.NewBroker(t, pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond, Multiplier: 2}))
		topic := mustTopic(t, b, "orders", pubsub.WithPartitions(partitions))
		h := pubsubtest.NewHistory()
		fail := func(ctx context.Context, msg pubsub.Message[string]) error {
			switch {
			case strings.HasPrefix(msg.Value, "flaky") && msg.Attempt < 2:
				return errors.New("busy")
			case strings.HasPrefix(msg.Value, "bad"):
				return fmt.Errorf("no such customer: %w", pubsub.ErrPermanent)
			case strings.HasPrefix(msg.Value, "poison"):
				return errors.New("always")
			}
			return nil
		}
		handler := pubsub.HandlerFunc[string](fail)
		subscribe := func(group, consumer string) *pubsub.Group[string] {
			g, err := topic.Subscribe(group, consumer, pubsubtest.Observe(h, "orders", group, consumer, handler))
			if err != nil {
				t.Fatalf("Subscribe(%s, %s): %v", group, consumer, err)
			}
			return g
		}
		publishRound := func(round int) {
			for i := range perRound {
				value := fmt.Sprintf("v%d-%d", round, i)
				switch i {
				case 5:
					value = "flaky" + value
				case 17:
					value = "bad" + value
				case 29:
					value = "poison" + value
				}
				h.Published("orders", mustPublish(t, topic, fmt.Sprintf("k%d", i%keys), value))
			}
		}

		billing := subscribe("billing", "billing-1")
		audit := subscribe("audit", "audit-1")
		publishRound(0)
		subscribe("billing", "billing-2")
		publishRound(1)
		subscribe("billing", "billing-3")
		publishRound(2)
		if err := billing.Leave(t.Context(), "billing-1"); err != nil {
			t.Fatal(err)
		}
		publishRound(3)
		pubsubtest.Drain(t, b)
		if err := audit.Seek(t.Context(), 2, 3); err != nil {
			t.Fatal(err)
		}
		h.Repositioned("audit", "orders", 2)
		pubsubtest.Drain(t, b)
		pubsubtest.NoteDeadLetters(h, billing)
		pubsubtest.NoteDeadLetters(h, audit)

		rep := h.Check()
		if err := rep.Err(); err != nil {
			t.Fatal(err)
		}
		if rep.Published != 4*perRound {
			t.Errorf("Published = %d, want %d", rep.Published, 4*perRound)
		}
		if rep.Redeliveries["attempt"] == 0 || rep.Redeliveries["reposition"] == 0 {
			t.Errorf("redeliveries %v: want some by attempt and some by reposition", rep.Redeliveries)
		}
		if rep.Redeliveries["owner"] != 0 {
			t.Errorf("redeliveries %v: a rebalance redelivered", rep.Redeliveries)
		}
	})
}

// script drives an observed handler by hand, so a test can build a history
// that no correct engine would produce.
type script struct {
	t *testing.T
	h *pubsubtest.History
}

// deliver calls consumer's observed handler of group for (partition,
// offset) at attempt, which returns err.
func (s script) deliver(group, consumer string, partition int, offset int64, key string, attempt int, err error) {
	s.t.Helper()
	handler := pubsubtest.Observe(s.h, "t", group, consumer, pubsub.HandlerFunc[string](
		func(context.Context, pubsub.Message[string]) error { return err }))
	m := pubsub.Message[string]{Topic: "t", Partition: partition, Offset: offset, Attempt: attempt}
	if key != "" {
		m.Key = []byte(key)
	}
	if got := handler.Handle(context.Background(), m); got != err {
		s.t.Fatalf("the observed handler returned %v, want %v", got, err)
	}
}

// hold starts a delivery that stays in flight until the returned function
// is called (or the test ends); it returns once the delivery started.
func (s script) hold(group, consumer string, partition int, offset int64, attempt int) (release func(error)) {
	results := make(chan error)
	started := make(chan struct{})
	handler := pubsubtest.Observe(s.h, "t", group, consumer, pubsub.HandlerFunc[string](
		func(context.Context, pubsub.Message[string]) error {
			close(started)
			return <-results
		}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		handler.Handle(context.Background(), pubsub.Message[string]{Topic: "t", Partition: partition, Offset: offset, Attempt: attempt})
	}()
	<-started
	var once sync.Once
	release = func(err error) { once.Do(func() { results <- err; <-done }) }
	s.t.Cleanup(func() { release(nil) }) // a delivery the test left in flight
	return release
}

func (s script) publish(partition int, offsets ...int64) {
	for _, o := range offsets {
		s.h.Published("t", pubsub.Position{Partition: partition, Offset: o})
	}
}

var errBusy = errors.New("busy")

// Hand-built histories, each breaking one guarantee (or not): Check must
// name the violation, and only it.
func TestHistoryCheck(t *testing.T) {
	cases := []struct {
		name  string
		build func(s script)
		want  string // a substring of the only violation; "" for none
	}{
		{"a clean run passes", func(s script) {
			s.publish(0, 0, 1)
			s.deliver("g", "c1", 0, 0, "a", 1, nil)
			s.deliver("g", "c1", 0, 1, "a", 1, nil)
		}, ""},
		{"a record a group never completed", func(s script) {
			s.publish(0, 0, 1)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
		}, "group g never completed t/0@1"},
		{"a record that failed and never came again", func(s script) {
			s.publish(0, 0)
			s.deliver("g", "c1", 0, 0, "", 1, errBusy)
		}, "group g never completed t/0@0"},
		{"a group that saw nothing still owes everything", func(s script) {
			pubsubtest.Observe(s.h, "t", "idle", "idle-1", pubsub.HandlerFunc[string](nil))
			s.publish(0, 0)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
		}, "group idle never completed t/0@0"},
		{"a delivery of a record never published", func(s script) {
			s.publish(0, 0)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
			s.deliver("g", "c1", 0, 1, "", 1, nil)
		}, "t/0@1, which was not published"},
		{"skipping ahead of a failed record", func(s script) {
			s.publish(0, 0, 1)
			s.deliver("g", "c1", 0, 0, "", 1, errBusy)
			s.deliver("g", "c1", 0, 1, "", 1, nil)
			s.deliver("g", "c1", 0, 0, "", 2, nil)
		}, "skips ahead of offset 0"},
		{"moving past a dead letter passes", func(s script) {
			s.publish(0, 0, 1)
			s.deliver("g", "c1", 0, 0, "", 1, errBusy)
			s.deliver("g", "c1", 0, 0, "", 2, errBusy)
			s.h.DeadLettered("g", "t", 0, 0)
			s.deliver("g", "c1", 0, 1, "", 1, nil)
		}, ""},
		{"a permanent error dead-letters", func(s script) {
			s.publish(0, 0, 1)
			s.deliver("g", "c1", 0, 0, "", 1, fmt.Errorf("bad: %w", pubsub.ErrPermanent))
			s.deliver("g", "c1", 0, 1, "", 1, nil)
		}, ""},
		{"a redelivery with the same attempt", func(s script) {
			s.publish(0, 0)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
		}, "redelivery not explained"},
		{"a redelivery after a seek", func(s script) {
			s.publish(0, 0, 1)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
			s.deliver("g", "c1", 0, 1, "", 1, nil)
			s.h.Repositioned("g", "t", 0)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
			s.deliver("g", "c1", 0, 1, "", 1, nil)
		}, ""},
		{"a seek of another partition explains nothing", func(s script) {
			s.publish(0, 0)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
			s.h.Repositioned("g", "t", 1)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
		}, "redelivery not explained"},
		{"a redelivery by the partition's new owner", func(s script) {
			s.publish(0, 0)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
			s.deliver("g", "c2", 0, 0, "", 1, nil)
		}, ""},
		{"a redelivery restarting from an older offset", func(s script) {
			s.publish(0, 0, 1, 2)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
			s.deliver("g", "c1", 0, 1, "", 1, nil)
			s.deliver("g", "c1", 0, 0, "", 2, nil)
			s.deliver("g", "c1", 0, 1, "", 2, nil)
			s.deliver("g", "c1", 0, 2, "", 1, nil)
		}, ""},
		{"two consumers with the same partition in flight", func(s script) {
			s.publish(0, 0)
			release := s.hold("g", "c1", 0, 0, 1)
			s.deliver("g", "c2", 0, 0, "", 2, nil)
			release(nil)
		}, "partition already in flight"},
		{"two groups with the same partition in flight", func(s script) {
			s.publish(0, 0)
			release := s.hold("g1", "c1", 0, 0, 1)
			s.deliver("g2", "c2", 0, 0, "", 1, nil)
			release(nil)
		}, ""},
		{"a takeover after a crash", func(s script) {
			s.publish(0, 0, 1)
			release := s.hold("g", "c1", 0, 0, 1)
			s.h.Crashed("c1")
			s.deliver("g", "c2", 0, 0, "", 2, nil)
			release(nil) // late: its ack cannot count
			s.deliver("g", "c2", 0, 1, "", 1, nil)
		}, ""},
		{"a crashed consumer's late start holds nothing and completes nothing", func(s script) {
			s.publish(0, 0, 1)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
			s.h.Crashed("c1")
			release := s.hold("g", "c1", 0, 1, 1)
			s.deliver("g", "c2", 0, 1, "", 2, nil)
			release(nil)
		}, ""},
		{"a crashed consumer's late start alone completes nothing", func(s script) {
			s.publish(0, 0)
			s.h.Crashed("c1")
			s.deliver("g", "c1", 0, 0, "", 1, nil)
		}, "group g never completed t/0@0"},
		{"a crashed consumer's late success completes nothing", func(s script) {
			s.publish(0, 0)
			release := s.hold("g", "c1", 0, 0, 1)
			s.h.Crashed("c1")
			release(nil)
		}, "group g never completed t/0@0"},
		{"a delivery still in flight", func(s script) {
			s.publish(0, 0)
			s.deliver("g", "c1", 0, 0, "", 1, nil)
			s.hold("g", "c1", 0, 0, 2)
		}, "still in flight"},
		{"one key in two partitions", func(s script) {
			s.publish(0, 0)
			s.publish(1, 0)
			s.deliver("g", "c1", 0, 0, "alice", 1, nil)
			s.deliver("g", "c1", 1, 0, "alice", 1, nil)
		}, `key "alice" delivered from partitions 0 and 1`},
		{"attempt zero", func(s script) {
			s.publish(0, 0)
			s.deliver("g", "c1", 0, 0, "", 0, nil)
		}, "attempt below 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := pubsubtest.NewHistory()
			tc.build(script{t, h})
			rep := h.Check()
			switch {
			case tc.want == "" && len(rep.Violations) != 0:
				t.Fatalf("violations of a valid history: %v", rep.Err())
			case tc.want != "" && (len(rep.Violations) != 1 || !strings.Contains(rep.Violations[0], tc.want)):
				t.Fatalf("violations %q, want one containing %q", rep.Violations, tc.want)
			case tc.want != "" && rep.Err() == nil:
				t.Fatal("Err() = nil with a violation")
			}
		})
	}
}

// A panicking handler is logged as ended with a *pubsub.PanicError, and
// the panic goes on to the broker.
func TestObserveLogsAPanic(t *testing.T) {
	h := pubsubtest.NewHistory()
	handler := pubsubtest.Observe(h, "t", "g", "c1", pubsub.HandlerFunc[string](
		func(context.Context, pubsub.Message[string]) error { panic("boom") }))
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want boom", v)
			}
		}()
		handler.Handle(context.Background(), pubsub.Message[string]{Topic: "t", Attempt: 1})
	}()
	events := h.Events()
	if len(events) != 2 || events[1].Kind != pubsubtest.End {
		t.Fatalf("events %v, want a start and an end", events)
	}
	if _, ok := errors.AsType[*pubsub.PanicError](events[1].Err); !ok {
		t.Errorf("end's error %v, want a *pubsub.PanicError", events[1].Err)
	}
}
