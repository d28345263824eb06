package conformance

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

func startCases() []confCase {
	return []confCase{
		{name: "a new group starts at the oldest retained record, as StartAt(Earliest) says", run: func(c *conf) {
			b := c.broker()
			// No group reads it yet, so the full partition trims: v2..v4 stay.
			topic := c.topic(b, "events", pubsub.WithRetention(pubsub.Retention{MaxMessages: 3, BlockTimeout: failureBound}))
			for i := range 5 {
				publishValue(c, topic, fmt.Sprint("v", i))
			}
			s := stream(c, topic, "default", "d1") // acks nothing yet, so its offset shows where it starts
			if got := s.Group().Committed(0); got != 2 {
				c.Errorf("a new group's Committed(0): got %d, want 2, the oldest retained record", got)
			}
			earliest := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "earliest", "e1", earliest, pubsub.StartAt(pubsub.Earliest()))
			var got []string
			for range 3 {
				d := recv(c, s)
				got = append(got, d.Value)
				d.Ack()
			}
			c.drain(b)
			want := []string{"v2", "v3", "v4"}
			if !slices.Equal(got, want) {
				c.Errorf("the default group got %q, want %q", got, want)
			}
			if got := earliest.Values(); !slices.Equal(got, want) {
				c.Errorf("StartAt(Earliest) got %q, want %q", got, want)
			}
			if err := s.Close(); err != nil {
				c.Errorf("Stream.Close: %v", err)
			}
		}},
		{name: "StartAt(Latest) delivers only the records published after the group was created", run: func(c *conf) {
			b, topic := c.brokerTopic("events")
			for i := range 3 {
				publishValue(c, topic, fmt.Sprint("v", i))
			}
			rec := pubsubtest.NewRecorder[string]()
			g := subscribe(c, topic, "g", "c1", rec, pubsub.StartAt(pubsub.Latest()))
			if got := g.Committed(0); got != 3 {
				c.Errorf("Committed(0) of a group starting at Latest: got %d, want 3", got)
			}
			publishValue(c, topic, "new")
			c.drain(b)
			if got, want := rec.Values(), []string{"new"}; !slices.Equal(got, want) {
				c.Errorf("delivered %q, want %q", got, want)
			}
		}},
		{name: "StartAt(AtOffset(n)) starts at n, clamped to the records retained", run: func(c *conf) {
			b := c.broker()
			// No group reads it yet, so the full partition trims: v3..v6 stay,
			// and the end is 7. Nothing is published later, so no group
			// needs another to make room.
			topic := c.topic(b, "events", pubsub.WithRetention(pubsub.Retention{MaxMessages: 4, BlockTimeout: failureBound}))
			for i := range 7 {
				publishValue(c, topic, fmt.Sprint("v", i))
			}
			starts := []struct {
				offset int64
				want   []string
			}{
				{4, []string{"v4", "v5", "v6"}},
				{0, []string{"v3", "v4", "v5", "v6"}}, // below the oldest retained: starts there
				{7, nil},
				{99, nil}, // past the end: starts at the end
			}
			recs := make([]*pubsubtest.Recorder[string], len(starts))
			groups := make([]*pubsub.Group[string], len(starts))
			for i, s := range starts {
				recs[i] = pubsubtest.NewRecorder[string]()
				groups[i] = subscribe(c, topic, fmt.Sprint("at-", s.offset), "c1", recs[i], pubsub.StartAt(pubsub.AtOffset(s.offset)))
			}
			c.drain(b)
			for i, s := range starts {
				if got := recs[i].Values(); !slices.Equal(got, s.want) {
					c.Errorf("StartAt(AtOffset(%d)) delivered %q, want %q", s.offset, got, s.want)
				}
				if got := groups[i].Committed(0); got != 7 {
					c.Errorf("StartAt(AtOffset(%d)): Committed(0) %d, want 7", s.offset, got)
				}
			}
		}},
		{name: "StartAt(AtTime(t)) starts at the first record created at or after t", needs: engine.InjectedClock, run: func(c *conf) {
			clock, b, topic := c.clockedBrokerTopic("events")
			for i := range 5 { // v_i created at clockStart + i seconds
				publishValue(c, topic, fmt.Sprint("v", i))
				clock.Advance(time.Second)
			}
			starts := []struct {
				at   time.Time
				want []string
			}{
				{clockStart.Add(2 * time.Second), []string{"v2", "v3", "v4", "new"}},
				{clockStart.Add(2500 * time.Millisecond), []string{"v3", "v4", "new"}},
				{clockStart.Add(-time.Hour), []string{"v0", "v1", "v2", "v3", "v4", "new"}},
				{clockStart.Add(time.Hour), []string{"new"}},
			}
			recs := make([]*pubsubtest.Recorder[string], len(starts))
			for i, s := range starts {
				recs[i] = pubsubtest.NewRecorder[string]()
				subscribe(c, topic, fmt.Sprint("g", i), "c1", recs[i], pubsub.StartAt(pubsub.AtTime(s.at)))
			}
			publishValue(c, topic, "new")
			c.drain(b)
			for i, s := range starts {
				if got := recs[i].Values(); !slices.Equal(got, s.want) {
					c.Errorf("StartAt(AtTime(%v)) delivered %q, want %q", s.at, got, s.want)
				}
			}
		}},
		{name: "no record before its start is ever delivered to a new group, even while records are published", run: func(c *conf) {
			b := c.broker()
			for round := range 10 {
				topic := c.topic(b, fmt.Sprint("events-", round))
				for i := range 50 {
					publishValue(c, topic, fmt.Sprint(i))
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					for i := 50; i < 100; i++ {
						if _, err := topic.PublishValue(c.ctx(), fmt.Sprint(i)); err != nil {
							c.Errorf("PublishValue(%d): %v", i, err)
							return
						}
					}
				}()
				atOffset := pubsubtest.NewRecorder[string]()
				subscribe(c, topic, "at-40", "c1", atOffset, pubsub.StartAt(pubsub.AtOffset(40)))
				before := topic.Stats().Published
				latest := pubsubtest.NewRecorder[string]()
				subscribe(c, topic, "latest", "c1", latest, pubsub.StartAt(pubsub.Latest()))
				after := topic.Stats().Published
				<-done
				c.drain(b)
				if got := offsetsOf(atOffset.Messages()); len(got) != 60 || got[0] != 40 || !consecutive(got) {
					c.Fatalf("round %d: StartAt(AtOffset(40)) delivered %s, want offsets 40..99 in order", round, span(got))
				}
				got := offsetsOf(latest.Messages())
				if len(got) > 0 && (got[0] < before || got[0] > after || !consecutive(got) || got[len(got)-1] != 99) {
					c.Fatalf("round %d: StartAt(Latest) between offsets %d and %d delivered %s, want a run from one of them to 99",
						round, before, after, span(got))
				}
			}
		}},
	}
}

func offsetsOf[V any](msgs []pubsub.Message[V]) []int64 {
	out := make([]int64, len(msgs))
	for i, m := range msgs {
		out[i] = m.Offset
	}
	return out
}

// consecutive reports whether offsets go up by one each.
func consecutive(offsets []int64) bool {
	for i := 1; i < len(offsets); i++ {
		if offsets[i] != offsets[i-1]+1 {
			return false
		}
	}
	return true
}

// span describes offsets briefly for a failure message.
func span(offsets []int64) string {
	if len(offsets) == 0 {
		return "no records"
	}
	return fmt.Sprintf("%d records, offsets %d..%d", len(offsets), offsets[0], offsets[len(offsets)-1])
}

func seekCases() []confCase {
	return []confCase{
		{name: "Seek delivers again from its offset, each record with Attempt 1", run: func(c *conf) {
			b := c.broker(pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond}))
			topic := c.topic(b, "orders")
			var failedOnce atomic.Bool
			log := &callLog[string]{fail: func(m pubsub.Message[string]) error {
				if m.Value == "e3" && failedOnce.CompareAndSwap(false, true) {
					return errBoom
				}
				return nil
			}}
			g := subscribe(c, topic, "billing", "b1", log)
			for i := range 5 {
				publishValue(c, topic, fmt.Sprint("e", i))
			}
			c.drain(b)
			if err := g.Seek(c.ctx(), 0, 2); err != nil {
				c.Fatalf("Seek(0, 2): %v", err)
			}
			c.drain(b)
			calls := log.all()
			if got, want := values(calls), []string{"e0", "e1", "e2", "e3", "e3", "e4", "e2", "e3", "e4"}; !slices.Equal(got, want) {
				c.Fatalf("handler calls: got %q, want %q", got, want)
			}
			if got, want := attempts(calls), []int{1, 1, 1, 1, 2, 1, 1, 1, 1}; !slices.Equal(got, want) {
				c.Errorf("attempts: got %v, want %v (a seek starts the count again)", got, want)
			}
		}},
		{name: "a Seek during a retry backoff delivers the record again at once, with Attempt 1", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			failed := make(chan struct{})
			log := &callLog[string]{fail: func(m pubsub.Message[string]) error {
				select {
				case <-failed:
					return nil
				default:
					close(failed) // only the very first call fails
					return errBoom
				}
			}}
			// A backoff as long as the failure bound: the subtest fails if the
			// engine waits it out.
			g := subscribe(c, topic, "billing", "b1", log, pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 5, BaseDelay: failureBound}))
			publishValue(c, topic, "a")
			c.wait("the first attempt", failed)
			if err := g.Seek(c.ctx(), 0, 0); err != nil {
				c.Fatalf("Seek(0, 0): %v", err)
			}
			c.drain(b)
			if got, want := attempts(log.all()), []int{1, 1}; !slices.Equal(got, want) {
				c.Errorf("attempts: got %v, want %v", got, want)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: 1, Retried: 1})
		}},
		{name: "Seek accepts offsets from the oldest retained record to the end of an existing partition, and moves nothing otherwise", run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, BlockTimeout: failureBound}))
			for i := range 4 { // e2 and e3 stay; the end is 4
				publishValue(c, topic, fmt.Sprint("e", i))
			}
			rec := pubsubtest.NewRecorder[string]()
			g := subscribe(c, topic, "billing", "b1", rec)
			c.drain(b)
			for _, bad := range []struct {
				partition int
				offset    int64
				want      error
			}{
				{0, 1, pubsub.ErrOffsetOutOfRange},
				{0, -1, pubsub.ErrOffsetOutOfRange},
				{0, 5, pubsub.ErrOffsetOutOfRange},
				{1, 2, pubsub.ErrInvalid},
				{-1, 2, pubsub.ErrInvalid},
			} {
				err := g.Seek(c.ctx(), bad.partition, bad.offset)
				c.wantIs(fmt.Sprintf("Seek(%d, %d)", bad.partition, bad.offset), err, bad.want)
			}
			c.settle()
			if got := g.Committed(0); got != 4 || rec.Len() != 2 {
				c.Errorf("after the failed seeks: Committed(0) %d and %d deliveries, want 4 and 2", got, rec.Len())
			}
			for _, off := range []int64{4, 2} {
				if err := g.Seek(c.ctx(), 0, off); err != nil {
					c.Errorf("Seek(0, %d): got %v, want nil", off, err)
				}
			}
			c.drain(b)
			if got, want := rec.Values(), []string{"e2", "e3", "e2", "e3"}; !slices.Equal(got, want) {
				c.Errorf("delivered %q, want %q", got, want)
			}
		}},
		{name: "Seek waits for the delivery in flight, which commits first", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			gt, log, g := gatedLog(c, topic)
			c.wait("the delivery of a", gt.entered)
			waitsForInFlight(c, gt, "Seek", func() error { return g.Seek(c.ctx(), 0, 0) })
			c.drain(b)
			// In a bubble the Seek surely began while a was in flight, so b
			// comes only after a's second delivery. In real time it may have
			// begun after b, which is then delivered twice.
			got := values(log.all())
			if !slices.Equal(got, []string{"a", "a", "b"}) && (c.bubble || !slices.Equal(got, []string{"a", "b", "a", "b"})) {
				c.Errorf("handler calls: got %q, want a, then a and b again from offset 0", got)
			}
			if got := g.Committed(0); got != 2 {
				c.Errorf("Committed(0): got %d, want 2", got)
			}
		}},
		{name: "a Seek or Replay whose context ends before the delivery in flight moves nothing", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			gt, log, g := gatedLog(c, topic)
			c.wait("the delivery of a", gt.entered)
			err := g.Seek(c.within(shortWait), 0, 2)
			c.wantIs("Seek with a delivery in flight past its context", err, context.DeadlineExceeded)
			err = g.Replay(c.within(shortWait), pubsub.Latest())
			c.wantIs("Replay with a delivery in flight past its context", err, context.DeadlineExceeded)
			gt.open()
			c.drain(b)
			if got, want := values(log.all()), []string{"a", "b"}; !slices.Equal(got, want) {
				c.Errorf("handler calls: got %q, want %q (nothing moved)", got, want)
			}
		}},
		{name: "Replay(AtOffset(n)) moves every partition to n, and the records come again with Attempt 1", run: func(c *conf) {
			b, topic := c.brokerTopic("orders", pubsub.WithPartitions(2), pubsub.WithPartitioner(pubsub.RoundRobin()))
			log := &callLog[string]{}
			g := subscribe(c, topic, "billing", "b1", log)
			for i := range 6 {
				publishValue(c, topic, fmt.Sprint("v", i))
			}
			c.drain(b)
			if err := g.Replay(c.ctx(), pubsub.AtOffset(1)); err != nil {
				c.Fatalf("Replay(AtOffset(1)): %v", err)
			}
			c.drain(b)
			calls := log.all()
			if len(calls) != 10 {
				c.Fatalf("got %d handler calls, want 6 and 4 again", len(calls))
			}
			again := map[int][]int64{}
			for _, m := range calls[6:] {
				again[m.Partition] = append(again[m.Partition], m.Offset)
				if m.Attempt != 1 {
					c.Errorf("replayed %s: Attempt %d, want 1", m.Value, m.Attempt)
				}
			}
			for p := range 2 {
				if want := []int64{1, 2}; !slices.Equal(again[p], want) {
					c.Errorf("partition %d replayed offsets %v, want %v", p, again[p], want)
				}
			}
		}},
		{name: "Replay(Latest) moves a paused group past its backlog", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			rec := pubsubtest.NewRecorder[string]()
			g := subscribe(c, topic, "billing", "b1", rec)
			if err := g.Pause(c.ctx()); err != nil {
				c.Fatalf("Pause: %v", err)
			}
			for i := range 3 {
				publishValue(c, topic, fmt.Sprint("old-", i))
			}
			if lag := g.Lag(); lag != 3 {
				c.Errorf("Lag before the replay: got %d, want 3", lag)
			}
			if err := g.Replay(c.ctx(), pubsub.Latest()); err != nil {
				c.Fatalf("Replay(Latest): %v", err)
			}
			if lag, committed := g.Lag(), g.Committed(0); lag != 0 || committed != 3 {
				c.Errorf("after Replay(Latest): Lag %d, Committed(0) %d; want 0 and 3", lag, committed)
			}
			if err := g.Resume(c.ctx()); err != nil {
				c.Fatalf("Resume: %v", err)
			}
			publishValue(c, topic, "new")
			c.drain(b)
			if got, want := rec.Values(), []string{"new"}; !slices.Equal(got, want) {
				c.Errorf("delivered %q, want %q", got, want)
			}
		}},
		{name: "Replay(AtTime(t)) moves a group to the first record created at or after t", needs: engine.InjectedClock, run: func(c *conf) {
			clock, b, topic := c.clockedBrokerTopic("events")
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "g", "c1", rec)
			for i := range 4 {
				publishValue(c, topic, fmt.Sprint("v", i))
				clock.Advance(time.Minute)
			}
			c.drain(b)
			if err := b.Replay(c.ctx(), "g", "events", pubsub.AtTime(clockStart.Add(2*time.Minute))); err != nil {
				c.Fatalf("Broker.Replay(AtTime): %v", err)
			}
			c.drain(b)
			if got, want := rec.Values(), []string{"v0", "v1", "v2", "v3", "v2", "v3"}; !slices.Equal(got, want) {
				c.Errorf("delivered %q, want %q", got, want)
			}
		}},
		{name: "Broker.Replay moves an existing group by name, and fails for an unknown one without moving anything", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "billing", "b1", rec)
			publishValue(c, topic, "a")
			publishValue(c, topic, "b")
			c.drain(b)
			c.wantIs("Broker.Replay of an unknown group", b.Replay(c.ctx(), "nobody", "orders", pubsub.Earliest()), pubsub.ErrSubscription)
			c.wantIs("Broker.Replay of an unknown topic", b.Replay(c.ctx(), "billing", "nothing", pubsub.Earliest()), pubsub.ErrTopicNotFound)
			c.wantIs("Broker.Replay to a negative offset", b.Replay(c.ctx(), "billing", "orders", pubsub.AtOffset(-1)), pubsub.ErrInvalid)
			c.settle()
			if rec.Len() != 2 {
				c.Errorf("after the failed replays: %d deliveries, want 2", rec.Len())
			}
			if err := b.Replay(c.ctx(), "billing", "orders", pubsub.AtOffset(1)); err != nil {
				c.Fatalf("Broker.Replay: %v", err)
			}
			c.drain(b)
			if got, want := rec.Values(), []string{"a", "b", "b"}; !slices.Equal(got, want) {
				c.Errorf("delivered %q, want %q", got, want)
			}
		}},
	}
}

func pauseCases() []confCase {
	return []confCase{
		{name: "a paused group delivers nothing and keeps its offsets until Resume", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			rec, g := pausedWithLag(c, b, topic)
			c.settle()
			if n, committed, lag := rec.Len(), g.Committed(0), g.Lag(); n != 1 || committed != 1 || lag != 2 {
				c.Errorf("while paused: %d deliveries, Committed(0) %d, Lag %d; want 1, 1, 2", n, committed, lag)
			}
			if err := g.Resume(c.ctx()); err != nil {
				c.Fatalf("Resume: %v", err)
			}
			c.drain(b)
			if got, want := rec.Values(), []string{"a", "b", "c"}; !slices.Equal(got, want) {
				c.Errorf("delivered %q, want %q", got, want)
			}
		}},
		{name: "Pause returns once the delivery in flight has ended, and that delivery commits", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			gt, log, g := gatedLog(c, topic)
			c.wait("the delivery of a", gt.entered)
			waitsForInFlight(c, gt, "Pause", func() error { return g.Pause(c.ctx()) })
			// In a bubble the Pause surely began while a was in flight, so b
			// never began. In real time it may have begun after b.
			want := []string{"a"}
			if got := g.Committed(0); got == 2 && !c.bubble {
				want = []string{"a", "b"}
			} else if got != 1 {
				c.Errorf("Committed(0) once Pause returned: got %d, want 1 (the delivery in flight commits)", got)
			}
			c.settle()
			if got := values(log.all()); !slices.Equal(got, want) {
				c.Errorf("handler calls while paused: got %q, want %q", got, want)
			}
			if err := g.Resume(c.ctx()); err != nil {
				c.Fatalf("Resume: %v", err)
			}
			c.drain(b)
			if got, want := values(log.all()), []string{"a", "b"}; !slices.Equal(got, want) {
				c.Errorf("handler calls: got %q, want %q", got, want)
			}
		}},
		{name: "a Pause whose context ends before the delivery in flight has paused all the same", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			gt, log, g := gatedLog(c, topic)
			c.wait("the delivery of a", gt.entered)
			err := g.Pause(c.within(shortWait))
			c.wantIs("Pause with a delivery in flight past its context", err, context.DeadlineExceeded)
			gt.open()
			c.wait("the end of the delivery of a", gt.returned)
			c.settle()
			if got := values(log.all()); !slices.Equal(got, []string{"a"}) {
				c.Errorf("handler calls after the Pause: got %q, want [a] (paused)", got)
			}
			c.wantIs("Drain with the paused group", b.Drain(c.ctx()), pubsub.ErrStalled)
			if err := g.Resume(c.ctx()); err != nil {
				c.Fatalf("Resume: %v", err)
			}
			c.drain(b)
			if got, want := values(log.all()), []string{"a", "b"}; !slices.Equal(got, want) {
				c.Errorf("handler calls: got %q, want %q", got, want)
			}
		}},
		{name: "pausing one group leaves the other groups delivering", run: func(c *conf) {
			b, topic := c.brokerTopic("orders")
			paused, other := pubsubtest.NewRecorder[string](), pubsubtest.NewRecorder[string]()
			g := subscribe(c, topic, "paused", "p1", paused)
			subscribe(c, topic, "other", "o1", other)
			if err := g.Pause(c.ctx()); err != nil {
				c.Fatalf("Pause: %v", err)
			}
			for i := range 3 {
				publishValue(c, topic, fmt.Sprint("v", i))
			}
			waitFor(c, other, 3)
			c.settle()
			if paused.Len() != 0 {
				c.Errorf("the paused group got %q, want nothing", paused.Values())
			}
			if err := g.Resume(c.ctx()); err != nil {
				c.Fatalf("Resume: %v", err)
			}
			c.drain(b)
			if got, want := paused.Values(), []string{"v0", "v1", "v2"}; !slices.Equal(got, want) {
				c.Errorf("the resumed group got %q, want %q", got, want)
			}
		}},
	}
}
