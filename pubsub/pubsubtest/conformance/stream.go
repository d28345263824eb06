package conformance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// settledRounds is how often the suite acks (or nacks) a Stream delivery
// and closes the Stream at once, hunting the race in which Close gives the
// settled delivery back. The window is narrow: with Stream.Close made to
// give back a delivery settled an instant before, the first failing round
// was anywhere from 0 to 700 under -race and from 140 to 990 without it
// (in one run of 300 rounds without it, none failed). A round takes about
// 0.1ms.
const settledRounds = 1000

// settledBudget bounds the real time the rounds of each kind take: an
// engine that talks to a server makes fewer of them (each round builds a
// broker) rather than run into failureBound. The in-memory engine makes
// all of them well within it.
const settledBudget = 2 * time.Second

func streamCases() []confCase {
	cases := []confCase{
		{name: "a Stream hands over one delivery per partition at a time and commits its offset only when it is acked", run: func(c *conf) {
			b, topic := c.brokerTopic("tasks")
			s := stream(c, topic, "workers", "w1")
			g := s.Group()
			publishValue(c, topic, "wash")
			publishValue(c, topic, "dry")
			d1 := recv(c, s)
			if d1.Value != "wash" || d1.Offset != 0 || d1.Attempt != 1 || d1.Topic != "tasks" {
				c.Errorf("first delivery: got %q offset %d attempt %d topic %q, want wash, 0, 1, tasks", d1.Value, d1.Offset, d1.Attempt, d1.Topic)
			}
			noDelivery(c, s)
			if committed, lag := g.Committed(0), g.Lag(); committed != 0 || lag != 2 {
				c.Errorf("with the delivery unacked: Committed(0) %d, Lag %d; want 0 and 2", committed, lag)
			}
			d1.Ack()
			d2 := recv(c, s)
			if d2.Value != "dry" || d2.Offset != 1 {
				c.Errorf("second delivery: got %q at offset %d, want dry at 1", d2.Value, d2.Offset)
			}
			if got := g.Committed(0); got != 1 {
				c.Errorf("Committed(0) once the next delivery came: got %d, want 1", got)
			}
			noDelivery(c, s)
			d2.Ack()
			d2.Ack()         // later calls do nothing
			d2.Nack(errBoom) // nor does a Nack after the Ack
			c.drain(b)
			if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 2}); got != want || g.Committed(0) != 2 {
				c.Errorf("stats %+v, Committed(0) %d; want %+v and 2", got, g.Committed(0), want)
			}
			if err := s.Close(); err != nil {
				c.Errorf("Stream.Close: %v", err)
			}
		}},
		{name: "a Stream can hold deliveries of different partitions at once, each partition waiting for its own", run: func(c *conf) {
			b, topic := c.brokerTopic("tasks", pubsub.WithPartitions(2), pubsub.WithPartitioner(pubsub.RoundRobin()))
			s := stream(c, topic, "workers", "w1")
			publishValues(c, topic, "a-1", "b-1", "a-2", "b-2")
			held := map[int]*pubsub.Delivery[string]{}
			for range 2 {
				d := recv(c, s)
				held[d.Partition] = d
			}
			if len(held) != 2 || held[0].Offset != 0 || held[1].Offset != 0 {
				c.Fatalf("the first two deliveries: got %v, want offset 0 of each partition", held)
			}
			noDelivery(c, s)
			held[1].Ack()
			if d := recv(c, s); d.Partition != 1 || d.Offset != 1 {
				c.Errorf("after acking partition 1: got partition %d offset %d, want partition 1 offset 1", d.Partition, d.Offset)
			} else {
				d.Ack()
			}
			held[0].Ack()
			if d := recv(c, s); d.Partition != 0 || d.Offset != 1 {
				c.Errorf("after acking partition 0: got partition %d offset %d, want partition 0 offset 1", d.Partition, d.Offset)
			} else {
				d.Ack()
			}
			c.drain(b)
			if err := s.Close(); err != nil {
				c.Errorf("Stream.Close: %v", err)
			}
		}},
		{name: "Nack retries a delivery with Attempt counting up, then dead-letters it", run: func(c *conf) {
			b, topic := c.brokerTopic("tasks")
			s := stream(c, topic, "workers", "w1", pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}))
			g := s.Group()
			publishValue(c, topic, "job")
			publishValue(c, topic, "next")
			d1 := recv(c, s)
			d1.Nack(errBoom)
			d2 := recv(c, s)
			if d2.ID != d1.ID || d2.Offset != 0 || d2.Value != "job" || d2.Attempt != 2 {
				c.Errorf("redelivery: got ID %q offset %d value %q attempt %d, want ID %q offset 0 job attempt 2", d2.ID, d2.Offset, d2.Value, d2.Attempt, d1.ID)
			}
			if got := g.Committed(0); got != 0 {
				c.Errorf("Committed(0) during the retry: got %d, want 0", got)
			}
			d2.Nack(errBoom)
			d3 := recv(c, s)
			if d3.Value != "next" || d3.Attempt != 1 {
				c.Errorf("after the dead letter: got %q attempt %d, want next attempt 1", d3.Value, d3.Attempt)
			}
			d3.Ack()
			c.drain(b)
			if dl := g.DeadLetters(); len(dl) != 1 || dl[0].Attempts != 2 || dl[0].Message.Value != "job" || !errors.Is(dl[0].Err, errBoom) {
				c.Errorf("dead letters: got %+v, want job after 2 attempts, wrapping the Nack's error", dl)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: 1, Retried: 1, DeadLettered: 1})
			if err := s.Close(); err != nil {
				c.Errorf("Stream.Close: %v", err)
			}
		}},
		{name: "Nack with an error wrapping ErrPermanent dead-letters the delivery at once", run: func(c *conf) {
			b, topic := c.brokerTopic("tasks")
			s := stream(c, topic, "workers", "w1", pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 5, BaseDelay: failureBound}))
			g := s.Group()
			publishValue(c, topic, "job")
			publishValue(c, topic, "next")
			recv(c, s).Nack(fmt.Errorf("job: %w", pubsub.ErrPermanent))
			d := recv(c, s) // a retry would wait the failure bound
			if d.Value != "next" || d.Attempt != 1 {
				c.Errorf("after a permanent Nack: got %q attempt %d, want next attempt 1", d.Value, d.Attempt)
			}
			d.Ack()
			c.drain(b)
			if dl := g.DeadLetters(); len(dl) != 1 || dl[0].Attempts != 1 || !errors.Is(dl[0].Err, pubsub.ErrPermanent) {
				c.Errorf("dead letters: got %+v, want job after 1 attempt, wrapping ErrPermanent", dl)
			}
			wantGroupStats(c, g, pubsub.GroupStats{Delivered: 1, DeadLettered: 1})
			if err := s.Close(); err != nil {
				c.Errorf("Stream.Close: %v", err)
			}
		}},
		{name: "a settled delivery is never given back when its Stream closes right after", realTime: true, run: func(c *conf) {
			for _, nack := range []bool{false, true} {
				start := time.Now()
				for round := 0; round < settledRounds && (round < 10 || time.Since(start) < settledBudget); round++ {
					b, topic := c.brokerTopic("tasks")
					s := stream(c, topic, "workers", "w1")
					publishValue(c, topic, "t1")
					d := recv(c, s)
					want := pubsub.GroupStats{Delivered: 1}
					if nack {
						d.Nack(fmt.Errorf("bad task: %w", pubsub.ErrPermanent))
						want = pubsub.GroupStats{DeadLettered: 1}
					} else {
						d.Ack()
					}
					if err := s.Close(); err != nil {
						c.Fatalf("round %d: Stream.Close: %v", round, err)
					}
					g := s.Group()
					if got := g.Stats(); got != want || g.Committed(0) != 1 {
						c.Fatalf("round %d (nack %v): after settling then closing: stats %+v, Committed(0) %d; want %+v and 1",
							round, nack, got, g.Committed(0), want)
					}
					if err := b.Close(c.ctx()); err != nil {
						c.Fatalf("round %d: Close: %v", round, err)
					}
				}
			}
		}},
		{name: "Stream.Close gives a held, unsettled delivery back to the group, and the next consumer gets it again", run: func(c *conf) {
			b, topic := c.brokerTopic("tasks")
			s := stream(c, topic, "workers", "w1")
			g := s.Group()
			publishValue(c, topic, "job")
			d := recv(c, s)
			if err := s.Close(); err != nil {
				c.Fatalf("Stream.Close: %v", err)
			}
			closedNow(c, s)
			d.Ack() // too late: it went back
			c.settle()
			if got := g.Committed(0); got != 0 {
				c.Errorf("Committed(0) after the give-back and a late Ack: got %d, want 0", got)
			}
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, topic, "workers", "w2", rec)
			c.drain(b)
			msgs := rec.Messages()
			if len(msgs) != 1 || msgs[0].ID != d.ID || msgs[0].Offset != 0 || msgs[0].Attempt != 2 {
				c.Errorf("the next consumer got %+v, want %q again at offset 0, Attempt 2", msgs, d.ID)
			}
			if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 1}); got != want {
				c.Errorf("stats: got %+v, want %+v (a give-back is no failure)", got, want)
			}
		}},
		{name: "a held delivery holds a Pause until its context ends, and the group has paused all the same", run: func(c *conf) {
			h := heldDelivery(c)
			b, s, g, d := h.b, h.s, h.g, h.d
			err := g.Pause(c.within(shortWait))
			c.wantIs("Pause with a held delivery", err, context.DeadlineExceeded)
			d.Ack()
			noDelivery(c, s)
			if err := g.Resume(c.ctx()); err != nil {
				c.Fatalf("Resume: %v", err)
			}
			finishHeld(c, b, s, "t2")
		}},
		{name: "a held delivery holds a Seek until its context ends, and the Seek moves nothing", run: func(c *conf) {
			h := heldDelivery(c)
			h.movesNothing(c, "Seek", func(ctx context.Context) error { return h.g.Seek(ctx, 0, 2) })
		}},
		{name: "a held delivery holds a Replay until its context ends, and the Replay moves nothing", run: func(c *conf) {
			h := heldDelivery(c)
			h.movesNothing(c, "Replay", func(ctx context.Context) error { return h.g.Replay(ctx, pubsub.Latest()) })
		}},
		{name: "a held delivery holds a Leave until its context ends, and the consumer has left all the same", run: func(c *conf) {
			h := heldDelivery(c)
			b, s, g, d := h.b, h.s, h.g, h.d
			err := g.Leave(c.within(shortWait), "w1")
			c.wantIs("Leave with a held delivery", err, context.DeadlineExceeded)
			if _, member := g.Assignment()["w1"]; member {
				c.Errorf("assignment %v after the Leave gave up: want w1 gone", g.Assignment())
			}
			d.Ack()
			waitClosed(c, s)
			if got := g.Committed(0); got != 1 {
				c.Errorf("Committed(0) once the held delivery was acked and C closed: got %d, want 1", got)
			}
			rec := pubsubtest.NewRecorder[string]()
			subscribe(c, h.tp, "workers", "w2", rec)
			c.drain(b)
			if got := rec.Values(); len(got) != 1 || got[0] != "t2" {
				c.Errorf("the next consumer got %q, want [t2]", got)
			}
		}},
		{name: "Broker.Close closes every Stream's channel, and Stream.Close afterwards does nothing", run: func(c *conf) {
			b := c.broker()
			tp := c.topic(b, "tasks")
			s1 := stream(c, tp, "workers", "w1")
			s2 := stream(c, tp, "audit", "a1")
			idle := stream(c, tp, "workers", "w-idle") // owns no partition
			publishValue(c, tp, "job")
			recv(c, s1).Ack()
			recv(c, s2).Ack()
			if err := b.Close(c.ctx()); err != nil {
				c.Fatalf("Close: %v", err)
			}
			for _, s := range []*pubsub.Stream[string]{s1, s2, idle} {
				closedNow(c, s)
				if err := s.Close(); err != nil {
					c.Errorf("Stream.Close after Broker.Close: got %v, want nil", err)
				}
			}
		}},
		{name: "a Stream never receives a value its codec cannot decode", run: func(c *conf) {
			b := c.broker()
			tp := newTopic(c, b, "orders", codec.String(), pickyStrings())
			s := stream(c, tp, "billing", "s1")
			publishValue(c, tp, "poison")
			publishValue(c, tp, "ok")
			d := recv(c, s)
			if d.Value != "ok" || d.Offset != 1 {
				c.Errorf("first delivery: got %q at offset %d, want ok at 1", d.Value, d.Offset)
			}
			d.Ack()
			c.drain(b)
			dl := s.Group().DeadLetters()
			if len(dl) != 1 || dl[0].Attempts != 1 || !errors.Is(dl[0].Err, errPoison) {
				c.Errorf("dead letters: got %+v, want poison after 1 attempt, wrapping the codec's error", dl)
			}
			if _, ok := errors.AsType[*pubsub.DecodeError](dl[0].Err); len(dl) == 1 && !ok {
				c.Errorf("dead letter Err: got %T, want a *pubsub.DecodeError", dl[0].Err)
			}
			if err := s.Close(); err != nil {
				c.Errorf("Stream.Close: %v", err)
			}
		}},
	}
	takeBack := []struct {
		name string
		call func(c *conf, g *pubsub.Group[string]) error
	}{
		{"Pause", func(c *conf, g *pubsub.Group[string]) error { return g.Pause(c.ctx()) }},
		{"Seek", func(c *conf, g *pubsub.Group[string]) error { return g.Seek(c.ctx(), 0, 0) }},
		{"Replay", func(c *conf, g *pubsub.Group[string]) error { return g.Replay(c.ctx(), pubsub.Earliest()) }},
		{"Leave", func(c *conf, g *pubsub.Group[string]) error { return g.Leave(c.ctx(), "w1") }},
	}
	for _, tb := range takeBack {
		cases = append(cases, confCase{
			name: tb.name + " takes back a delivery nobody has received, at once",
			run:  func(c *conf) { takeBackUnread(c, tb.name, tb.call, false) },
		})
	}
	cases = append(cases, confCase{
		name:  "a delivery taken back unread by Pause, Seek, Replay or Leave comes again with the same Attempt",
		needs: engine.GiveBack,
		run: func(c *conf) {
			for _, tb := range takeBack {
				takeBackUnread(c, tb.name, tb.call, true)
			}
		},
	})
	return cases
}

// takeBackUnread publishes one record to a Stream that does not read it,
// calls call on the stream's group (which must return without anyone
// reading), then reads the record from the group again. With sameAttempt,
// it also checks that taking it back counted no attempt.
func takeBackUnread(c *conf, name string, call func(*conf, *pubsub.Group[string]) error, sameAttempt bool) {
	c.Helper()
	b := c.broker()
	tp := c.topic(b, "tasks")
	s := stream(c, tp, "workers", "w1")
	g := s.Group()
	publishValue(c, tp, "t1")
	c.settle() // the delivery waits on C, unread
	if err := call(c, g); err != nil {
		c.Fatalf("%s with a delivery nobody received: got %v, want nil without waiting for a reader", name, err)
	}
	if name == "Leave" {
		waitClosed(c, s)
		s = stream(c, tp, "workers", "w2")
	} else if err := g.Resume(c.ctx()); err != nil {
		c.Fatalf("Resume: %v", err)
	}
	d := recv(c, s)
	if d.Value != "t1" || d.Offset != 0 {
		c.Errorf("after %s: got %q at offset %d, want t1 at 0", name, d.Value, d.Offset)
	}
	if sameAttempt && d.Attempt != 1 {
		c.Errorf("after %s: Attempt %d, want 1: a delivery taken back unread was never attempted", name, d.Attempt)
	}
	d.Ack()
	c.drain(b)
	if got := g.Stats(); sameAttempt && got.Retried != 0 {
		c.Errorf("after %s: stats %+v, want no retry counted", name, got)
	}
	if err := s.Close(); err != nil {
		c.Errorf("Stream.Close: %v", err)
	}
}

// heldDelivery returns a Stream of group "workers" on a one-partition topic
// "tasks" to which t1 and t2 were published, and the delivery of t1, which
// the caller holds.
func heldDelivery(c *conf) held {
	c.Helper()
	b := c.broker()
	tp := c.topic(b, "tasks")
	s := stream(c, tp, "workers", "w1")
	publishValue(c, tp, "t1")
	publishValue(c, tp, "t2")
	d := recv(c, s)
	if d.Value != "t1" {
		c.Fatalf("first delivery: got %q, want t1", d.Value)
	}
	return held{b, tp, s, s.Group(), d}
}

// movesNothing checks that move, a Seek or a Replay (what) made while h's
// delivery is held, gives up when its context ends and has moved nothing;
// then h's delivery is acked, and the stream goes on from t2.
func (h held) movesNothing(c *conf, what string, move func(ctx context.Context) error) {
	c.Helper()
	err := move(c.within(shortWait))
	c.wantIs(what+" with a held delivery", err, context.DeadlineExceeded)
	if got := h.g.Committed(0); got != 0 {
		c.Errorf("Committed(0) after the %s gave up: got %d, want 0", what, got)
	}
	h.d.Ack()
	finishHeld(c, h.b, h.s, "t2")
}

type held struct {
	b  *pubsub.Broker
	tp *pubsub.Topic[string, string]
	s  *pubsub.Stream[string]
	g  *pubsub.Group[string]
	d  *pubsub.Delivery[string]
}

// finishHeld receives the next delivery, which must be want, acks it,
// drains and closes the stream.
func finishHeld(c *conf, b *pubsub.Broker, s *pubsub.Stream[string], want string) {
	c.Helper()
	d := recv(c, s)
	if d.Value != want || d.Attempt != 1 {
		c.Errorf("next delivery: got %q attempt %d, want %s attempt 1", d.Value, d.Attempt, want)
	}
	d.Ack()
	c.drain(b)
	if got := s.Group().Stats().Delivered; got != 2 {
		c.Errorf("Delivered: got %d, want 2", got)
	}
	if err := s.Close(); err != nil {
		c.Errorf("Stream.Close: %v", err)
	}
}

// closedNow fails the subtest unless C is closed already.
func closedNow[V any](c *conf, s *pubsub.Stream[V]) {
	c.Helper()
	select {
	case d, ok := <-s.C():
		if ok {
			c.Errorf("Stream.C: got a delivery (%v), want it closed", d.Value)
		}
	default:
		c.Error("Stream.C: open, want it closed by now")
	}
}
