package jetstream

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
)

// handled writes down who handled which record, with which attempt.
type handled struct {
	mu    sync.Mutex
	by    map[string][]string // value → "<consumer> attempt <n>", in order
	count map[string]int      // consumer → records handled
	first map[int]string      // partition → the first delivery to consumer "b": "attempt <n> after <d>"
	all   chan struct{}       // closed when every value was handled
	want  int
}

func newHandled(want int) *handled {
	return &handled{by: map[string][]string{}, count: map[string]int{}, first: map[int]string{}, all: make(chan struct{}), want: want}
}

// add notes m handled by consumer; since is when consumer joined.
func (h *handled) add(consumer string, m pubsub.Message[string], since time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if consumer == "b" {
		if _, ok := h.first[m.Partition]; !ok {
			h.first[m.Partition] = fmt.Sprintf("attempt %d after %v", m.Attempt, time.Since(since).Round(time.Millisecond))
		}
	}
	h.by[m.Value] = append(h.by[m.Value], fmt.Sprintf("%s attempt %d", consumer, m.Attempt))
	h.count[consumer]++
	if len(h.by) == h.want && h.count[consumer] > 0 {
		select {
		case <-h.all:
		default:
			close(h.all)
		}
	}
	return h.count[consumer]
}

// TestCleanLeaveHandsOverAtOnce is the reproduction of the research note
// on stranded records: broker A's consumer handles about 1,000 of 4,000
// records over 4 partitions while they flow, leaves (Group.Leave, or
// Stream.Close), and A closes; broker B joins the group. The records A's
// workers had pulled and not delivered (a pull rides on every ack) go
// back to the server as if never delivered, so B delivers every one of
// them at once, Attempt 1, and every record is handled exactly once. Before,
// a stopping worker kept such a record for a next local worker that never
// came: B got it only after AckWait (30s here), with Attempt 2.
func TestCleanLeaveHandsOverAtOnce(t *testing.T) {
	for _, how := range []string{"leave", "stream"} {
		t.Run(how, func(t *testing.T) {
			const n, parts, ackWait = 4000, 4, 30 * time.Second
			opts := testOptions(WithAckWait(ackWait))
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()

			a := pubsub.NewBroker(pubsub.WithEngine(testServer.Engine(opts...)))
			defer a.Close(ctx)
			ta, err := pubsub.NewTopic(a, "orders", codec.String(), codec.String(), pubsub.WithPartitions(parts))
			if err != nil {
				t.Fatal(err)
			}
			entries := make([]pubsub.Entry[string, string], n)
			for i := range entries {
				entries[i] = pubsub.Entry[string, string]{Key: fmt.Sprint("key-", i%64), Value: fmt.Sprint("v", i)}
			}
			if _, err := ta.PublishBatch(ctx, entries); err != nil {
				t.Fatal(err)
			}
			h := newHandled(n)
			reached := make(chan struct{}) // A handled 1,000
			var once sync.Once
			start := time.Now()
			var leave func() error
			switch how {
			case "leave":
				g, err := ta.Subscribe("g", "a", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
					if h.add("a", m, start) >= 1000 {
						once.Do(func() { close(reached) })
					}
					return nil
				}))
				if err != nil {
					t.Fatal(err)
				}
				leave = func() error { return g.Leave(ctx, "a") }
			case "stream":
				s, err := ta.Stream("g", "a")
				if err != nil {
					t.Fatal(err)
				}
				stopped := make(chan struct{})
				go func() { // exits when the test closes the stream, after the 1,000th ack
					for d := range s.C() {
						select {
						case <-stopped:
							continue // not received: the caller stopped reading
						default:
						}
						if h.add("a", d.Message, start) >= 1000 {
							d.Ack()
							once.Do(func() { close(reached) })
							<-stopped
							continue
						}
						d.Ack()
					}
				}()
				leave = func() error {
					defer close(stopped)
					return s.Close()
				}
			}
			select {
			case <-reached:
			case <-ctx.Done():
				t.Fatal("A did not handle 1,000 records")
			}
			if err := leave(); err != nil {
				t.Fatal(err)
			}
			_ = a.Close(ctx) // the group is stalled without consumers: what Close says of it is not the point

			b := brokerOn(t, testServer.Engine(opts...))
			tb, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(parts))
			if err != nil {
				t.Fatal(err)
			}
			joined := time.Now()
			if _, err := tb.Subscribe("g", "b", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
				h.add("b", m, joined)
				return nil
			})); err != nil {
				t.Fatal(err)
			}
			// Well before AckWait: a record stranded in A would come only then.
			bound := time.NewTimer(ackWait / 3)
			defer bound.Stop()
			select {
			case <-h.all:
			case <-bound.C:
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			t.Logf("A handled %d, B %d; B's first delivery by partition: %v", h.count["a"], h.count["b"], h.first)
			if len(h.by) != n {
				t.Fatalf("%d of %d records handled %v after B joined: the rest were stranded (B's first deliveries: %v)",
					len(h.by), n, ackWait/3, h.first)
			}
			for p, first := range h.first {
				if first[:len("attempt 1 ")] != "attempt 1 " {
					t.Errorf("B's first delivery on partition %d: %s, want attempt 1", p, first)
				}
			}
			for v, by := range h.by {
				if len(by) != 1 || !slices.Contains([]string{"a attempt 1", "b attempt 1"}, by[0]) {
					t.Errorf("%s handled %q, want once, attempt 1", v, by)
				}
			}
		})
	}
}

// TestGiveBackLeavesTheAttemptAlone: a record pulled once and given back
// comes again with NumDelivered 1, as if never delivered (the consumer is
// reset to it), where a Nak would make it 2; a record being retried is
// Nak'ed (its attempts go on counting); so is one fetched before the
// consumer was reset by a Seek (the slot's epoch moved).
func TestGiveBackLeavesTheAttemptAlone(t *testing.T) {
	ee, err := testServer.Engine(testOptions()...).(*opener).Open(engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e := ee.(*eng)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	defer e.Close(ctx)
	tt, err := e.CreateTopic(ctx, "orders", engine.TopicSpec{Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	tp := tt.(*topic)
	spec, err := engine.GroupSpec{}.Resolve(e.retry)
	if err != nil {
		t.Fatal(err)
	}
	g, err := openGroup(ctx, e, tp, "g", &spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"a", "b"} {
		if _, err := tp.AppendOne(ctx, 0, &engine.Record{Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := newPuller(e.js, e.names.stream("orders", 0), e.names.consumer("g", 0), pullerRoom)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	// next pulls one record: its value and delivery count.
	next := func() (record, string, uint64) {
		t.Helper()
		if err := p.pull(time.Second); err != nil {
			t.Fatal(err)
		}
		m, err := p.next(nil, 2*time.Second)
		if err != nil || m == nil {
			t.Fatalf("pull: %v, %v", m, err)
		}
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		return m, string(m.Data()), md.NumDelivered
	}
	s := g.slots[0]

	m, v, n := next()
	g.giveBack(s, 0, m)
	if m, v2, n2 := next(); v2 != v || n2 != 1 {
		t.Fatalf("after giving back %s (delivered %d), the next pull has %s delivered %d times; want it again, once", v, n, v2, n2)
	} else {
		_ = m.NakWithDelay(0) // now it is being retried
	}
	m, v, n = next()
	if v != "a" || n != 2 {
		t.Fatalf("the retry: %s delivered %d times, want a, 2", v, n)
	}
	g.giveBack(s, 0, m)
	if m, v, n = next(); v != "a" || n != 3 {
		t.Errorf("a retry given back came again as %s delivered %d times; want a, 3: Nak'ed, still counting", v, n)
	}
	_ = m.Ack()
	m, v, _ = next()
	s.bumpEpoch(0) // as a Seek does
	g.giveBack(s, 0, m)
	if _, v2, n2 := next(); v2 != v || n2 != 2 {
		t.Errorf("a record fetched before a reset and given back came again as %s delivered %d times; want %s, 2: Nak'ed", v2, n2, v)
	}
}
