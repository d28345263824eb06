package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
)

// batchLog is a batch handler that records every call, failed or not, and
// runs fail (when set) to decide its outcome.
type batchLog[V any] struct {
	mu    sync.Mutex
	calls [][]pubsub.Message[V]
	fail  func(call int, msgs []pubsub.Message[V]) error
}

func (l *batchLog[V]) HandleBatch(_ context.Context, msgs []pubsub.Message[V]) error {
	l.mu.Lock()
	call := len(l.calls)
	l.calls = append(l.calls, slices.Clone(msgs)) // msgs is valid only during the call
	fail := l.fail
	l.mu.Unlock()
	if fail != nil {
		return fail(call, msgs)
	}
	return nil
}

func (l *batchLog[V]) all() [][]pubsub.Message[V] {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// flat returns every message of every call, in call order.
func (l *batchLog[V]) flat() []pubsub.Message[V] {
	var out []pubsub.Message[V]
	for _, call := range l.all() {
		out = append(out, call...)
	}
	return out
}

func subscribeBatch[K, V any](c *conf, topic *pubsub.Topic[K, V], group, consumer string, h pubsub.BatchHandler[V], opts ...pubsub.SubscribeOption) *pubsub.Group[V] {
	c.Helper()
	g, err := topic.SubscribeBatch(group, consumer, h, opts...)
	if err != nil {
		c.Fatalf("SubscribeBatch(%q, %q): %v", group, consumer, err)
	}
	return g
}

// failAt returns a batch handler outcome that fails the first message
// whose value is bad with err, as a BatchError naming its index.
func failAt(msgs []pubsub.Message[string], bad string, err error) error {
	for i, m := range msgs {
		if m.Value == bad {
			return &pubsub.BatchError{Index: i, Err: err}
		}
	}
	return nil
}

// seqStrings returns "v0", "v1", ... "v<n-1>".
func seqStrings(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("v%d", i)
	}
	return out
}

func batchCases() []confCase {
	batches := engine.Batches
	return []confCase{
		{name: "a batch consumer gets a partition's records once each, in offset order, at most WithBatchSize per call, what is there at once", needs: batches, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			want := seqStrings(10)
			for _, v := range want {
				publishValue(c, topic, v)
			}
			log := &batchLog[string]{}
			g := subscribeBatch(c, topic, "billing", "b1", log, pubsub.WithBatchSize(4))
			c.drain(b)
			calls := log.all()
			if got := values(log.flat()); !slices.Equal(got, want) {
				c.Errorf("values delivered: got %v, want %v", got, want)
			}
			for i, call := range calls {
				if len(call) == 0 || len(call) > 4 {
					c.Errorf("call %d: %d messages, want 1 to 4", i, len(call))
				}
			}
			if len(calls) > 0 && len(calls[0]) != 4 {
				c.Errorf("first call: %d messages, want 4: the 10 records were published before the consumer joined", len(calls[0]))
			}
			for i, m := range log.flat() {
				if m.Offset != int64(i) || m.Attempt != 1 || m.Topic != "orders" || m.ID == "" {
					c.Errorf("message %d: offset %d attempt %d topic %q ID %q, want offset %d attempt 1 topic \"orders\" and an ID",
						i, m.Offset, m.Attempt, m.Topic, m.ID, i)
				}
			}
			if got := g.Committed(0); got != 10 {
				c.Errorf("Committed(0): got %d, want 10", got)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: 10})
		}},
		{name: "every group's batch consumers see every record, each partition in order by one consumer of the group", needs: batches, run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(4))
			logs := map[string]*batchLog[string]{"g1/a": {}, "g1/b": {}, "g2/a": {}}
			subscribeBatch(c, topic, "g1", "a", logs["g1/a"], pubsub.WithBatchSize(3))
			subscribeBatch(c, topic, "g1", "b", logs["g1/b"], pubsub.WithBatchSize(5))
			subscribeBatch(c, topic, "g2", "a", logs["g2/a"])
			keys := []string{"alice", "bob", "carol", "dave", "erin", "frank"}
			var published []string
			for i := range 60 {
				k := keys[i%len(keys)]
				v := fmt.Sprintf("%s-%d", k, i)
				publish(c, topic, k, v)
				published = append(published, v)
			}
			c.drain(b)
			for _, group := range []string{"g1", "g2"} {
				byPart := map[int][]pubsub.Message[string]{}
				owner := map[int]string{}
				for name, l := range logs {
					if name[:2] != group {
						continue
					}
					for _, m := range l.flat() {
						byPart[m.Partition] = append(byPart[m.Partition], m)
						if o, ok := owner[m.Partition]; ok && o != name {
							c.Errorf("group %s partition %d: delivered to %s and %s, want one consumer", group, m.Partition, o, name)
						}
						owner[m.Partition] = name
					}
				}
				var got []string
				for p, msgs := range byPart {
					for i, m := range msgs {
						if m.Offset != int64(i) {
							c.Errorf("group %s partition %d: message %d has offset %d, want offsets 0, 1, ... in order, once each", group, p, i, m.Offset)
							break
						}
						got = append(got, m.Value)
					}
				}
				slices.Sort(got)
				want := slices.Sorted(slices.Values(published))
				if !slices.Equal(got, want) {
					c.Errorf("group %s: got %d values %v, want each of the %d published once", group, len(got), got, len(want))
				}
			}
		}},
		{name: "a BatchError commits the messages before its index and retries the failed one alone, then the rest follow", needs: batches, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			publishValues(c, topic, "a", "b", "bad", "c", "d")
			failed := false
			log := &batchLog[string]{fail: func(_ int, msgs []pubsub.Message[string]) error {
				if failed {
					return nil
				}
				if err := failAt(msgs, "bad", errBoom); err != nil {
					failed = true
					return err
				}
				return nil
			}}
			g := subscribeBatch(c, topic, "billing", "b1", log, pubsub.WithGroupRetry(pubsub.RetryPolicy{BaseDelay: time.Millisecond}))
			c.drain(b)
			// What was delivered after the failing call: "bad" alone on its
			// second attempt, then what followed it, on their first.
			calls := log.all()
			var seen []string
			i := 0
			for ; i < len(calls) && !slices.ContainsFunc(calls[i], func(m pubsub.Message[string]) bool { return m.Value == "bad" }); i++ {
				seen = append(seen, values(calls[i])...)
			}
			if i+1 >= len(calls) {
				c.Fatalf("calls %v: want one with \"bad\" and more after it", calls)
			}
			for _, m := range calls[i] {
				if m.Value == "bad" {
					break
				}
				seen = append(seen, m.Value)
			}
			if retry := calls[i+1]; len(retry) != 1 || retry[0].Value != "bad" || retry[0].Attempt != 2 {
				c.Errorf("the call after the failure: got %v (attempts %v), want [bad] alone on attempt 2", values(retry), attempts(retry))
			}
			var rest []pubsub.Message[string]
			for _, call := range calls[i+2:] {
				rest = append(rest, call...)
			}
			if got := values(rest); !slices.Equal(got, []string{"c", "d"}) || !slices.Equal(attempts(rest), []int{1, 1}) {
				c.Errorf("after the retry: got %v attempts %v, want [c d] on attempt 1: the prefix [%v] is never redelivered", got, attempts(rest), seen)
			}
			if !slices.Equal(seen, []string{"a", "b"}) {
				c.Errorf("delivered before \"bad\": got %v, want [a b] once", seen)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: 5, Retried: 1})
		}},
		{name: "a batch message that keeps failing is dead-lettered after MaxAttempts with its error, and the partition moves on", needs: batches, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			publishValues(c, topic, "a", "bad", "b")
			log := &batchLog[string]{fail: func(_ int, msgs []pubsub.Message[string]) error { return failAt(msgs, "bad", errBoom) }}
			g := subscribeBatch(c, topic, "billing", "b1", log, pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond}))
			c.drain(b)
			var bad []int
			var good []string
			for _, m := range log.flat() {
				if m.Value == "bad" {
					bad = append(bad, m.Attempt)
				} else {
					good = append(good, m.Value)
				}
			}
			if !slices.Equal(bad, []int{1, 2, 3}) {
				c.Errorf("attempts on \"bad\": got %v, want [1 2 3]", bad)
			}
			// "b" may have come in a call with "bad", unprocessed: it comes
			// again after the dead letter. "a" was acked and never comes again.
			if len(good) < 2 || good[0] != "a" || slices.Contains(good[1:], "a") || good[len(good)-1] != "b" {
				c.Errorf("other values: got %v, want \"a\" once, then \"b\"", good)
			}
			if flat := log.flat(); flat[len(flat)-1].Value != "b" {
				c.Errorf("last delivered: got %q, want \"b\", after the dead letter", flat[len(flat)-1].Value)
			}
			dl := g.DeadLetters()
			if len(dl) != 1 || dl[0].Message.Value != "bad" || dl[0].Attempts != 3 || !errors.Is(dl[0].Err, errBoom) {
				c.Fatalf("dead letters: got %+v, want \"bad\" after 3 attempts with the handler's error", dl)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: 2, Retried: 2, DeadLettered: 1})
			if got := g.Committed(0); got != 3 {
				c.Errorf("Committed(0): got %d, want 3", got)
			}
		}},
		{name: "ErrPermanent in a BatchError dead-letters the message at once", needs: batches, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			publishValues(c, topic, "a", "bad", "b")
			log := &batchLog[string]{fail: func(_ int, msgs []pubsub.Message[string]) error {
				return failAt(msgs, "bad", fmt.Errorf("unknown currency: %w", pubsub.ErrPermanent))
			}}
			g := subscribeBatch(c, topic, "billing", "b1", log)
			c.drain(b)
			if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 2, DeadLettered: 1}); got != want {
				c.Errorf("stats: got %+v, want %+v (no retry)", got, want)
			}
			if dl := g.DeadLetters(); len(dl) != 1 || dl[0].Attempts != 1 || !errors.Is(dl[0].Err, pubsub.ErrPermanent) {
				c.Errorf("dead letters: got %+v, want \"bad\" after 1 attempt, wrapping ErrPermanent", dl)
			}
		}},
		{name: "a batch handler's plain error or panic fails its first message, which is retried alone, then the rest come again", needs: batches, run: func(c *conf) {
			for _, how := range []string{"error", "panic"} {
				b, topic := c.brokerTopic("orders-" + how)
				publishValues(c, topic, "a", "b", "c")
				log := &batchLog[string]{fail: func(call int, _ []pubsub.Message[string]) error {
					if call > 0 {
						return nil
					}
					if how == "panic" {
						panic(errBoom)
					}
					return errBoom
				}}
				g := subscribeBatch(c, topic, "billing", "b1", log, pubsub.WithGroupRetry(pubsub.RetryPolicy{BaseDelay: time.Millisecond}))
				c.drain(b)
				calls := log.all()
				if len(calls) < 2 || len(calls[1]) != 1 || calls[1][0].Value != "a" || calls[1][0].Attempt != 2 {
					c.Fatalf("%s: calls %v, want the first message alone on attempt 2 after the failed call", how, calls)
				}
				var rest []string
				for _, call := range calls[2:] {
					rest = append(rest, values(call)...)
				}
				if !slices.Equal(rest, []string{"b", "c"}) {
					c.Errorf("%s: after the retry got %v, want [b c]", how, rest)
				}
				if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 3, Retried: 1}); got != want {
					c.Errorf("%s: stats: got %+v, want %+v", how, got, want)
				}
			}
		}},
		{name: "an undecodable value is dead-lettered at once and never reaches a batch handler, which gets the values around it", needs: batches, run: func(c *conf) {
			b := c.broker()
			topic := newTopic(c, b, "orders", pickyStrings(), pickyStrings())
			publishValues(c, topic, "a", "poison", "b")
			log := &batchLog[string]{}
			g := subscribeBatch(c, topic, "billing", "b1", log)
			c.drain(b)
			if got := values(log.flat()); !slices.Equal(got, []string{"a", "b"}) {
				c.Errorf("delivered: got %v, want [a b]", got)
			}
			var de *pubsub.DecodeError
			if dl := g.DeadLetters(); len(dl) != 1 || dl[0].Attempts != 1 || !errors.As(dl[0].Err, &de) || de.Offset != 1 {
				c.Errorf("dead letters: got %+v, want offset 1 after 1 attempt with a *DecodeError", dl)
			}
		}},
		{name: "Pause, Seek and Leave wait for a batch in flight, each only until its ctx ends, and the batch then commits once", needs: batches, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			c.Cleanup(func() { once.Do(func() { close(release) }) })
			var calls [][]string
			var mu sync.Mutex
			h := pubsub.BatchHandlerFunc[string](func(_ context.Context, msgs []pubsub.Message[string]) error {
				mu.Lock()
				calls = append(calls, values(msgs))
				first := len(calls) == 1
				mu.Unlock()
				if first {
					close(entered)
					<-release
				}
				return nil
			})
			publishValues(c, topic, "a", "b", "c")
			g := subscribeBatch(c, topic, "billing", "b1", h)
			c.wait("the first batch", entered)
			c.wantIs("Pause while a batch is in flight", g.Pause(c.within(shortWait)), context.DeadlineExceeded)
			c.wantIs("Seek while a batch is in flight", g.Seek(c.within(shortWait), 0, 0), context.DeadlineExceeded)
			if got := g.Committed(0); got != 0 {
				c.Errorf("Committed(0) while the batch is in flight: got %d, want 0", got)
			}
			once.Do(func() { close(release) })
			if err := g.Pause(c.ctx()); err != nil {
				c.Fatalf("Pause after the batch returned: %v", err)
			}
			if got := g.Committed(0); got != 3 {
				c.Errorf("Committed(0) after the batch: got %d, want 3", got)
			}
			if err := g.Resume(c.ctx()); err != nil {
				c.Fatal(err)
			}
			publishValue(c, topic, "d")
			c.drain(b)
			mu.Lock()
			defer mu.Unlock()
			var got []string
			for _, call := range calls {
				got = append(got, call...)
			}
			if !slices.Equal(got, []string{"a", "b", "c", "d"}) {
				c.Errorf("delivered: got %v, want [a b c d] (the seek that timed out moved nothing)", got)
			}
		}},
		{name: "a batch still running when Close gives up is reported Running, and commits none of its messages when it returns", needs: batches, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			publishValues(c, topic, "a", "b", "c")
			entered, release, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
			var once sync.Once
			c.Cleanup(func() { once.Do(func() { close(release) }) })
			g := subscribeBatch(c, topic, "billing", "b1", pubsub.BatchHandlerFunc[string](func(context.Context, []pubsub.Message[string]) error {
				close(entered)
				defer close(returned)
				<-release // ignores its context
				return nil
			}))
			c.wait("the first batch", entered)
			wantUnfinished(c, b.Close(c.within(shortWait)), []pubsub.Unfinished{{Group: "billing", Topic: "orders", Partition: 0, Committed: 0, End: 3, Running: true}}...)
			once.Do(func() { close(release) })
			c.wait("the batch handler's return", returned)
			lateCommittedNothing(c, g, "batch")
		}},
		{name: "a partition leaves a batch consumer only after its batch in flight committed, and is not redelivered", needs: batches, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			publishValues(c, topic, "a", "b", "c")
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			c.Cleanup(func() { once.Do(func() { close(release) }) })
			first := &batchLog[string]{fail: func(call int, _ []pubsub.Message[string]) error {
				if call == 0 {
					close(entered)
					<-release
				}
				return nil
			}}
			g := subscribeBatch(c, topic, "billing", "b1", first)
			c.wait("the first batch", entered)
			second := &batchLog[string]{}
			subscribeBatch(c, topic, "billing", "b2", second)
			c.wantIs("Leave while the batch is in flight", g.Leave(c.within(shortWait), "b1"), context.DeadlineExceeded)
			once.Do(func() { close(release) })
			publishValue(c, topic, "d")
			c.drain(b)
			if got := values(first.flat()); !slices.Equal(got, []string{"a", "b", "c"}) {
				c.Errorf("the leaving consumer got %v, want [a b c]", got)
			}
			if got := values(second.flat()); !slices.Equal(got, []string{"d"}) {
				c.Errorf("the partition's next owner got %v, want [d] only: the batch in flight committed before it moved", got)
			}
		}},
		{name: "a group may mix batch and per-record consumers: each record once, each partition in order", needs: batches, run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(4))
			batch := &batchLog[string]{}
			one := &callLog[string]{}
			subscribeBatch(c, topic, "billing", "batch", batch)
			subscribe(c, topic, "billing", "one", one)
			if a := topic.Partitions(); a != 4 {
				c.Fatalf("partitions: %d", a)
			}
			want := seqStrings(40)
			for _, v := range want {
				publish(c, topic, v, v)
			}
			c.drain(b)
			all := append(batch.flat(), one.all()...)
			byPart := map[int][]int64{}
			var got []string
			for _, m := range all {
				byPart[m.Partition] = append(byPart[m.Partition], m.Offset)
				got = append(got, m.Value)
			}
			slices.Sort(got)
			if !slices.Equal(got, slices.Sorted(slices.Values(want))) {
				c.Errorf("delivered: got %v, want each of %d once", got, len(want))
			}
			for p, offs := range byPart {
				if !slices.IsSorted(offs) {
					c.Errorf("partition %d: offsets %v, want increasing", p, offs)
				}
			}
			if len(batch.flat()) == 0 || len(one.all()) == 0 {
				c.Errorf("batch consumer got %d, per-record consumer %d: want both to own partitions", len(batch.flat()), len(one.all()))
			}
		}},
		{name: "Replay redelivers to a batch consumer from the start, on attempt 1", needs: batches, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			publishValues(c, topic, "a", "b", "c")
			log := &batchLog[string]{}
			g := subscribeBatch(c, topic, "billing", "b1", log)
			c.drain(b)
			if err := g.Replay(c.ctx(), pubsub.Earliest()); err != nil {
				c.Fatal(err)
			}
			c.drain(b)
			if got := values(log.flat()); !slices.Equal(got, []string{"a", "b", "c", "a", "b", "c"}) {
				c.Errorf("delivered: got %v, want [a b c] twice", got)
			}
			if got := attempts(log.flat()); slices.ContainsFunc(got, func(a int) bool { return a != 1 }) {
				c.Errorf("attempts: got %v, want all 1", got)
			}
		}},
		{name: "Close drains batch consumers before it stops", needs: batches, run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(2))
			log := &batchLog[string]{}
			subscribeBatch(c, topic, "billing", "b1", log, pubsub.WithBatchSize(7))
			want := seqStrings(50)
			for _, v := range want {
				publish(c, topic, v, v)
			}
			if err := b.Close(c.ctx()); err != nil {
				c.Fatalf("Close: %v", err)
			}
			got := values(log.flat())
			slices.Sort(got)
			if !slices.Equal(got, slices.Sorted(slices.Values(want))) {
				c.Errorf("delivered by Close's return: got %d values, want each of %d once", len(got), len(want))
			}
		}},
		{name: "WithBatchWait gathers what is published within the wait into one batch", needs: engine.Batches | engine.VirtualTime, run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			times := newCallTimes()
			log := &batchLog[string]{fail: func(int, []pubsub.Message[string]) error {
				times.mark()
				return nil
			}}
			subscribeBatch(c, topic, "billing", "b1", log, pubsub.WithBatchSize(10), pubsub.WithBatchWait(50*time.Millisecond))
			publishValue(c, topic, "a")
			time.Sleep(10 * time.Millisecond)
			publishValue(c, topic, "b")
			publishValue(c, topic, "c")
			c.drain(b)
			calls := log.all()
			if len(calls) != 1 || !slices.Equal(values(calls[0]), []string{"a", "b", "c"}) {
				c.Errorf("calls: got %v, want one batch [a b c]", calls)
			}
			if at := times.all(); !slices.Equal(at, []time.Duration{50 * time.Millisecond}) {
				c.Errorf("calls at %v of virtual time, want [50ms]: the wait runs from the first record", at)
			}
		}},
		{name: "batch options are ErrInvalid outside SubscribeBatch, and out of range in it", needs: batches, run: func(c *conf) {
			_, topic := c.brokerTopic("orders")
			_, err := topic.Subscribe("g", "c", &callLog[string]{}, pubsub.WithBatchSize(8))
			c.wantIs("Subscribe with WithBatchSize", err, pubsub.ErrInvalid)
			_, err = topic.Stream("g", "c", pubsub.WithBatchWait(time.Second))
			c.wantIs("Stream with WithBatchWait", err, pubsub.ErrInvalid)
			for _, opt := range []pubsub.SubscribeOption{pubsub.WithBatchSize(-1), pubsub.WithBatchSize(1 << 20), pubsub.WithBatchWait(-time.Second)} {
				_, err = topic.SubscribeBatch("g", "c", &batchLog[string]{}, opt)
				c.wantIs("SubscribeBatch with a bad option", err, pubsub.ErrInvalid)
			}
			_, err = topic.SubscribeBatch("g", "c", nil)
			c.wantIs("SubscribeBatch with a nil handler", err, pubsub.ErrSubscription)
			if _, err := topic.Subscribe("g", "c", &callLog[string]{}); err != nil {
				c.Errorf("Subscribe after the refusals: got %v, want nil (they changed nothing)", err)
			}
		}},
	}
}
