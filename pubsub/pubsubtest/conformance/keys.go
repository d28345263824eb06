package conformance

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
)

// keyLog is the handler of the key-concurrency cases. It records every
// call in the order they began, counts how many run at once (peak) and
// catches two calls of one key that overlap; act, when set, decides a
// call's outcome (and may block it) before it ends.
type keyLog struct {
	mu       sync.Mutex
	began    []pubsub.Message[string] // in the order they began
	acked    []pubsub.Message[string] // in the order they returned nil
	running  int
	peak     int
	busy     map[string]bool // keys with a call running
	overlaps []string
	changed  chan struct{} // closed and replaced when a call begins or ends
	act      func(ctx context.Context, m pubsub.Message[string]) error
}

func newKeyLog(act func(context.Context, pubsub.Message[string]) error) *keyLog {
	return &keyLog{busy: map[string]bool{}, changed: make(chan struct{}), act: act}
}

func (l *keyLog) Handle(ctx context.Context, m pubsub.Message[string]) error {
	key := string(m.Key)
	l.mu.Lock()
	l.began = append(l.began, m)
	l.running++
	l.peak = max(l.peak, l.running)
	if m.Key != nil {
		if l.busy[key] {
			l.overlaps = append(l.overlaps, fmt.Sprintf("%s (offset %d attempt %d)", key, m.Offset, m.Attempt))
		}
		l.busy[key] = true
	}
	l.broadcastLocked()
	l.mu.Unlock()
	var err error
	if l.act != nil {
		err = l.act(ctx, m)
	}
	l.mu.Lock()
	l.running--
	if m.Key != nil {
		l.busy[key] = false
	}
	if err == nil {
		l.acked = append(l.acked, m)
	}
	l.broadcastLocked()
	l.mu.Unlock()
	return err
}

func (l *keyLog) broadcastLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// await waits until cond, read under l.mu, holds, failing the subtest
// after failureBound.
func (l *keyLog) await(c *conf, what string, cond func(l *keyLog) bool) {
	c.Helper()
	for {
		l.mu.Lock()
		ok, changed := cond(l), l.changed
		l.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-c.ctx().Done():
			c.Fatalf("%s: did not happen within %v", what, failureBound)
		}
	}
}

// meeting is a barrier for n calls of a keyLog's handler: each that
// arrives waits until n run at once (full closes then), or the subtest's
// bound ends.
type meeting struct {
	n    int
	full chan struct{}
	once sync.Once
}

func newMeeting(n int) *meeting { return &meeting{n: n, full: make(chan struct{})} }

// arrive is called by a handler of log: it closes full once n of log's
// calls run at once, and waits for it.
func (mt *meeting) arrive(c *conf, log *keyLog) {
	log.mu.Lock()
	if log.running == mt.n {
		mt.once.Do(func() { close(mt.full) })
	}
	log.mu.Unlock()
	select {
	case <-mt.full:
	case <-c.ctx().Done():
	}
}

// snapshot returns what the log saw so far.
func (l *keyLog) snapshot() (began, acked []pubsub.Message[string], peak int, overlaps []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.began), slices.Clone(l.acked), l.peak, slices.Clone(l.overlaps)
}

// checkKeys fails the subtest if two calls of one key overlapped, or a
// key's acked values are not want's values of that key, in order.
func (l *keyLog) checkKeys(c *conf, want []keyed) {
	c.Helper()
	_, acked, _, overlaps := l.snapshot()
	if len(overlaps) > 0 {
		c.Errorf("calls of one key overlapped: %q", overlaps)
	}
	wantBy, gotBy := map[string][]string{}, map[string][]string{}
	for _, r := range want {
		wantBy[r.key] = append(wantBy[r.key], r.value)
	}
	for _, m := range acked {
		gotBy[string(m.Key)] = append(gotBy[string(m.Key)], m.Value)
	}
	for k, w := range wantBy {
		if !slices.Equal(gotBy[k], w) {
			c.Errorf("key %q acked %q, want %q, in that order", k, gotBy[k], w)
		}
	}
}

// keyed is a record to publish: its key and value.
type keyed struct{ key, value string }

// publishKeyed publishes recs in order to partition 0 of topic.
func publishKeyed(c *conf, topic *pubsub.Topic[string, string], recs []keyed) {
	c.Helper()
	for _, r := range recs {
		publish(c, topic, r.key, r.value)
	}
}

// spread is rounds records for each of keys, round robin: k0-0, k1-0, …,
// k0-1, k1-1, ….
func spread(keys, rounds int) []keyed {
	var recs []keyed
	for i := range rounds {
		for k := range keys {
			recs = append(recs, keyed{fmt.Sprintf("k%d", k), fmt.Sprintf("k%d-%d", k, i)})
		}
	}
	return recs
}

// values of recs.
func valuesOf(recs []keyed) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.value
	}
	return out
}

// awaitCommitted waits until g's committed offset on partition 0 is want,
// failing the subtest if it goes past it or does not reach it within
// failureBound. In a bubble the engine settles first and must be there;
// in real time the subtest yields until it is.
func awaitCommitted(c *conf, g *pubsub.Group[string], want int64) {
	c.Helper()
	c.settle()
	for {
		got := g.Committed(0)
		switch {
		case got == want:
			return
		case got > want:
			c.Fatalf("Committed(0): got %d, past the unsettled record at %d", got, want)
		case c.bubble || c.ctx().Err() != nil:
			c.Fatalf("Committed(0): got %d, want %d (the lowest unsettled offset)", got, want)
		}
		runtime.Gosched()
	}
}

// eventually waits until cond holds: in a bubble the engine settles first
// and cond must hold then; in real time the subtest yields until it does,
// failing after failureBound.
func (c *conf) eventually(what string, cond func() bool) {
	c.Helper()
	c.settle()
	for !cond() {
		if c.bubble || c.ctx().Err() != nil {
			c.Fatalf("%s: did not happen", what)
		}
		runtime.Gosched()
	}
}

// held starts a group of n on a one-partition topic whose handler (a
// keyLog) blocks the record of key "slow" until release is closed, and
// publishes recs. It returns once every record but the slow one was
// acked, the slow one running.
type heldWindow struct {
	b       *pubsub.Broker
	topic   *pubsub.Topic[string, string]
	g       *pubsub.Group[string]
	log     *keyLog
	release func()
}

func holdWindow(c *conf, n int, recs []keyed, opts ...pubsub.BrokerOption) *heldWindow {
	c.Helper()
	h := &heldWindow{b: c.broker(opts...)}
	h.topic = c.topic(h.b, "orders")
	gate := make(chan struct{})
	var once sync.Once
	h.release = func() { once.Do(func() { close(gate) }) }
	c.Cleanup(h.release) // before the broker's Close
	h.log = newKeyLog(func(ctx context.Context, m pubsub.Message[string]) error {
		if string(m.Key) == "slow" {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	h.g = subscribe(c, h.topic, "billing", "b1", h.log, pubsub.WithKeyConcurrency(n))
	publishKeyed(c, h.topic, recs)
	h.log.await(c, "every record but the slow one acked", func(l *keyLog) bool {
		return len(l.acked) == len(recs)-1 && l.running == 1
	})
	return h
}

// slowFirst is a window whose oldest record is held: slow at offset 0,
// then seven records of other keys.
func slowFirst() []keyed {
	recs := []keyed{{"slow", "slow"}}
	for i := range 7 {
		recs = append(recs, keyed{fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)})
	}
	return recs
}

// keyConcurrencyCases are the guarantees of WithKeyConcurrency.
func keyConcurrencyCases() []confCase {
	return []confCase{
		{name: "WithKeyConcurrency runs up to n deliveries of a partition at once, never two of one key, each key in order", needs: engine.KeyConcurrency, run: func(c *conf) {
			const n = 4
			b, topic := c.brokerTopic("orders")
			mt := newMeeting(n)
			var log *keyLog
			log = newKeyLog(func(_ context.Context, m pubsub.Message[string]) error {
				if m.Offset < n { // the first n records, of n keys, meet: n run at once or none returns
					mt.arrive(c, log)
				}
				if m.Offset == 0 {
					// k0-0 returns only once the two first rounds of the
					// other keys were acked: meanwhile k0-1, at offset 8,
					// must wait for it.
					log.await(c, "the other keys' first two rounds acked", func(l *keyLog) bool { return len(l.acked) >= 14 })
				}
				return nil
			})
			g := subscribe(c, topic, "billing", "b1", log, pubsub.WithKeyConcurrency(n))
			recs := spread(8, 5)
			publishKeyed(c, topic, recs)
			c.wait(fmt.Sprintf("%d deliveries of the partition at once", n), mt.full)
			c.drain(b)
			log.checkKeys(c, recs)
			if _, _, peak, _ := log.snapshot(); peak != n {
				c.Errorf("at most %d deliveries ran at once, want %d (WithKeyConcurrency(%d))", peak, n, n)
			}
			if got, want := g.Committed(0), int64(len(recs)); got != want {
				c.Errorf("Committed(0): got %d, want %d", got, want)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: int64(len(recs))})
		}},
		{name: "keyless records each count as a key of their own, and run at once", needs: engine.KeyConcurrency, run: func(c *conf) {
			const n = 3
			b, topic := c.brokerTopic("orders")
			mt := newMeeting(n)
			var log *keyLog
			log = newKeyLog(func(context.Context, pubsub.Message[string]) error {
				mt.arrive(c, log)
				return nil
			})
			subscribe(c, topic, "billing", "b1", log, pubsub.WithKeyConcurrency(n))
			for i := range 2 * n {
				publishValue(c, topic, fmt.Sprint(i))
			}
			c.wait(fmt.Sprintf("%d keyless deliveries at once", n), mt.full)
			c.drain(b)
			if _, acked, _, _ := log.snapshot(); len(acked) != 2*n {
				c.Errorf("acked %d records, want %d", len(acked), 2*n)
			}
		}},
		{name: "a record waiting out a retry holds back only its key: other keys flow, its key's next record waits for it", needs: engine.KeyConcurrency, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			log := newKeyLog(func(_ context.Context, m pubsub.Message[string]) error {
				if m.Value == "bad-1" && m.Attempt == 1 {
					return errBoom
				}
				return nil
			})
			// A backoff of a second: in real time the six other records are
			// handled long before it ends.
			g := subscribe(c, topic, "billing", "b1", log, pubsub.WithKeyConcurrency(2),
				pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second}))
			recs := []keyed{{"bad", "bad-1"}, {"bad", "bad-2"}}
			for i := range 6 {
				recs = append(recs, keyed{fmt.Sprintf("g%d", i), fmt.Sprintf("good-%d", i)})
			}
			publishKeyed(c, topic, recs)
			log.await(c, "the other keys' records acked while bad-1 waits out its backoff", func(l *keyLog) bool { return len(l.acked) == 6 })
			began, _, _, _ := log.snapshot()
			var bad []string
			for _, m := range began {
				if string(m.Key) == "bad" {
					bad = append(bad, fmt.Sprintf("%s attempt %d", m.Value, m.Attempt))
				}
			}
			if want := []string{"bad-1 attempt 1"}; !slices.Equal(bad, want) {
				c.Errorf("while bad-1 waited out its backoff, key bad saw %q, want %q", bad, want)
			}
			if got := g.Committed(0); got != 0 {
				c.Errorf("Committed(0) while bad-1 is unsettled: got %d, want 0", got)
			}
			c.drain(b)
			began, _, _, _ = log.snapshot()
			bad = bad[:0]
			for _, m := range began {
				if string(m.Key) == "bad" {
					bad = append(bad, fmt.Sprintf("%s attempt %d", m.Value, m.Attempt))
				}
			}
			if want := []string{"bad-1 attempt 1", "bad-1 attempt 2", "bad-2 attempt 1"}; !slices.Equal(bad, want) {
				c.Errorf("key bad saw %q, want %q", bad, want)
			}
			log.checkKeys(c, recs)
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: 8, Retried: 1})
		}},
		{name: "a dead-lettered record settles its key, and the key's next record follows", needs: engine.KeyConcurrency, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			log := newKeyLog(func(_ context.Context, m pubsub.Message[string]) error {
				if m.Value == "poison" {
					return fmt.Errorf("no: %w", pubsub.ErrPermanent)
				}
				return nil
			})
			g := subscribe(c, topic, "billing", "b1", log, pubsub.WithKeyConcurrency(3))
			recs := []keyed{{"a", "poison"}, {"b", "b-1"}, {"a", "a-2"}, {"c", "c-1"}}
			publishKeyed(c, topic, recs)
			c.drain(b)
			log.checkKeys(c, []keyed{{"b", "b-1"}, {"a", "a-2"}, {"c", "c-1"}})
			if dl := g.DeadLetters(); len(dl) != 1 || dl[0].Message.Value != "poison" || dl[0].Attempts != 1 {
				c.Errorf("dead letters: got %+v, want poison after 1 attempt", dl)
			}
			if got, want := g.Committed(0), int64(4); got != want {
				c.Errorf("Committed(0): got %d, want %d", got, want)
			}
		}},
		{name: "the committed offset stops at the oldest unsettled record, never past it, and moves on once it settles", needs: engine.KeyConcurrency, run: func(c *conf) {
			recs := append([]keyed{{"a", "a"}, {"b", "b"}}, slowFirst()...)
			h := holdWindow(c, 4, recs)
			awaitCommitted(c, h.g, 2)
			if got, want := h.g.Lag(), int64(len(recs)-2); got != want {
				c.Errorf("Lag: got %d, want %d (lag counts from the committed offset)", got, want)
			}
			h.release()
			c.drain(h.b)
			if got, want := h.g.Committed(0), int64(len(recs)); got != want {
				c.Errorf("Committed(0) once the slow record settled: got %d, want %d", got, want)
			}
			h.log.checkKeys(c, recs)
		}},
		{name: "Pause waits for every delivery in flight, none begins after it, and Resume redelivers nothing that settled", needs: engine.KeyConcurrency, run: func(c *conf) {
			const n = 3
			b, topic := c.brokerTopic("orders")
			gt := newGate(c, false)
			// bad fails first, and waits out its backoff while the others
			// are acked: the committed offset stays at it, below them.
			log := newKeyLog(func(ctx context.Context, m pubsub.Message[string]) error {
				if m.Value == "bad" {
					if m.Attempt == 1 {
						return errBoom
					}
					return nil
				}
				return gt.handler()(ctx, m)
			})
			g := subscribe(c, topic, "billing", "b1", log, pubsub.WithKeyConcurrency(n),
				pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second}))
			recs := append([]keyed{{"bad", "bad"}}, spread(8, 1)...)
			publishKeyed(c, topic, recs)
			log.await(c, fmt.Sprintf("bad failed, and %d deliveries in flight", n), func(l *keyLog) bool {
				return l.running == n && len(l.began) == n+1
			})
			c.wantIs("Pause with deliveries in flight", g.Pause(c.within(shortWait)), context.DeadlineExceeded)
			gt.open()
			if err := g.Pause(c.ctx()); err != nil {
				c.Fatalf("Pause once they were released: %v", err)
			}
			c.settle()
			began, acked, _, _ := log.snapshot()
			if len(began) != n+1 || len(acked) != n {
				c.Errorf("after Pause returned: %d deliveries began and %d acked, want %d and the %d in flight", len(began), len(acked), n+1, n)
			}
			if got := g.Committed(0); got != 0 {
				c.Errorf("Committed(0) with bad unsettled: got %d, want 0", got)
			}
			if err := g.Resume(c.ctx()); err != nil {
				c.Fatalf("Resume: %v", err)
			}
			c.drain(b)
			began, _, _, _ = log.snapshot()
			if got, want := values(began), append(valuesOf(recs), "bad"); !sameSet(got, want) {
				c.Errorf("delivered %q, want bad twice and each of the others once", got)
			}
			log.checkKeys(c, recs)
		}},
		{name: "a consumer leaving with deliveries in flight hands its partition over once they end, and nothing settled is delivered again", needs: engine.KeyConcurrency, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			gate := make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(gate) }) }
			c.Cleanup(release)
			// bad fails and waits out its backoff, slow is in flight, the
			// others are acked: b1 leaves with all three kinds in its
			// window.
			first := newKeyLog(func(ctx context.Context, m pubsub.Message[string]) error {
				switch m.Value {
				case "bad":
					return errBoom
				case "slow":
					select {
					case <-gate:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				return nil
			})
			policy := pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second})
			g := subscribe(c, topic, "billing", "b1", first, pubsub.WithKeyConcurrency(4), policy)
			recs := []keyed{{"bad", "bad"}, {"slow", "slow"}}
			for i := range 6 {
				recs = append(recs, keyed{fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)})
			}
			publishKeyed(c, topic, recs)
			first.await(c, "bad failed, slow in flight, the others acked", func(l *keyLog) bool {
				return len(l.began) == len(recs) && len(l.acked) == len(recs)-2 && l.running == 1
			})
			next := newKeyLog(nil)
			subscribe(c, topic, "billing", "b2", next, pubsub.WithKeyConcurrency(4), policy)
			left := make(chan error, 1)
			go func() { left <- g.Leave(c.ctx(), "b1") }() // returns once the slow delivery ended
			c.settle()
			select {
			case err := <-left:
				c.Fatalf("Leave returned %v while a delivery of b1 was in flight", err)
			default:
			}
			release()
			if err := <-left; err != nil {
				c.Fatalf("Leave: %v", err)
			}
			c.drain(b)
			if began, _, _, _ := next.snapshot(); len(began) != 1 || began[0].Value != "bad" || began[0].Attempt != 2 {
				var got []string
				for _, m := range began {
					got = append(got, fmt.Sprintf("%s attempt %d", m.Value, m.Attempt))
				}
				c.Errorf("the next consumer got %q, want only [bad attempt 2]: the records b1 settled are not delivered again", got)
			}
			if got, want := g.Committed(0), int64(len(recs)); got != want {
				c.Errorf("Committed(0): got %d, want %d", got, want)
			}
		}},
		{name: "Seek with deliveries in flight waits for them, then discards the window and delivers again from its offset, attempts from 1", needs: engine.KeyConcurrency, run: func(c *conf) {
			windowReposition(c, func(g *pubsub.Group[string]) error { return g.Seek(c.ctx(), 0, 0) })
		}},
		{name: "Replay with deliveries in flight waits for them, then discards the window and delivers again from its start, attempts from 1", needs: engine.KeyConcurrency, run: func(c *conf) {
			windowReposition(c, func(g *pubsub.Group[string]) error { return g.Replay(c.ctx(), pubsub.Earliest()) })
		}},
		{name: "a Close whose context ends with deliveries in flight reports the partition at its oldest unsettled record", needs: engine.KeyConcurrency, run: func(c *conf) {
			recs := append([]keyed{{"a", "a"}}, slowFirst()...)
			h := holdWindow(c, 4, recs)
			awaitCommitted(c, h.g, 1)
			err := h.b.Close(c.within(50 * time.Millisecond))
			se, ok := errors.AsType[*pubsub.ShutdownError](err)
			if !ok {
				c.Fatalf("Close: got %T (%v), want a *pubsub.ShutdownError", err, err)
			}
			var got []pubsub.Unfinished
			for _, u := range se.Unfinished {
				u.Running = false // timing: whether the handler returned within the grace is not the point here
				got = append(got, u)
			}
			if want := []pubsub.Unfinished{{Group: "billing", Topic: "orders", Partition: 0, Committed: 1, End: int64(len(recs))}}; !slices.Equal(got, want) {
				c.Errorf("Unfinished: got %+v, want %+v", se.Unfinished, want)
			}
		}},
		{name: "a Stream of a group with WithKeyConcurrency(n) holds up to n deliveries of a partition at once, each acked on its own", needs: engine.KeyConcurrency, run: func(c *conf) {
			const n = 3
			b, topic := c.brokerTopic("tasks")
			s := stream(c, topic, "workers", "w1", pubsub.WithKeyConcurrency(n))
			recs := spread(6, 1)
			publishKeyed(c, topic, recs)
			var held []*pubsub.Delivery[string]
			for range n {
				held = append(held, recv(c, s))
			}
			noDelivery(c, s)
			if got := s.Group().Committed(0); got != 0 {
				c.Errorf("Committed(0) with %d deliveries outstanding: got %d, want 0", n, got)
			}
			got := values(messagesOf(held))
			held[1].Ack()
			more := recv(c, s)
			got = append(got, more.Value)
			held[0].Ack()
			held[2].Ack()
			more.Ack()
			for range len(recs) - n - 1 {
				d := recv(c, s)
				got = append(got, d.Value)
				d.Ack()
			}
			c.drain(b)
			if want := valuesOf(recs); !sameSet(got, want) {
				c.Errorf("the stream got %q, want each of %q once", got, want)
			}
		}},
		{name: "Snapshot shows a partition's deliveries in flight and its oldest unsettled offset", needs: engine.KeyConcurrency | engine.Snapshots, run: func(c *conf) {
			recs := append([]keyed{{"a", "a"}}, slowFirst()...)
			h := holdWindow(c, 4, recs)
			awaitCommitted(c, h.g, 1)
			part := func() pubsub.GroupPartitionSnapshot { return h.b.Snapshot().Topics[0].Groups[0].Partitions[0] }
			c.eventually("the snapshot shows the acks taken", func() bool { return part().Running == 1 })
			if p := part(); p.Running != 1 || p.OldestUnsettled != 1 || p.Committed != 1 || !p.InFlight {
				c.Errorf("snapshot %+v: want 1 running, the oldest unsettled and committed offset 1, in flight", p)
			}
			h.release()
			c.drain(h.b)
			c.settle()
			if p := h.b.Snapshot().Topics[0].Groups[0].Partitions[0]; p.Running != 0 || p.OldestUnsettled != -1 || p.InFlight {
				c.Errorf("snapshot once drained %+v: want none running, OldestUnsettled -1", p)
			}
		}},
		{name: "WithStuckAfter names the key holding the partition when its oldest unsettled delivery runs too long", needs: engine.KeyConcurrency | engine.StuckDetection, run: func(c *conf) {
			const after = 50 * time.Millisecond
			events := stuckEvents(make(chan pubsub.StuckEvent, 8))
			recs := slowFirst()
			h := holdWindow(c, 4, recs, pubsub.WithHooks(events), pubsub.WithStuckAfter(after))
			e := events.next(c)
			if d := e.Delivery; e.Returned || d.Offset != 0 || string(d.Key) != "slow" || e.Running < after {
				c.Errorf("stuck event %+v (key %q), want offset 0 of key slow, running at least %v", e, d.Key, after)
			}
			h.release()
			if e := events.next(c); !e.Returned || e.Delivery.Offset != 0 {
				c.Errorf("event after the handler returned: %+v, want Returned for offset 0", e)
			}
			c.drain(h.b)
		}},
		{name: "WithKeyConcurrency(1) is the default, another n is ErrSubscription, and bad values and batch consumers are ErrInvalid", needs: engine.KeyConcurrency, run: func(c *conf) {
			_, topic := c.brokerTopic("orders")
			h := newKeyLog(nil)
			subscribe(c, topic, "plain", "c1", h)
			subscribe(c, topic, "plain", "c2", h, pubsub.WithKeyConcurrency(1))
			_, err := topic.Subscribe("plain", "c3", h, pubsub.WithKeyConcurrency(2))
			c.wantIs("joining a group of one at a time with WithKeyConcurrency(2)", err, pubsub.ErrSubscription)
			subscribe(c, topic, "wide", "c1", h, pubsub.WithKeyConcurrency(8))
			_, err = topic.Subscribe("wide", "c2", h)
			c.wantIs("joining a group of 8 without the option", err, pubsub.ErrSubscription)
			subscribe(c, topic, "wide", "c3", h, pubsub.WithKeyConcurrency(8))
			for _, n := range []int{0, -1, pubsub.MaxKeyConcurrency + 1} {
				_, err := topic.Subscribe("bad", "c1", h, pubsub.WithKeyConcurrency(n))
				c.wantIs(fmt.Sprintf("WithKeyConcurrency(%d)", n), err, pubsub.ErrInvalid)
			}
			_, err = topic.SubscribeBatch("batch", "c1", pubsub.BatchHandlerFunc[string](func(context.Context, []pubsub.Message[string]) error { return nil }),
				pubsub.WithKeyConcurrency(2))
			c.wantIs("SubscribeBatch with WithKeyConcurrency(2)", err, pubsub.ErrInvalid)
		}},
	}
}

// windowReposition holds a window (the slow record in flight, the others
// acked), repositions the group to offset 0 with move, which must wait
// for the slow delivery, and checks that afterwards every record is
// delivered again from 0, attempts from 1.
func windowReposition(c *conf, move func(*pubsub.Group[string]) error) {
	c.Helper()
	recs := slowFirst()
	h := holdWindow(c, 4, recs)
	moved := make(chan error, 1)
	go func() { moved <- move(h.g) }() // returns once the slow delivery ended
	c.settle()
	select {
	case err := <-moved:
		c.Fatalf("the reposition returned %v while a delivery was in flight", err)
	default:
	}
	h.release()
	if err := <-moved; err != nil {
		c.Fatalf("reposition: %v", err)
	}
	c.drain(h.b)
	began, _, _, _ := h.log.snapshot()
	after := began[len(recs):] // the first window's calls: every record once
	for _, m := range after {
		if m.Attempt != 1 {
			c.Errorf("after the reposition %s came with attempt %d, want 1", m.Value, m.Attempt)
		}
	}
	if got, want := values(after), valuesOf(recs); !sameSet(got, want) {
		c.Errorf("after the reposition: delivered %q, want each of %q once", got, want)
	}
	if got, want := h.g.Committed(0), int64(len(recs)); got != want {
		c.Errorf("Committed(0): got %d, want %d", got, want)
	}
}

// sameSet reports whether got and want hold the same values, each as
// often.
func sameSet(got, want []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want)))
}

// messagesOf returns the Messages of Stream deliveries.
func messagesOf(ds []*pubsub.Delivery[string]) []pubsub.Message[string] {
	out := make([]pubsub.Message[string], len(ds))
	for i, d := range ds {
		out[i] = d.Message
	}
	return out
}
